"""The claims ledger (issue 36, item 3): docs/claims.md generated from the pre-registered claims
and the committed boards' CSVs by harness/report/claims_ledger.py, under the verdict rules its
docstring and docs/claims/README.md declare; `rlbench claims` regenerates it."""

from __future__ import annotations

import csv
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.report.claims_ledger import (
    FAILED,
    INCONCLUSIVE,
    NOT_SHOWN,
    NOT_TESTABLE,
    PENDING,
    SHOWN,
    UNTESTED,
    judge_claim,
    load_claims,
    render,
)
from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
LEDGER = ROOT / "docs" / "claims.md"
CONTROLS = {"positive": "grpo@lr_tenth", "aa": "grpo@aa"}
COLUMNS = ["row", "baseline", "n_seeds", "heldout/pass_at_1/final_mean",
           "heldout/pass_at_1/at_budget_mean",
           "tool_calls_per_traj/final_mean", "tool_calls_per_traj/vs_baseline_mean",
           "tool_calls_per_traj/vs_baseline_low", "tool_calls_per_traj/vs_baseline_high",
           "primary_identical_to", "primary_estimate", "primary_low", "primary_high",
           "primary_p_adjusted", "primary_mde", "primary_significant"]


def _row(label, est=0.0, low=-0.01, high=0.01, mde=0.02, sig=False, baseline="grpo"):
    """A CSV row; every row's mean is 2.0 (a claim in percent is read against it)."""
    return {"row": label, "baseline": baseline, "n_seeds": "5",
            "heldout/pass_at_1/final_mean": 2.0, "heldout/pass_at_1/at_budget_mean": 1.5,
            "tool_calls_per_traj/final_mean": 2.0,
            "tool_calls_per_traj/vs_baseline_mean": est, "tool_calls_per_traj/vs_baseline_low": low,
            "tool_calls_per_traj/vs_baseline_high": high, "primary_identical_to": "",
            "primary_estimate": est, "primary_low": low, "primary_high": high,
            "primary_p_adjusted": 0.01 if sig else 0.5, "primary_mde": mde,
            "primary_significant": int(sig)}


def _board(root: Path, rows: list[dict], status: str = "Confirmatory", worse: int = -1) -> str:
    """A board page folder in ``root``: the CSV, the page's plan lines, the README's
    Reproduce line; with an A/A row and a positive control row detected in direction ``worse``
    (the handicapped baseline is worse: lower, or higher where fewer is the claim)."""
    page = root / "leaderboards" / "bed" / "task" / "tiny"
    page.mkdir(parents=True, exist_ok=True)
    rows = [_row("grpo", baseline=""), *rows,
            _row(CONTROLS["positive"], 0.05 * worse, *sorted([0.03 * worse, 0.07 * worse]),
                 sig=True), _row(CONTROLS["aa"])]
    with open(page / "leaderboard.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (page / "leaderboard.md").write_text(
        f"# task / tiny\n\n- Primary metric: heldout pass@1 (last evaluation).\n"
        f"- **{status}**: the reason.\n")
    (root / "leaderboards" / "bed" / "README.md").write_text(
        "- Reproduce (from the repository root): `rlbench sweep sweep=bed`, then "
        "`rlbench board --experiment bed --out leaderboards/bed`.\n")
    return "leaderboards/bed/task/tiny"


def _judge(root: Path, evidence: list[dict], unit: str = "points; 0.03 in the boards' units",
           number: float | None = 3.0, gpu_only: bool = False,
           metric: str = "heldout/pass_at_1") -> tuple[str, str]:
    entry = {"paper": "A 2026", "methods": ["m"], "claim": "m beats grpo.",
             "claim_number": number, "claim_unit": unit,
             "testbed": {"sweep": "bed", "status": "existing", "why": "it can"},
             "primary": {"metric": metric, "comparison": "m vs grpo", "test": "Dunnett"},
             "cannot_show": "much", "gpu_only": gpu_only, "evidence": evidence}
    (root / "docs" / "claims").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "claims" / "m.yaml").write_text(yaml.safe_dump(entry))
    claims, pages = load_claims(root)
    verdict, reason, _ = judge_claim(claims[0], pages)
    return verdict, reason


