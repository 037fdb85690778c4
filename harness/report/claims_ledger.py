"""The claims ledger (issue 36): each seed paper's pre-registered claim (``docs/claims/*.yaml``)
read against the committed board pages its ``evidence:`` names, written to ``docs/claims.md`` by
``rlbench claims``. Every number under a board is read from that page's ``leaderboard.csv`` (or
quoted from its page); the others are the claim file's. Nothing is typed by hand.

Verdict rules, in order (docs/claims/README.md states the same):

1. **No evidence**: ``gpu_only`` -> *not testable on CPU (needs the GPU suite)*; otherwise
   *inconclusive (no row tests the claim yet)*.
2. **Claimed effect C**, in board units: a ``claim_unit`` saying "<x> in the boards' units"
   gives C = x; "percent fewer" gives C = -claim_number% of the baseline row's mean on the page;
   otherwise C is unknown. The claimed direction is lower when ``claim_unit`` says "fewer", else
   higher.
3. **A row decides** only when its metric is the claim's primary metric and its page's primary
   (the ``primary_*`` columns of a page whose "Confirmatory" line says it is; on a track board,
   the paired interval, the test the LANTERN claim declares) and it is not identical to its
   baseline. Any other row is printed as a descriptive paired interval and decides nothing.
   A page whose plan reads at the token budget (``plan.read: budget``) reads its primary as
   "<metric> at the common tokens-generated budget", the name an equal-compute claim gives.
   A response curve's slope (a ``curve`` entry; harness/report/curves.py) decides when its y
   is the claim's primary metric, C the entry's ``claimed`` slope: *shown* when its interval
   excludes 0 and holds C, *not shown* when it excludes C, else *inconclusive* (a slope is a
   size, not only a direction: one far short of C supports nothing).
4. **Controls**: a page's rows decide only when its evidence entry names a positive control row
   that the page detects (significant, against the claimed direction) and an A/A row that it does
   not. Otherwise the rows read "controls not run" (or "controls failed") and cannot give
   *shown* or *not shown*: a testbed not checked to be sensitive cannot say it could have seen
   the effect, nor one not checked for false positives that it saw it.
5. **A deciding row** is *shown* when significant in the claimed direction; *not shown* when
   significant against it, or its MDE is at or below |C|, or its interval excludes C; otherwise
   *inconclusive*. The claim is *shown* when any deciding row is, *not shown* when every deciding
   row is, else *inconclusive (under-powered)*. With no deciding row it is inconclusive, the
   cause in brackets: *(controls not run)* or *(the testbed failed its controls)* when only
   the controls block its rows (the reason says what they would give once the controls pass),
   else *(no row tests the claim yet)*.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.report.tables import metric_spec
from harness.typed_config import ConfigError

__all__ = [
    "FAILED",
    "INCONCLUSIVE",
    "NOT_SHOWN",
    "NOT_TESTABLE",
    "PENDING",
    "SHOWN",
    "UNTESTED",
    "LedgerError",
    "judge_claim",
    "load_claims",
    "render",
    "write_ledger",
]

SHOWN = "shown"
NOT_SHOWN = "not shown (the testbed could have seen it)"
INCONCLUSIVE = "inconclusive (under-powered)"
# inconclusive for a reason other than power: the four verdicts, the cause in brackets
PENDING = "inconclusive (controls not run)"
UNTESTED = "inconclusive (no row tests the claim yet)"
FAILED = "inconclusive (the testbed failed its controls)"
NOT_TESTABLE = "not testable on CPU (needs the GPU suite)"
OUT = "docs/claims.md"
AT_BUDGET = "at the common tokens-generated budget"  # a claim read at equal compute
COMMAND = f"rlbench claims --out {OUT}"
ORDER = ("lpo", "agpo", "aem", "lope", "arpo", "aepo", "arbitrary_entropy", "lantern")
# track boards (LANTERN): metric -> (its paired-difference column stem, its mean column)
TRACK = {"final/episodes_to_threshold": ("episodes", "episodes to threshold"),
         "final/auc": ("AUC", "AUC")}
SECONDARY = "a secondary column of its page (a descriptive paired interval: no test, no MDE)"
WHY = {SHOWN: "a deciding row is significant in the claimed direction",
       NOT_SHOWN: "every deciding row is significant against the claim, or its MDE is at or "
                  "below |C|, or its interval excludes C",
       INCONCLUSIVE: "a deciding row's MDE is above |C| (or C is unknown) and its interval "
                     "holds C"}


class LedgerError(ConfigError):
    """A claim file or a board it names is not as the ledger needs; the message names it (the
    CLI prints it as one line, exit 2)."""


@dataclass
class Page:
    """A committed board page folder: its CSV rows and what its pages say."""

    path: str  # repository-relative, e.g. leaderboards/testbed-offpolicy/countdown-tiny/tiny
    rows: dict[str, dict[str, str]]
    track: bool  # a track board: paired intervals per agent, no analysis plan
    status: str  # the page's "Confirmatory" / "Descriptive only" line, verbatim
    primary: str  # the page's primary metric title, e.g. "heldout pass@1"
    reproduce: str  # the board README's Reproduce line, verbatim
    # the page's own controls line (harness/report/controls.py), e.g. "controls passed";
    # "" on a page whose board declares none
    declared_controls: str = ""
    # its response curves' slope lines (harness/report/curves.py), by curve name: estimate,
    # interval, SE, p, MDE and the runs in the fit, as printed
    curves: dict[str, dict[str, str]] = field(default_factory=dict)
    # the page's plan reads each run's primary at the common token budget (plan.read: budget),
    # not at its last evaluation
    at_budget: bool = False
    # the page's learning-check lines (harness/report/tables.py ``learning_check``), verbatim:
    # whether its baseline improved over its warm start on every seed
    learning: list[str] = field(default_factory=list)


@dataclass
class Reading:
    """One evidence row read from its page: the comparison with its baseline over ``seeds``."""

    row: str
    baseline: str
    seeds: str
    est: float  # the estimate of row - baseline and its interval
    low: float
    high: float
    p: float = math.nan  # adjusted p-value
    mde: float = math.nan
    significant: bool = False
    blocked: str = ""  # why the row cannot decide ("" = it decides)
    result: str = ""  # SHOWN / NOT_SHOWN / INCONCLUSIVE where it decides or would
    mean: float = math.nan  # the row's own mean on the metric


# a response curve's section on a page (harness/report/curves.py ``section``): its title, then
# after its table the slope line
CURVE_LINE = re.compile(
    r"^### (?P<name>[\w.-]+): `final/(?P<y>[\w./-]+)` against `(?P<x>[\w./-]+)`\n"
    r"(?:(?!### ).*\n)*?- Slope: \*\*(?P<est>[-+.\d]+)\*\* \[(?P<low>[-+.\d]+), "
    r"(?P<high>[-+.\d]+)\], SE (?P<se>[.\d]+), p (?P<p>[-+.\de]+), MDE (?P<mde>[.\d]+) "
    r"\((?P<n>\d+) runs", re.M)


def _num(x: str | None) -> float:
    return float(x) if x and re.fullmatch(r"[-+]?[\d.]+(e[-+]?\d+)?|nan", x) else math.nan


def read_page(root: Path, board: str, where: str) -> Page:
    folder = root / board
    if not board.startswith("leaderboards/") or not (folder / "leaderboard.csv").is_file():
        raise LedgerError(f"{where}.board: {board!r} is not a folder under leaderboards/ "
                          "holding a leaderboard.csv")
    with open(folder / "leaderboard.csv", newline="") as f:
        reader = csv.DictReader(f)
        records, columns = list(reader), reader.fieldnames or []
    if not {"row", "agent"} & set(columns):
        raise LedgerError(f"{where}.board: {board}/leaderboard.csv has no row or agent column")
    track = "row" not in columns
    md = (folder / "leaderboard.md").read_text() if (folder / "leaderboard.md").exists() else ""
    status = re.search(r"^- (\*\*(?:Confirmatory|Descriptive only)\*\*.*?)\.?$", md, re.M)
    prim = re.search(r"^- Primary metric: (.+?) \((.*)\)\.$", md, re.M)
    declared = re.search(r"^- Controls: \*\*(controls (?:passed|failed|not run))\*\*", md, re.M)
    readme = root / "leaderboards" / board.split("/")[1] / "README.md"
    repro = re.search(r"^- (Reproduce.*?)\.?$", readme.read_text() if readme.exists() else "",
                      re.M)
    return Page(board, {r["agent" if track else "row"]: r for r in records}, track,
                status[1] if status else "", prim[1] if prim else "",
                repro[1] if repro else f"no Reproduce line in {readme.relative_to(root)}",
                declared[1] if declared else "",
                {m["name"]: m.groupdict() for m in CURVE_LINE.finditer(md)},
                bool(prim) and prim[2].startswith("evaluation at the common budget"),
                re.findall(r"^- Learning check: (.+?)\.?$", md, re.M))


def _checked_row(line: str) -> str:
    """The row a learning-check line is about: "baseline `<row>`, ..." -> <row>."""
    return line.split("`")[1] if line.count("`") >= 2 else ""


def load_claims(root: Path, folder: str = "docs/claims") -> tuple[list[dict], dict[str, Page]]:
    """The claim files (each with its ``stem``) and the board pages their evidence names, in
    ledger order; bad input -> :class:`LedgerError` naming the file and key."""
    paths = sorted((root / folder).glob("*.yaml"), key=lambda p: (
        ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
    if not paths:
        raise LedgerError(f"{folder}: no claim files (*.yaml)")
    claims, pages = [], {}
    for path in paths:
        name = f"{folder}/{path.name}"
        try:
            entry = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise LedgerError(f"{name}: not YAML ({' '.join(str(exc).split())})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("evidence"), list):
            raise LedgerError(f"{name}: evidence: a list of {{board, rows, metric}} is "
                              "required ([] where no committed board tests the claim)")
        for key in ("paper", "methods", "claim", "claim_number", "claim_unit", "testbed",
                    "primary", "cannot_show", "gpu_only"):
            if key not in entry:
                raise LedgerError(f"{name}: {key}: missing")
        for i, ev in enumerate(entry["evidence"]):
            where = f"{name}: evidence[{i}]"
            if isinstance(ev, dict) and "curve" in ev:
                page = pages.get(ev["board"]) or read_page(root, str(ev["board"]), where)
                pages[page.path] = page
                _check_curve(page, ev, where)
                continue
            if not isinstance(ev, dict) or not {"board", "rows", "metric"} <= set(ev) \
                    or not isinstance(ev["rows"], list) or not ev["rows"]:
                raise LedgerError(f"{where}: needs board, rows (a list) and metric (or board, "
                                  "curve, metric and claimed for a response curve)")
            page = pages.get(ev["board"]) or read_page(root, str(ev["board"]), where)
            pages[page.path] = page
            for row in [*ev["rows"], *(ev.get("controls") or {}).values()]:
                if row not in page.rows:
                    raise LedgerError(f"{where}.rows: no row {row!r} in "
                                      f"{page.path}/leaderboard.csv")
            first = next(iter(page.rows.values()))
            if page.track and (ev["metric"] not in TRACK or ev.get("baseline") not in page.rows):
                raise LedgerError(f"{where}: a track board needs metric one of {sorted(TRACK)} "
                                  "and baseline naming one of its agents")
            if not page.track and f"{ev['metric']}/final_mean" not in first:
                raise LedgerError(f"{where}.metric: {ev['metric']!r} is not a metric of "
                                  f"{page.path}/leaderboard.csv")
        claims.append({**entry, "stem": path.stem})
    return claims, pages


def _check_curve(page: Page, ev: dict, where: str) -> None:
    """A curve entry: ``{board, curve, metric, claimed}``, the page drawing that curve of that
    metric with a fitted slope, and the slope the claim predicts."""
    if not {"board", "curve", "metric", "claimed"} <= set(ev) or isinstance(
            ev["claimed"], bool) or not isinstance(ev["claimed"], int | float):
        raise LedgerError(f"{where}: a curve entry needs board, curve, metric and claimed (the "
                          "slope the claim predicts, a number)")
    found = page.curves.get(str(ev["curve"]))
    if found is None or found["y"] != ev["metric"]:
        raise LedgerError(f"{where}.curve: no fitted curve {ev['curve']!r} of "
                          f"final/{ev['metric']} on {page.path}/leaderboard.md (its curves: "
                          f"{', '.join(sorted(page.curves)) or 'none'})")


def read_curve(page: Page, ev: dict) -> Reading:
    """A response curve's slope, read from its page: b against 0 (no response), significant
    when its interval excludes 0."""
    c = page.curves[ev["curve"]]
    r = Reading(f"slope of {ev['curve']}", "0 (no response)", f"{c['n']} runs",
                *(_num(c[k]) for k in ("est", "low", "high", "p", "mde")))
    r.significant = r.low > 0 or r.high < 0
    return r


def claimed_effect(claim: dict, page: Page, ev: dict, base: str) -> tuple[float | None, str]:
    """C in the page's units and how it was read (rule 2)."""
    unit, n = str(claim["claim_unit"]), claim["claim_number"]
    m = re.search(r"([-+]?\d*\.?\d+) in the boards' units", unit)
    if m:
        return float(m[1]), f"{m[1]} (the claim file's conversion)"
    if "percent fewer" in unit and n is not None and base in page.rows:
        at = "at_budget" if read_as(page, ev["metric"]) != ev["metric"] else "final"
        mean = _num(page.rows[base].get(TRACK[ev["metric"]][1] if page.track
                                        else f"{ev['metric']}/{at}_mean"))
        if not math.isnan(mean):
            return -n / 100 * mean, (f"{n:g}% below `{base}`'s mean on this page, "
                                     f"{mean:.{1 if page.track else 3}f}")
    return None, "unknown (the claim file gives no conversion to the boards' units)"


