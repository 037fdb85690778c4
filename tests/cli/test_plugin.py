"""Extending by decorator: the example plugin under examples/ registers a new algorithm from
outside the tree (entry points `rlbench.algorithms` + `rlbench.conf`) and trains for a step,
importing nothing from rlbench but its public API, `harness.api`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import QUIET_RUN, rlbench

PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "rlbench_grpo_pos"
RLBENCH_PACKAGES = ("harness", "algorithms", "tasks", "lantern", "conf")


def _rlbench_imports(path: Path) -> list[str]:
    """The modules of rlbench that ``path`` imports (``import x`` and ``from x import y``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        found += [n for n in names if n.split(".")[0] in RLBENCH_PACKAGES]
    return found


def test_the_example_plugin_imports_only_the_public_api():
    sources = sorted((PLUGIN / "rlbench_grpo_pos").rglob("*.py"))
    assert sources
    imported = {str(p.relative_to(PLUGIN)): _rlbench_imports(p) for p in sources}
    assert imported["rlbench_grpo_pos/__init__.py"] == ["harness.api"]
    assert {m for ms in imported.values() for m in ms} == {"harness.api"}, imported


def test_the_public_api_names_what_it_exports():
    import harness.api

    assert sorted(harness.api.__all__) == sorted(set(harness.api.__all__))
    missing = [n for n in harness.api.__all__ if not hasattr(harness.api, n)]
    assert not missing
    for name in ("register_algorithm", "register_advantage", "Algorithm", "RolloutBatch",
                 "Task", "Example", "Score", "ADVANTAGES"):
        assert name in harness.api.__all__


@pytest.fixture
def plugin_env(tmp_path, cli_env):
    """Install the plugin with pip into a private site dir on PYTHONPATH, so other tests (and
    processes running in parallel) never see it appear or disappear."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                    "--no-deps", "--no-build-isolation", "--target", str(site), str(PLUGIN)],
                   check=True, timeout=300)
    return {**cli_env, "PYTHONPATH": str(site)}


@pytest.mark.slow
def test_example_plugin_registers_and_trains_a_step(plugin_env, tmp_path):
    cli_env = plugin_env
    listed = rlbench("list", "algorithms", env=cli_env, cwd=tmp_path)
    assert "grpo_pos" in listed.stdout
    out = rlbench("train", "algorithm=grpo_pos", *QUIET_RUN, "trainer.steps=1",
                  "trainer.eval_every=0", env=cli_env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["rlbench.algorithm"] == "grpo_pos"
    assert run.data.params["algorithm.advantage.name"] == "grpo_pos"
    assert run.data.metrics["final/steps"] == 1
