"""Coverage of the board's 95% interval (issue 31): a seeded simulation calls the real
:func:`harness.report.stats.interval` on 4000 samples per case and counts how often the interval
contains the true mean.

Measured with these seeds (4000 replications, binomial SE about 0.0035 at 0.95):

==================  ======  ======  ======
data                n = 5   n = 10  n = 20
==================  ======  ======  ======
normal(0, 1)        0.955   0.949   0.952
exponential(1) - 1  0.873   0.895   0.920
lognormal(0, 1)     0.817   0.831   0.875
==================  ======  ======  ======

The t-interval is exact on normal data; on skewed data it undercovers, less as n grows (the mean
becomes more normal). The percentile bootstrap the board used from 10 seeds on covered 0.904 on
normal data at n = 10 (issue 31), below every normal entry here. The skewed bounds below are the
measured values rounded down to the next 0.01: they document the t-interval's known weakness and
catch a method that is worse.
"""

import numpy as np
import pytest

from harness.report.stats import interval, t_interval

REPS = 4000
DATA = {  # name -> (draw n values, true mean)
    "normal": (lambda rng, n: rng.normal(0.0, 1.0, n), 0.0),
    "shifted exponential": (lambda rng, n: rng.exponential(1.0, n) - 1.0, 0.0),
    "lognormal": (lambda rng, n: rng.lognormal(0.0, 1.0, n), float(np.exp(0.5))),
}
FLOOR = {  # the lowest coverage accepted; normal: the nominal level up to simulation noise
    ("normal", 5): 0.94, ("normal", 10): 0.94, ("normal", 20): 0.94,
    ("shifted exponential", 5): 0.87, ("shifted exponential", 10): 0.89,
    ("shifted exponential", 20): 0.92,
    ("lognormal", 5): 0.81, ("lognormal", 10): 0.83, ("lognormal", 20): 0.87,
}


def _coverage(name: str, n: int) -> float:
    draw, mu = DATA[name]
    rng = np.random.default_rng([n, list(DATA).index(name)])  # independent of test order
    hits = 0
    for _ in range(REPS):
        iv = interval(draw(rng, n), 0.95)
        hits += iv.low <= mu <= iv.high
    return hits / REPS


@pytest.mark.parametrize("n", [5, 10, 20])
@pytest.mark.parametrize("name", list(DATA))
def test_95_percent_interval_covers_the_true_mean(name, n):
    assert _coverage(name, n) >= FLOOR[name, n]


@pytest.mark.parametrize("n", [9, 10, 20])
def test_a_tenth_value_does_not_switch_method(n):
    x = np.random.default_rng(n).normal(0.3, 0.05, n)
    iv = interval(x)
    assert iv.method == "t"
    assert iv == t_interval(x)
