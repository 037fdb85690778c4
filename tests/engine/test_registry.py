from types import SimpleNamespace

import pytest

from harness import registry as reg
from harness.registry import Registry, RegistryError


def test_duplicate_name_raises():
    r: Registry = Registry("widget")
    r.register("a", object())
    with pytest.raises(RegistryError, match="already registered"):
        r.register("a", object())


def test_unknown_name_lists_valid_names_and_closest_match():
    r: Registry = Registry("widget")
    for name in ("grpo", "dr_grpo", "rloo"):
        r.register(name, name.upper())
    with pytest.raises(RegistryError) as err:
        r.get("gpro")
    msg = str(err.value)
    assert "Did you mean 'grpo'" in msg and "dr_grpo, grpo, rloo" in msg


def test_decorator_registers_and_returns_the_object():
    r: Registry = Registry("widget")

    @r.register("thing")
    class Thing:
        pass

    assert r.get("thing") is Thing and r.names() == ["thing"]


def test_lazy_entry_imports_only_when_fetched():
    r: Registry = Registry("widget")
    r.register("od", "collections:OrderedDict")
    assert isinstance(r._entries["od"], str)
    from collections import OrderedDict

    assert r.get("od") is OrderedDict


def test_a_lazy_entry_is_replaced_by_its_own_definition_and_by_no_other():
    # harness/__init__.py registers the `group` rollout lazily; importing harness.rollout then
    # runs its decorator on the same definition, which must not count as a second registration
    r: Registry = Registry("widget")
    r.register("od", "collections:OrderedDict")
    from collections import Counter, OrderedDict

    assert r.register("od", OrderedDict) is OrderedDict and r._entries["od"] is OrderedDict
    with pytest.raises(RegistryError, match="already registered"):
        r.register("od", Counter)
    r.register("c", "collections:Counter")
    with pytest.raises(RegistryError, match="already registered"):
        r.register("c", OrderedDict)


def test_the_command_line_imports_no_torch_until_a_command_needs_it(tmp_path):
    # `rlbench --help`, `board`, `export` and `import` start in well under a second: torch (and
    # scipy) are imported by the code that uses them, not by `import harness`
    import subprocess
    import sys

    code = ("import sys, harness, harness.cli.transfer, harness.manifest, harness.report.config; "
            "from harness.cli.main import build_parser; build_parser(); "
            "print(sorted(k for k in ('torch', 'scipy', 'harness.rollout') if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]
    assert "group" in reg.ROLLOUTS and reg.ROLLOUTS.get("group").__module__ == "harness.rollout"


def test_lazy_entry_with_missing_module_names_the_extra():
    r: Registry = Registry("backend")
    r.register("vllm", "not_a_real_module_xyz:Engine")
    with pytest.raises(ImportError, match=r"\[gpu\]"):
        r.get("vllm")


def test_plugins_are_loaded_from_entry_points(monkeypatch):
    r: Registry = Registry("widget", entry_point_group="rlbench.test_widgets")
    loaded = []

    def load():
        r.register("from_plugin", 42)
        loaded.append(True)

    fake = SimpleNamespace(name="p", value="p.mod", load=load)
    monkeypatch.setattr(reg, "entry_points", lambda group: [fake] if group == r.entry_point_group
                        else [])
    assert r.get("from_plugin") == 42 and loaded == [True]


def test_builtin_axes_are_populated():
    assert {"grpo", "dr_grpo", "rloo", "maxrl", "dapo", "reinforce_pp"} <= set(reg.ALGORITHMS)
    assert "countdown" in reg.TASKS
    assert {"grpo", "dr_grpo"} <= set(reg.ADVANTAGES)
    assert "ppo_clip" in reg.POLICY_LOSSES and "group" in reg.ROLLOUTS
    assert "hf" in reg.BACKENDS and {"tiny", "hf"} <= set(reg.MODELS)


@pytest.mark.parametrize("name", ["agentic_qa", "code", "countdown", "geometry3k", "math"])
def test_every_variant_task_rejects_an_unknown_variant_naming_the_key(name):
    import dataclasses

    from harness.task import VariantTask

    cls = reg.TASKS.get(name)
    assert issubclass(cls, VariantTask)
    config = dataclasses.replace(cls.Config(), variant="huge")
    with pytest.raises(ValueError, match=r"task.variant='huge' is not valid; valid variants: "
                                         r"tiny, full"):
        cls(config)
