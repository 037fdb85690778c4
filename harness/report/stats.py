"""Small-sample statistics for leaderboards: confidence intervals over seeds.

RL runs are expensive, so a benchmark typically has 3-5 seeds per algorithm. With so few samples
a normal-approximation interval is too narrow; the Student-t interval is the honest one. From
``bootstrap_min_n`` (10) seeds on, :func:`interval` switches to a percentile bootstrap, which does
not assume the seed-to-seed spread is normal (pass rates are bounded and often skewed) and is
accurate enough with that many samples. The bootstrap is seeded, so a leaderboard regenerated from
the same runs is byte-identical.

Two algorithms run on the same seeds share their seed-induced noise (same data order, same initial
sampling state), so comparing them *per seed* (a paired difference) is much tighter than comparing
two independent means; :func:`paired_interval` does that over the seeds both algorithms have.

Every interval carries the two-sided p-value of "the mean is 0" from the same procedure (a
one-sample t-test, or the percentile bootstrap's own tail mass), so the interval excludes 0
exactly when p < 1 - confidence (up to the bootstrap's quantile interpolation). A board makes many
paired comparisons at once; :func:`holm` adjusts their p-values for the family (Holm's step-down
procedure, statsmodels' ``multipletests``), which controls the chance of any false "†" at
1 - confidence.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

__all__ = [
    "Interval",
    "bootstrap_interval",
    "holm",
    "interval",
    "mean_ci",
    "paired_diff",
    "paired_interval",
    "t_interval",
]

BOOTSTRAP_MIN_N = 10
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
_CHUNK = 2_000_000  # resampled values drawn at once (bounds memory for large samples)


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values with a two-sided confidence interval ``[low, high]``.

    ``method`` is ``"t"`` (Student-t), ``"bootstrap"`` (percentile bootstrap) or ``"none"``
    (fewer than two values: no spread to estimate, ``low``/``high`` are nan). ``p`` is the
    two-sided p-value of "the mean is 0" by the same method (nan for ``"none"``)."""

    mean: float
    low: float
    high: float
    n: int
    method: str
    p: float = math.nan

    @property
    def half_width(self) -> float:
        """Half the interval's width: the ± of a t-interval; for a (possibly asymmetric)
        bootstrap interval, (high - low) / 2."""
        return (self.high - self.low) / 2.0

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies strictly on one side of 0 (never for nan)."""
        return bool(self.low > 0.0 or self.high < 0.0)


def _check(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _array(values: Iterable[float]) -> np.ndarray:
    return np.asarray(list(values), dtype=float).reshape(-1)


def _degenerate(x: np.ndarray) -> Interval | None:
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    if x.size == 1:
        return Interval(float(x[0]), math.nan, math.nan, 1, "none")
    return None


def t_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean ± t_{(1+confidence)/2, n-1} · s / √n (s: sample standard deviation, ddof=1)."""
    _check(confidence)
    x = _array(values)
    if (d := _degenerate(x)) is not None:
        return d
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    half = float(_st.t.ppf(0.5 + confidence / 2.0, df=x.size - 1)) * sd / math.sqrt(x.size)
    if sd > 0:
        p = float(2.0 * _st.t.sf(abs(mean) / (sd / math.sqrt(x.size)), df=x.size - 1))
    else:  # no spread: the mean is exactly what every value is
        p = 1.0 if mean == 0 else 0.0
    return Interval(mean, mean - half, mean + half, int(x.size), "t", p)


def bootstrap_interval(values: Iterable[float], confidence: float = 0.95,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       ) -> Interval:
    """Percentile bootstrap interval of the mean: ``resamples`` samples of size n drawn with
    replacement (numpy's PCG64 seeded with ``seed``, so the result is deterministic); the
    interval is the (1-confidence)/2 and (1+confidence)/2 quantiles of their means (numpy's
    default linear interpolation between order statistics)."""
    _check(confidence)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    x = _array(values)
    if (d := _degenerate(x)) is not None:
        return d
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _CHUNK // x.size)
    means = np.concatenate([
        x[rng.integers(0, x.size, size=(min(per_chunk, resamples - start), x.size))].mean(axis=1)
        for start in range(0, resamples, per_chunk)
    ])
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
    # the smallest level whose percentile interval still excludes 0
    p = min(1.0, 2.0 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    return Interval(float(x.mean()), float(low), float(high), int(x.size), "bootstrap", p)


def interval(values: Iterable[float], confidence: float = 0.95,
             bootstrap_min_n: int = BOOTSTRAP_MIN_N, resamples: int = BOOTSTRAP_RESAMPLES,
             seed: int = BOOTSTRAP_SEED) -> Interval:
    """The leaderboard's interval: Student-t below ``bootstrap_min_n`` values, a seeded
    percentile bootstrap from there on."""
    x = _array(values)
    if x.size >= bootstrap_min_n:
        return bootstrap_interval(x, confidence, resamples, seed)
    return t_interval(x, confidence)


def holm(pvalues: Iterable[float], confidence: float = 0.95) -> list[float]:
    """Holm-adjusted p-values of a family (nan entries are left out of the family and stay nan):
    a comparison is significant family-wise at 1 - ``confidence`` when its adjusted p is below
    that level."""
    from statsmodels.stats.multitest import multipletests

    _check(confidence)
    p = np.asarray(list(pvalues), dtype=float)
    out = np.full(p.shape, math.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(p[ok], alpha=1.0 - confidence, method="holm")[1]
    return [float(v) for v in out]


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
                    confidence: float = 0.95, bootstrap_min_n: int = BOOTSTRAP_MIN_N,
                    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                    ) -> Interval:
    """:func:`interval` of ``a[s] - b[s]`` over the seeds ``s`` present in both (``n`` = the
    number of pairs); seeds only one side has are ignored."""
    return interval(_shared(a, b), confidence, bootstrap_min_n, resamples, seed)


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
