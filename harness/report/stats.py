"""Small-sample statistics for leaderboards: confidence intervals over seeds.

RL runs are expensive, so a benchmark typically has 3-10 seeds per algorithm. Every interval on a
board is the Student-t interval of the mean (mean ± t_{(1+c)/2, n-1} · s/√n; Student, 1908), at
every n. With so few samples a normal-approximation interval is too narrow, and so is the
percentile bootstrap: its quantiles come from the empirical distribution of the n values, whose
spread is the plug-in (ddof=0) estimate and which has no t-quantile correction, so it undercovers
at small n (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13; Hesterberg, "What
Teachers Should Know About the Bootstrap", The American Statistician 69(4), 2015, on its
"narrowness bias" in small samples). Issue 31's simulation of 95% intervals on normal data at
n = 10 measured coverage 0.961 for t against 0.904 for the percentile bootstrap the board used to
switch to from 10 seeds on; it no longer switches. The t-interval assumes the mean over seeds is
roughly normal; on skewed data it undercovers somewhat at small n
(tests/report/test_stats_coverage.py measures by how much).

Two algorithms run on the same seeds share their seed-induced noise (same data order, same initial
sampling state), so comparing them *per seed* (a paired difference) is much tighter than comparing
two independent means; :func:`paired_interval` does that over the seeds both algorithms have.

Every interval carries the two-sided p-value of "the mean is 0" from the one-sample t-test, so the
interval excludes 0 exactly when p < 1 - confidence. When every value is the same (no spread) the
t statistic is 0/0 or x/0: the p-value is undefined (nan, never 0) and the interval is the
zero-width [mean, mean] — a description of the sample, which :attr:`Interval.excludes_zero` does
not count as excluding 0. These intervals are descriptive on a board; its confirmatory test, one
comparison per row in a seed-blocked model with a family-wise adjustment, is
:mod:`harness.report.analysis`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Interval",
    "interval",
    "mean_ci",
    "paired_diff",
    "paired_interval",
    "t_interval",
]


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values with a two-sided confidence interval ``[low, high]``.

    ``method`` is ``"t"`` (Student-t) or ``"none"`` (fewer than two values: no spread to
    estimate, ``low``/``high`` are nan). ``p`` is the two-sided p-value of "the mean is 0" (nan
    for ``"none"`` and for values without spread, where the test statistic is undefined)."""

    mean: float
    low: float
    high: float
    n: int
    method: str
    p: float = math.nan

    @property
    def half_width(self) -> float:
        """Half the interval's width: the ± of a t-interval."""
        return (self.high - self.low) / 2.0

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies strictly on one side of 0. Never for nan bounds,
        and never for a zero-width interval (values without spread): it estimates no
        uncertainty, so it is no evidence against 0 (its p-value is nan)."""
        return bool(self.high > self.low and (self.low > 0.0 or self.high < 0.0))


def _check(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _array(values: Iterable[float]) -> np.ndarray:
    return np.asarray(list(values), dtype=float).reshape(-1)


def t_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean ± t_{(1+confidence)/2, n-1} · s / √n (s: sample standard deviation, ddof=1), with
    the one-sample t-test's two-sided p-value of "the mean is 0".

    Fewer than two values: method ``"none"``, nan bounds and p. Values that are all equal: the
    interval is ``[mean, mean]`` and p is nan (t = 0/0 or x/0 is undefined; a p of 0 would count
    as the strongest evidence there is)."""
    _check(confidence)
    x = _array(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    if x.size == 1:
        return Interval(float(x[0]), math.nan, math.nan, 1, "none")
    if np.ptp(x) == 0:  # tested on the values, not on s, which rounding can leave at 1e-17
        v = float(x[0])
        return Interval(v, v, v, int(x.size), "t", math.nan)
    from scipy import stats as _st  # here: importing the tables must not cost scipy's second

    mean, se = float(x.mean()), float(x.std(ddof=1)) / math.sqrt(x.size)
    half = float(_st.t.ppf(0.5 + confidence / 2.0, df=x.size - 1)) * se
    p = float(2.0 * _st.t.sf(abs(mean) / se, df=x.size - 1))
    return Interval(mean, mean - half, mean + half, int(x.size), "t", p)


def interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """The leaderboard's interval: Student-t at every number of values (:func:`t_interval`)."""
    return t_interval(values, confidence)


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t ``confidence`` interval of the mean.

    Returns ``(mean, half_width)``; one value gives ``(value, nan)`` (no spread to estimate) and
    no values give ``(nan, nan)``. Values are taken as given: callers drop missing ones.
    """
    iv = t_interval(values, confidence)
    return iv.mean, iv.half_width


def _shared(a: Mapping[Hashable, float], b: Mapping[Hashable, float]) -> list[float]:
    return [a[s] - b[s] for s in sorted(set(a) & set(b), key=str)]


def paired_interval(a: Mapping[Hashable, float], b: Mapping[Hashable, float],
                    confidence: float = 0.95) -> Interval:
    """:func:`interval` of ``a[s] - b[s]`` over the seeds ``s`` present in both (``n`` = the
    number of pairs); seeds only one side has are ignored."""
    return interval(_shared(a, b), confidence)


def paired_diff(
    a: Mapping[Hashable, float],
    b: Mapping[Hashable, float],
    confidence: float = 0.95,
) -> tuple[float, float, int]:
    """Mean and Student-t CI half-width of ``a[s] - b[s]`` over the seeds ``s`` present in both.

    Returns ``(mean_diff, half_width, n_pairs)``; seeds only one side has are ignored.
    """
    iv = t_interval(_shared(a, b), confidence)
    return iv.mean, iv.half_width, iv.n
