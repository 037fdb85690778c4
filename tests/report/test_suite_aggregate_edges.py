"""The suite score's arithmetic (harness/report/aggregate.py) on numbers worked by hand: the
pooled seed SD and its degrees of freedom, the refusals that name the task, the regression flag,
paired effects in seed order, which algorithms are scored, and the bootstrap's knobs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.report.aggregate import TaskScores, _seed_key, _seeded, aggregate
from harness.report.config import BoardError


def test_the_seed_sd_pools_every_rows_squares_over_their_degrees_of_freedom():
    t = TaskScores("t", "m", 0.5, {"grpo": {"0": 0.1, "1": 0.3},
                                   "x": {"0": 0.5, "1": 0.5, "2": 0.8}, "empty": {}})
    assert t.df == 3
    assert t.sd == pytest.approx(math.sqrt((0.02 + 0.06) / 3))


def test_a_task_without_two_seeds_in_any_row_is_refused_naming_it():
    with pytest.raises(BoardError) as err:
        TaskScores("cd / tiny", "heldout/pass_at_1", 0.2, {"grpo": {"0": 0.3}, "x": {"1": 0.4}})
    assert str(err.value) == (
        "cd / tiny: no row has two seeds, so the task's seed noise (the suite score's unit) "
        "cannot be estimated; run more seeds or leave the task out of the suite")


def test_a_task_without_spread_is_refused_naming_it_and_the_metric():
    with pytest.raises(BoardError) as err:
        TaskScores("cd / tiny", "heldout/pass_at_1", 0.2, {"grpo": {"0": 0.3, "1": 0.3}})
    assert str(err.value) == (
        "cd / tiny: every row gives the same final heldout/pass_at_1 on every seed, so the task's "
        "seed noise (the suite score's unit) is 0; leave the task out of the suite or evaluate "
        "on more problems")


def test_one_row_with_two_seeds_is_enough():
    t = TaskScores("t", "m", 0.2, {"grpo": {"0": 0.1, "1": 0.3}})
    assert t.df == 1 and t.sd == pytest.approx(math.sqrt(0.02))


def test_effects_without_grpo_runs_are_empty():
    t = TaskScores("t", "m", 0.2, {"x": {"0": 0.1, "1": 0.3}})
    assert t.effects("x") == {}


def test_spread_in_one_row_is_enough():
    t = TaskScores("t", "m", 0.2, {"grpo": {"0": 0.3, "1": 0.3}, "x": {"0": 0.1, "1": 0.2}})
    assert t.df == 2 and t.sd == pytest.approx(math.sqrt(0.005 / 2))


def test_regressed_means_every_row_ends_below_the_warm_start():
    finals = {"grpo": {"0": 0.4, "1": 0.6}, "x": {"0": 0.7, "1": 0.8}}
    assert TaskScores("t", "m", 0.9, finals).regressed
    assert not TaskScores("t", "m", 0.75, finals).regressed   # x's mean 0.75 is not below
    assert not TaskScores("t", "m", 0.5, finals).regressed
    assert not TaskScores("t", "m", math.nan, finals).regressed


def test_effects_are_paired_differences_in_sd_units_in_seed_order():
    t = TaskScores("t", "m", 0.0, {"grpo": {"2": 0.2, "10": 0.4, "1": 0.0},
                                   "x": {"10": 0.5, "2": 0.5, "7": 0.9}})
    eff = t.effects("x")
    assert list(eff) == ["2", "10"]
    assert eff["2"] == pytest.approx(0.3 / t.sd) and eff["10"] == pytest.approx(0.1 / t.sd)
    assert t.effects("nobody") == {}
    assert t.effects("grpo") == {"1": 0.0, "2": 0.0, "10": 0.0}


def test_seed_keys_sort_numbers_by_length_then_text():
    assert sorted(["10", "2", "b", "1"], key=_seed_key) == ["1", "2", "b", "10"]


def test_seeded_restores_the_callers_generator_even_on_error():
    np.random.seed(5)
    expected = np.random.rand()
    np.random.seed(5)
    with pytest.raises(RuntimeError), _seeded(1):
        inside = np.random.rand()
        raise RuntimeError
    assert np.random.rand() == expected
    with _seeded(1):
        assert np.random.rand() == inside


def _task(name, offsets, seeds=("0", "1", "2", "3")):
    base = [0.1, 0.3, 0.2, 0.25]
    return TaskScores(name, "m", 0.0, {a: {s: base[i] + off + 0.01 * i * (a != "grpo")
                                           for i, s in enumerate(seeds)}
                                       for a, off in offsets.items()})


def test_aggregate_refuses_tasks_without_grpo_naming_them():
    no_grpo = TaskScores("t9", "m", 0.0, {"x": {"0": 0.1, "1": 0.2}})
    with pytest.raises(BoardError) as err:
        aggregate([_task("t0", {"grpo": 0, "x": 0.1}), no_grpo], reps=20)
    assert str(err.value) == ("the suite score is the paired effect against grpo, and these "
                              "tasks have no grpo runs: t9")


def test_only_algorithms_on_every_task_with_shared_seeds_are_scored():
    tasks = [_task("t0", {"grpo": 0.0, "x": 0.1, "y": 0.2, "z": 0.0, "w": 0.1}),
             _task("t1", {"grpo": 0.0, "x": 0.2, "y": 0.1})]
    agg = aggregate(tasks, reps=20)
    assert agg.algorithms == ["x", "y"]
    assert agg.partial == {"w": ["t0"], "z": ["t0"]}
    assert agg.seeds == {"x": ["0", "1", "2", "3"], "y": ["0", "1", "2", "3"]}
    assert agg.matrices["x"].shape == (4, 2)
    assert agg.matrices["x"][:, 0].tolist() == pytest.approx(
        [tasks[0].effects("x")[s] for s in ["0", "1", "2", "3"]])
    assert agg.tasks is tasks


def test_an_algorithm_without_seeds_shared_with_grpo_is_listed_not_scored():
    t0 = TaskScores("t0", "m", 0.0, {"grpo": {"0": 0.1, "1": 0.2}, "x": {"5": 0.3, "6": 0.4}})
    agg = aggregate([t0], reps=20)
    assert agg.algorithms == [] and agg.partial == {"x": ["t0"]}
    assert agg.iqm == {} and agg.mean == {} and agg.poi == {}
    t1 = TaskScores("t1", "m", 0.0, {"grpo": {"0": 0.1, "1": 0.2, "2": 0.3},
                                     "a": {"5": 0.3, "6": 0.4}, "x": {"0": 0.2, "1": 0.2}})
    agg = aggregate([t1], reps=20)
    assert agg.algorithms == ["x"] and agg.partial == {"a": ["t1"]}


def test_scored_seeds_are_in_seed_order():
    seeds = ("2", "10", "1", "3")
    agg = aggregate([_task("t0", {"grpo": 0.0, "x": 0.1}, seeds)], reps=20)
    assert agg.seeds["x"] == ["1", "2", "3", "10"]


def test_every_task_without_grpo_is_named():
    t = [TaskScores(n, "m", 0.0, {"x": {"0": 0.1, "1": 0.2}}) for n in ("t8", "t9")]
    with pytest.raises(BoardError, match=r"have no grpo runs: t8; t9$"):
        aggregate(t, reps=20)


@pytest.mark.slow
def test_aggregate_intervals_contain_their_point_and_follow_the_knobs():
    tasks = [_task("t0", {"grpo": 0.0, "x": 0.1}), _task("t1", {"grpo": 0.0, "x": 0.05})]
    agg = aggregate(tasks, reps=200)
    for est in (agg.iqm["x"], agg.mean["x"], agg.poi["x"]):
        assert est[1] <= est[0] <= est[2] and est[1] < est[2]
    assert agg.iqm["x"][1] != agg.mean["x"][1] and agg.iqm["x"][2] != agg.mean["x"][2]
    assert agg.mean["x"][0] == pytest.approx(agg.matrices["x"].mean())
    assert agg.poi["x"][0] > 0.5
    same = aggregate(tasks, reps=200)
    assert same.iqm == agg.iqm and same.poi == agg.poi
    narrow = aggregate(tasks, reps=200, confidence=0.5)
    for est in ("iqm", "mean", "poi"):
        n, w = getattr(narrow, est)["x"], getattr(agg, est)["x"]
        assert n[2] - n[1] < w[2] - w[1], est
    assert aggregate(tasks, reps=200, seed=1).mean["x"][1:] != agg.mean["x"][1:]
    assert aggregate(tasks, reps=50).mean["x"][1:] != agg.mean["x"][1:]



def test_aggregate_defaults_to_seed_0_and_95_percent():
    tasks = [_task("t0", {"grpo": 0.0, "x": 0.1}), _task("t1", {"grpo": 0.0, "x": 0.05})]
    default = aggregate(tasks, reps=100)
    explicit = aggregate(tasks, reps=100, seed=0, confidence=0.95)
    assert default.iqm == explicit.iqm and default.mean == explicit.mean
    assert default.poi == explicit.poi
