"""Edges of the board's confirmatory analysis (harness/report/analysis.py) that the mutation run
showed unguarded: the seeded family quantile a page's digits rest on, ties in the max-|t| tail,
the one-comparison case, the declared alpha and power, the assumption checks, the notes that say
why there is no test, the planning bounds, and what counts as the same run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats as st

from harness.report import analysis
from harness.report.analysis import (
    Analysis,
    Comparison,
    analyse,
    critical_value,
    identical_to,
    mde_at,
    seeds_needed,
)


def _board(seed: int, rows: int, seeds: int, sd: float = 0.01) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    block = rng.normal(0.0, 0.03, seeds)
    return {f"r{i}": {str(s): 0.2 + block[s] + rng.normal(0, sd) for s in range(seeds)}
            for i in range(rows)}


def _many_to_one(rows: int) -> list[tuple[str, str]]:
    return [(f"r{i}", "r0") for i in range(1, rows)]


def test_the_family_quantile_is_seeded_so_a_page_rebuilds_to_the_same_digits():
    """The critical value of three comparisons is a Monte-Carlo quantile; its draws are seeded
    (seed 0, 200,000 draws), so every rebuild prints the same digits. Another seed or draw count
    moves it by the Monte-Carlo error (~1e-3), far outside this tolerance."""
    corr = np.full((3, 3), 0.5) + 0.5 * np.eye(3)
    assert critical_value(corr, 12) == pytest.approx(2.687288500995566, rel=1e-9)
    assert analysis._max_abs_t(corr, 12).size == 200_000


def test_the_draws_do_not_depend_on_the_basis_lapack_picks_for_a_repeated_eigenvalue(
        monkeypatch):
    """Dunnett's equicorrelated matrix has a repeated eigenvalue; any orthonormal basis of its
    eigenspace is a valid eigendecomposition, and LAPACK builds for different CPUs return
    different ones. The seeded draws (and so a page's digits) must not move with that choice."""
    import scipy.linalg

    corr = np.full((3, 3), 0.5) + 0.5 * np.eye(3)  # eigenvalues 0.5, 0.5, 2
    before = analysis._max_abs_t(corr, 12)
    # the definition, with the root made another way (Schur): Z R / sqrt(W / df), seed 0
    rng = np.random.default_rng(0)
    z = rng.standard_normal((200_000, 3)) @ np.real(scipy.linalg.sqrtm(corr))
    w = rng.chisquare(12, 200_000) / 12
    assert np.abs(before - np.sort(np.abs(z).max(axis=1) / np.sqrt(w))).max() < 1e-12
    theta = 0.7
    turn = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])

    def rotated(real):
        def eigh(a, *args, **kwargs):
            lam, vec = real(a, *args, **kwargs)
            assert lam[0] == pytest.approx(lam[1])
            vec = vec.copy()
            vec[:, :2] = vec[:, :2] @ turn  # another basis of the same eigenspace
            return lam, vec
        return eigh

    monkeypatch.setattr(np.linalg, "eigh", rotated(np.linalg.eigh))
    monkeypatch.setattr(scipy.linalg, "eigh", rotated(scipy.linalg.eigh))
    after = analysis._max_abs_t(corr, 12)
    assert np.abs(after - before).max() < 1e-12


def test_a_draw_equal_to_the_bound_counts_as_reaching_it():
    """p = P(max|T| >= |t|): a draw tied with the bound is in the tail."""
    draws = np.array([1.0, 2.0, 3.0, 4.0])
    corr = np.full((2, 2), 0.5) + 0.5 * np.eye(2)
    assert analysis._exceed(2.0, corr, 5, draws) == 0.75
    assert analysis._exceed(4.5, corr, 5, draws) == 0.0
    assert analysis._exceed(0.5, corr, 5, draws) == 1.0


def test_one_comparison_is_an_exact_student_t_test_on_the_pooled_error():
    data = _board(0, rows=2, seeds=6)
    result = analyse(data, [("r1", "r0")])
    (comp,) = result.comparisons
    assert result.df == 5
    c = st.t.ppf(0.975, 5)
    assert result.critical == pytest.approx(c)
    assert comp.p_adjusted == pytest.approx(2 * st.t.sf(abs(comp.t), 5))
    assert (comp.low, comp.high) == pytest.approx((comp.estimate - c * comp.se,
                                                   comp.estimate + c * comp.se))
    assert comp.mde == pytest.approx((c + st.t.ppf(0.8, 5)) * comp.se)
    assert comp.n == 6 and (comp.row, comp.baseline) == ("r1", "r0")
    assert not math.isnan(result.levene_p)  # two rows: their spreads are compared