def read_row(page: Page, ev: dict, row: str) -> Reading:
    """A row's comparison on the evidence metric: the page's primary test where it applies."""
    rec, metric = page.rows[row], ev["metric"]
    if page.track:
        col = f"diff {TRACK[metric][0]} vs {ev['baseline']}"
        r = Reading(row, ev["baseline"], rec["seeds"],
                    *(_num(rec.get(col + k)) for k in ("", " low", " high")))
        r.significant, r.mean = r.low > 0 or r.high < 0, _num(rec.get(TRACK[metric][1]))
        return r
    title = _title(metric)
    # the row's mean where the page reads it: at the token budget on a page whose plan says so
    at = "at_budget" if read_as(page, metric) != metric else "final"
    mean = _num(rec.get(f"{metric}/{at}_mean"))
    if title != page.primary:
        return Reading(row, rec["baseline"], rec["n_seeds"], *(
            _num(rec.get(f"{metric}/vs_baseline_{k}")) for k in ("mean", "low", "high")),
            mean=mean, blocked=SECONDARY)
    r = Reading(row, rec["baseline"], rec["n_seeds"], *(_num(rec[f"primary_{k}"]) for k in (
        "estimate", "low", "high", "p_adjusted", "mde")), rec["primary_significant"] == "1",
        mean=mean)
    if rec.get("primary_identical_to"):
        r.blocked = "identical to its baseline in every run (not tested)"
    elif not page.status.startswith("**Confirmatory**"):
        r.blocked = "its page is descriptive only"
    return r


