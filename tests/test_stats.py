"""Student-t intervals and paired differences against hand-computed values."""

import math

import pytest

from harness.stats import mean_ci, paired_diff


def test_mean_ci_matches_hand_computed_t_interval():
    # x = 1, 2, 3, 4: mean 2.5, s = sqrt(5/3) = 1.290994, se = s/2 = 0.645497,
    # t(0.975, df=3) = 3.182446 -> half-width 2.054260; t(0.95, df=3) = 2.353363 -> 1.519090.
    mean, half = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == pytest.approx(2.5)
    assert half == pytest.approx(2.054260, abs=1e-6)
    assert mean_ci([1.0, 2.0, 3.0, 4.0], confidence=0.90)[1] == pytest.approx(1.519090, abs=1e-6)


def test_mean_ci_identical_values_have_zero_width():
    assert mean_ci([0.25, 0.25, 0.25]) == (pytest.approx(0.25), pytest.approx(0.0))


def test_mean_ci_degenerate_sizes():
    mean, half = mean_ci([0.7])
    assert mean == pytest.approx(0.7) and math.isnan(half)
    mean, half = mean_ci([])
    assert math.isnan(mean) and math.isnan(half)


def test_mean_ci_rejects_bad_confidence():
    with pytest.raises(ValueError, match="confidence"):
        mean_ci([1.0, 2.0], confidence=95)


def test_paired_diff_uses_only_shared_seeds():
    a = {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.9}
    b = {1: 0.4, 2: 0.5, 3: 0.6, 4: 0.1}
    # shared seeds 1, 2, 3: diffs 0.2, 0.2, 0.3 -> mean 0.233333, s = 0.057735,
    # se = 0.033333, t(0.975, df=2) = 4.302653 -> half-width 0.143422.
    mean, half, n = paired_diff(a, b)
    assert n == 3
    assert mean == pytest.approx(0.233333, abs=1e-6)
    assert half == pytest.approx(0.143422, abs=1e-6)


def test_paired_diff_without_shared_seeds():
    mean, half, n = paired_diff({"0": 1.0}, {"1": 0.0})
    assert n == 0 and math.isnan(mean) and math.isnan(half)
