"""``conf/algorithm/*.yaml``: every file builds, lists every knob with a comment, and config
mistakes fail naming the key; the algorithm modules keep to their import rule."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import algorithms
from harness.algorithm import AlgorithmConfig, KLConfig, OverlongConfig, build_algorithm
from harness.registry import ADVANTAGES, ALGORITHMS, POLICY_LOSSES, ROLLOUTS, RegistryError
from harness.typed_config import ConfigError, schema_of

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf" / "algorithm"
BUILTIN = ["aepo", "agpo", "arbitrary_entropy", "arpo", "cispo", "dapo", "dr_grpo", "gppo", "grpo",
           "grpo_aem", "lope", "lpo_fwd", "lpo_rev", "maxrl", "reinforce_pp", "rloo"]


def load(name: str):
    return OmegaConf.load(CONF / f"{name}.yaml")


def fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_builtin_algorithm_has_a_config_file():
    assert sorted(p.stem for p in CONF.glob("*.yaml")) == BUILTIN
    assert set(BUILTIN) <= set(ALGORITHMS.names())


@pytest.mark.parametrize("name", BUILTIN)
def test_config_builds_the_registered_bundle(name):
    algo = build_algorithm(load(name), max_new_tokens=12)
    assert type(algo) is ALGORITHMS.get(name)
    assert algo.config.name == name
    assert type(algo).__doc__ and type(algo).__doc__.strip()
    assert algo.L_max == 12  # agg_L_max: null -> rollout.max_new_tokens


@pytest.mark.parametrize("name", BUILTIN)
def test_config_lists_every_knob(name):
    node = OmegaConf.to_container(load(name))
    assert set(node) == fields(AlgorithmConfig)
    assert set(node["kl"]) == fields(KLConfig)
    assert set(node["overlong"]) == fields(OverlongConfig)
    parts = (("rollout", ROLLOUTS), ("advantage", ADVANTAGES), ("loss", POLICY_LOSSES))
    for key, registry in parts:
        schema = schema_of(registry.get(node[key]["name"]))
        assert set(node[key]) - {"name"} == fields(schema), f"{name}.{key}"


@pytest.mark.parametrize("name", BUILTIN)
def test_every_knob_line_has_a_comment(name):
    for line in (CONF / f"{name}.yaml").read_text().splitlines():
        code = line.split("#", 1)[0].strip()
        if code and not code.endswith(":"):  # a knob, not a section header
            assert "#" in line, f"{name}.yaml: {line!r} has no comment"


def test_baseline_settings():
    grpo, dr, dapo = (build_algorithm(load(n), 12) for n in ("grpo", "dr_grpo", "dapo"))
    assert grpo.config.agg == "token-mean" and grpo.config.kl.coef == 0.0
    assert dr.config.agg == "seq-mean-token-sum-norm" and dr.config.agg_L_max is None
    assert dapo.config.agg == "token-mean" and dapo.config.kl.coef == 0.0
    loss = dapo.policy_loss
    assert (loss.clip_low, loss.clip_high, loss.dual_clip_c) == (0.2, 0.28, 10.0)
    assert dapo.config.overlong.enabled and dapo.config.overlong.buffer_frac == 0.2
    assert dapo.config.overlong.penalty == 1.0 and dapo.rollout.max_gen_batches == 4
    assert not any(load(n).overlong.enabled for n in BUILTIN if n != "dapo")


def test_agg_l_max_overrides_max_new_tokens():
    node = load("dr_grpo")
    node.agg_L_max = 7
    assert build_algorithm(node, max_new_tokens=12).L_max == 7


@pytest.mark.parametrize(
    "section, key",
    [("loss", "clip_hihg"), ("advantage", "std_knd"), ("rollout", "max_gen_batch")],
)
def test_misspelt_knob_raises_config_error_naming_the_full_key(section, key):
    node = load("dapo")
    node[section][key] = 1
    with pytest.raises(ConfigError, match=f"algorithm\\.{section}\\.{key}"):
        build_algorithm(node, max_new_tokens=12)


@pytest.mark.parametrize("path", ["entropy_coeff", "kl.coeff", "overlong.buffer"])
def test_misspelt_top_level_or_nested_knob_names_the_key(path):
    node = load("grpo")
    OmegaConf.update(node, path, 1, force_add=True)
    with pytest.raises(ConfigError, match=re.escape(f"algorithm.{path}")):
        build_algorithm(node, max_new_tokens=12)


def test_wrongly_typed_knob_raises_config_error():
    node = load("grpo")
    node.loss.clip_low = "wide"
    with pytest.raises(ConfigError, match=r"algorithm\.loss"):
        build_algorithm(node, max_new_tokens=12)


def test_unknown_advantage_name_lists_the_valid_names():
    node = load("grpo")
    node.advantage = {"name": "gpro"}
    with pytest.raises(RegistryError) as info:
        build_algorithm(node, max_new_tokens=12)
    message = str(info.value)
    assert "'gpro'" in message and "Did you mean 'grpo'" in message
    for valid in ("dr_grpo", "grpo", "maxrl", "reinforce_pp", "rloo"):
        assert valid in message


def test_unknown_algorithm_name_lists_the_valid_names():
    node = load("grpo")
    node.name = "ppo"
    with pytest.raises(RegistryError, match=r"Valid names: .*grpo"):
        build_algorithm(node, max_new_tokens=12)


def test_algorithm_modules_import_only_from_harness():
    package = Path(algorithms.__file__).parent
    for path in package.glob("*.py"):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.name} has no module docstring"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("algorithms"), f"{path.name}: {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("algorithms") for a in node.names), path.name