def _title(metric: str) -> str:
    """A metric as a page's primary line names it: heldout/pass_at_1 -> heldout pass@1,
    heldout/tool_calls_per_traj -> heldout tool_calls_per_traj (harness/report/tables.py,
    Spec.title)."""
    return metric_spec(metric).title if "/" in metric else metric


def read_as(page: Page, metric: str) -> str:
    """The evidence metric as its page reads it: a page whose plan reads the primary at the
    common token budget reads ``<metric> at the common tokens-generated budget`` (a claim at
    equal compute names its primary metric so), any other page the metric itself."""
    return f"{metric} {AT_BUDGET}" if page.at_budget and _title(metric) == page.primary \
        else metric


def row_result(r: Reading, c: float | None, sign: int) -> str:
    """Rule 5 for one row; ``sign`` is the claimed direction (+1 higher, -1 lower)."""
    if r.significant:
        return SHOWN if r.est * sign > 0 else NOT_SHOWN
    powered = c is not None and (r.mde <= abs(c) or not r.low <= c <= r.high)  # NaN: False
    return NOT_SHOWN if powered else INCONCLUSIVE


def curve_result(r: Reading, c: float) -> str:
    """Rule 5 for a response curve: the claim is a slope ``c`` (1: y follows x), not only a
    direction, so a slope that leaves 0 but falls far short of ``c`` is no support. *Shown*:
    the interval excludes 0 and holds ``c``; *not shown*: it excludes ``c``; else
    inconclusive."""
    if not r.low <= c <= r.high:
        return NOT_SHOWN
    return SHOWN if r.significant and r.est * c > 0 else INCONCLUSIVE