def test_alpha_and_power_are_the_ones_declared():
    data = _board(1, rows=3, seeds=6)
    default = analyse(data, _many_to_one(3))
    assert (default.alpha, default.power) == (0.05, 0.8)
    assert all(c.alpha == 0.05 for c in default.comparisons)
    loose = analyse(data, _many_to_one(3), alpha=0.2, power=0.9)
    assert (loose.alpha, loose.power) == (0.2, 0.9)
    assert loose.critical < default.critical
    for comp in loose.comparisons:
        assert comp.alpha == 0.2
        assert comp.mde == pytest.approx((loose.critical + st.t.ppf(0.9, loose.df)) * comp.se)
    assert critical_value(np.eye(1), 8, alpha=0.2) == pytest.approx(st.t.ppf(0.9, 8))
    assert mde_at(0.01, _many_to_one(3), 6, power=0.9) > mde_at(0.01, _many_to_one(3), 6)
    assert mde_at(0.01, _many_to_one(3), 6, alpha=0.2) < mde_at(0.01, _many_to_one(3), 6)


def test_significance_is_strictly_below_alpha():
    def comp(p: float, alpha: float = 0.05) -> Comparison:
        return Comparison("a", "b", 5, 0.0, 1.0, 0.0, p, -1.0, 1.0, 1.0, alpha)

    assert not comp(0.05).significant
    assert comp(0.0499).significant
    assert not comp(0.06).significant and comp(0.06, alpha=0.1).significant
    assert Comparison("a", "b", 5, 0.0, 1.0, 0.0, 0.04, -1.0, 1.0, 1.0).alpha == 0.05


def test_an_analysis_without_comparisons_has_no_mde_and_declared_defaults():
    empty = Analysis()
    assert math.isnan(empty.mde) and math.isnan(empty.sigma) and math.isnan(empty.critical)
    assert (empty.alpha, empty.power, empty.df, empty.note) == (0.05, 0.8, 0, "")
    assert math.isnan(empty.levene_p) and math.isnan(empty.shapiro_p)


def test_the_assumption_checks_are_brown_forsythe_and_shapiro_wilk_on_the_residuals():
    data = _board(2, rows=3, seeds=6)
    result = analyse(data, _many_to_one(3))
    rows = sorted(data)
    cells = [(r, s, data[r][s]) for r in rows for s in sorted(data[r], key=int)]
    X = np.column_stack([np.ones(len(cells))]
                        + [[1.0 * (c[0] == r) for c in cells] for r in rows[1:]]
                        + [[1.0 * (c[1] == s) for c in cells] for s in sorted(data["r0"])[1:]])
    resid = sm.OLS(np.array([c[2] for c in cells]), X).fit().resid
    groups = [resid[[i for i, c in enumerate(cells) if c[0] == r]] for r in rows]
    assert result.levene_p == pytest.approx(st.levene(*groups, center="median").pvalue)
    assert result.levene_p != pytest.approx(st.levene(*groups, center="mean").pvalue)
    assert result.shapiro_p == pytest.approx(st.shapiro(resid).pvalue)


def test_the_spread_check_needs_two_residuals_in_every_row():
    data = _board(3, rows=3, seeds=5)
    data["r2"] = {"0": data["r2"]["0"], "1": data["r2"]["1"]}
    assert not math.isnan(analyse(data, _many_to_one(3)).levene_p)
    data["r2"] = {"0": data["r2"]["0"]}  # one residual: no spread to compare
    result = analyse(data, _many_to_one(3))
    assert math.isnan(result.levene_p) and not math.isnan(result.shapiro_p)


def test_the_smallest_testable_board_gets_a_normality_check():
    """Two rows on two seeds: one residual degree of freedom, four residuals; normality is
    checked (a 2 x 2 design's residuals are +-e in both rows, so their spreads are equal by
    construction and Brown-Forsythe has nothing to compare)."""
    small = {"a": {"0": 0.1, "1": 0.3}, "b": {"0": 0.2, "1": 0.25}}
    result = analyse(small, [("a", "b")])
    assert result.df == 1 and len(result.comparisons) == 1
    assert not math.isnan(result.shapiro_p)


