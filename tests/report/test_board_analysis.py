"""The board's confirmatory analysis (harness/report/analysis.py, issue 31): the seed-blocked
model's estimates and errors, the single-step max-|t| family correction (Dunnett many-to-one),
its error rate and power by simulation, the seeds a pilot says are needed, and the detection of
rows identical by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from harness.report import analysis
from harness.report.analysis import analyse, critical_value, identical_to, mde_at, seeds_needed


def _board(rng, rows: int, seeds: int, effects=None, sd: float = 0.01, seed_sd: float = 0.03):
    """row -> seed -> value: a common level, a seed effect every row shares, noise."""
    block = rng.normal(0.0, seed_sd, seeds)
    effects = effects or {}
    return {f"r{i}": {str(s): 0.2 + block[s] + effects.get(f"r{i}", 0.0) + rng.normal(0, sd)
                      for s in range(seeds)} for i in range(rows)}


def _many_to_one(rows: int) -> list[tuple[str, str]]:
    return [(f"r{i}", "r0") for i in range(1, rows)]


@pytest.fixture
def fewer_draws(monkeypatch):
    monkeypatch.setattr(analysis, "_DRAWS", 20_000)


def test_dunnett_critical_value_matches_the_multivariate_t_integral():
    """18 rows, one baseline, 5 seeds: 17 comparisons correlated 0.5, 68 residual df: c = 2.94
    (the figure of issue 31); the Monte-Carlo tail agrees with scipy's numerical integral."""
    k, df = 17, 68
    corr = np.full((k, k), 0.5) + 0.5 * np.eye(k)
    c = critical_value(corr, df)
    assert c == pytest.approx(2.94, abs=0.01)
    inside = st.multivariate_t.cdf(np.full(k, c), shape=corr, df=df,
                                   lower_limit=np.full(k, -c), random_state=1)
    assert inside == pytest.approx(0.95, abs=0.003)
    # one comparison: exactly Student-t
    assert critical_value(np.eye(1), 10) == pytest.approx(st.t.ppf(0.975, 10))


def test_estimates_are_paired_differences_and_the_error_pools_every_row():
    rng = np.random.default_rng(0)
    data = _board(rng, rows=4, seeds=6)
    result = analyse(data, _many_to_one(4))
    assert result.df == (4 - 1) * (6 - 1)
    for comp in result.comparisons:
        paired = np.mean([data[comp.row][s] - data["r0"][s] for s in data["r0"]])
        assert comp.estimate == pytest.approx(paired)
        assert comp.se == pytest.approx(result.sigma * math.sqrt(2 / 6))
        assert comp.t == pytest.approx(comp.estimate / comp.se)
        # the simultaneous interval excludes 0 exactly when the adjusted p is below alpha
        assert comp.significant == (comp.p_adjusted < 0.05)
    # the shared seed effect is absorbed: sigma is the noise (0.01), not the seed spread (0.03)
    assert result.sigma < 0.02


@pytest.mark.slow
def test_the_family_error_rate_holds_and_uncorrected_tests_would_break_it(fewer_draws):
    """Six identical rows (no true difference), 5 seeds, 300 boards: the chance of any
    significant comparison stays near 5%; per-comparison t-tests would make it ~20%."""
    rng = np.random.default_rng(1)
    any_adjusted = any_raw = 0
    for _ in range(300):
        result = analyse(_board(rng, rows=6, seeds=5), _many_to_one(6))
        any_adjusted += any(c.significant for c in result.comparisons)
        raw = [2 * st.t.sf(abs(c.t), result.df) for c in result.comparisons]
        any_raw += any(p < 0.05 for p in raw)
    assert any_adjusted / 300 <= 0.085
    assert any_raw / 300 >= 0.12


def test_an_effect_of_one_mde_is_detected_with_the_declared_power(fewer_draws):
    rng = np.random.default_rng(2)
    contrasts = _many_to_one(5)
    mde = mde_at(0.01, contrasts, seeds=8)
    hits = 0
    for _ in range(200):
        result = analyse(_board(rng, rows=5, seeds=8, effects={"r1": mde}), contrasts)
        hits += next(c for c in result.comparisons if c.row == "r1").significant
    assert 0.68 <= hits / 200 <= 0.92


