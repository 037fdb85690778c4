"""The math grader's bookkeeping (harness/mathgrade/grading.py), with the worker processes
replaced by a scripted ``_run``: which items are graded, cached or refused as too long, the
cache's size limit, the per-status counts, the worker count and time limits, and the reward and
statistics a verdict becomes."""

from __future__ import annotations

import pytest

from harness.mathgrade.grading import (
    STATUSES,
    GraderConfig,
    GradeResult,
    MathGrader,
    _Proc,
    answer_reward,
    grading_stats,
)


class Scripted(MathGrader):
    """A grader whose workers answer ``correct`` when gold == answer, and record what they got."""

    def __init__(self, config=None):
        super().__init__(config or GraderConfig(workers=1))
        self.batches: list[list[tuple[str, str]]] = []

    def _run(self, pairs):
        self.batches.append(list(pairs))
        return [GradeResult(g == a, "timeout" if a == "slow" else "ok", a) for g, a in pairs]


def test_each_distinct_pair_is_graded_once_and_shared_by_its_duplicates():
    g = Scripted()
    out = g.grade([("1", "1"), ("1", "2"), ("1", "1")])
    assert g.batches == [[("1", "1"), ("1", "2")]]
    assert [r.correct for r in out] == [True, False, True]
    assert out[0] is out[2]


def test_a_graded_pair_is_answered_from_the_cache_next_time():
    g = Scripted()
    first = g.grade([("1", "1")])[0]
    again = g.grade([("1", "1"), ("2", "3")])
    assert g.batches == [[("1", "1")], [("2", "3")]]
    assert again[0] is first
    assert g.counts["cached"] == 1
    g.grade([("1", "1"), ("2", "3")])
    assert g.counts["cached"] == 3
    assert [b for b in g.batches if b] == [[("1", "1")], [("2", "3")]]


def test_answers_longer_than_the_limit_are_not_graded():
    g = Scripted(GraderConfig(workers=1, max_answer_chars=3))
    out = g.grade([("1", "1234"), ("1", "123")])
    assert (out[0].correct, out[0].status) == (False, "too_long")
    assert g.batches == [[("1", "123")]]
    assert g.counts["too_long"] == 1


def test_the_cache_forgets_the_least_recently_used_pair_beyond_its_size():
    g = Scripted(GraderConfig(workers=1, cache_size=2))
    g.grade([("a", "1")])
    g.grade([("b", "2")])
    g.grade([("a", "1")])        # a is now the most recently used
    g.grade([("c", "3")])        # evicts b
    g.batches.clear()
    g.grade([("a", "1"), ("b", "2"), ("c", "3")])
    assert g.batches == [[("b", "2")]]


def test_counts_add_up_every_status_over_the_graders_life():
    g = Scripted()
    g.grade([("1", "1"), ("1", "slow"), ("1", "1")])
    assert g.counts["ok"] == 2 and g.counts["timeout"] == 1
    assert set(g.counts) == {*STATUSES, "killed", "cached"}
    assert g.counts["killed"] == 0 and g.counts["cached"] == 0


def test_nothing_to_grade_starts_no_worker():
    g = MathGrader(GraderConfig(workers=1))
    assert g.grade([]) == []
    assert g._procs == []


def test_workers_default_to_the_cpu_count_at_most_eight(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert MathGrader().n_workers == 8
    monkeypatch.setattr("os.cpu_count", lambda: 3)
    assert MathGrader().n_workers == 3
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert MathGrader().n_workers == 1
    assert MathGrader(GraderConfig(workers=5)).n_workers == 5


def test_a_negative_worker_count_is_refused():
    with pytest.raises(ValueError, match=r"^grader\.workers must be >= 1, got -2$"):
        MathGrader(GraderConfig(workers=-2))


def test_a_started_worker_gets_the_item_timeout_plus_grace_else_the_startup_timeout():
    g = MathGrader(GraderConfig(workers=1, timeout_s=3.0, kill_grace_s=0.5,
                                startup_timeout_s=60.0))
    proc = _Proc.__new__(_Proc)  # no process: _limit reads only ``ready``
    proc.ready = True
    assert g._limit(proc) == 3.5
    proc.ready = False
    assert g._limit(proc) == 60.0


@pytest.mark.parametrize("correct,extracted,reward", [
    (True, True, 2.0), (False, True, 0.25), (False, False, 0.0), (True, False, 2.0)])
def test_answer_reward(correct, extracted, reward):
    got = answer_reward(correct, extracted, 2, 0.25)
    assert got == reward and isinstance(got, float)


@pytest.mark.parametrize("status,timeout,error", [
    ("ok", 0.0, 0.0), ("timeout", 1.0, 0.0), ("error", 0.0, 1.0), ("gold_error", 0.0, 1.0),
    ("too_long", 0.0, 1.0), ("none", 0.0, 0.0)])
def test_grading_stats_flag_timeouts_and_errors(status, timeout, error):
    stats = grading_stats("boxed", status)
    assert (stats["grade_timeout"], stats["grade_error"]) == (timeout, error)


def test_grading_stats_name_exactly_one_extraction_method():
    stats = grading_stats("answer_line", "ok")
    assert {k: v for k, v in stats.items() if k.startswith("extract_")} == {
        "extract_boxed": 0.0, "extract_answer_line": 1.0, "extract_last_number": 0.0,
        "extract_none": 0.0}
    assert grading_stats("none", "ok")["extract_none"] == 1.0
