"""What a sweep cell does when it starts (harness/cell_plan.py): which config keys make two runs
the same cell, how ``trainer.resume`` is read, and the skip / resume / fresh / busy decision
against a scripted MLflow client."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from harness import cell_plan
from harness.cell_plan import (
    HASH_TAG,
    NON_SEMANTIC_KEYS,
    RESUME_AUTO,
    RESUME_OFF,
    RESUME_REQUIRED,
    CellPlan,
    config_hash,
    plan_cell,
    resume_mode,
)


def cfg(resume="auto", skip_finished=True, **extra):
    node = {"algorithm": {"name": "grpo"}, "seed": 0,
            "trainer": {"resume": resume, "skip_finished": skip_finished, "output_dir": "/o"},
            "tracking": {"uri": "x"}}
    node.update(extra)
    return OmegaConf.create(node)


# ---- config_hash ---------------------------------------------------------------------------

def test_config_hash_is_16_hex_digits_of_sha256_of_the_sorted_json():
    import hashlib

    data = {"a": 1, "b": {"c": [1, 2]}}
    expected = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    assert config_hash(data) == expected
    assert config_hash(OmegaConf.create(data)) == expected


def test_config_hash_does_not_depend_on_the_order_of_the_keys():
    """``+task.eval.a.path=.. +task.eval.b.path=..`` in either order, or a yaml listing its keys
    in another order, compose the same cell: a rerun must skip it, not train it again."""
    one = {"seed": 0, "task": {"eval": {"a": {"n": 1}, "b": {"n": 2}}}}
    other = {"task": {"eval": {"b": {"n": 2}, "a": {"n": 1}}}, "seed": 0}
    assert config_hash(one) == config_hash(other)
    assert config_hash(OmegaConf.create(one)) == config_hash(OmegaConf.create(other))


def test_an_unset_block_seed_hashes_as_before_the_key_existed_and_a_set_one_does_not():
    """Runs made before ``block_seed`` existed still skip their cells; an A/A run (a set
    block seed) is another cell than the plain run of its seed."""
    before = {"seed": 0, "algorithm": {"name": "grpo"}}
    assert config_hash({**before, "block_seed": None}) == config_hash(before)
    assert config_hash(OmegaConf.create({**before, "block_seed": None})) == config_hash(before)
    assert config_hash({**before, "block_seed": 0}) != config_hash(before)


def test_config_hash_ignores_the_non_semantic_keys_only():
    base = {"seed": 0, "trainer": {"lr": 1.0}, "backend": {"threads": 1}}
    h = config_hash(base)
    assert config_hash({**base, "tracking": {"uri": "elsewhere"}}) == h
    assert config_hash({**base, "backend": {"threads": 8}}) == h
    assert config_hash({**base, "trainer": {"lr": 1.0, "output_dir": "/x", "resume": "true"}}) == h
    assert config_hash({**base, "trainer": {"lr": 2.0}}) != h
    assert config_hash({**base, "seed": 1}) != h
    assert "trainer.output_dir" in NON_SEMANTIC_KEYS and "backend.threads" in NON_SEMANTIC_KEYS


def test_config_hash_tolerates_missing_or_non_dict_parents():
    assert config_hash({"trainer": 3, "seed": 0}) == config_hash({"trainer": 3, "seed": 0})
    assert config_hash({"seed": 0}) != config_hash({"seed": 0, "trainer": 3})


def test_config_hash_does_not_modify_a_dict_config_it_is_given():
    data = {"seed": 0, "tracking": {"uri": "x"}}
    config_hash(data)
    assert data == {"seed": 0, "tracking": {"uri": "x"}}


def test_config_hash_resolves_interpolations():
    a = OmegaConf.create({"x": 2, "y": "${x}"})
    assert config_hash(a) == config_hash({"x": 2, "y": 2})


def test_config_hash_falls_back_to_str_for_unserialisable_values():
    assert config_hash({"p": Path("/a")}) == config_hash({"p": "/a"})


# ---- resume_mode ---------------------------------------------------------------------------

@pytest.mark.parametrize("value,mode", [
    (None, RESUME_OFF), ("auto", RESUME_AUTO), ("", RESUME_AUTO), (" AUTO ", RESUME_AUTO),
    ("true", RESUME_REQUIRED), ("Yes", RESUME_REQUIRED), ("1", RESUME_REQUIRED),
    (True, RESUME_REQUIRED),
    ("false", RESUME_OFF), ("NO", RESUME_OFF), ("0", RESUME_OFF), ("none", RESUME_OFF),
    ("null", RESUME_OFF), (False, RESUME_OFF), (" /ckpt/step_1 ", "/ckpt/step_1"),
])
def test_resume_mode_reads_every_spelling(value, mode):
    assert resume_mode(value) == mode


def test_resume_modes_are_the_documented_words():
    assert (RESUME_AUTO, RESUME_REQUIRED, RESUME_OFF) == ("auto", "true", "false")


# ---- the plan ------------------------------------------------------------------------------

def run(run_id, status, output_dir=None, kind=None):
    tags = {}
    if output_dir is not None:
        tags["rlbench.output_dir"] = str(output_dir)
    if kind is not None:
        tags["rlbench.kind"] = kind
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, status=status),
                           data=SimpleNamespace(tags=tags))


class Client:
    def __init__(self, runs):
        self.runs = runs
        self.queries = []

    def search_runs(self, experiment_ids, filter_string, order_by, max_results):
        self.queries.append((experiment_ids, filter_string, order_by, max_results))
        return self.runs


def checkpoint(out: Path, step=3, run_id="r1") -> Path:
    path = out / "checkpoints" / f"step_{step:07d}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"run_id": run_id}))
    (out / "checkpoints" / "latest").write_text(path.name)
    return path


def test_without_a_store_a_cell_starts_fresh():
    plan = plan_cell(cfg(), None, None)
    assert plan == CellPlan("fresh", config_hash(cfg()))


def test_a_finished_run_with_the_hash_is_skipped(monkeypatch):
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: None)
    client = Client([run("r0", "KILLED"), run("r1", "FINISHED")])
    plan = plan_cell(cfg(), client, "7")
    digest = config_hash(cfg())
    assert (plan.action, plan.run_id, plan.config_hash) == ("skip", "r1", digest)
    assert plan.reason == (f"run r1 FINISHED with config hash {digest} "
                           "(trainer.skip_finished=false runs it again)")
    assert client.queries == [(["7"], f"tags.`{HASH_TAG}` = '{digest}'",
                               ["attributes.start_time DESC"], 1000)]


def test_runs_of_another_kind_do_not_count(monkeypatch):
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: None)
    plan = plan_cell(cfg(), Client([run("e1", "FINISHED", kind="eval")]), "7")
    assert plan.action == "fresh"
    plan = plan_cell(cfg(), Client([run("t1", "FINISHED", kind="train")]), "7")
    assert plan.action == "skip"


def test_skip_finished_off_runs_a_finished_cell_again(monkeypatch, tmp_path):
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: None)
    checkpoint(tmp_path)
    client = Client([run("r1", "FINISHED", tmp_path)])
    assert plan_cell(cfg(skip_finished=False), client, "7").action == "fresh"


def test_the_newest_unfinished_run_with_a_checkpoint_is_resumed(monkeypatch, tmp_path):
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: None)
    ck = checkpoint(tmp_path / "b")
    client = Client([run("r0", "FINISHED"), run("r1", "KILLED"),
                     run("r2", "FAILED", tmp_path / "nothing-here"),
                     run("r3", "RUNNING", tmp_path / "b")])
    plan = plan_cell(cfg(skip_finished=False), client, "7")
    assert (plan.action, plan.run_id, plan.checkpoint, plan.output_dir) == (
        "resume", "r3", ck, tmp_path / "b")
    assert plan.config_hash == config_hash(cfg(skip_finished=False))
    assert plan.reason == f"run r3 ended RUNNING with a checkpoint at {ck}"


def test_resume_off_never_resumes(monkeypatch, tmp_path):
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: None)
    checkpoint(tmp_path)
    client = Client([run("r1", "KILLED", tmp_path)])
    assert plan_cell(cfg(resume="false"), client, "7").action == "fresh"
    assert plan_cell(cfg(resume="auto"), client, "7").action == "resume"


def test_resume_true_without_a_checkpoint_is_an_error(monkeypatch):
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: None)
    with pytest.raises(FileNotFoundError, match=r"^trainer\.resume=true: no unfinished run with "
                                                r"config hash [0-9a-f]{16} left a checkpoint"):
        plan_cell(cfg(resume="true"), Client([run("r1", "KILLED")]), "7")


def test_resume_from_a_path_reads_the_run_id_and_output_dir(tmp_path):
    ck = checkpoint(tmp_path / "out", run_id="abc")
    plan = plan_cell(cfg(resume=str(tmp_path / "out")), None, None)
    assert (plan.action, plan.run_id, plan.checkpoint, plan.output_dir) == (
        "resume", "abc", ck, tmp_path / "out")
    assert plan.reason == f"trainer.resume={tmp_path / 'out'}"
    # the resumed run is tagged with its cell's hash (trainer.resume is not part of it), so a
    # sweep of the same cell afterwards finds it FINISHED and skips it
    assert plan.config_hash == config_hash(cfg()) == config_hash(cfg(resume=str(tmp_path)))


def test_resume_from_a_bare_checkpoint_dir_uses_it_as_the_output_dir(tmp_path):
    (tmp_path / "trainer_state.json").write_text("{}")
    plan = plan_cell(cfg(resume=str(tmp_path)), None, None)
    assert (plan.run_id, plan.checkpoint, plan.output_dir) == (None, tmp_path, tmp_path)


class FakeClaim:
    def __init__(self):
        self.released = 0
        self.lost = threading.Event()

    def release(self):
        self.released += 1


def test_a_cell_claimed_by_a_live_process_is_busy(monkeypatch):
    seen = []
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: seen.append(a) or "host:123")
    plan = plan_cell(cfg(), Client([]), "7", "sqlite:///x.db")
    digest = config_hash(cfg())
    assert (plan.action, plan.claim) == ("busy", None)
    assert plan.reason == f"cell {digest} is claimed by host:123, which is training it"
    assert seen[0][1:] == ("7", digest, "sqlite:///x.db")


def test_a_trained_cell_holds_its_claim_and_a_skipped_one_releases_it(monkeypatch):
    claim = FakeClaim()
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: claim)
    plan = plan_cell(cfg(), Client([]), "7")
    assert plan.action == "fresh" and plan.claim is claim and claim.released == 0
    assert not plan.lost()
    claim.lost.set()
    assert plan.lost()
    plan.release()
    assert claim.released == 1

    other = FakeClaim()
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: other)
    skipped = plan_cell(cfg(), Client([run("r1", "FINISHED")]), "7")
    assert skipped.action == "skip" and skipped.claim is None and other.released == 1


def test_a_failed_plan_releases_the_claim(monkeypatch):
    claim = FakeClaim()
    monkeypatch.setattr(cell_plan, "claim_cell", lambda *a: claim)
    with pytest.raises(FileNotFoundError):
        plan_cell(cfg(resume="true"), Client([]), "7")
    assert claim.released == 1


def test_a_plan_without_a_claim_is_never_lost():
    plan = CellPlan("fresh", "0" * 16)
    assert not plan.lost()
    plan.release()  # nothing to release
