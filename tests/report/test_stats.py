"""Student-t intervals, their p-values and paired differences against
hand-computed values; values without spread (issue 31: p undefined, never 0). Coverage is
simulated in test_stats_coverage.py."""

import math

import numpy as np
import pytest

from harness.report.stats import (
    Interval,
    interval,
    mean_ci,
    paired_diff,
    paired_interval,
    t_interval,
)


def test_mean_ci_matches_hand_computed_t_interval():
    # x = 1, 2, 3, 4: mean 2.5, s = sqrt(5/3) = 1.290994, se = s/2 = 0.645497,
    # t(0.975, df=3) = 3.182446 -> half-width 2.054260; t(0.95, df=3) = 2.353363 -> 1.519090.
    mean, half = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == pytest.approx(2.5)
    assert half == pytest.approx(2.054260, abs=1e-6)
    assert mean_ci([1.0, 2.0, 3.0, 4.0], confidence=0.90)[1] == pytest.approx(1.519090, abs=1e-6)


def test_mean_ci_identical_values_have_zero_width():
    assert mean_ci([0.25, 0.25, 0.25]) == (0.25, 0.0)


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


# ---------------------------------------------------------------------------------- intervals

def test_t_interval_bounds_by_hand():
    # [1, 2, 3, 4]: mean 2.5, half-width t(0.975, 3) * s / sqrt(4) = 3.182446 * 0.645497.
    iv = t_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182446 * math.sqrt(5 / 3) / 2
    assert (iv.mean, iv.n, iv.method) == (2.5, 4, "t")
    assert iv.low == pytest.approx(2.5 - half, abs=1e-6)
    assert iv.high == pytest.approx(2.5 + half, abs=1e-6)
    assert iv.half_width == pytest.approx(2.054260, abs=1e-6)


def test_interval_is_student_t_at_every_n():
    x = list(np.linspace(0.0, 1.0, 30))
    for n in (2, 9, 10, 11, 30):
        assert interval(x[:n]) == t_interval(x[:n])
        assert interval(x[:n]).method == "t"
    assert interval([0.5]).method == "none" and math.isnan(interval([]).mean)


def test_paired_interval_by_hand():
    a = {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.9}
    b = {1: 0.4, 2: 0.5, 3: 0.6, 4: 0.1}
    # diffs 0.2, 0.2, 0.3 (seeds 1-3): mean 0.233333 ± 0.143422 (see above)
    iv = paired_interval(a, b)
    assert iv.n == 3 and iv.method == "t"
    assert iv.low == pytest.approx(0.233333 - 0.143422, abs=1e-6)
    assert iv.high == pytest.approx(0.233333 + 0.143422, abs=1e-6)
    assert iv.excludes_zero
    # ten pairs: still the t-interval of the per-seed differences
    c = {s: 0.1 * s for s in range(10)}
    d = {s: 0.1 * s - (0.05 if s % 2 else -0.01) for s in range(12)}
    diffs = [c[s] - d[s] for s in range(10)]
    assert paired_interval(c, d) == t_interval(diffs)


@pytest.mark.parametrize(("low", "high", "excludes"), [
    (0.01, 0.2, True), (-0.3, -0.1, True), (0.0, 0.2, False), (-0.1, 0.1, False),
    (-0.2, 0.0, False), (math.nan, math.nan, False)])
def test_excludes_zero(low, high, excludes):
    assert Interval(0.05, low, high, 3, "t").excludes_zero is excludes


def test_interval_validates_arguments():
    with pytest.raises(ValueError, match="confidence"):
        interval([1.0, 2.0], confidence=1.0)


def test_t_p_value_by_hand():
    # x = 1, 2, 3, 4: t = 2.5 / 0.645497 = 3.872983 on 3 df; two-sided p = 2 * sf(t) = 0.030466
    assert t_interval([1, 2, 3, 4]).p == pytest.approx(0.030466, abs=1e-6)
    assert t_interval([-1, -2, -3, -4]).p == pytest.approx(0.030466, abs=1e-6)
    assert math.isnan(t_interval([1.0]).p)


@pytest.mark.parametrize("values", [[0.01, 0.01], [0.0, 0.0], [0.1] * 3, [-0.3] * 7])
def test_no_spread_gives_an_undefined_p_and_a_zero_width_interval(values):
    """t = mean / 0 is undefined: p is nan (not 0, which a family-wise adjustment would count as
    the strongest evidence), the interval is [value, value] and it is not counted as excluding 0."""
    iv = t_interval(values)
    assert math.isnan(iv.p)
    assert (iv.mean, iv.low, iv.high, iv.n, iv.method) == (values[0], values[0], values[0],
                                                           len(values), "t")
    assert not iv.excludes_zero
    assert paired_interval(dict(enumerate(values)), dict.fromkeys(range(len(values)), 0.0)) == iv


@pytest.mark.parametrize("shift", [0.0, 0.2, 0.45, 0.7])
def test_p_below_level_exactly_when_the_interval_excludes_zero(shift):
    x = np.random.default_rng(5).normal(shift, 1.0, size=12)
    for iv in (interval(x), interval(x[:6])):
        assert (iv.p < 0.05) == iv.excludes_zero
