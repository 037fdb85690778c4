"""Compatibility declared, not guessed (issue 21 item 1): tasks declare what they offer, algorithms
and their parts what they need; `rlbench list matrix` prints the matrix, an incompatible pair exits
2 naming the pair and the reason, a compatible pair is not refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers the bundles and their parts)
import tasks  # noqa: F401
from harness import compat
from harness.cli.hydra_app import preflight
from harness.cli.main import main
from harness.config import CONF_DIR
from harness.registry import TASKS
from harness.task import Task


def _row(text: str, name: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.split()[:1] == [name])


def test_list_matrix_prints_every_algorithm_and_task(capsys):
    main(["list", "matrix"])
    out = capsys.readouterr().out
    header = out.splitlines()[1].split()
    assert {"countdown", "agentic_qa", "geometry3k_tiny", "math_tiny", "code"} <= set(header)
    arpo, grpo = _row(out, "arpo"), _row(out, "grpo")
    assert arpo[1 + header.index("agentic_qa")] == "ok"
    assert arpo[1 + header.index("countdown")] == "-"
    assert set(grpo[1:]) == {"ok"}
    assert "entropy_branching needs multi-turn tool calls (tools)" in out
    algos = {p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml")}
    assert algos <= {line.split()[0] for line in out.splitlines()[2:] if line.strip()}


def test_incompatible_pair_exits_2_naming_the_pair_and_the_reason(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "algorithm=arpo", "task=countdown", "model=tiny"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "algorithm=arpo x task=countdown" in err
    assert "tools" in err and "entropy_branching" in err


def test_plain_sweep_over_an_incompatible_pair_is_refused_up_front(capsys):
    with pytest.raises(SystemExit) as exc:
        preflight(["algorithm=grpo,aepo", "task=countdown", "seed=0"], multirun=True)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "cell 2/2" in err and "algorithm=aepo x task=countdown" in err


@pytest.mark.slow
def test_compatible_pairs_are_not_refused():
    cells = preflight(["algorithm=arpo,grpo", "task=agentic_qa", "seed=0"], multirun=True)
    assert len(cells) == 2
    preflight(["algorithm=lope", "task=geometry3k_tiny", "model=tiny_vlm"], multirun=False)


def test_a_task_configured_without_tools_does_not_offer_them(capsys):
    """agentic_qa's full variant with ``full.tools: []`` is closed-book: ARPO is refused there
    (naming the configuration), GRPO is not, and the tiny variant keeps its search tool."""
    closed = ["task=agentic_qa", "task.variant=full", "task.full.tools=[]", "seed=0"]
    with pytest.raises(SystemExit) as exc:
        preflight(["algorithm=arpo", *closed], multirun=False)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "algorithm=arpo x task=agentic_qa" in err and "as configured" in err
    preflight(["algorithm=grpo", *closed], multirun=False)
    preflight(["algorithm=arpo", "task=agentic_qa", "task.variant=full", "seed=0"],
              multirun=False)
    assert compat.task_offers("agentic_qa") >= {"tools"}  # the class still declares it
    tiny_cfg = OmegaConf.create({"variant": "tiny", "full": {"tools": []}})
    assert "tools" in compat.task_offers("agentic_qa", tiny_cfg)  # tiny always searches


def test_a_text_only_model_is_refused_for_a_task_declaring_images_before_any_data_is_read(
        capsys, monkeypatch):
    """The preflight refuses model=tiny on an image task from the declarations alone (reading
    geometry3k's data would render diagrams first), and lets the text mode of geometry3k, which
    withholds images, through."""
    from tasks.geometry3k.task import Geometry3kTask

    def no_data(self):
        raise AssertionError("the preflight read the task's data")

    monkeypatch.setattr(Geometry3kTask, "train_examples", no_data)
    with pytest.raises(SystemExit) as exc:
        preflight(["task=geometry3k_tiny", "model=tiny"], multirun=False)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "task=geometry3k (variant tiny) has images" in err and "model=tiny_vlm" in err
    text = OmegaConf.create({"variant": "full", "full": {"mode": "text"}})
    assert "images" not in compat.task_offers("geometry3k", text)
    assert "images" in compat.task_offers(
        "geometry3k", OmegaConf.create({"variant": "full", "full": {"mode": "image"}}))
    preflight(["task=geometry3k", "task.variant=full", "task.full.mode=text", "model=tiny"],
              multirun=False)


def test_a_model_path_that_is_unset_missing_not_a_model_or_uncached_is_refused_by_the_preflight(
        capsys, tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"  # a Hugging Face cache holding one snapshot of SomeOrg/cached
    snapshot = cache / "models--SomeOrg--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--SomeOrg--cached" / "refs").mkdir()
    (cache / "models--SomeOrg--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    for path, needle in ((None, "model.path is not set"),
                         (tmp_path / "nope", "does not exist"),
                         (tmp_path, "has no config.json"),
                         ("SomeOrg/uncached", "rlbench downloads nothing")):
        with pytest.raises(SystemExit) as exc:
            preflight(["model=hf", *([f"model.path={path}"] if path else [])], multirun=False)
        assert exc.value.code == 2 and needle in capsys.readouterr().err
    preflight(["model=hf", "model.path=SomeOrg/cached"], multirun=False)
    preflight(["model=hf", f"model.path={snapshot}"], multirun=False)
    preflight(["model=hf"], multirun=False, hardware=False)  # --cfg: nothing is run


def test_the_compatible_sweeper_drops_a_cell_its_configuration_cannot_run():
    cells = preflight(["hydra/sweeper=compatible", "algorithm=grpo,arpo", "task=agentic_qa",
                       "task.variant=full", "task.full.tools=[]", "seed=0"], multirun=True)
    assert [c for c in cells if "algorithm=arpo" in c] == [] and len(cells) == 1


def test_a_configuration_can_withhold_a_capability_but_never_add_one(monkeypatch):
    class Greedy(Task):
        offers: ClassVar[frozenset[str]] = frozenset({compat.BINARY_CORRECT})

        @classmethod
        def offers_for(cls, config):
            return frozenset({compat.BINARY_CORRECT, compat.TOOLS, compat.IMAGES})

    monkeypatch.setitem(TASKS._entries, "greedy", Greedy)
    assert compat.task_offers("greedy", OmegaConf.create({})) == {compat.BINARY_CORRECT}


def test_overriding_a_part_changes_what_the_algorithm_needs():
    """The declaration sits on the parts: GRPO with ARPO's branching rollout needs tools."""
    grpo = OmegaConf.load(CONF_DIR / "algorithm" / "grpo.yaml")
    assert compat.check(grpo, "countdown").ok
    grpo.rollout = {"name": "entropy_branching"}
    verdict = compat.check(grpo, "countdown")
    assert not verdict.ok and "rollout entropy_branching" in verdict.reason


@dataclass
class _BareConfig:
    variant: str = "tiny"


class _Undeclared(Task):
    """A third-party task that declares nothing."""

    Config = _BareConfig


class _Typo(Task):
    Config = _BareConfig
    offers: ClassVar[frozenset[str]] = frozenset({"tool"})


def test_a_task_that_declares_nothing_offers_nothing(monkeypatch):
    monkeypatch.setitem(TASKS._entries, "undeclared_test", _Undeclared)
    lope = OmegaConf.load(CONF_DIR / "algorithm" / "lope.yaml")
    verdict = compat.check(lope, "undeclared_test")
    assert not verdict.ok and "binary correct/wrong verdict" in verdict.reason
    assert compat.check(OmegaConf.load(CONF_DIR / "algorithm" / "grpo.yaml"),
                        "undeclared_test").ok


def test_an_unknown_capability_is_an_error_not_a_silent_pass(monkeypatch):
    monkeypatch.setitem(TASKS._entries, "typo_test", _Typo)
    with pytest.raises(ValueError, match="unknown capabilities"):
        compat.check(OmegaConf.load(CONF_DIR / "algorithm" / "grpo.yaml"), "typo_test")
