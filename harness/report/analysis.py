"""The confirmatory analysis of a board: one primary metric, one comparison per row against its
declared baseline, tested together in a seed-blocked model, with the power to detect what the
sweep declared it was run for.

**Model.** Every row of a board runs on the same seeds, and a seed fixes the data order and the
sampling stream of every algorithm alike, so the primary metric ``y`` of row ``r`` at seed ``s``
is modelled as the two-way additive model without interaction

    y_rs = mu + a_r + b_s + e_rs,      e_rs ~ N(0, sigma^2) independent,

fitted by ordinary least squares over every row that takes part in a comparison (statsmodels'
OLS on a row + seed dummy design, so a missing cell is allowed). Each confirmatory comparison is
a contrast ``a_row - a_baseline``; its estimate is the paired mean difference over shared seeds
(exactly, when every row has every seed), and its standard error uses the residual variance pooled
over all rows, with ``(R - 1)(S - 1)`` degrees of freedom on a complete design of R rows and S
seeds, instead of the ``S - 1`` of one paired t-test.

**Test.** The family is the board's confirmatory comparisons and nothing else (secondary metrics
are descriptive). Adjusted p-values are single-step max-|t| (Hothorn, Bretz & Westfall, 2008,
"Simultaneous inference in general parametric models"): ``p_i = P(max_j |T_j| >= |t_i|)``, with
``T`` multivariate t with the residual degrees of freedom and the contrasts' correlation matrix,
evaluated on 200,000 seeded draws of ``T`` (from the symmetric square root of the correlation
matrix, so the same on every machine; Monte-Carlo error of a probability near 0.05 about
0.0005; one comparison uses Student-t exactly), so a page rebuilds to the same digits. When
every row is compared with one baseline this is Dunnett's many-to-one test (Dunnett, 1955); with
several baselines (LPO's paired-temperature protocol) the same procedure follows the contrasts'
correlations. The simultaneous interval is ``estimate +- c * SE`` with ``c`` the family's
critical value (``P(max |T| <= c) = 1 - alpha``), so an interval excludes 0 exactly when the
adjusted p is below alpha.

**Assumptions, checked and printed**: equal residual spread across rows (Brown-Forsythe's
median-centred Levene test on the residuals grouped by row) and normal residuals (Shapiro-Wilk).
Additivity (a seed helps every row alike) is what pairing assumes too.

**Power.** The minimum detectable effect of a comparison at alpha (two-sided, family-adjusted)
and power ``1 - beta`` is ``MDE = (c + t_{1-beta, df}) * SE`` (the usual normal-theory
approximation with the family's critical value in place of ``z_{1-alpha/2}``). For planning,
:func:`seeds_needed` takes sigma from a pilot and finds the fewest seeds whose MDE is at most
the effect to detect on a complete design of the same rows and comparisons.

**Identical rows.** A row whose runs are the baseline's runs bit for bit (e.g. GPPO and CISPO are
GRPO when every importance ratio is 1) is a null comparison by construction: it is labelled and
left out of the model and the family (:func:`identical_to`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as st

__all__ = ["Analysis", "Comparison", "analyse", "critical_value", "identical_to", "mde_at",
           "seeds_needed"]

_DRAWS = 200_000  # draws of T per (correlation, df): seeded, so pages rebuild identically
_DRAW_SEED = 0
# metrics that differ between identical runs (time, memory): not part of "identical"
_UNSTABLE = ("wall_s", "time_", "peak_", "warm_start_s")


@dataclass(frozen=True)
class Comparison:
    """One confirmatory contrast ``row - baseline`` on the primary metric."""

    row: str
    baseline: str
    n: int  # seeds both rows have
    estimate: float
    se: float
    t: float
    p_adjusted: float  # single-step max-|t| over the family
    low: float  # simultaneous interval: estimate -+ critical * se
    high: float
    mde: float  # minimum detectable effect at alpha (family) and the plan's power
    alpha: float = 0.05

    @property
    def significant(self) -> bool:
        """Adjusted p below the family's level (the simultaneous interval then excludes 0, up
        to the Monte-Carlo quantile's resolution)."""
        return bool(self.p_adjusted < self.alpha)


@dataclass
class Analysis:
    """The fitted model, its family of comparisons and the checks of its assumptions."""

    comparisons: list[Comparison] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)  # rows in the model
    seeds: list[str] = field(default_factory=list)
    df: int = 0  # residual degrees of freedom
    sigma: float = math.nan  # residual standard deviation
    critical: float = math.nan  # c: P(max |T| <= c) = 1 - alpha
    alpha: float = 0.05
    power: float = 0.8
    levene_p: float = math.nan  # Brown-Forsythe: equal residual spread across rows
    shapiro_p: float = math.nan  # Shapiro-Wilk: normal residuals
    note: str = ""  # why there is no test (too few seeds, no comparison)

    @property
    def mde(self) -> float:
        """The largest MDE of the family (the effect every comparison can detect)."""
        return max((c.mde for c in self.comparisons), default=math.nan)


