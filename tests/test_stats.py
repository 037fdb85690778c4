"""Student-t and bootstrap intervals, their p-values, paired differences and Holm's correction
against hand-computed values."""

import math

import numpy as np
import pytest

from harness.report.stats import (
    Interval,
    bootstrap_interval,
    holm,
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


# ---------------------------------------------------------------------------------- intervals

def test_t_interval_bounds_by_hand():
    # [1, 2, 3, 4]: mean 2.5, half-width t(0.975, 3) * s / sqrt(4) = 3.182446 * 0.645497.
    iv = t_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182446 * math.sqrt(5 / 3) / 2
    assert (iv.mean, iv.n, iv.method) == (2.5, 4, "t")
    assert iv.low == pytest.approx(2.5 - half, abs=1e-6)
    assert iv.high == pytest.approx(2.5 + half, abs=1e-6)
    assert iv.half_width == pytest.approx(2.054260, abs=1e-6)


def test_bootstrap_two_values_by_hand():
    # Resample means of [0, 1] are 0 (p 1/4), 0.5 (1/2), 1 (1/4): the 2.5% and 97.5% quantiles
    # of 10,000 of them are 0 and 1 (a quarter of the draws sit at each end).
    iv = bootstrap_interval([0.0, 1.0])
    assert (iv.mean, iv.low, iv.high, iv.n, iv.method) == (0.5, 0.0, 1.0, 2, "bootstrap")


def test_bootstrap_skewed_sample_by_hand():
    # [0, 0, 0, 1]: a resample's mean is B/4 with B ~ Binomial(4, 1/4); P(B <= 2) = 0.949 and
    # P(B <= 3) = 0.996 bracket 0.975, and P(B = 0) = 0.316 > 0.025: the interval is [0, 0.75],
    # asymmetric about the mean 0.25 (a t-interval would go below 0).
    iv = bootstrap_interval([0.0, 0.0, 0.0, 1.0])
    assert (iv.low, iv.high) == (0.0, 0.75)
    assert iv.half_width == pytest.approx(0.375)
    assert t_interval([0.0, 0.0, 0.0, 1.0]).low < 0


def test_bootstrap_is_deterministic_and_seeded():
    x = np.random.default_rng(3).normal(size=15)
    a, b = bootstrap_interval(x), bootstrap_interval(list(x))
    assert a == b
    c = bootstrap_interval(x, seed=1)
    assert (c.low, c.high) != (a.low, a.high)
    assert c.low == pytest.approx(a.low, abs=0.05) and c.high == pytest.approx(a.high, abs=0.05)
    assert bootstrap_interval([0.3] * 12) == Interval(pytest.approx(0.3), pytest.approx(0.3),
                                                      pytest.approx(0.3), 12, "bootstrap", 0.0)


def test_bootstrap_coverage_and_agreement_with_t():
    """95% percentile intervals of n=20 normal samples cover the true mean about 95% of the
    time, and agree with the t-interval for a large sample."""
    rng = np.random.default_rng(0)
    reps, hits = 400, 0
    for i in range(reps):
        iv = bootstrap_interval(rng.normal(1.0, 2.0, size=20), resamples=2000, seed=i)
        hits += iv.low <= 1.0 <= iv.high
    assert 0.88 <= hits / reps <= 0.985
    x = rng.normal(size=200)
    boot, t = bootstrap_interval(x), t_interval(x)
    assert boot.half_width == pytest.approx(t.half_width, rel=0.1)
    assert boot.mean == t.mean


def test_interval_switches_to_bootstrap_at_ten():
    x = list(np.linspace(0.0, 1.0, 10))
    assert interval(x[:9]).method == "t" and interval(x[:9]) == t_interval(x[:9])
    assert interval(x).method == "bootstrap" and interval(x) == bootstrap_interval(x)
    assert interval(x, bootstrap_min_n=11).method == "t"
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
    # ten pairs: the bootstrap of the per-seed differences
    c = {s: 0.1 * s for s in range(10)}
    d = {s: 0.1 * s - (0.05 if s % 2 else -0.01) for s in range(12)}
    diffs = [c[s] - d[s] for s in range(10)]
    assert paired_interval(c, d) == bootstrap_interval(diffs)


@pytest.mark.parametrize(("low", "high", "excludes"), [
    (0.01, 0.2, True), (-0.3, -0.1, True), (0.0, 0.2, False), (-0.1, 0.1, False),
    (-0.2, 0.0, False), (math.nan, math.nan, False)])
def test_excludes_zero(low, high, excludes):
    assert Interval(0.05, low, high, 3, "t").excludes_zero is excludes


def test_interval_validates_arguments():
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_interval([1.0, 2.0], resamples=0)


def test_t_p_value_by_hand():
    # x = 1, 2, 3, 4: t = 2.5 / 0.645497 = 3.872983 on 3 df; two-sided p = 2 * sf(t) = 0.030466
    assert t_interval([1, 2, 3, 4]).p == pytest.approx(0.030466, abs=1e-6)
    assert t_interval([-1, -2, -3, -4]).p == pytest.approx(0.030466, abs=1e-6)
    assert t_interval([0.3, 0.3]).p == 0.0 and t_interval([0.0, 0.0]).p == 1.0
    assert math.isnan(t_interval([1.0]).p)


@pytest.mark.parametrize("shift", [0.0, 0.2, 0.45, 0.7])
def test_p_below_level_exactly_when_the_interval_excludes_zero(shift):
    x = np.random.default_rng(5).normal(shift, 1.0, size=12)  # bootstrap from 10 on
    for iv in (interval(x), interval(x[:6])):  # bootstrap, t
        assert (iv.p < 0.05) == iv.excludes_zero or abs(iv.p - 0.05) < 0.01


def test_bootstrap_p_is_twice_the_smaller_tail():
    # all 10,000 resampled means of positive values are > 0: p = 0; a sample centred on 0 has
    # about half its resampled means on each side: p near 1
    assert bootstrap_interval([0.1, 0.2, 0.3] * 4).p == 0.0
    assert bootstrap_interval([-1.0, 1.0] * 6).p == pytest.approx(1.0, abs=0.05)


def test_holm_by_hand():
    # sorted p 0.01, 0.03, 0.04, 0.2 (m = 4): 4 * 0.01 = 0.04, 3 * 0.03 = 0.09, 2 * 0.04 = 0.08
    # -> running max 0.09, 1 * 0.2 = 0.2; nan stays out of the family
    assert holm([0.04, 0.01, float("nan"), 0.2, 0.03]) == pytest.approx(
        [0.09, 0.04, float("nan"), 0.2, 0.09], nan_ok=True)
    assert holm([]) == []