def controls(page: Page, ev: dict, sign: int) -> str:
    """'' when the page's positive control is detected and its A/A control is not (rule 4). A
    board that declares its controls (plan.controls) says so on the page, tested on the metric
    and in the direction it declares: that line is read. Otherwise (the LANTERN track) the
    evidence entry's control rows are read, detected in the claim's direction."""
    if page.declared_controls:
        state = page.declared_controls
        return "" if state == "controls passed" else f"{state} (the board's declared controls)"
    names, said, ok = ev.get("controls") or {}, [], True
    for key, what, want in (("positive", "positive", True), ("aa", "A/A", False)):
        if key not in names:
            said.append(f"no {what} control row on this page")
            continue
        r = read_row(page, ev, names[key])
        seen = r.significant and (r.est * sign < 0 or not want)
        ok &= seen == want
        said.append(f"{what} `{names[key]}` {'detected' if seen else 'not detected'}")
    if len(names) < 2:
        return f"controls not run ({'; '.join(said)})"
    return "" if ok else f"controls failed ({'; '.join(said)})"


def _aggregate(results: list[str]) -> str:
    return SHOWN if SHOWN in results else NOT_SHOWN if results and all(
        r == NOT_SHOWN for r in results) else INCONCLUSIVE


def judge_claim(claim: dict, pages: dict[str, Page]) -> tuple[str, str, list[tuple]]:
    """(verdict, one-line reason, [(page, evidence, C text, controls note, readings)])."""
    sign = -1 if "fewer" in str(claim["claim_unit"]) else 1
    blocks = []
    for ev in claim["evidence"]:
        page = pages[ev["board"]]
        if "curve" in ev:  # the slope the claim predicts, e.g. 1: held at its target
            c, ctext = float(ev["claimed"]), f"slope {ev['claimed']:g} (the claim file's)"
            readings = [read_curve(page, ev)]
        else:
            base = ev.get("baseline") or page.rows[ev["rows"][0]].get("baseline", "")
            c, ctext = claimed_effect(claim, page, ev, base)
            readings = [read_row(page, ev, row) for row in ev["rows"]]
        # a curve is of final values: never read "at the budget"
        read = ev["metric"] if "curve" in ev else read_as(page, ev["metric"])
        for r in readings:
            if not r.blocked and read != claim["primary"]["metric"]:
                r.blocked = f"not the claim's primary metric, {claim['primary']['metric']}"
            if not r.blocked:
                r.result = curve_result(r, c) if "curve" in ev else row_result(r, c, sign)
        blocks.append((page, ev, ctext, controls(page, ev, sign), readings))
    if not blocks:
        return (NOT_TESTABLE, "no committed board tests it and it needs the GPU suite", []) \
            if claim["gpu_only"] else (UNTESTED, "no testbed run yet: no board tests it", [])
    deciding = [r.result for *_, note, rs in blocks if not note for r in rs if r.result]
    if deciding:
        return _aggregate(deciding), WHY[_aggregate(deciding)], blocks
    pending = [r.result for *_, note, rs in blocks if note for r in rs if r.result]
    if pending:
        notes = sorted({note.split(" (")[0] for *_, note, _ in blocks if note})
        verdict = PENDING if any(n.startswith("controls not run") for n in notes) else FAILED
        return verdict, (f"{' and '.join(notes)} on its testbeds, so neither *shown* nor "
                              "*not shown* can be given; read alone, its deciding rows would "
                              f"give *{_aggregate(pending)}*"), blocks
    why = sorted({r.blocked for *_, rs in blocks for r in rs})
    return UNTESTED, "no row decides: " + "; ".join(why), blocks


