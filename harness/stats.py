"""Small-sample statistics for leaderboards: Student-t confidence intervals over seeds.

RL runs are expensive, so a benchmark typically has 3-5 seeds per algorithm. With so few samples
a normal-approximation interval is too narrow; the Student-t interval is the honest one. Two
algorithms run on the same seeds share their seed-induced noise (same data order, same initial
sampling state), so comparing them *per seed* (a paired difference) is much tighter than comparing
two independent means; ``paired_diff`` does that over the seeds both algorithms have.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping

import numpy as np
from scipy import stats as _st

__all__ = ["mean_ci", "paired_diff"]


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t ``confidence`` interval of the mean.

    Returns ``(mean, half_width)``; one value gives ``(value, nan)`` (no spread to estimate) and
    no values give ``(nan, nan)``. Values are taken as given: callers drop missing ones.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.asarray(list(values), dtype=float)
    n = x.size
    if n == 0:
        return math.nan, math.nan
    mean = float(x.mean())
    if n == 1:
        return mean, math.nan
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    t = float(_st.t.ppf(0.5 + confidence / 2.0, df=n - 1))
    return mean, t * sem


def paired_diff(
    a: Mapping[Hashable, float],
    b: Mapping[Hashable, float],
    confidence: float = 0.95,
) -> tuple[float, float, int]:
    """Mean and CI half-width of ``a[s] - b[s]`` over the seeds ``s`` present in both.

    Returns ``(mean_diff, half_width, n_pairs)``; seeds only one side has are ignored.
    """
    shared = sorted(set(a) & set(b), key=str)
    diffs = [a[s] - b[s] for s in shared]
    mean, half = mean_ci(diffs, confidence)
    return mean, half, len(shared)