def test_each_reason_for_no_test_is_named():
    assert analyse({"a": {"0": 0.1}}, [("a", "b")]).note == \
        "no comparison with runs on both sides"
    assert analyse({"a": {"0": 0.1, "1": 0.2}, "b": {"2": 0.3, "3": 0.1}}, [("a", "b")]).note == \
        "no comparison the seed-blocked design can estimate (no shared seeds)"
    assert analyse({"a": {"0": 0.1}, "b": {"0": 0.2}}, [("a", "b")]).note == \
        "1 seed(s): no residual degrees of freedom to test with"
    flat = {"a": {"0": 0.1, "1": 0.2}, "b": {"0": 0.15, "1": 0.25}}
    assert analyse(flat, [("a", "b")]).note == \
        "no residual variance (every row moves with the seed exactly)"


def _two_rows(level: float, d: float) -> dict[str, dict[str, float]]:
    """Two rows on three seeds whose residuals are (d, -d, 0) and (-d, d, 0): SD sqrt(2) d."""
    return {"a": {"0": level + d, "1": level - d, "2": level},
            "b": {"0": level + 0.1 - d, "1": level + 0.1 + d, "2": level + 0.1}}


def test_the_no_variance_guard_is_one_part_in_a_billion_of_the_values_scale():
    """Residual SD at or under 1e-9 of the values' scale (at least 1) is rounding: no test.
    Above it, noise is noise however small the values are."""
    tested = analyse(_two_rows(0.5, 1.5e-9 / math.sqrt(2)), [("a", "b")])
    assert tested.sigma == pytest.approx(1.5e-9, rel=1e-3)
    assert tested.comparisons and not tested.note
    rounding = analyse(_two_rows(1000.0, 5e-7 / math.sqrt(2)), [("a", "b")])
    assert rounding.sigma == pytest.approx(5e-7, rel=1e-3)  # 5e-10 of the values
    assert not rounding.comparisons and rounding.note.startswith("no residual variance")
    small = analyse({r: {s: v * 1e-4 for s, v in by.items()}
                     for r, by in _board(4, 3, 6).items()}, _many_to_one(3))
    assert small.comparisons and not small.note


def test_a_row_paired_with_itself_is_no_comparison():
    data = _board(5, rows=2, seeds=5)
    result = analyse(data, [("r0", "r0"), ("r1", "r0")])
    assert [(c.row, c.baseline) for c in result.comparisons] == [("r1", "r0")]
    assert not analyse(data, [("r1", "r1")]).comparisons


def test_linearly_dependent_contrasts_are_tested_together_and_planned_alike():
    """r1 - r0, r2 - r1 and r2 - r0: the third is the sum of the first two, so the contrasts'
    correlation matrix is singular (and not many-to-one); the family is still tested, and the
    planning MDE on the same contrasts is the analysis's."""
    contrasts = [("r1", "r0"), ("r2", "r1"), ("r2", "r0")]
    result = analyse(_board(6, rows=3, seeds=6), contrasts)
    assert len(result.comparisons) == 3 and not math.isnan(result.critical)
    assert result.critical < critical_value(np.full((3, 3), 0.5) + 0.5 * np.eye(3), result.df)
    assert result.mde == pytest.approx(mde_at(result.sigma, contrasts, 6), rel=1e-6)


def test_too_few_seeds_plan_nothing_and_two_seeds_can_be_enough():
    assert mde_at(0.01, _many_to_one(3), 1) == math.inf
    assert math.isfinite(mde_at(0.01, _many_to_one(3), 2))
    assert seeds_needed(1e-6, [("a", "b")], 0.5) == 2
    with pytest.raises(ValueError, match="> 0"):
        seeds_needed(0.01, [("a", "b")], -0.1)


def test_an_mde_equal_to_the_effect_is_enough():
    pair = [("a", "b")]
    at7 = mde_at(0.01, pair, 7)
    assert seeds_needed(0.01, pair, at7) == 7
    assert seeds_needed(0.01, pair, at7, most=7) == 7
    assert seeds_needed(0.01, pair, at7, most=6) is None


def test_seeds_needed_searches_up_to_200_seeds_by_default():
    pair = [("a", "b")]
    at201 = mde_at(0.01, pair, 201)
    assert seeds_needed(0.01, pair, at201) is None
    assert seeds_needed(0.01, pair, at201, most=201) == 201


