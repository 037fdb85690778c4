"""A board's sensitivity controls (issue 36): before its comparisons are read, a testbed is
checked to see what it should and not to see what it should not.

A board config declares, per named sweep, two control rows by label (``plan.controls``,
conf/board/*.yaml):

* **positive**: a deliberately handicapped baseline (a tenth of the learning rate, half the
  samples) on the baseline's seeds. It must be *detected*: significantly below its baseline.
* **aa**: the baseline itself on seeds of its own, each run paired with the baseline's run of
  its ``block_seed`` (tag ``rlbench.seed``; the seed it trained with is ``rlbench.train_seed``).
  It must be *not detected*: a significant difference is a false positive.

A testbed whose claim is about another quantity than the primary declares the ``metric`` both
are tested on (a final metric such as ``token_entropy``) and the ``direction`` the positive
control must move it (``above``: an entropy bonus raises entropy); a declared metric is read at
``final/``, the primary where the plan reads it (``plan.read``: its last evaluation, or at the
token budget).

Each control is compared with its baseline alone by the board's test (harness/report/
analysis.py: the seed-blocked model, here of two rows, so a paired t-test; a family of one at
the plan's ``alpha``; MDE at its ``power``). Controls are not in the family of the method rows,
and their runs are not in the method rows' model: an A/A row's runs do not share their blocks'
data order and sampling, so its residuals carry the seed-to-seed variance that blocking removes
from every other row, and pooled with them it would change every method comparison's SE,
degrees of freedom and critical value. Leaving both controls out keeps the method rows' adjusted
p-values and intervals exactly those of a board without them (tests/report/
test_board_controls.py). For the same reason a row whose runs were paired by ``block_seed``
but that no sweep declares a control is left out of the test and named on the page.

A declared control row missing from the page reads "controls not run"; the page's verdict is
"controls passed" only when every declared control ran and came out as it must.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.report.analysis import Comparison, analyse
from harness.report.config import CONTROL_ROLES, BoardConfig, BoardError
from harness.report.tables import Row, Spec

__all__ = ["FAILED", "NOT_RUN", "PASSED", "Control", "Controls", "check_controls", "csv_fields",
           "head_lines", "section", "split_controls"]

PASSED, FAILED, NOT_RUN = "controls passed", "controls failed", "controls not run"
WHAT = {"positive": "positive control", "aa": "A/A control"}
# what each control must come out as
EXPECTED = {"positive": "detected", "aa": "not detected"}


@dataclass
class Control:
    """One declared control: its row on the page (None: not run) and its test."""

    role: str  # positive | aa
    label: str  # the declared row label
    sweep: str  # the named sweep that declares it
    row: Row | None = None
    comparison: Comparison | None = None
    note: str = ""  # why it has no test
    metric: str | None = None  # the final metric it is tested on (None: the board's primary)
    direction: str = "below"  # where a positive control must be detected

    @property
    def what(self) -> str:
        """The control's kind in words, with its metric and direction when declared."""
        extra = [f"on {self.metric}"] if self.metric else []
        if self.role == "positive" and self.direction != "below":
            extra.append(f"expected {self.direction}")
        return WHAT[self.role] + (f" ({', '.join(extra)})" if extra else "")

    @property
    def result(self) -> str:
        """The verdict in words: a positive control is *detected* when its difference from its
        baseline is significant in its declared direction (by default negative: the primary,
        pass@k or mean@n, is higher for better); an A/A control is *detected (false positive)*
        when significant at all."""
        c = self.comparison
        if self.row is None:
            return "not run"
        if c is None:
            return "not tested"
        if self.role == "aa":
            return "detected (false positive)" if c.significant else "not detected"
        if not c.significant:
            return "not detected"
        if (c.estimate < 0) == (self.direction == "below"):
            return "detected"
        return f"detected {'above' if self.direction == 'below' else 'below'} its baseline " \
            "(the wrong way)"

    @property
    def passed(self) -> bool:
        return self.result == EXPECTED[self.role]