def _one(root: Path, controls: dict | None = CONTROLS, status: str = "Confirmatory",
         metric: str = "heldout/pass_at_1", worse: int = -1, **row) -> list[dict]:
    ev = {"board": _board(root, [_row("m", **row)], status, worse), "rows": ["m"],
          "metric": metric}
    return [{**ev, "controls": controls}] if controls else [ev]


# -- the verdict rules, each on a synthetic board -----------------------------------------------
def test_significant_in_the_claimed_direction_is_shown(tmp_path):
    assert _judge(tmp_path, _one(tmp_path, est=0.01, low=0.002, high=0.018, sig=True))[0] == SHOWN


def test_significant_against_the_claimed_direction_is_not_shown(tmp_path):
    ev = _one(tmp_path, est=-0.01, low=-0.018, high=-0.002, sig=True)
    assert _judge(tmp_path, ev)[0] == NOT_SHOWN
    assert _judge(tmp_path, ev, unit="none retrieved", number=None)[0] == NOT_SHOWN  # C unknown


def test_not_significant_with_the_mde_at_or_below_the_claim_is_not_shown(tmp_path):
    ev = _one(tmp_path, est=0.01, low=-0.005, high=0.035, mde=0.03)  # the interval holds C
    assert _judge(tmp_path, ev)[0] == NOT_SHOWN


def test_an_interval_that_excludes_the_claim_is_not_shown_whatever_the_mde(tmp_path):
    ev = _one(tmp_path, est=0.0, low=-0.02, high=0.02, mde=0.05)
    assert _judge(tmp_path, ev)[0] == NOT_SHOWN


def test_an_mde_above_the_claim_with_the_claim_inside_the_interval_is_inconclusive(tmp_path):
    ev = _one(tmp_path, est=0.01, low=-0.03, high=0.05, mde=0.04)
    assert _judge(tmp_path, ev)[0] == INCONCLUSIVE
    assert _judge(tmp_path, ev, unit="none retrieved", number=None)[0] == INCONCLUSIVE


def test_no_evidence_is_not_testable_when_gpu_only_else_inconclusive(tmp_path):
    assert _judge(tmp_path, [], gpu_only=True)[0] == NOT_TESTABLE
    verdict, reason = _judge(tmp_path, [])
    assert verdict == UNTESTED and "no testbed run yet" in reason


@pytest.mark.parametrize("controls, said", [
    (None, "controls not run"),
    ({"positive": CONTROLS["positive"]}, "controls not run"),
    ({"positive": CONTROLS["aa"], "aa": CONTROLS["aa"]}, "controls failed"),  # not detected
    ({"positive": CONTROLS["positive"], "aa": CONTROLS["positive"]}, "controls failed"),
])
def test_without_passing_controls_no_row_is_shown_or_not_shown(tmp_path, controls, said):
    shown = _one(tmp_path, controls, est=0.01, low=0.002, high=0.018, sig=True)
    verdict, reason = _judge(tmp_path, shown)
    assert verdict == (PENDING if said == "controls not run" else FAILED)
    assert said in reason and "would give *shown*" in reason
    not_shown = _one(tmp_path, controls, est=0.0, low=-0.01, high=0.01, mde=0.01)
    verdict, reason = _judge(tmp_path, not_shown)
    assert verdict in (PENDING, FAILED) and f"would give *{NOT_SHOWN}*" in reason


@pytest.mark.parametrize("kw, why", [
    ({"status": "Descriptive only"}, "descriptive only"),
    ({"metric": "tool_calls_per_traj"}, "secondary column"),  # not the page's primary
])
def test_a_row_that_is_not_confirmatory_decides_nothing(tmp_path, kw, why):
    ev = _one(tmp_path, est=0.01, low=0.002, high=0.018, sig=True, **kw)
    verdict, reason = _judge(tmp_path, ev, metric=kw.get("metric", "heldout/pass_at_1"))
    assert verdict == UNTESTED and why in reason


