"""The compatibility rules themselves (harness/compat.py) on small declared parts: which part a
need is charged to, the exact reason an incompatible pair is refused with, when it says "as
configured", the config-error line, how task options map to tasks, and the matrix's layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers the bundles and their parts)
import tasks  # noqa: F401
from harness import compat
from harness.registry import ADVANTAGES, ALGORITHMS, POLICY_LOSSES, ROLLOUTS, TASKS
from harness.task import Task
from harness.typed_config import ConfigError


@dataclass
class _Cfg:
    variant: str = "x"


class _Offers(Task):
    Config = _Cfg
    offers: ClassVar[frozenset[str]] = frozenset({compat.TOOLS, compat.BINARY_CORRECT})

    @classmethod
    def offers_for(cls, config):
        return frozenset() if config.get("closed") else cls.offers


class _Nothing(Task):
    Config = _Cfg


class _NeedsAll:
    needs: ClassVar[frozenset[str]] = frozenset({compat.TOOLS, compat.IMAGES})


class _NeedsTools:
    needs: ClassVar[frozenset[str]] = frozenset({compat.TOOLS})


class _NeedsBinary:
    needs: ClassVar[frozenset[str]] = frozenset({compat.BINARY_CORRECT})


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(TASKS._entries, "t_offers", _Offers)
    monkeypatch.setitem(TASKS._entries, "t_nothing", _Nothing)
    monkeypatch.setitem(ALGORITHMS._entries, "a_all", _NeedsAll)
    monkeypatch.setitem(ALGORITHMS._entries, "a_free", _Nothing)
    monkeypatch.setitem(ROLLOUTS._entries, "r_tools", _NeedsTools)
    monkeypatch.setitem(ADVANTAGES._entries, "adv_binary", _NeedsBinary)
    monkeypatch.setitem(POLICY_LOSSES._entries, "l_tools", _NeedsTools)


def node(**parts):
    return OmegaConf.create(parts)


def test_the_vocabulary_names_three_capabilities():
    assert compat.CAPABILITIES == {"tools": "multi-turn tool calls", "images": "image prompts",
                                   "binary_correct": "a binary correct/wrong verdict"}


def test_a_need_is_charged_to_the_first_part_that_declares_it(registered):
    needs = compat.algorithm_needs(node(name="a_free", rollout={"name": "r_tools"},
                                        advantage={"name": "adv_binary"},
                                        loss={"name": "l_tools"}))
    assert needs == {"tools": "rollout r_tools", "binary_correct": "advantage adv_binary"}
    assert compat.algorithm_needs(node(name="a_all", loss={"name": "l_tools"})) == {
        "tools": "algorithm a_all", "images": "algorithm a_all"}


def test_an_algorithm_node_without_get_is_read_by_its_name_only(registered):
    class ByName:
        def __getitem__(self, key):
            return "a_all"

    assert compat.algorithm_needs(ByName()) == {"tools": "algorithm a_all",
                                                "images": "algorithm a_all"}


def test_parts_without_a_name_or_node_need_nothing(registered):
    assert compat.algorithm_needs(node(name="a_free", rollout={"k": 1}, loss=None)) == {}
    assert compat.algorithm_needs({"name": "a_free", "rollout": "r_tools"}) == {}


def test_an_incompatible_pair_names_every_missing_need_in_order(registered):
    verdict = compat.check(node(name="a_all"), "t_nothing")
    assert verdict == compat.Verdict(False, (
        "algorithm a_all needs image prompts (images), which task t_nothing does not offer; "
        "algorithm a_all needs multi-turn tool calls (tools), which task t_nothing does not "
        "offer"))


def test_a_compatible_pair_has_no_reason(registered):
    assert compat.check(node(name="a_free", rollout={"name": "r_tools"}), "t_offers") == \
        compat.Verdict(True, "")


def test_the_reason_says_as_configured_only_when_the_class_offers_it(registered):
    closed = OmegaConf.create({"closed": True})
    verdict = compat.check(node(name="a_free", rollout={"name": "r_tools"}), "t_offers", closed)
    assert verdict.reason == ("rollout r_tools needs multi-turn tool calls (tools), which task "
                              "t_offers as configured does not offer")
    # images are not offered by the class at all: no "as configured"
    verdict = compat.check(node(name="a_all"), "t_offers", OmegaConf.create({}))
    assert verdict.reason == ("algorithm a_all needs image prompts (images), which task t_offers "
                              "does not offer")


def test_task_offers_reads_the_class_and_what_its_configuration_withholds(registered):
    assert compat.task_offers("t_offers") == {"tools", "binary_correct"}
    assert compat.task_offers("t_offers", OmegaConf.create({"closed": True})) == frozenset()
    assert compat.task_offers("t_nothing", OmegaConf.create({})) == frozenset()


def test_an_unknown_capability_names_the_class_the_attribute_and_the_vocabulary():
    class Typo:
        needs: ClassVar[frozenset[str]] = frozenset({"tool", "image"})

    with pytest.raises(ValueError) as err:
        compat._declared(Typo, "needs")
    assert str(err.value) == (
        f"{Typo.__qualname__!r}.needs declares unknown capabilities ['image', 'tool']; "
        "known: tools, images, binary_correct")


def test_an_unknown_capability_of_an_instance_names_the_instance():
    from types import SimpleNamespace

    part = SimpleNamespace(offers={"image"})
    with pytest.raises(ValueError) as err:
        compat._declared(part, "offers")
    assert str(err.value).startswith(f"{part!r}.offers declares unknown capabilities ['image']")


def test_check_config_raises_one_line_naming_the_pair(registered):
    cfg = OmegaConf.create({"algorithm": {"name": "a_all"},
                            "task": {"name": "t_offers"}})
    with pytest.raises(ConfigError) as err:
        compat.check_config(cfg)
    assert str(err.value) == (
        "incompatible pair algorithm=a_all x task=t_offers: algorithm a_all needs image prompts "
        "(images), which task t_offers does not offer")
    compat.check_config(OmegaConf.create({"algorithm": {"name": "a_free"},
                                          "task": {"name": "t_offers"}}))


@pytest.fixture
def conf(tmp_path):
    (tmp_path / "algorithm").mkdir()
    (tmp_path / "task").mkdir()
    (tmp_path / "algorithm" / "zz_free.yaml").write_text("name: a_free\n")
    (tmp_path / "algorithm" / "aa_all.yaml").write_text("name: a_all\n")
    (tmp_path / "task" / "base.yaml").write_text("name: t_offers\n")
    (tmp_path / "task" / "derived.yaml").write_text("defaults:\n  - base\n  - _self_\nx: 1\n")
    (tmp_path / "task" / "bare.yaml").write_text("defaults:\n  - _self_\nx: 1\n")
    (tmp_path / "task" / "nothing.yaml").write_text("name: t_nothing\n")
    return tmp_path


def test_task_options_map_to_their_task_or_the_one_they_extend(conf):
    assert compat.task_configs(conf) == {"base": "t_offers", "derived": "t_offers",
                                         "nothing": "t_nothing"}


def test_a_task_option_that_names_its_task_keeps_it_whatever_it_extends(conf):
    task = conf / "task"
    (task / "named.yaml").write_text("defaults:\n  - base\n  - _self_\nname: t_nothing\n")
    (task / "self_first.yaml").write_text("defaults:\n  - _self_\n  - base\nx: 1\n")
    (task / "overrides.yaml").write_text(
        "defaults:\n  - _self_\n  - override /x: y\n  - base\nx: 1\n")
    configs = compat.task_configs(conf)
    assert configs["named"] == "t_nothing"
    assert configs["self_first"] == "t_offers"
    assert configs["overrides"] == "t_offers"


def test_algorithm_options_are_the_top_level_yaml_files_in_order(conf):
    configs = compat.algorithm_configs(conf)
    assert list(configs) == ["aa_all", "zz_free"]
    assert configs["aa_all"].name == "a_all"


def test_the_matrix_has_a_verdict_per_algorithm_and_task_option(registered, conf):
    algos, task_opts, cells = compat.matrix(conf)
    assert algos == ["aa_all", "zz_free"] and task_opts == ["base", "derived", "nothing"]
    assert [cells["zz_free", t].ok for t in task_opts] == [True, True, True]
    assert [cells["aa_all", t].ok for t in task_opts] == [False, False, False]


def test_the_matrix_text_lines_up_columns_and_lists_each_reason_once(registered, conf):
    assert compat.format_matrix(conf).splitlines() == [
        "         base  derived  nothing",
        "aa_all   -     -        -",
        "zz_free  ok    ok       ok",
        "",
        "- = incompatible (refused with exit 2):",
        "  aa_all: algorithm a_all needs image prompts (images), which task t_offers does not "
        "offer",
        "  aa_all: algorithm a_all needs image prompts (images), which task t_nothing does not "
        "offer; algorithm a_all needs multi-turn tool calls (tools), which task t_nothing does "
        "not offer",
    ]


def test_a_compatible_matrix_has_no_reason_section(registered, tmp_path):
    (tmp_path / "algorithm").mkdir()
    (tmp_path / "task").mkdir()
    (tmp_path / "algorithm" / "f.yaml").write_text("name: a_free\n")
    (tmp_path / "task" / "n.yaml").write_text("name: t_nothing\n")
    assert compat.format_matrix(tmp_path).splitlines() == ["   n", "f  ok"]


def test_a_need_of_the_loss_alone_is_charged_to_the_loss(registered):
    assert compat.algorithm_needs(node(name="a_free", loss={"name": "l_tools"})) == {
        "tools": "loss l_tools"}


def test_short_task_names_get_columns_of_at_least_two_characters(registered, tmp_path):
    (tmp_path / "algorithm").mkdir()
    (tmp_path / "task").mkdir()
    (tmp_path / "algorithm" / "f.yaml").write_text("name: a_free\n")
    (tmp_path / "algorithm" / "g.yaml").write_text("name: a_all\n")
    (tmp_path / "algorithm" / "h.yaml").write_text("name: a_all\n")
    (tmp_path / "task" / "m.yaml").write_text("name: t_nothing\n")
    (tmp_path / "task" / "n.yaml").write_text("name: t_nothing\n")
    lines = compat.format_matrix(tmp_path).splitlines()
    assert lines[:4] == ["   m   n", "f  ok  ok", "g  -   -", "h  -   -"]
    assert lines[-1].startswith("  g, h: algorithm a_all needs image prompts (images)")