@dataclass
class Controls:
    """The controls a board declares for the sweeps its runs came from."""

    items: list[Control] = field(default_factory=list)
    unblocked: list[str] = field(default_factory=list)  # block_seed rows no sweep declares
    source: str = ""  # the board config that declares them
    alpha: float = 0.05
    power: float = 0.8

    @property
    def status(self) -> str:
        """'' (none declared), :data:`NOT_RUN`, :data:`FAILED` or :data:`PASSED`."""
        if not self.items:
            return ""
        if any(c.row is None for c in self.items):
            return NOT_RUN
        return PASSED if all(c.passed for c in self.items) else FAILED

    def by_key(self) -> dict[str, Control]:
        return {c.row.key: c for c in self.items if c.row is not None}


def _matching(rows: list[Row], label: str) -> list[Row]:
    """The rows a declared label names: the row of that key, else every row of that label (one
    per temperature)."""
    return [r for r in rows if r.key == label] or [r for r in rows if r.label == label]


def split_controls(rows: list[Row], cfg: BoardConfig) -> tuple[list[Row], Controls]:
    """(the rows the plan's comparisons are tested on, the declared controls). Left out of the
    first: every row of a declared control label and every row whose runs were paired by
    ``block_seed`` (trained on other seeds than their label)."""
    sweeps = sorted({r.sweep for row in rows for r in row.runs.values() if r.sweep})
    out = Controls(source=cfg.source, alpha=cfg.plan.alpha, power=cfg.plan.power)
    seen: set[tuple[str, str]] = set()
    for sweep in sweeps:
        for role in CONTROL_ROLES:
            declared = cfg.plan.controls.get(sweep, {})
            label = declared.get(role)
            if label is None or (role, label) in seen:
                continue
            seen.add((role, label))
            control = Control(role, label, sweep, metric=declared.get("metric"),
                              direction=declared.get("direction", "below"))
            found = _matching(rows, label)
            control.row = found[0] if found else None
            if len(found) > 1:  # shown, not tested: which of them is the control is unsaid
                control.note = (f"{len(found)} rows labelled {label} (one per temperature): "
                                "declare one by its key")
            out.items.append(control)
    left_out = {id(r) for lab in cfg.plan.control_labels(sweeps) for r in _matching(rows, lab)}
    out.unblocked = sorted(r.key for r in rows if id(r) not in left_out
                           and any(run.train_seed for run in r.runs.values()))
    left_out |= {id(r) for r in rows if r.key in out.unblocked}
    return [r for r in rows if id(r) not in left_out], out


def check_controls(controls: Controls, rows: list[Row], prim: Spec | None,
                   read: str = "final") -> None:
    """Test each control that ran against its baseline on its declared metric (else ``prim``,
    read where the plan reads it: ``final`` or at the ``budget``), in a model of the two rows
    alone (a family of one at the plan's level)."""
    by_key = {r.key: r for r in rows}
    for c in controls.items:
        if c.row is None or c.note:
            continue
        base = by_key.get(c.row.baseline)
        if prim is None and c.metric is None:
            c.note = "no primary metric"
        elif base is None:
            c.note = f"no baseline row ({c.row.baseline_note or 'none paired'})"
        else:
            key = f"final/{c.metric}" if c.metric else f"{read}/{prim.name}"
            if c.metric and not (c.row.per_seed(key) or base.per_seed(key)):
                raise BoardError(f"plan.controls.{c.sweep}.metric: {c.metric!r} is not a final "
                                 f"metric of the control runs ({key} not found; e.g. "
                                 "token_entropy, or a primary such as heldout/pass_at_1)")
            a = analyse({c.row.key: c.row.per_seed(key), base.key: base.per_seed(key)},
                        [(c.row.key, base.key)], controls.alpha, controls.power)
            if a.comparisons:
                c.comparison = a.comparisons[0]
            else:
                c.note = a.note or "no comparison"