def test_a_row_read_on_another_metric_than_the_claims_primary_decides_nothing(tmp_path):
    ev = _one(tmp_path, est=0.01, low=0.002, high=0.018, sig=True)
    verdict, reason = _judge(tmp_path, ev, metric="heldout/pass_at_1 at the budget")
    assert verdict == UNTESTED and "not the claim's primary metric" in reason


def test_percent_fewer_is_read_against_the_baselines_mean_in_the_lower_direction(tmp_path):
    """C = -50% of grpo's mean 2.0 = -1.0, and lower is the claimed direction."""
    unit = "percent fewer tool calls than GRPO"
    ev = _one(tmp_path, worse=1, est=-0.5, low=-0.8, high=-0.2, sig=True)
    assert _judge(tmp_path, ev, unit=unit, number=50)[0] == SHOWN
    ev = _one(tmp_path, worse=1, est=0.5, low=0.2, high=0.8, sig=True)  # more calls
    assert _judge(tmp_path, ev, unit=unit, number=50)[0] == NOT_SHOWN
    ev = _one(tmp_path, worse=1, est=-0.5, low=-0.9, high=-0.1, mde=1.2)  # |C| < MDE, C outside
    assert _judge(tmp_path, ev, unit=unit, number=50)[0] == NOT_SHOWN
    ev = _one(tmp_path, worse=1, est=-0.5, low=-1.1, high=0.1, mde=1.2)  # C inside
    assert _judge(tmp_path, ev, unit=unit, number=50)[0] == INCONCLUSIVE


# -- the committed page --------------------------------------------------------------------------
def _generated() -> str:
    claims, pages = load_claims(ROOT)
    return render(claims, pages, LEDGER, ROOT)


def test_the_committed_ledger_is_what_the_generator_writes_now():
    """A hand edit or a stale page (a board or claim file changed since) fails here:
    `rlbench claims` regenerates it."""
    assert LEDGER.read_text() == _generated()


def test_the_ledger_says_it_is_generated_and_gives_a_verdict_for_each_of_the_nine_methods():
    text = LEDGER.read_text()
    assert text.startswith("> Generated by `rlbench claims`") and "rlbench claims --out" in \
        text.splitlines()[0]
    verdicts = re.findall(r"^\| \[(\w+)\]\(#\1\) \| (.+?) \| \*(.+?)\* \|", text, re.M)
    methods = {m for _, ms, _ in verdicts for m in re.findall(r"`([^`]+)`", ms)}
    assert {"lpo_fwd", "lpo_rev", "agpo", "grpo_aem", "lope", "arpo", "aepo",
            "arbitrary_entropy", "lantern"} <= methods
    assert {v for *_, v in verdicts} <= {SHOWN, NOT_SHOWN, INCONCLUSIVE, NOT_TESTABLE, PENDING,
                                         UNTESTED, FAILED}


def _numbers(line: str) -> list[str]:
    plain = re.sub(r"`[^`]*`|\]\([^)]*\)", " ", line)  # code spans and link targets
    return re.findall(r"[-+]?\d+(?:\.\d+)?", plain)


def _matches(token: str, cells: list[str]) -> bool:
    d = len(token.split(".")[1]) if "." in token else 0
    spec = f"{'+' if token[0] in '+-' else ''}.{d}f"
    for cell in cells:
        try:
            if format(float(cell), spec) == token or cell == token:
                return True
        except ValueError:
            continue
    return False