def test_seeds_needed_plans_at_the_declared_power():
    pair = [("a", "b")]
    n = seeds_needed(0.01, pair, 0.02, power=0.9)
    assert n == next(k for k in range(2, 200) if mde_at(0.01, pair, k, power=0.9) <= 0.02)
    assert n > seeds_needed(0.01, pair, 0.02)
    short = mde_at(0.01, pair, 200, power=0.9) * 0.999  # 200 seeds reach it at 0.8, not 0.9
    assert seeds_needed(0.01, pair, short) is not None
    assert seeds_needed(0.01, pair, short, power=0.9) is None


def test_one_comparison_plans_with_student_t():
    sigma, n = 0.01, 6
    expect = (st.t.ppf(0.975, n - 1) + st.t.ppf(0.8, n - 1)) * sigma * math.sqrt(2 / n)
    assert mde_at(sigma, [("a", "b")], n) == pytest.approx(expect)


def test_only_final_and_start_metrics_decide_identity_and_time_memory_never_do():
    base = {"0": {"final/h/pass_at_1": 0.2, "start/h/pass_at_1": 0.1, "train/loss": 1.0,
                  "final/wall_s": 5.0, "final/time_rollout_s": 2.0, "final/peak_rss_mb": 9.0,
                  "final/warm_start_s": 1.0}}
    noisy = {"0": {**base["0"], "train/loss": 2.0, "final/wall_s": 6.0,
                   "final/time_rollout_s": 3.0, "final/peak_rss_mb": 10.0,
                   "final/warm_start_s": 2.0}}
    assert identical_to(noisy, base)
    assert not identical_to({"0": {**base["0"], "start/h/pass_at_1": 0.11}}, base)
    missing = {"0": {k: v for k, v in base["0"].items() if k != "final/h/pass_at_1"}}
    assert not identical_to(missing, base)
    only_time = {"0": {"final/wall_s": 1.0, "train/loss": 1.0}}
    assert not identical_to(only_time, only_time)  # nothing to compare: not shown identical
    two = {"0": base["0"], "1": {**base["0"], "final/h/pass_at_1": 0.3}}
    assert not identical_to(two, {"0": base["0"], "1": base["0"]})  # every shared seed counts


def _half_and_same(scale: float = 1.0) -> dict[str, dict[str, float]]:
    """A row 0.0025 above the baseline on average, one equal to it, one in between (times
    ``scale``); unrounded, the solve puts the equal row at about -1e-16 on this design."""
    base = [0.2, 0.3, 0.25, 0.4, 0.1, 0.15]
    wiggle = [0.01, -0.01, 0.02, -0.02, 0.0, 0.003]
    mean = sum(wiggle) / 6
    return {"grpo": {str(s): scale * v for s, v in enumerate(base)},
            "half": {str(s): scale * (v + 0.0025 + w - mean)
                     for s, (v, w) in enumerate(zip(base, wiggle))},
            "mid": {str(s): scale * (v + w / 2) for s, (v, w) in enumerate(zip(base, wiggle))},
            "same": {str(s): scale * v for s, v in enumerate(base)}}


_PAIRS = [("half", "grpo"), ("mid", "grpo"), ("same", "grpo")]


def test_an_exact_zero_or_half_difference_is_estimated_exactly_not_with_blas_rounding():
    """The least-squares solve leaves ~1e-17 of rounding that differs between BLAS builds: a
    row equal to the baseline came out -1e-16 (printed -0.000) and a difference of 0.0025
    either side of the half (+0.002 on one machine, +0.003 on another). Estimates and SEs sit
    on a grid of 1e-12 of the data's scale, so both are exact, and a zero is +0."""
    got = {c.row: c for c in analyse(_half_and_same(), _PAIRS).comparisons}
    assert got["same"].estimate == 0.0 and math.copysign(1.0, got["same"].estimate) == 1.0
    assert got["half"].estimate == pytest.approx(0.0025, abs=1e-15)
    assert got["half"].estimate == round(0.0025 / 1e-12) * 1e-12
    assert got["half"].se == round(got["half"].se / 1e-12) * 1e-12


def test_the_estimates_grid_scales_with_the_data():
    """Token counts are ~1e5, so their rounding noise is ~1e-11: the grid is 1e-12 of the
    largest value, not 1e-12 absolute (which would keep the noise)."""
    quantum = 1e-12 * 1e5 * 0.4  # max |y|: the baseline's 0.4 at seed 3, times the scale
    for c in analyse(_half_and_same(1e5), _PAIRS).comparisons:
        assert c.estimate / quantum == pytest.approx(round(c.estimate / quantum), abs=1e-6)
        assert c.se / quantum == pytest.approx(round(c.se / quantum), abs=1e-6)
