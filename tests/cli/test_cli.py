"""The `rlbench` command line, run as a user runs it: a run and its signals in subprocesses; the
listings and the refusals, which end before any run, in this process (``rlbench_in_process``,
tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import QUIET_RUN, RLBENCH, rlbench


def test_list_names_the_baselines_and_countdown(tmp_path, cli_env, rlbench_in_process):
    out = rlbench_in_process("list", "algorithms", env=cli_env, cwd=tmp_path)
    assert out.returncode == 0
    names = {line.split()[0] for line in out.stdout.splitlines()[1:] if line.strip()}
    assert {"grpo", "dr_grpo", "rloo", "maxrl", "dapo", "reinforce_pp"} <= names
    out = rlbench_in_process("list", "tasks", env=cli_env, cwd=tmp_path)
    assert "countdown" in out.stdout


def test_unknown_algorithm_exits_nonzero_listing_valid_names(tmp_path, cli_env, rlbench_in_process):
    out = rlbench_in_process("train", "algorithm=nonexistent", env=cli_env, cwd=tmp_path)
    assert out.returncode == 2
    for name in ("grpo", "dr_grpo", "rloo", "maxrl", "dapo", "reinforce_pp"):
        assert name in out.stderr
    out = rlbench_in_process("train", "algorithm=grpoo", env=cli_env, cwd=tmp_path)
    assert out.returncode == 2 and "Did you mean 'grpo'?" in out.stderr


def test_unknown_config_key_exits_nonzero_naming_it(tmp_path, cli_env, rlbench_in_process):
    out = rlbench_in_process("train", "trainer.stepz=3", env=cli_env, cwd=tmp_path)
    assert out.returncode == 2 and "stepz" in out.stderr
    out = rlbench_in_process("train", "algorithm.loss.clip_hihg=0.3", env=cli_env, cwd=tmp_path)
    assert out.returncode == 2 and "clip_hihg" in out.stderr


def test_wrong_type_exits_nonzero_naming_the_key(tmp_path, cli_env, rlbench_in_process):
    out = rlbench_in_process("train", "trainer.steps=many", env=cli_env, cwd=tmp_path)
    assert out.returncode == 2 and "trainer.steps" in out.stderr


@pytest.mark.slow
def test_missing_data_path_names_the_path(tmp_path, cli_env):
    # refused inside the Hydra app: a subprocess
    missing = tmp_path / "no_such_dir"
    out = rlbench("train", "task.variant=full", f"task.full.data_dir={missing}",
                  *QUIET_RUN[:5], env=cli_env, cwd=tmp_path)
    assert out.returncode == 2
    assert str(missing) in out.stderr and "task.full.data_dir" in out.stderr


@pytest.mark.slow
def test_sigterm_marks_the_run_killed_and_leaves_a_checkpoint(tmp_path, cli_env):
    proc = subprocess.Popen(
        [*RLBENCH, "train", *QUIET_RUN, "trainer.steps=100000", "trainer.eval_every=0",
         "trainer.checkpoint_every=0", f"trainer.output_dir={tmp_path / 'out'}"],
        env=cli_env, cwd=tmp_path, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.time() + 240
    for line in proc.stderr:  # wait until training is under way
        if " step 2/" in line or time.time() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    proc.stderr.read()
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert run.info.status == "KILLED"
    latest = tmp_path / "out" / "checkpoints" / "latest"
    ckpt = latest.parent / latest.read_text().strip()
    assert (ckpt / "trainer_state.json").exists() and (ckpt / "model.safetensors").exists()


@pytest.mark.slow
def test_sigterm_to_a_joblib_sweep_stops_its_cells_and_marks_them_killed(tmp_path, cli_env):
    """`kill <pid>` of a sweep reaches its process alone; the cells train in joblib's worker
    processes, which before the fix trained on as orphans. Both cells must stop at a step
    boundary, their runs KILLED with a checkpoint, and no worker may outlive the sweep."""
    from harness.cli.hydra_app import _children

    proc = subprocess.Popen(
        [*RLBENCH, "sweep", *QUIET_RUN, "seed=0,1", "trainer.steps=100000",
         "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.status_every=1",
         "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
         f"hydra.sweep.dir={tmp_path / 'multirun'}"],
        env=cli_env, cwd=tmp_path, stderr=subprocess.PIPE, text=True,
    )
    deadline, training = time.time() + 240, set()
    for line in proc.stderr:  # wait until both cells are under way
        if " step 2/" in line:
            training.add(line.split("]")[1])
        if len(training) == 2 or time.time() > deadline:
            break
    assert len(training) == 2, "both cells should be training"
    workers = _children(proc.pid)
    assert workers
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=120)  # EOF once every writer of the pipe (the workers) is gone
    finally:
        for pid in [*workers, proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGTERM  # ended by the signal, as before the fix
    deadline = time.time() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"]
    for run in runs:
        latest = Path(run.data.tags["rlbench.output_dir"]) / "checkpoints" / "latest"
        assert (latest.parent / latest.read_text().strip() / "trainer_state.json").exists()