def test_every_number_under_a_board_is_read_from_the_csv_it_cites():
    """Table rows: each number is a cell of that row in the cited CSV (at the printed decimals),
    a curve's slope row from that curve's slope line on the cited page. Other lines: from the
    CSV, the cited page or README, or the claim file."""
    claim_text = {p.stem: p.read_text() for p in (ROOT / "docs" / "claims").glob("*.yaml")}
    stem, csv_rows, quoted, checked = "", {}, "", 0
    for line in LEDGER.read_text().splitlines():
        if m := re.match(r'<a id="(\w+)">', line):
            stem, csv_rows, quoted = m[1], {}, ""
        elif m := re.match(r"### \[[^\]]+\]\(\.\./(leaderboards/[^)]+)/leaderboard\.md\)", line):
            page = ROOT / m[1]
            with open(page / "leaderboard.csv", newline="") as f:
                csv_rows = {r.get("row") or r["agent"]: list(r.values()) for r in csv.DictReader(f)}
            quoted = (page / "leaderboard.md").read_text() + (
                ROOT / "leaderboards" / m[1].split("/")[1] / "README.md").read_text()
        elif csv_rows and (m := re.match(r"\| `slope of ([\w.-]+)` \|", line)):
            # a response curve's slope: quoted from that curve's slope line on its page
            slope = re.search(rf"^### {re.escape(m[1])}: .*?^(- Slope: .*)$", quoted,
                              re.M | re.S)
            assert slope, (stem, m[1])
            for token in _numbers(line):  # a whole number of the line, not a prefix of one
                assert re.search(rf"(?<![\d.]){re.escape(token)}(?![\d])", slope[1]), \
                    (stem, m[1], token)
                checked += 1
        elif csv_rows and (m := re.match(r"\| `([^`]+)` \|", line)):
            for token in _numbers(line):
                assert _matches(token, csv_rows[m[1]]), (stem, m[1], token)
                checked += 1
        else:
            everything = [c for cells in csv_rows.values() for c in cells]
            sources = quoted + "".join(claim_text.values() if not stem else [claim_text[stem]])
            for token in _numbers(line):
                assert token in sources or _matches(token, everything), (stem, token, line)
    assert checked > 100


def test_each_board_is_linked_with_its_readmes_two_reproduce_commands():
    text = LEDGER.read_text()
    boards = re.findall(r"^### \[[^\]]+\]\(\.\./(leaderboards/[^)]+)/leaderboard\.md\)\n\n"
                        r".*\n- (Reproduce.*)\.$", text, re.M)
    assert len(boards) == sum(len(c["evidence"]) for c in load_claims(ROOT)[0])
    for page, line in boards:
        assert (ROOT / page / "leaderboard.md").is_file()
        # the run command(s) (the LANTERN track: its sweep and its A/A's), then the board's
        commands = re.findall(r"`[^`]*(?:rlbench|python) [^`]+`", line)
        assert len(commands) >= 2 and "rlbench board " in commands[-1], line
        assert line in (ROOT / "leaderboards" / page.split("/")[1] / "README.md").read_text()


# -- the command ---------------------------------------------------------------------------------
OFF = "leaderboards/testbed-offpolicy/countdown-tiny/tiny"


