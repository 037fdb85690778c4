"""Edges of the board's intervals (harness/report/stats.py): what an interval of no value, one
value or equal values says, the confidence bounds, booleans and nested input, and the paired
comparison's seeds and confidence."""

from __future__ import annotations

import math

import pytest

from harness.report import stats


def test_an_interval_of_no_values_has_method_none_and_n_zero():
    iv = stats.t_interval([])
    assert (iv.n, iv.method) == (0, "none")
    assert math.isnan(iv.mean) and math.isnan(iv.low) and math.isnan(iv.p)


def test_an_interval_of_one_value_is_that_value_with_method_none():
    iv = stats.t_interval([0.25])
    assert (iv.mean, iv.n, iv.method) == (0.25, 1, "none")
    assert math.isnan(iv.low) and math.isnan(iv.high)


def test_confidence_must_lie_strictly_between_zero_and_one():
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\)"):
            stats.t_interval([1.0, 2.0], bad)


def test_boolean_values_count_as_zero_and_one():
    assert stats.t_interval([True, True, True]).mean == 1.0
    iv = stats.t_interval([True, False, True, True])
    assert iv.mean == 0.75 and iv.n == 4


def test_nested_values_are_flattened():
    iv = stats.t_interval([[0.5, 0.5], [0.5, 0.5]])
    assert (iv.mean, iv.low, iv.high, iv.n) == (0.5, 0.5, 0.5, 4)
    assert stats.t_interval([[1.0, 2.0], [3.0, 4.0]]).n == 4


def test_paired_comparisons_pair_seeds_of_mixed_types():
    a = {1: 0.5, "b": 0.75, 3: 0.25}
    b = {1: 0.25, "b": 0.25, 3: 0.25, 9: 1.0}
    iv = stats.paired_interval(a, b)
    assert iv.n == 3 and iv.mean == pytest.approx(0.25)
    mean, _, n = stats.paired_diff(a, b)
    assert (mean, n) == (pytest.approx(0.25), 3)


def test_paired_comparisons_use_the_given_confidence():
    a = {0: 0.1, 1: 0.5, 2: 0.4}
    b = {0: 0.0, 1: 0.1, 2: 0.3}
    wide = stats.paired_interval(a, b, 0.99)
    narrow = stats.paired_interval(a, b, 0.5)
    assert narrow.half_width < stats.paired_interval(a, b).half_width < wide.half_width
    assert stats.paired_diff(a, b, 0.5)[1] == pytest.approx(narrow.half_width)
    assert stats.paired_diff(a, b, 0.5)[1] < stats.paired_diff(a, b)[1]
