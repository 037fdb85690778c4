"""The claims ledger's verdict rules (harness/report/claims_ledger.py, rules 2-5) at their
edges, on pages built in memory: an interval's ends, the direction a control must move in, the
column a budget-read page is read from, the numbers a page prints, and the reason each verdict
gives. The mutation run (benchmarks/mutation.py) showed these unguarded by the end-to-end tests in
test_claims_ledger.py."""

from __future__ import annotations

import math

import pytest

from harness.report.claims_ledger import (
    FAILED,
    INCONCLUSIVE,
    NOT_SHOWN,
    NOT_TESTABLE,
    PENDING,
    SHOWN,
    UNTESTED,
    Page,
    Reading,
    _num,
    _title,
    claimed_effect,
    controls,
    curve_result,
    judge_claim,
    read_curve,
    read_row,
    row_result,
)

METRIC = "heldout/pass_at_1"
CONFIRMATORY = "**Confirmatory**: the reason"


def _rec(label: str, est=0.0, low=-0.01, high=0.01, mde=0.02, sig=False, baseline="grpo",
         identical="") -> dict[str, str]:
    return {"row": label, "baseline": baseline, "n_seeds": "5",
            f"{METRIC}/final_mean": "2.0", f"{METRIC}/at_budget_mean": "1.5",
            "primary_identical_to": identical, "primary_estimate": str(est),
            "primary_low": str(low), "primary_high": str(high),
            "primary_p_adjusted": "0.01" if sig else "0.5", "primary_mde": str(mde),
            "primary_significant": "1" if sig else "0"}


def _page(*recs: dict, at_budget: bool = False, status: str = CONFIRMATORY,
          curves: dict | None = None) -> Page:
    rows = {"grpo": _rec("grpo", baseline=""), **{r["row"]: r for r in recs}}
    return Page("leaderboards/bed/task/tiny", rows, False, status, "heldout pass@1",
                "Reproduce: x", curves=curves or {}, at_budget=at_budget)


def _track(low: float, high: float) -> Page:
    rec = {"agent": "lantern", "seeds": "5", "diff AUC vs base": str((low + high) / 2),
           "diff AUC vs base low": str(low), "diff AUC vs base high": str(high), "AUC": "0.5"}
    return Page("leaderboards/lantern/x", {"lantern": rec, "base": {"agent": "base"}}, True,
                "", "", "Reproduce: x")


def _reading(est: float, low: float, high: float, mde: float = 0.02, sig: bool = False
             ) -> Reading:
    return Reading("m", "grpo", "5", est, low, high, 0.01 if sig else 0.5, mde, sig)


def _claim(evidence: list[dict], unit: str = "0.03 in the boards' units", number=3.0,
           gpu_only: bool = False, metric: str = METRIC) -> dict:
    return {"claim_unit": unit, "claim_number": number, "gpu_only": gpu_only,
            "primary": {"metric": metric}, "evidence": evidence}


# -- numbers as a page prints them ----------------------------------------------------------


def test_page_numbers_are_read_with_exponents_and_anything_else_is_nan():
    assert _num("1.5e-05") == pytest.approx(1.5e-5)
    assert _num("-0.031") == -0.031
    assert math.isnan(_num("nan"))
    for text in ("", None, "—", "12 runs", "0.1 (p)"):
        assert math.isnan(_num(text))


def test_a_metric_without_a_group_is_its_own_title():
    assert _title("episodes") == "episodes"
    assert _title(METRIC) == "heldout pass@1"


# -- rule 2: the claimed effect --------------------------------------------------------------


def test_percent_fewer_is_the_exact_share_of_the_baselines_mean():
    page = _page(_rec("m"))
    c, text = claimed_effect(_claim([], unit="percent fewer tool calls", number=25.0), page,
                             {"metric": METRIC}, "grpo")
    assert c == pytest.approx(-0.25 * 2.0, rel=1e-12)
    assert "25% below `grpo`'s mean on this page, 2.000" in text


