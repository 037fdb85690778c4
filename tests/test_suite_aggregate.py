"""The suite's aggregate board (issue 21 item 3) on synthetic MLflow runs: the normalisation, IQM
against scipy's trimmed mean, rliable's intervals and probability of improvement, the board files,
and the refusal of duplicated cells (issue 20: never "latest run wins")."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from harness.cli.main import main
from harness.report.aggregate import aggregate, normalise
from harness.report.board import build_leaderboards
from harness.report.config import BoardError

TASKS = {"countdown": 0.2, "math": 0.5, "agentic_qa": 0.8}  # task -> warm start W
SEEDS = range(5)
GAIN = {"grpo": 0.3, "maxrl": 0.5, "dapo": 0.1}  # share of the headroom gained


def _run(client, exp, *, alg, task, seed, final, start, t=0):
    rid = client.create_run(exp, start_time=1000 + t, tags={
        "rlbench.algorithm": alg, "rlbench.task": task, "rlbench.task_variant": "tiny",
        "rlbench.model": "tiny", "rlbench.seed": str(seed), "rlbench.temperature": "1.0",
        "rlbench.sweep": "suite"}).info.run_id
    client.log_batch(rid, metrics=[Metric("final/heldout/pass_at_1", final, 0, 8),
                                   Metric("start/heldout/pass_at_1", start, 0, 0),
                                   Metric("eval/heldout/pass_at_1", start, 0, 0),
                                   Metric("eval/heldout/pass_at_1", final, 0, 8)],
                     params=[Param(k, str(v)) for k, v in {
                         "seed": seed, "algorithm.name": alg, "task.name": task}.items()])
    client.set_terminated(rid, "FINISHED")
    return rid


def _suite_store(root, *, arpo=True, duplicate=False):
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("suite", artifact_location=(root / "a").as_uri())
    t = 0
    for task, W in TASKS.items():
        for alg, g in GAIN.items():
            for seed in SEEDS:
                t += 1
                x = W + (g + 0.02 * seed) * (1 - W)
                _run(client, exp, alg=alg, task=task, seed=seed, final=x,
                     start=W + 0.01 * (seed - 2), t=t)
        if arpo and task == "agentic_qa":
            for seed in SEEDS:
                t += 1
                _run(client, exp, alg="arpo", task=task, seed=seed, final=0.9, start=W, t=t)
    if duplicate:  # a second FINISHED run of grpo x math seed 3
        _run(client, exp, alg="grpo", task="math", seed=3, final=0.99, start=0.5, t=t + 1)
    return uri


def test_normalisation_is_gain_over_the_warm_start_relative_to_headroom():
    assert normalise(0.8, 0.6) == pytest.approx(0.5)
    assert normalise(0.6, 0.6) == 0.0
    assert normalise(0.3, 0.6) == pytest.approx(-0.75)
    with pytest.raises(BoardError, match="headroom"):
        normalise(1.0, 1.0)


def test_iqm_is_scipys_trimmed_mean_and_the_interval_contains_it():
    from harness.report.aggregate import TaskScores

    rng = np.random.default_rng(0)
    x = rng.normal(0.4, 0.2, size=(10, 3))  # 10 runs x 3 tasks
    tasks = [TaskScores(f"t{j}", "heldout/pass_at_1", 0.0,
                        {"grpo": {str(i): x[i, j] for i in range(10)}}) for j in range(3)]
    agg = aggregate(tasks, reps=300)
    point, low, high = agg.iqm["grpo"]
    assert point == pytest.approx(scipy.stats.trim_mean(x.ravel(), 0.25))
    assert agg.mean["grpo"][0] == pytest.approx(x.mean())
    assert low < point < high
    assert agg.poi == {}  # no algorithm beside grpo


def test_suite_board_writes_the_aggregate_beside_per_task_boards(tmp_path):
    uri = _suite_store(tmp_path)
    out = tmp_path / "boards"
    written = build_leaderboards(uri, "suite", out, log_to_mlflow=False, allow_dirty=True,
                                 export=False, suite=True, suite_reps=50)
    names = {p.relative_to(out).as_posix() for p in written}
    assert {"aggregate/aggregate.md", "aggregate/aggregate.csv",
            "aggregate/performance_profile.png"} <= names
    assert "countdown-tiny/tiny/leaderboard.md" in names
    md = (out / "aggregate" / "aggregate.md").read_text()
    assert "arpo (agentic_qa-tiny / tiny)" in md  # one task only: listed, not aggregated
    rows = {line.split(",")[0]: line.split(",") for line in
            (out / "aggregate" / "aggregate.csv").read_text().splitlines()[1:]}
    assert set(rows) == {"grpo", "maxrl", "dapo"}
    # gold: every task's normalised scores are gain + 0.02 seed (W is the mean start, exact)
    gold = {a: np.array([[g + 0.02 * s for _ in TASKS] for s in SEEDS]) for a, g in GAIN.items()}
    for alg, m in gold.items():
        assert float(rows[alg][2]) == pytest.approx(scipy.stats.trim_mean(m.ravel(), 0.25),
                                                    abs=1e-5)
        assert float(rows[alg][5]) == pytest.approx(m.mean(), abs=1e-5)
    # maxrl beats grpo on every run pairing but seed overlaps: P(maxrl > grpo) = 1
    assert float(rows["maxrl"][8]) == pytest.approx(1.0)
    assert float(rows["dapo"][8]) == pytest.approx(0.0)
    assert "Suite aggregate" in (out / "README.md").read_text()


def test_duplicated_cell_is_refused_naming_the_runs(tmp_path, capsys):
    uri = _suite_store(tmp_path, duplicate=True)
    with pytest.raises(BoardError, match=r"math-tiny / tiny.*grpo seed 3: runs"):
        build_leaderboards(uri, "suite", tmp_path / "b", log_to_mlflow=False, allow_dirty=True,
                           export=False, suite=True, suite_reps=50)
    assert not (tmp_path / "b" / "aggregate").exists()  # refused before writing anything
    with pytest.raises(SystemExit) as exc:
        main(["board", "--suite", "--experiment", "suite", "--tracking-uri", uri, "--out",
              str(tmp_path / "c"), "--no-mlflow", "--allow-dirty", "--no-export",
              "--suite-reps", "50"])
    assert exc.value.code == 2
    assert "does not choose between them" in capsys.readouterr().err