@pytest.mark.parametrize("text, needle", [
    ("evidence: [{board: leaderboards/nope, rows: [a], metric: m}]\n", "m.yaml: evidence[0].board"),
    (f"evidence: [{{board: {OFF}, rows: [nope], metric: heldout/pass_at_1}}]\n",
     "m.yaml: evidence[0].rows: no row 'nope'"),
    (f"evidence: [{{board: {OFF}, rows: [agpo], metric: heldout/nope}}]\n",
     "m.yaml: evidence[0].metric: 'heldout/nope'"),
    ("claim: [unclosed\n", "m.yaml: not YAML"),
    ("paper: x\n", "m.yaml: evidence: a list"),
])
def test_bad_claim_input_is_one_line_naming_the_file_and_key_and_exit_2(
        tmp_path, rlbench_in_process, text, needle):
    entry = yaml.safe_load((ROOT / "docs" / "claims" / "agpo.yaml").read_text())
    entry.pop("evidence")
    (tmp_path / "docs" / "claims").mkdir(parents=True)
    (tmp_path / "docs" / "claims" / "m.yaml").write_text(
        (yaml.safe_dump(entry) + text) if "evidence" in text else text)
    (tmp_path / "leaderboards").symlink_to(ROOT / "leaderboards")
    done = rlbench_in_process("claims", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_rlbench_claims_writes_the_ledger_and_says_whether_it_changed(tmp_path, rlbench_in_process):
    out = tmp_path / "claims.md"
    first = rlbench_in_process("claims", "--out", str(out), cwd=ROOT)
    again = rlbench_in_process("claims", "--out", str(out), cwd=ROOT)
    assert first.returncode == again.returncode == 0
    assert "(changed)" in first.stdout and "(unchanged)" in again.stdout
    assert out.read_text().startswith("> Generated by `rlbench claims`")


@pytest.mark.slow
def test_rebuild_boards_reports_a_stale_ledger(tmp_path):
    """benchmarks/rebuild_boards.py regenerates the ledger in its clone after the boards and
    returns the changed lines: none when the committed page is current."""
    rebuild = load_benchmark("rebuild_boards")
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    _judge(repo, _one(repo, est=0.01, low=0.002, high=0.018, sig=True))
    (repo / "docs" / "claims.md").write_text("stale\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "stale"], cwd=repo, check=True)
    assert "-stale" in rebuild.rebuild_ledger(repo)
    subprocess.run([*git, "commit", "-qam", "current"], cwd=repo, check=True)
    assert rebuild.rebuild_ledger(repo) == []


@pytest.mark.parametrize(("line", "verdict"), [
    ("controls passed", SHOWN), ("controls not run", PENDING), ("controls failed", FAILED)])
def test_a_board_that_declares_its_controls_is_read_from_its_controls_line(tmp_path, line,
                                                                           verdict):
    """A board with plan.controls tests them on its own primary metric and prints the outcome
    ("- Controls: **...**"): that line decides, not the evidence entry's rows read in the
    claim's direction (which would read a "fewer" claim's handicapped baseline backwards)."""
    ev = _one(tmp_path, controls=None, est=0.01, low=0.002, high=0.018, sig=True)
    page = tmp_path / ev[0]["board"] / "leaderboard.md"
    page.write_text(page.read_text() + f"- Controls: **{line}** (positive `grpo@lr_div10` ...).\n")
    assert _judge(tmp_path, ev)[0] == verdict


# -- response curves (arbitrary-entropy PO: entropy against its target) -------------------------
def _curve_page(root: Path, slope: float, low: float, high: float, mde: float,
                controls: str = "controls passed") -> str:
    """A page whose md holds a response curve section as the board writes it
    (harness/report/curves.py ``section``), so the ledger's parser is held to the real text."""
    from harness.report.config import CurveSpec
    from harness.report.curves import Curve
    from harness.report.curves import section as curve_section
    from harness.report.stats import Interval

    board = _board(root, [])
    spec = CurveSpec("entropy_vs_target", "arbitrary_entropy", "algorithm.rollout.target_entropy",
                     "token_entropy", "grpo", True)
    curve = Curve(spec, [(0.1, "arbitrary_entropy@0.1", Interval(0.3, 0.28, 0.32, 5, "t"))],
                  slope=slope, se=(high - low) / 4, low=low, high=high, p=0.5, mde=mde, df=20,
                  n=25)
    md = root / board / "leaderboard.md"
    md.write_text(md.read_text() + f"- Controls: **{controls}** (declared).\n"
                  + "\n".join(curve_section([curve], 0.95)) + "\n")
    return board


def _curve_ev(board: str, **kw) -> list[dict]:
    return [{"board": board, "curve": "entropy_vs_target", "metric": "token_entropy",
             "claimed": 1, **kw}]


@pytest.mark.parametrize(("slope", "low", "high", "mde", "verdict"), [
    (0.9, 0.7, 1.1, 0.3, SHOWN),            # follows the target
    (0.02, -0.03, 0.07, 0.08, NOT_SHOWN),   # flat, and the testbed would have seen a slope of 1
    (0.3, -0.5, 1.1, 1.4, INCONCLUSIVE),    # too few runs to tell 0 from 1
    (-0.4, -0.6, -0.2, 0.3, NOT_SHOWN),     # moves against the target
    (0.05, 0.02, 0.08, 0.03, NOT_SHOWN),    # moves with it, far short of following it
    (0.7, 0.4, 1.0, 0.4, SHOWN),            # the interval's edge holds 1
])
def test_a_response_curves_slope_decides_against_the_claimed_slope(tmp_path, slope, low, high,
                                                                   mde, verdict):
    board = _curve_page(tmp_path, slope, low, high, mde)
    got = _judge(tmp_path, _curve_ev(board), metric="token_entropy")[0]
    assert got == verdict


def test_a_curve_without_passing_controls_decides_nothing(tmp_path):
    board = _curve_page(tmp_path, 0.02, -0.03, 0.07, 0.08, controls="controls not run")
    assert _judge(tmp_path, _curve_ev(board), metric="token_entropy")[0] == PENDING


def test_a_curve_on_another_metric_than_the_claims_primary_decides_nothing(tmp_path):
    board = _curve_page(tmp_path, 0.9, 0.7, 1.1, 0.3)
    assert _judge(tmp_path, _curve_ev(board))[0] == UNTESTED


@pytest.mark.parametrize(("change", "said"), [
    ({"curve": "entropy_vs_temperature"}, r"no fitted curve 'entropy_vs_temperature'"),
    ({"metric": "heldout/pass_at_1"}, r"no fitted curve 'entropy_vs_target' of "
                                      r"final/heldout/pass_at_1"),
    ({"claimed": "one"}, r"claimed \(the slope the claim predicts, a number\)"),
])
def test_a_bad_curve_entry_is_refused_naming_it(tmp_path, change, said):
    from harness.report.claims_ledger import LedgerError

    board = _curve_page(tmp_path, 0.9, 0.7, 1.1, 0.3)
    with pytest.raises(LedgerError, match=said):
        _judge(tmp_path, _curve_ev(board, **change), metric="token_entropy")


# -- a claim at equal compute (LOPE): decided only by a page that reads at the token budget ------
AT_BUDGET = "heldout/pass_at_1 at the common tokens-generated budget"


@pytest.mark.parametrize(("at", "verdict"), [
    ("evaluation at the common budget of 300,000 tokens generated (within 5%)", SHOWN),
    ("last evaluation", UNTESTED)])
def test_an_equal_compute_claim_is_decided_only_by_a_page_read_at_the_budget(tmp_path, at,
                                                                            verdict):
    ev = _one(tmp_path, est=0.01, low=0.002, high=0.018, sig=True)
    page = tmp_path / ev[0]["board"] / "leaderboard.md"
    page.write_text(page.read_text().replace("(last evaluation)", f"({at})"))
    assert _judge(tmp_path, ev, metric=AT_BUDGET)[0] == verdict
    # the row's mean where its page reads it (at the budget: at_budget_mean, 1.5)
    text = render(*load_claims(tmp_path), tmp_path / "docs" / "claims.md", tmp_path)
    row = next(ln for ln in text.splitlines() if ln.startswith("| `m` |"))
    assert row.split(" | ")[3] == ("1.500" if verdict == SHOWN else "2.000")


def test_rebuild_boards_write_copies_a_rebuilt_board_and_the_ledger_back(tmp_path):
    """``--write`` replaces the committed files of a board with the clone's rebuilt ones (new
    files included) and leaves other boards alone; the ledger is copied as a file."""
    rebuild = load_benchmark("rebuild_boards")
    clone, root = tmp_path / "clone", tmp_path / "root"
    for base, text in ((clone, "rebuilt"), (root, "committed")):
        (base / "leaderboards" / "b" / "t").mkdir(parents=True)
        (base / "leaderboards" / "other").mkdir(parents=True)
        (base / "docs").mkdir()
        (base / "leaderboards" / "b" / "t" / "leaderboard.md").write_text(text)
        (base / "leaderboards" / "other" / "leaderboard.md").write_text(text)
        (base / "docs" / "claims.md").write_text(text)
    (clone / "leaderboards" / "b" / "t" / "new.png").write_bytes(b"png")
    rebuild.write_back("b", clone, root)
    rebuild.write_back("docs/claims.md", clone, root)
    assert (root / "leaderboards" / "b" / "t" / "leaderboard.md").read_text() == "rebuilt"
    assert (root / "leaderboards" / "b" / "t" / "new.png").read_bytes() == b"png"
    assert (root / "leaderboards" / "other" / "leaderboard.md").read_text() == "committed"
    assert (root / "docs" / "claims.md").read_text() == "rebuilt"


def test_the_ledger_quotes_each_pages_learning_check_under_its_controls(tmp_path):
    """A testbed whose baseline does not improve over its warm start on some seed says so on
    its page (the learning check); the ledger quotes each such line beside the page's rows."""
    ev = _one(tmp_path)
    page = tmp_path / ev[0]["board"] / "leaderboard.md"
    _judge(tmp_path, ev)
    text = render(*load_claims(tmp_path), tmp_path / "docs" / "claims.md", tmp_path)
    assert "Learning check" not in text
    check = ("baseline `grpo`, heldout pass@1: above its step-0 value on 4 of 5 seeds; not on "
             "seed 0 (-0.015)")
    other = "baseline `dr_grpo`, heldout pass@1: above its step-0 value on 5 of 5 seeds"
    page.write_text(page.read_text() + f"\n- Learning check: {check}.\n"
                    f"- Learning check: {other}.\n")
    text = render(*load_claims(tmp_path), tmp_path / "docs" / "claims.md", tmp_path)
    lines = text.splitlines()
    at = lines.index(f"- Learning check (quoted from its page): {check}.")
    assert lines[at - 1].startswith("- Controls: ")
    assert "dr_grpo" not in text  # only the baselines of the claim's rows


def test_rebuild_boards_writes_back_only_with_write_and_only_what_changed(monkeypatch):
    rebuild, written = load_benchmark("rebuild_boards"), []
    monkeypatch.setattr(rebuild, "_git", lambda *args, cwd: "abc")
    monkeypatch.setattr(rebuild, "rebuild", lambda b, clone: ["+x"] if b == "changed" else [])
    monkeypatch.setattr(rebuild, "rebuild_ledger", lambda clone: ["+y"])
    monkeypatch.setattr(rebuild, "write_back", lambda name, clone, root: written.append(name))
    assert rebuild.main(["changed", "same"]) == 1 and written == []
    assert rebuild.main(["changed", "same", "--write"]) == 1
    assert written == ["changed", rebuild.LEDGER]
    monkeypatch.setattr(rebuild, "rebuild_ledger", lambda clone: [])
    written.clear()
    rebuild.main(["changed", "same", "--write"])
    assert written == ["changed"]
    # a rebuild that failed (a mistyped board, rlbench board exiting non-zero) is not written
    monkeypatch.setattr(rebuild, "rebuild", lambda b, clone: [f"{rebuild.FAILED}no board"])
    written.clear()
    assert rebuild.main(["typo", "--write"]) == 1 and written == []


def test_the_ledger_quotes_the_learning_check_of_every_baseline_of_the_claims_rows(tmp_path):
    board = _board(tmp_path, [_row("m"), _row("m2", baseline="grpo T=0.6")])
    page = tmp_path / board / "leaderboard.md"
    checks = [f"baseline `{b}`, heldout pass@1: above its step-0 value on 5 of 5 seeds "
              "(every seed)" for b in ("grpo T=0.6", "grpo", "rloo")]
    page.write_text(page.read_text() + "".join(f"- Learning check: {c}.\n" for c in checks))
    _judge(tmp_path, [{"board": board, "rows": ["m", "m2"], "metric": "heldout/pass_at_1",
                       "controls": CONTROLS}])
    text = render(*load_claims(tmp_path), tmp_path / "docs" / "claims.md", tmp_path)
    quoted = [ln for ln in text.splitlines() if ln.startswith("- Learning check")]
    assert quoted == [f"- Learning check (quoted from its page): {c}." for c in checks[:2]]