def test_a_page_read_at_the_budget_takes_the_baselines_mean_at_the_budget():
    page = _page(_rec("m"), at_budget=True)
    c, text = claimed_effect(_claim([], unit="percent fewer tool calls", number=10.0), page,
                             {"metric": METRIC}, "grpo")
    assert c == pytest.approx(-0.10 * 1.5, rel=1e-12) and text.endswith("1.500")


# -- rule 3: which row decides ---------------------------------------------------------------


def test_a_row_identical_to_its_baseline_is_blocked_saying_so():
    page = _page(_rec("m", est=0.0, low=0.0, high=0.0, identical="grpo"))
    r = read_row(page, {"metric": METRIC}, "m")
    assert r.blocked == "identical to its baseline in every run (not tested)"
    assert read_row(_page(_rec("m")), {"metric": METRIC}, "m").blocked == ""


@pytest.mark.parametrize("low, high, significant", [
    (0.5, 1.5, True), (-1.5, -0.5, True), (0.0, 1.0, False), (-1.0, 0.0, False),
    (-0.5, 0.5, False)])
def test_a_track_rows_interval_is_significant_only_when_it_excludes_zero(low, high,
                                                                          significant):
    r = read_row(_track(low, high), {"metric": "final/auc", "baseline": "base"}, "lantern")
    assert r.significant is significant
    assert (r.low, r.high) == (low, high)


@pytest.mark.parametrize("low, high, significant", [
    (0.2, 1.2, True), (-1.2, -0.2, True), (0.0, 1.0, False), (-1.0, 0.0, False)])
def test_a_slope_is_significant_only_when_its_interval_excludes_zero(low, high, significant):
    curve = {"est": str((low + high) / 2), "low": str(low), "high": str(high), "p": "0.01",
             "mde": "0.3", "n": "12", "y": "entropy"}
    r = read_curve(_page(curves={"c": curve}), {"curve": "c"})
    assert r.significant is significant


def test_a_curve_on_a_page_read_at_the_budget_is_still_read_at_its_final_values():
    """A curve is of final values: the claim names its metric plainly, and the page's budget
    reading of its primary does not apply to it."""
    curve = {"est": "1.0", "low": "0.8", "high": "1.2", "p": "0.0", "mde": "0.2", "n": "12",
             "y": "heldout/pass_at_1"}
    page = _page(at_budget=True, curves={"c": curve})
    page.declared_controls = "controls passed"
    ev = {"board": page.path, "curve": "c", "metric": METRIC, "claimed": 1.0}
    verdict, _, blocks = judge_claim(_claim([ev]), {page.path: page})
    assert verdict == SHOWN and not blocks[0][4][0].blocked


# -- rule 4: controls ------------------------------------------------------------------------

CONTROL_ROWS = {"positive": "pos", "aa": "aa"}


def _controls(pos_est: float, aa_est: float, aa_sig: bool, sign: int = 1) -> str:
    page = _page(_rec("pos", pos_est, *sorted([pos_est - 0.01, pos_est + 0.01]), sig=True),
                 _rec("aa", aa_est, *sorted([aa_est - 0.01, aa_est + 0.01]), sig=aa_sig))
    return controls(page, {"metric": METRIC, "controls": CONTROL_ROWS}, sign)


def test_controls_pass_when_the_handicap_is_seen_against_the_claim_and_aa_is_not_seen():
    assert _controls(-0.05, 0.0, False) == ""
    assert _controls(+0.05, 0.0, False, sign=-1) == ""  # a claim of fewer: worse is more


def test_a_positive_control_seen_in_the_claimed_direction_is_not_detected():
    """The handicapped copy must be worse; one that comes out better (here by 0.5, less than
    one unit) says the testbed moves the wrong way."""
    assert _controls(+0.5, 0.0, False) == \
        "controls failed (positive `pos` not detected; A/A `aa` not detected)"