def _max_abs_t(corr: np.ndarray, df: int) -> np.ndarray:
    """Sorted draws of max_j |T_j|, T multivariate t (``df``, correlation ``corr``):
    ``T = Z R / sqrt(W / df)``, ``Z`` standard normal rows, ``W`` chi-square(df), and ``R`` the
    symmetric square root of ``corr``. Why that root: it exists for a singular ``corr`` and is
    unique, while an eigen- or SVD factor (what scipy's and numpy's samplers use) is not where an
    eigenvalue repeats, as in Dunnett's equicorrelated many-to-one matrix: there LAPACK's
    kernels (AVX2 vs AVX-512 builds) pick different bases, and the same seed gave different
    draws, and a page different digits, on two machines."""
    rng = np.random.default_rng(_DRAW_SEED)
    lam, vec = np.linalg.eigh(corr)
    root = (vec * np.sqrt(np.clip(lam, 0.0, None))) @ vec.T  # V diag(sqrt(lam)) V^T
    z = rng.standard_normal((_DRAWS, corr.shape[0])) @ root
    w = rng.chisquare(df, _DRAWS) / df
    return np.sort(np.abs(z).max(axis=1) / np.sqrt(w))


def _exceed(bound: float, corr: np.ndarray, df: int, draws: np.ndarray | None) -> float:
    """P(max_j |T_j| >= bound)."""
    if corr.shape[0] == 1:
        return float(2.0 * st.t.sf(bound, df))
    assert draws is not None
    return float(1.0 - np.searchsorted(draws, bound, side="left") / draws.size)


def critical_value(corr: np.ndarray, df: int, alpha: float = 0.05,
                   draws: np.ndarray | None = None) -> float:
    """``c`` with ``P(max_j |T_j| <= c) = 1 - alpha`` (Dunnett's critical value when ``corr`` is
    the many-to-one correlation)."""
    if corr.shape[0] == 1:
        return float(st.t.ppf(1.0 - alpha / 2.0, df))
    draws = _max_abs_t(corr, df) if draws is None else draws
    return float(np.quantile(draws, 1.0 - alpha))


def _design(cells: list[tuple[str, str, float]], rows: list[str], seeds: list[str]
            ) -> tuple[np.ndarray, np.ndarray]:
    """Intercept, treatment dummies of rows[1:] and seeds[1:] (first row, first seed: reference)."""
    X = np.zeros((len(cells), 1 + len(rows) - 1 + len(seeds) - 1))
    X[:, 0] = 1.0
    for i, (row, seed, _) in enumerate(cells):
        if (r := rows.index(row)) > 0:
            X[i, r] = 1.0
        if (s := seeds.index(seed)) > 0:
            X[i, len(rows) - 1 + s] = 1.0
    return X, np.array([y for _, _, y in cells])


def _contrast(rows: list[str], width: int, row: str, base: str) -> np.ndarray:
    """``a_row - a_base`` as a vector over the model's coefficients."""
    v = np.zeros(width)
    for name, sign in ((row, 1.0), (base, -1.0)):
        if (r := rows.index(name)) > 0:
            v[r] += sign
    return v