def _f(x: float, d: int, sign: str = "+") -> str:
    return "—" if math.isnan(x) else format(x, f"{sign}.{d}f")


def _section(claim: dict, verdict: str, reason: str, blocks: list[tuple], rel) -> list[str]:
    bed, prim, n = claim["testbed"], claim["primary"], claim["claim_number"]
    sweep = f"`{bed['sweep']}`" if bed["sweep"] else "none yet"
    status = bed["status"].replace("_", " ")
    lines = ["", f'<a id="{claim["stem"]}"></a>', "", f"## {claim['stem']}: {claim['paper']}",
             "", f"**Verdict: *{verdict}*** — {reason}.", "",
             f"- Methods: {', '.join(f'`{m}`' for m in claim['methods'])}.",
             f"- Claim: {claim['claim']} Claimed number: "
             f"{'none' if n is None else n} ({claim['claim_unit']}).",
             f"- Testbed: {sweep} ({status}): {bed['why']}",
             f"- Primary: `{prim['metric']}`; {prim['comparison']}; {prim['test']}.",
             f"- Cannot show: {claim['cannot_show']}",
             f"- Needs the GPU suite: {'yes' if claim['gpu_only'] else 'no'}."]
    if not blocks:
        lines += ["", "No evidence yet: no committed board tests this claim."]
    for page, ev, ctext, note, readings in blocks:
        d = 1 if page.track else 3
        target = rel(page.path + "/leaderboard.md")
        lines += ["", f"### [{page.path.removeprefix('leaderboards/')}]({target})", "",
                  "- Status: " + ("the track's paired 95% interval per agent (the test the claim "
                                  "declares; no family adjustment, no MDE)" if page.track else
                                  page.status or "no Confirmatory or Descriptive line")
                  + f"; primary metric of the page: {page.primary or 'none declared'}"
                  + (" at the common token budget" if page.at_budget else "") + ".",
                  f"- {page.reproduce}.", f"- Claimed effect C: {ctext}.",
                  f"- Controls: {note.removeprefix('controls ') or 'passed'}.",
                  *(f"- Learning check (quoted from its page): {ln}." for ln in page.learning
                    if _checked_row(ln) in {r.baseline for r in readings}),
                  "",
                  f"| row | baseline | seeds | row's mean | Δ `{ev['metric']}` | interval | "
                  f"{'p' if 'curve' in ev else 'adjusted p'} | MDE | reading |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in readings:
            read = (f"descriptive: {r.blocked}" if r.blocked else
                    f"would read *{r.result}*; {note.split(' (')[0]}" if note else
                    f"*{r.result}*")
            mark = (" †" if page.track else " ‡") if r.significant else ""
            lines.append(f"| `{r.row}` | `{r.baseline}` | {r.seeds} | {_f(r.mean, d, '')} | "
                         f"{_f(r.est, d)}{mark} | "
                         f"[{_f(r.low, d)}, {_f(r.high, d)}] | {_f(r.p, 3, '')} | "
                         f"{_f(r.mde, 3, '')} | {read} |")
    return lines


def render(claims: list[dict], pages: dict[str, Page], out: Path, root: Path) -> str:
    """The ledger page; links are relative to ``out``."""
    def rel(path: str) -> str:
        return Path(os.path.relpath(root / path, out.parent)).as_posix()

    judged = [(c, *judge_claim(c, pages)) for c in claims]
    lines = [f"> Generated by `rlbench claims` from docs/claims/*.yaml and the committed boards' "
             f"leaderboard.csv; do not edit by hand. Regenerate: `{COMMAND}` "
             "(`python benchmarks/rebuild_boards.py` also does, after the boards).", "",
             "# Claims ledger", "",
             f"Each seed paper's headline claim, pre-registered in [docs/claims/]"
             f"({rel('docs/claims/README.md')}), read against the committed board pages its "
             f"`evidence:` names, by the [verdict rules]({rel('docs/claims/README.md')}#verdicts)"
             " (`harness/report/claims_ledger.py`). Every number under a board is read from that "
             "page's `leaderboard.csv` or quoted from its page; the others are the claim file's. "
             "‡: significant for the board's family; †: the track's interval excludes 0.", "",
             "| claim | methods | verdict | why |", "|---|---|---|---|"]
    lines += [f"| [{c['stem']}](#{c['stem']}) | {', '.join(f'`{m}`' for m in c['methods'])} | "
              f"*{v}* | {why} |" for c, v, why, _ in judged]
    for c, verdict, reason, blocks in judged:
        lines += _section(c, verdict, reason, blocks, rel)
    return "\n".join(lines) + "\n"


def write_ledger(root: Path, out: str = OUT, claims_dir: str = "docs/claims") -> bool:
    """Write the ledger to ``root/out``; True when its text changed."""
    path = root / out
    text = render(*load_claims(root, claims_dir), path, root)
    old = path.read_text() if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return old != text