@pytest.mark.parametrize("aa_est", [+0.05, -0.05])
def test_an_aa_difference_seen_in_either_direction_fails_the_controls(aa_est):
    assert _controls(-0.05, aa_est, True) == \
        "controls failed (positive `pos` detected; A/A `aa` detected)"


def test_a_missing_control_row_is_named():
    page = _page(_rec("pos", -0.05, -0.06, -0.04, sig=True))
    said = controls(page, {"metric": METRIC, "controls": {"positive": "pos"}}, 1)
    assert said == "controls not run (positive `pos` detected; no A/A control row on this page)"


# -- rule 5: a deciding row and a slope ------------------------------------------------------


@pytest.mark.parametrize("low, high", [(0.03, 0.08), (-0.02, 0.03)])
def test_a_claim_on_the_intervals_end_is_held_by_it(low, high):
    """C = 0.03 at either end of the interval: the interval holds C, so with an MDE above |C|
    the row is inconclusive, not *not shown*."""
    assert row_result(_reading((low + high) / 2, low, high, mde=0.05), 0.03, 1) == INCONCLUSIVE
    assert row_result(_reading((low + high) / 2, low, high, mde=0.03), 0.03, 1) == NOT_SHOWN


def test_a_slope_claim_on_the_intervals_end_is_held_by_it():
    assert curve_result(_reading(1.2, 1.0, 1.4, sig=True), 1.0) == SHOWN
    assert curve_result(_reading(0.7, 0.4, 1.0, sig=True), 1.0) == SHOWN
    assert curve_result(_reading(0.5, 0.3, 0.7, sig=True), 1.0) == NOT_SHOWN
    assert curve_result(_reading(0.5, -0.2, 1.2), 1.0) == INCONCLUSIVE


# -- the reason each verdict gives -----------------------------------------------------------


def test_no_evidence_says_why_in_its_reason():
    assert judge_claim(_claim([], gpu_only=True), {})[:2] == (
        NOT_TESTABLE, "no committed board tests it and it needs the GPU suite")
    assert judge_claim(_claim([]), {})[:2] == (UNTESTED, "no testbed run yet: no board tests it")


def test_rows_that_cannot_decide_are_listed_in_the_reason():
    page = _page(_rec("m"), _rec("n", identical="grpo"))
    ev = [{"board": page.path, "rows": ["m"], "metric": "tool_calls_per_traj"},
          {"board": page.path, "rows": ["n"], "metric": METRIC}]
    page.declared_controls = "controls passed"
    page.rows["m"].update({"tool_calls_per_traj/vs_baseline_mean": "0.1",
                           "tool_calls_per_traj/vs_baseline_low": "0.0",
                           "tool_calls_per_traj/vs_baseline_high": "0.2"})
    verdict, reason, _ = judge_claim(_claim(ev, metric=METRIC), {page.path: page})
    assert verdict == UNTESTED
    assert reason == ("no row decides: a secondary column of its page (a descriptive paired "
                      "interval: no test, no MDE); identical to its baseline in every run "
                      "(not tested)")


def test_controls_that_block_rows_on_two_pages_are_both_named_in_the_reason():
    failed, unrun = _page(_rec("m", 0.05, 0.04, 0.06, sig=True)), \
        _page(_rec("m", 0.05, 0.04, 0.06, sig=True))
    failed.path, unrun.path = "leaderboards/a/t/tiny", "leaderboards/b/t/tiny"
    failed.declared_controls = "controls failed"
    ev = [{"board": failed.path, "rows": ["m"], "metric": METRIC},
          {"board": unrun.path, "rows": ["m"], "metric": METRIC}]
    verdict, reason, _ = judge_claim(_claim(ev), {failed.path: failed, unrun.path: unrun})
    assert verdict == PENDING
    assert reason.startswith("controls failed and controls not run on its testbeds, so "
                             "neither *shown* nor *not shown* can be given")
    assert reason.endswith("would give *shown*")
    failed_only = judge_claim(_claim(ev[:1]), {failed.path: failed})
    assert failed_only[0] == FAILED and failed_only[1].startswith("controls failed on its")
