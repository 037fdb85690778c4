"""The suite's aggregate board (issue 21 item 3, issue 31 item 6) on synthetic runs: the score
(per-seed paired effect against GRPO in units of the task's pooled seed SD) and its failure modes,
IQM against scipy's trimmed mean, rliable's intervals and probability of improvement, their
reproducibility (issue 31: rliable ignores its random_state), the board files, and the refusal of
duplicated cells (issue 20: never "latest run wins")."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import scipy.stats
from mlflow.entities import Metric, Param

from harness.cli.main import main
from harness.report.aggregate import TaskScores, aggregate, performance_profile, render
from harness.report.board import build_leaderboards
from harness.report.config import BoardError
from harness.tracking import open_client

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
    client = open_client(uri)
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


def _tasks(offsets: dict[str, float], warm: tuple[float, ...] = (0.2, 0.5, 0.8),
           seeds: int = 5, noise: float = 0.02, seed: int = 0) -> list[TaskScores]:
    """Tasks whose rows are level + the algorithm's offset + per-run normal noise."""
    rng = np.random.default_rng(seed)
    return [TaskScores(f"t{j}", "heldout/pass_at_1", W, {
        a: {str(s): 0.5 + off + rng.normal(0.0, noise) for s in range(seeds)}
        for a, off in offsets.items()}) for j, W in enumerate(warm)]


def test_score_is_the_paired_effect_in_units_of_the_pooled_seed_sd():
    # grpo 0.5, 0.6, 0.7: mean 0.6, SS 0.02 (2 df); maxrl 0.6, 0.6, 0.9, 0.1: mean 0.55,
    # SS 0.0025 + 0.0025 + 0.1225 + 0.2025 = 0.33 (3 df) -> sigma = sqrt(0.35 / 5) = 0.264575.
    # Seed 3 has no grpo run: no pair.
    t = TaskScores("t", "heldout/pass_at_1", 0.4, {
        "grpo": {"0": 0.5, "1": 0.6, "2": 0.7}, "maxrl": {"0": 0.6, "1": 0.6, "2": 0.9,
                                                          "3": 0.1}})
    assert (t.sd, t.df) == (pytest.approx(0.264575, abs=1e-6), 5)
    assert t.effects("maxrl") == pytest.approx({"0": 0.1 / 0.264575, "1": 0.0,
                                                "2": 0.2 / 0.264575}, abs=1e-5)
    assert t.effects("grpo") == {"0": 0.0, "1": 0.0, "2": 0.0}


def test_warm_start_near_one_does_not_change_the_score():
    """(x - W) / (1 - W) multiplied noise by 50 at W = 0.98; the score does not use W."""
    near_one = _tasks({"grpo": 0.0, "maxrl": 0.01}, warm=(0.98, 0.5, 0.2))
    far = _tasks({"grpo": 0.0, "maxrl": 0.01}, warm=(0.2, 0.5, 0.2))
    assert near_one[0].effects("maxrl") == far[0].effects("maxrl")
    a, b = aggregate(near_one, reps=200), aggregate(far, reps=200)
    assert (a.iqm, a.mean, a.poi) == (b.iqm, b.mean, b.poi)
    assert np.abs(a.matrices["maxrl"]).max() < 5  # a few seed-SDs, not 50x the noise


def test_an_algorithm_worse_than_grpo_keeps_its_negative_score():
    agg = aggregate(_tasks({"grpo": 0.0, "dapo": -0.05}), reps=300)
    assert agg.algorithms == ["dapo"]
    assert agg.iqm["dapo"][2] < 0 and agg.mean["dapo"][2] < 0  # whole interval below 0
    assert (agg.matrices["dapo"] < 0).all()
    assert agg.poi["dapo"][0] < 0.1 and agg.poi["dapo"][2] < 0.5


def test_a_task_where_every_row_ends_below_its_warm_start_is_flagged():
    tasks = _tasks({"grpo": 0.0, "maxrl": 0.05}, warm=(0.9, 0.54, 0.2))
    # levels 0.5 (grpo) and 0.55 (maxrl): both below 0.9; maxrl above 0.54; both above 0.2
    assert [t.regressed for t in tasks] == [True, False, False]
    assert not TaskScores("t", "m", math.nan, tasks[0].finals).regressed  # W unknown
    md, _ = render(aggregate(tasks, reps=50), [], 0.95, 50)
    assert "| t0 | heldout/pass_at_1 |" in md and md.count("| ⚠ yes |") == 1
    assert "⚠ On t0 every algorithm ends below the warm start" in md


@pytest.mark.parametrize("finals", [
    {"grpo": {"0": 0.3, "1": 0.3, "2": 0.3}, "maxrl": {"0": 0.4, "1": 0.4}},  # no spread
    {"grpo": {"0": 0.3}, "maxrl": {"1": 0.4}},  # no row with two seeds
])
def test_a_task_without_seed_noise_is_refused_naming_it(finals):
    finals = copy.deepcopy(finals)  # the parameter is shared by reruns in one process
    with pytest.raises(BoardError, match=r"^countdown-tiny / tiny: .*seed noise"):
        TaskScores("countdown-tiny / tiny", "heldout/pass_at_1", 0.2, finals)
    finals["grpo"]["9"] = 0.31  # one row with spread is enough
    assert TaskScores("countdown-tiny / tiny", "heldout/pass_at_1", 0.2, finals).sd > 0


