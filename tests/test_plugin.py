"""Extending by decorator: the example plugin under examples/ registers a new algorithm from
outside the tree (entry points `rlbench.algorithms` + `rlbench.conf`) and trains for a step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.test_cli import QUIET_RUN, rlbench

PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "rlbench_grpo_pos"


@pytest.fixture
def plugin_env(tmp_path, cli_env):
    """Install the plugin with pip into a private site dir on PYTHONPATH, so other tests (and
    processes running in parallel) never see it appear or disappear."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                    "--no-deps", "--no-build-isolation", "--target", str(site), str(PLUGIN)],
                   check=True, timeout=300)
    return {**cli_env, "PYTHONPATH": str(site)}


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
