"""What a run leaves behind, run as a user runs it: the log in cli.log, k-of-N sweep progress
and summaries, MLflow tags, datasets and tables, the warm start outside final/wall_s, the last
checkpoint only, nothing left by a skipped rerun; and where the demo writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import FAST_PRETRAIN

RLBENCH = [sys.executable, "-m", "harness.cli"]
SMALL = [*FAST_PRETRAIN, "backend.threads=1", "data.prompts_per_step=4", "rollout.n=4",
         "task.tiny.eval.heldout.limit=8", "task.tiny.eval.heldout.n=4",
         "task.tiny.eval.heldout.k=[1,4]", "trainer.steps=2", "trainer.eval_every=2",
         "trainer.checkpoint_every=1"]


@pytest.mark.slow
def test_a_sweep_logs_progress_summaries_and_what_mlflow_users_expect(tmp_path, cli_env):
    args = [*RLBENCH, "sweep", "seed=0,1", *SMALL, f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    out = subprocess.run(args, env=cli_env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    err = out.stderr
    assert "sweep: 1/2 cells done" in err and "sweep: 2/2 cells done" in err
    assert "sweep finished" in err and "(2 trained, 0 skipped" in err
    assert " eta " in err and "run id:" in err and "checkpoint:" in err
    for bar in ("Loading weights", "Writing model shards", "\r"):
        assert bar not in err
    cells = sorted((tmp_path / "multirun").glob("*-grpo-*"))
    assert len(cells) == 2
    log = (cells[0] / "cli.log").read_text()
    assert "step 2/2" in log and "finished 2 steps" in log  # the run is in its log file
    # only the last checkpoint of a finished run is kept
    assert [p.name for p in (cells[0] / "checkpoints").glob("step_*")] == ["step_0000002"]

    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("rlbench")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 2
    run = runs[0]
    tags, metrics = run.data.tags, run.data.metrics
    assert tags["mlflow.source.name"].startswith("rlbench sweep") and "mlflow.user" in tags
    assert "mlflow.source.git.commit" in tags
    # warm start reported apart: the cell that built the model spent time there, not in wall_s
    assert {"final/wall_s", "final/warm_start_s"} <= set(metrics)
    contexts = {(d.dataset.name, d.tags[0].value) for d in run.inputs.dataset_inputs}
    assert contexts == {("countdown/train", "train"), ("countdown/heldout", "eval")}
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert artifacts == ["samples/eval_step_000000.json", "samples/eval_step_000002.json"]

    again = subprocess.run(args, env=cli_env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0 and "(0 trained, 2 skipped as FINISHED" in again.stderr
    # a skipped cell leaves no directory behind
    assert len(sorted((tmp_path / "multirun").glob("*-grpo-*"))) == 2


def test_the_demo_writes_only_under_its_directory(tmp_path, monkeypatch):
    """Every command of the demo points its output (MLflow store, cells, boards) into the demo
    directory, which .gitignore ignores."""
    from harness.cli import demo

    calls: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(demo, "_run", lambda args, env: calls.append((args, env)))
    demo.run_demo(str(tmp_path / "d"))
    root = str(tmp_path / "d")
    assert all(env["MLFLOW_TRACKING_URI"] == f"sqlite:///{root}/mlruns.db" for _, env in calls)
    sweep = next(args for args, _ in calls if args[0] == "sweep")
    assert f"hydra.sweep.dir={root}/multirun/${{now:%Y%m%d-%H%M%S}}" in sweep
    board = next(args for args, _ in calls if args[0] == "board")
    assert board[board.index("--out") + 1] == f"{root}/leaderboards"
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().split()
    assert f"{demo.DEFAULT_DIR}/" in ignored
