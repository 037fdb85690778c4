"""Runs that survive being killed, and sweeps that rerun only what did not finish (subprocesses,
as a user or a cluster runs them)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.cell_plan import config_hash, plan_cell, resume_mode
from harness.tracking import open_client
from tests.helpers import QUIET_RUN, RLBENCH, cli_environment, make_config, rlbench

RUN = [*QUIET_RUN, "trainer.steps=24", "trainer.eval_every=8", "trainer.checkpoint_every=8",
       "trainer.status_every=0"]
# Metrics that measure the machine rather than the computation.
MACHINE = ("time/", "final/wall_s", "final/warm_start_s", "final/time_", "final/peak_mem_mb")


def _env(base: dict[str, str], tmp: Path, name: str) -> dict[str, str]:
    env = dict(base)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / f'{name}.db'}"
    return env


def _only_run(uri: str):
    client = open_client(uri)
    runs = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert len(runs) == 1, [r.info.status for r in runs]
    return client, runs[0]


def _series(client: MlflowClient, run) -> dict[tuple[str, int], set[float]]:
    out: dict[tuple[str, int], set[float]] = {}
    for key in run.data.metrics:
        if key.startswith(MACHINE):
            continue
        for m in client.get_metric_history(run.info.run_id, key):
            out.setdefault((key, m.step), set()).add(m.value)
    return out


@pytest.mark.slow
def test_sigkilled_run_resumes_to_the_same_metrics_as_an_uninterrupted_run(tmp_path, cli_env):
    (tmp_path / "whole").mkdir()
    (tmp_path / "killed").mkdir()
    whole_env = _env(cli_env, tmp_path, "whole")
    out = rlbench("train", *RUN, env=whole_env, cwd=tmp_path / "whole")
    assert out.returncode == 0, out.stderr[-2000:]

    killed_env = _env(cli_env, tmp_path, "killed")
    proc = subprocess.Popen([*RLBENCH, "train", *RUN], env=killed_env, cwd=tmp_path / "killed",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    checkpoints = None
    while time.time() < deadline and proc.poll() is None:
        found = list((tmp_path / "killed").glob("outputs/*/checkpoints/step_0000008"))
        if found:
            checkpoints = found[0].parent
            break
        time.sleep(0.05)
    assert checkpoints is not None and proc.poll() is None, "no checkpoint before the run ended"
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: the MLflow run is left RUNNING
    proc.wait(timeout=60)
    client, run = _only_run(killed_env["MLFLOW_TRACKING_URI"])
    assert run.info.status == "RUNNING"
    last_before = max(m.step for m in client.get_metric_history(run.info.run_id,
                                                                 "rollout/reward_mean"))
    assert last_before < 24
    # the resume point: the newest checkpoint at the kill (a finished run keeps only its last)
    resumed_from = int(sorted(checkpoints.glob("step_*"))[-1].name.split("_")[1])

    again = rlbench("train", *RUN, env=killed_env, cwd=tmp_path / "killed")  # the same cell
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming run" in again.stderr
    client, resumed = _only_run(killed_env["MLFLOW_TRACKING_URI"])
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    wclient, whole = _only_run(whole_env["MLFLOW_TRACKING_URI"])

    ours, theirs = _series(client, resumed), _series(wclient, whole)
    after = {k: v for k, v in theirs.items() if k[1] > resumed_from}
    assert any(key == "eval/heldout/pass_at_1" for key, _ in after)
    assert any(key == "rollout/reward_mean" for key, _ in after)
    for key, values in after.items():
        assert ours.get(key) == values, (key, ours.get(key), values)
    # the steps logged twice (before the kill and again after resuming) agree with themselves
    assert all(len(v) == 1 for v in ours.values())
    assert set(ours) == set(theirs)


# one step, no evaluation: what is skipped is decided by the cell's config and its run's status,
# not by what the run did
LAUNCHED = ["sweep", "algorithm=grpo", *QUIET_RUN, "trainer.steps=1", "trainer.eval_every=0",
            "trainer.status_every=0", "tracking.experiment=launchers"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory, model_cache: Path,
             mlflow_schema: Path) -> dict:
    """Seeds 0 and 1 swept on the joblib launcher (two jobs), seed 2 on submitit's local one,
    into one store; the runs as they were then (the rerun test adds one). Shared by the two
    tests below, so the rerun test skips cells a sweep of its own would have had to train."""
    tmp = tmp_path_factory.mktemp("launchers")
    env = cli_environment(tmp, model_cache, mlflow_schema)  # cli_env, once for the module
    joblib = rlbench(*LAUNCHED, "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                     "backend.threads=0", env=env, cwd=tmp)
    assert joblib.returncode == 0, joblib.stderr[-2000:]
    submitit = rlbench(*LAUNCHED, "seed=2", "hydra/launcher=submitit_local", env=env, cwd=tmp)
    assert submitit.returncode == 0, submitit.stderr[-2000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("launchers").experiment_id])
    return {"env": env, "cwd": tmp, "runs": runs}


@pytest.mark.slow
def test_joblib_and_submitit_local_sweeps_land_in_one_experiment(launched):
    runs = launched["runs"]
    assert sorted(r.data.tags["rlbench.seed"] for r in runs) == ["0", "1", "2"]
    assert all(r.info.status == "FINISHED" for r in runs)
    joblib_threads = {r.data.params["backend.threads"] for r in runs
                      if r.data.tags["rlbench.seed"] != "2"}
    cores = os.cpu_count() or 1
    assert joblib_threads == {str(max(1, cores // min(2, cores)))}  # capped per job


@pytest.mark.slow
def test_rerunning_a_sweep_skips_the_finished_cells(launched):
    env, cwd = launched["env"], launched["cwd"]
    # the joblib sweep's two cells again, on the basic launcher: the launcher and the thread
    # count are not part of a cell, so both are found FINISHED and skipped
    again = rlbench(*LAUNCHED, "seed=0,1", env=env, cwd=cwd)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("skipped: run") == 2
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("launchers").experiment_id
    assert len(client.search_runs([experiment])) == 3
    # a changed knob is another cell (one of the cells is enough to show it)
    third = rlbench(*LAUNCHED, "seed=0", "algorithm.loss.clip_high=0.28", env=env, cwd=cwd)
    assert third.returncode == 0 and "skipped: run" not in third.stderr, third.stderr[-2000:]
    runs = client.search_runs([experiment])
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)


def test_config_hash_ignores_where_and_how_verbosely_a_run_logs(tmp_path, model_cache):
    base = make_config(tmp_path, model_cache)
    same = make_config(tmp_path / "elsewhere", model_cache, "trainer.status_every=5",
                       "tracking.experiment=other", "backend.threads=2",
                       "trainer.resume=false")
    assert config_hash(base) == config_hash(same)
    for knob in ("seed=1", "algorithm=rloo", "trainer.steps=7", "rollout.temperature=0.7"):
        assert config_hash(make_config(tmp_path, model_cache, knob)) != config_hash(base), knob


@pytest.mark.parametrize(("value", "mode"), [
    (None, "false"), ("auto", "auto"), (True, "true"), ("True", "true"), (False, "false"),
    ("/some/dir", "/some/dir"),
])
def test_resume_values_normalise(value, mode):
    assert resume_mode(value) == mode


def test_resume_true_without_a_resumable_run_names_the_problem(tmp_path, model_cache):
    cfg = make_config(tmp_path, model_cache, "trainer.resume=true")
    with pytest.raises(FileNotFoundError, match=r"trainer\.resume=true"):
        plan_cell(cfg, None, None)