@pytest.mark.slow
def test_seeds_needed_is_the_fewest_seeds_whose_mde_reaches_the_effect():
    contrasts = _many_to_one(18)
    n = seeds_needed(0.0133, contrasts, 0.02)
    assert mde_at(0.0133, contrasts, n) <= 0.02 < mde_at(0.0133, contrasts, n - 1)
    assert seeds_needed(0.0133, contrasts, 0.01) > n  # half the effect: more seeds
    assert seeds_needed(0.5, contrasts, 0.001, most=50) is None
    with pytest.raises(ValueError):
        seeds_needed(0.01, contrasts, 0.0)


def test_the_mde_printed_by_the_analysis_is_the_planning_mde_at_its_seeds():
    rng = np.random.default_rng(3)
    contrasts = _many_to_one(5)
    result = analyse(_board(rng, rows=5, seeds=7), contrasts)
    assert result.mde == pytest.approx(mde_at(result.sigma, contrasts, 7), rel=0.01)


def test_no_test_without_residual_degrees_of_freedom_or_variance():
    one_seed = {"a": {"0": 0.1}, "b": {"0": 0.2}}
    result = analyse(one_seed, [("a", "b")])
    assert not result.comparisons and "degrees of freedom" in result.note
    flat = {"a": {"0": 0.1, "1": 0.2}, "b": {"0": 0.15, "1": 0.25}}  # same shift on every seed
    result = analyse(flat, [("a", "b")])
    assert not result.comparisons and "no residual variance" in result.note
    assert analyse({"a": {"0": 0.1}}, [("a", "missing")]).note


def test_rows_identical_by_construction_are_detected_bit_for_bit():
    base = {"0": {"final/h/pass_at_1": 0.2, "final/tokens_total": 100.0, "final/wall_s": 5.0},
            "1": {"final/h/pass_at_1": 0.3, "final/tokens_total": 90.0, "final/wall_s": 6.0}}
    same = {s: {**m, "final/wall_s": m["final/wall_s"] + 1} for s, m in base.items()}
    assert identical_to(same, base)  # time differs between identical runs
    off = {s: dict(m) for s, m in same.items()}
    off["1"]["final/h/pass_at_1"] = np.nextafter(0.3, 1.0)
    assert not identical_to(off, base)
    assert not identical_to({"9": base["0"]}, base)  # no shared seed: not shown identical


def test_adjusted_p_is_the_family_max_t_tail_not_the_single_test_p():
    rng = np.random.default_rng(4)
    data = _board(rng, rows=6, seeds=5, effects={"r1": 0.02, "r2": 0.012})
    result = analyse(data, _many_to_one(6))
    k = len(result.comparisons)
    corr = np.full((k, k), 0.5) + 0.5 * np.eye(k)  # many-to-one, complete design
    for comp in result.comparisons:
        bound = abs(comp.t)
        inside = st.multivariate_t.cdf(np.full(k, bound), shape=corr, df=result.df,
                                       lower_limit=np.full(k, -bound), random_state=1)
        assert comp.p_adjusted == pytest.approx(1.0 - inside, abs=0.004)
        single = 2 * st.t.sf(bound, result.df)
        assert comp.p_adjusted >= single - 1e-9
        if single < 0.2:
            assert comp.p_adjusted > 1.5 * single  # the family's price is paid


def test_a_contrast_the_design_cannot_estimate_is_dropped_not_reported():
    rng = np.random.default_rng(5)
    data = _board(rng, rows=3, seeds=5)
    data["lonely"] = {"9": 0.9}  # a seed no other row has: a_lonely is confounded with it
    result = analyse(data, [*_many_to_one(3), ("lonely", "r0")])
    assert {c.row for c in result.comparisons} == {"r1", "r2"}
    data["empty"] = {"0": math.nan, "1": math.nan}
    assert "empty" not in {c.row for c in analyse(data, [("empty", "r0")]).comparisons}


def test_seed_labels_are_strings_and_missing_values_do_not_count_as_seeds():
    rng = np.random.default_rng(6)
    data = _board(rng, rows=3, seeds=6)
    ints = {r: {int(s): v for s, v in by.items()} for r, by in data.items()}
    as_int = analyse(ints, _many_to_one(3))
    as_str = analyse(data, _many_to_one(3))
    assert [c.estimate for c in as_int.comparisons] == [c.estimate for c in as_str.comparisons]
    data["r1"]["3"] = math.nan
    comp = next(c for c in analyse(data, _many_to_one(3)).comparisons if c.row == "r1")
    assert comp.n == 5