def analyse(values: Mapping[str, Mapping[str, float]], contrasts: Sequence[tuple[str, str]],
            alpha: float = 0.05, power: float = 0.8) -> Analysis:
    """Fit the seed-blocked model to ``values`` (row -> seed -> primary metric) over the rows
    named in ``contrasts`` ((row, baseline) pairs) and test the contrasts as one family."""
    import statsmodels.api as sm

    out = Analysis(alpha=alpha, power=power)
    clean = {r: {str(s): float(y) for s, y in v.items() if not math.isnan(float(y))}
             for r, v in values.items()}  # seed labels as strings: 0 and "0" are one seed
    # a row paired with itself is no comparison (a board labels such a row identical instead)
    pairs = [(r, b) for r, b in contrasts if r != b and clean.get(r) and clean.get(b)]
    if not pairs:
        out.note = "no comparison with runs on both sides"
        return out
    rows = sorted({name for pair in pairs for name in pair})
    cells = [(r, s, y) for r in rows for s, y in sorted(clean[r].items())]
    seeds = sorted({s for _, s, _ in cells}, key=lambda s: (len(s), s))
    X, y = _design(cells, rows, seeds)
    # a contrast the design cannot estimate (a row whose seeds no other row has) is dropped,
    # never reported from an arbitrary least-squares solution
    proj = np.linalg.pinv(X) @ X
    pairs = [(r, b) for r, b in pairs if np.allclose(
        (v := _contrast(rows, X.shape[1], r, b)) @ proj, v, atol=1e-8)]
    if not pairs:
        out.note = "no comparison the seed-blocked design can estimate (no shared seeds)"
        return out
    rank = int(np.linalg.matrix_rank(X))
    out.rows, out.seeds, out.df = rows, seeds, len(y) - rank
    if out.df < 1:
        out.note = f"{len(seeds)} seed(s): no residual degrees of freedom to test with"
        return out
    fit = sm.OLS(y, X).fit()
    out.sigma = float(np.sqrt(fit.scale))
    L = np.array([_contrast(rows, X.shape[1], r, b) for r, b in pairs])
    # on a grid of 1e-12 of the data's scale: the least-squares solve leaves ~1e-17 of rounding
    # that differs between BLAS builds, so an estimate of exactly 0 or an exact half (0.0025)
    # printed -0.000 or +0.003 on one machine and +0.000 or +0.002 on another (+ 0.0: no -0)
    quantum = 1e-12 * max(1.0, float(np.abs(y).max()))
    est = np.round(L @ fit.params / quantum) * quantum + 0.0
    cov = L @ fit.cov_params() @ L.T
    se = np.round(np.sqrt(np.diag(cov)) / quantum) * quantum
    # every residual 0 (up to rounding): the t statistics are undefined, never huge
    if not out.sigma > 1e-9 * max(1.0, float(np.abs(y).max())):
        out.note = "no residual variance (every row moves with the seed exactly)"
        return out
    corr = cov / np.outer(se, se)
    draws = _max_abs_t(corr, out.df) if len(pairs) > 1 else None
    out.critical = critical_value(corr, out.df, alpha, draws)
    t_power = float(st.t.ppf(power, out.df))
    t = est / se
    for (r, b), e, s, tv in zip(pairs, est, se, t):
        p = _exceed(abs(float(tv)), corr, out.df, draws)
        n = len(set(clean[r]) & set(clean[b]))
        out.comparisons.append(Comparison(
            r, b, n, float(e), float(s), float(tv), float(min(1.0, max(0.0, p))),
            float(e - out.critical * s), float(e + out.critical * s),
            float((out.critical + t_power) * s), alpha))
    # here df >= 1 and sigma > 0: at least two rows, at least four residuals, not all equal
    resid = np.asarray(fit.resid)
    groups = [resid[[i for i, c in enumerate(cells) if c[0] == r]] for r in rows]
    if all(len(g) > 1 for g in groups):  # a spread needs two residuals in every row
        out.levene_p = float(st.levene(*groups, center="median").pvalue)
    out.shapiro_p = float(st.shapiro(resid).pvalue)
    return out


def _balanced_corr(contrasts: Sequence[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray, int]:
    """Correlation and per-contrast variance factor (SE^2 = sigma^2 * factor / n) of the
    contrasts on a complete design, and the number of rows."""
    rows = sorted({name for pair in contrasts for name in pair})
    C = np.zeros((len(contrasts), len(rows)))
    for i, (r, b) in enumerate(contrasts):
        C[i, rows.index(r)], C[i, rows.index(b)] = 1.0, -1.0
    G = C @ C.T
    d = np.sqrt(np.diag(G))
    return G / np.outer(d, d), np.diag(G), len(rows)


def mde_at(sigma: float, contrasts: Sequence[tuple[str, str]], seeds: int, alpha: float = 0.05,
           power: float = 0.8) -> float:
    """The family's largest MDE with ``seeds`` seeds on a complete design of the contrasts'
    rows, residual SD ``sigma``."""
    corr, factor, n_rows = _balanced_corr(contrasts)
    if seeds < 2:  # no residual degrees of freedom (two rows or more: df >= 1 from two seeds)
        return math.inf
    df = (n_rows - 1) * (seeds - 1)
    c = critical_value(corr, df, alpha)
    return float((c + st.t.ppf(power, df)) * sigma * math.sqrt(float(factor.max()) / seeds))


def seeds_needed(sigma: float, contrasts: Sequence[tuple[str, str]], delta: float,
                 alpha: float = 0.05, power: float = 0.8, most: int = 200) -> int | None:
    """The fewest seeds (2..``most``) at which every contrast's MDE is at most ``delta``; None
    when even ``most`` seeds are not enough."""
    if not delta > 0:
        raise ValueError(f"the effect to detect must be > 0, got {delta}")
    lo, hi = 2, most
    if mde_at(sigma, contrasts, hi, alpha, power) > delta:
        return None
    while lo < hi:  # MDE falls with the number of seeds
        mid = (lo + hi) // 2
        if mde_at(sigma, contrasts, mid, alpha, power) <= delta:
            hi = mid
        else:
            lo = mid + 1
    return lo


def identical_to(a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]]
                 ) -> bool:
    """Do two rows' runs (seed -> summary metrics) agree bit for bit on every shared seed (at
    least one) in every ``final/*`` and ``start/*`` metric but time and memory?"""
    shared = set(a) & set(b)
    if not shared:
        return False
    for seed in shared:
        keys = {k for k in (*a[seed], *b[seed]) if k.startswith(("final/", "start/"))
                and not any(u in k for u in _UNSTABLE)}
        if not keys or any(a[seed].get(k) != b[seed].get(k) for k in keys):
            return False
    return True