def test_grpo_is_the_reference_not_a_row():
    agg = aggregate(_tasks({"grpo": 0.0, "maxrl": 0.03}), reps=50)
    assert agg.algorithms == ["maxrl"] and "grpo" not in agg.iqm and "grpo" not in agg.matrices
    md, table = render(agg, [], 0.95, 50)
    assert "grpo is the reference: its score is 0 by construction" in md
    assert [line.split(",")[0] for line in table.splitlines()[1:]] == ["maxrl"]
    assert "| grpo |" not in md.split("## Per task: mean final")[0]


def test_a_task_without_grpo_is_refused_naming_it():
    tasks = _tasks({"grpo": 0.0, "maxrl": 0.03})
    del tasks[1].finals["grpo"]
    with pytest.raises(BoardError, match="no grpo runs: t1"):
        aggregate(tasks, reps=50)


@pytest.mark.slow
def test_aggregate_is_reproducible_and_leaves_the_global_generator_alone():
    tasks = _tasks({"grpo": 0.0, "maxrl": 0.02, "dapo": -0.01})
    np.random.seed(12345)
    before = np.random.get_state()
    first = aggregate(tasks, reps=200, seed=3)
    after = np.random.get_state()
    assert before[0] == after[0] and (before[1] == after[1]).all() and before[2:] == after[2:]
    np.random.seed(54321)  # whatever the caller's generator holds
    again = aggregate(tasks, reps=200, seed=3)
    assert (first.iqm, first.mean, first.poi) == (again.iqm, again.mean, again.poi)  # exact
    other = aggregate(tasks, reps=200, seed=4)
    assert other.iqm != first.iqm and other.poi != first.poi


def test_performance_profile_is_seeded_and_leaves_the_global_generator_alone(tmp_path,
                                                                            monkeypatch):
    from rliable import library as rly

    bands = []
    real = rly.create_performance_profile

    def record(*args, **kwargs):
        out = real(*args, **kwargs)
        bands.append(out[1])
        return out

    monkeypatch.setattr(rly, "create_performance_profile", record)
    agg = aggregate(_tasks({"grpo": 0.0, "maxrl": 0.02}), reps=50)
    for caller in (99, 100):  # whatever the caller's generator holds
        np.random.seed(caller)
        before = np.random.get_state()[1].copy()
        performance_profile(agg, tmp_path / f"{caller}.png", reps=50, seed=1)
        assert (np.random.get_state()[1] == before).all()
    assert (bands[0]["maxrl"] == bands[1]["maxrl"]).all()


def test_each_performance_profile_legend_entry_is_its_own_algorithms_line(tmp_path,
                                                                         monkeypatch):
    # with bands drawn, a legend given a list of names paired them with lines and bands in
    # drawing order: the best algorithm's line was labelled with another's name
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from harness.report.plots import style

    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    agg = aggregate(_tasks({"grpo": 0.0, "maxrl": 0.02, "rloo": -0.01, "dapo": 0.05}), reps=50)
    performance_profile(agg, tmp_path / "p.png", reps=50)
    (ax,) = saved[0].axes
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert sorted(labels) == ["dapo", "maxrl", "rloo"]
    lines = {line.get_label(): line for line in ax.get_lines()}
    for label, handle in zip(labels, legend.legend_handles):
        assert isinstance(handle, Line2D), (label, handle)  # not an interval band
        assert handle.get_color() == lines[label].get_color(), label
        assert matplotlib.colors.same_color(handle.get_color(), style(label).color), label


def test_iqm_is_scipys_trimmed_mean_and_the_interval_contains_it():
    tasks = _tasks({"grpo": 0.0, "maxrl": 0.02}, seeds=10, noise=0.05)
    x = np.array([[t.effects("maxrl")[str(s)] for t in tasks] for s in range(10)])
    agg = aggregate(tasks, reps=300)
    point, low, high = agg.iqm["maxrl"]
    assert point == pytest.approx(scipy.stats.trim_mean(x.ravel(), 0.25))
    assert agg.mean["maxrl"][0] == pytest.approx(x.mean())
    assert low < point < high


@pytest.mark.slow
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
    assert set(rows) == {"maxrl", "dapo"}  # grpo is the reference, score 0
    # gold: on each task the rows are W + (gain + 0.02 seed)(1 - W) (arpo on agentic_qa: 0.9 on
    # every seed, 4 df of zero spread); sigma pools the rows' sums of squares over their df
    sigma = {}
    for task, W in TASKS.items():
        rows_x = [np.array([W + (g + 0.02 * s) * (1 - W) for s in SEEDS]) for g in GAIN.values()]
        rows_x += [np.full(len(SEEDS), 0.9)] if task == "agentic_qa" else []
        ss = sum(((x - x.mean()) ** 2).sum() for x in rows_x)
        sigma[task] = np.sqrt(ss / sum(len(x) - 1 for x in rows_x))
    gold = {a: np.array([[(g - GAIN["grpo"]) * (1 - W) / sigma[task]
                          for task, W in TASKS.items()] for _ in SEEDS])
            for a, g in GAIN.items() if a != "grpo"}
    for alg, m in gold.items():
        assert float(rows[alg][2]) == pytest.approx(scipy.stats.trim_mean(m.ravel(), 0.25),
                                                    rel=1e-5)
        assert float(rows[alg][5]) == pytest.approx(m.mean(), rel=1e-5)
    # maxrl beats grpo on every run pairing but seed overlaps: P(maxrl > grpo) = 1
    assert float(rows["maxrl"][8]) == pytest.approx(1.0)
    assert float(rows["dapo"][8]) == pytest.approx(0.0)
    assert "Suite aggregate" in (out / "README.md").read_text()


@pytest.mark.slow
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