def head_lines(controls: Controls) -> list[str]:
    """The controls' verdict for the page's head, beside the plan's."""
    lines = []
    if controls.items:
        said = [f"{c.what} `{c.label}` " + (
            "has no row on this page" if c.row is None else
            c.result + (f" ({c.note})" if c.note else "")) for c in controls.items]
        lines.append(f"- Controls: **{controls.status}** (`plan.controls` in "
                     f"`{controls.source}`): " + "; ".join(said) + ".")
    if controls.unblocked:
        lines.append("- Left out of the test, paired with their baseline by `block_seed` (their "
                     "runs trained on other seeds than the ones they are paired on) and "
                     "declared as no control: " + ", ".join(controls.unblocked) + ".")
    return lines


def _fmt(x: float, spec: str) -> str:
    return "—" if math.isnan(x) else format(x, spec)


def section(controls: Controls) -> list[str]:
    """The page's Controls section (before the primary comparisons)."""
    if not controls.items:
        return []
    pct = f"{round((1 - controls.alpha) * 100)}%"
    lines = ["", "## Controls", "",
             f"**{controls.status}.** Each testbed is first checked to be sensitive: a positive "
             "control (a deliberately handicapped baseline) must be detected "
             + ("in its declared direction from its baseline " if any(
                 c.direction != "below" for c in controls.items) else "below its baseline ")
             +
             "and an A/A control (the baseline on other seeds, each run paired with the "
             "baseline's run of its `block_seed`) must not be detected. Each is compared with "
             "its baseline alone by the seed-blocked model (two rows: a paired t-test), a "
             f"family of one at level {controls.alpha:g} ({pct} interval, unadjusted p, MDE at "
             f"power {controls.power:g}); neither enters the primary comparisons' model or "
             "family, so they change no method row's result (docs/analysis.md, Controls)."]
    declared = [c for c in controls.items if c.what != WHAT[c.role]]
    if declared:  # a testbed whose claim is not the primary metric (an entropy target)
        lines.append("Declared for this testbed: " + "; ".join(
            f"the {c.what}" for c in declared) + " (the metric the claim is about, and the "
            "way its handicap or push must move it).")
    lines += ["",
             "| control | row | baseline | seeds | Δ | interval | p | MDE | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in controls.items:
        k, base = c.what, c.row.baseline if c.row else "—"
        if c.comparison is None:
            why = "no row on this page: " + NOT_RUN if c.row is None else \
                f"not tested: {c.note}"
            lines.append(f"| {k} | {c.label} | {base} | — | — | — | — | — | {why} |")
            continue
        m = c.comparison
        lines.append(f"| {k} | {c.row.key} | {m.baseline} | {m.n} | {m.estimate:+.3f} | "
                     f"[{m.low:+.3f}, {m.high:+.3f}] | {_fmt(m.p_adjusted, '.3f')} | "
                     f"{m.mde:.3f} | **{c.result}** |")
    return lines


def csv_fields(controls: Controls, key: str) -> dict[str, str]:
    """The CSV columns of row ``key`` on a board that declares controls: ``control`` (positive |
    aa | empty), ``control_result`` (the verdict in words), ``control_passed`` (1 | 0) and, where
    a control declares its metric, ``control_metric``."""
    if not controls.items:
        return {}
    # on a board whose controls declare their metric, the control rows' primary_* columns hold
    # their test on it: control_metric names it
    declared = any(x.metric for x in controls.items)
    c = controls.by_key().get(key)
    if c is None:
        return {"control": "", "control_result": "", "control_passed": "",
                **({"control_metric": ""} if declared else {})}
    return {"control": c.role, "control_result": c.result,
            "control_passed": str(int(c.passed)),
            **({"control_metric": c.metric or ""} if declared else {})}
