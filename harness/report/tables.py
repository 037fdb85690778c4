"""Leaderboard tables: the rows ``harness.report.board`` computes, rendered as markdown and CSV.

Markdown cells read ``mean ± half-width (n)`` (a Student-t interval at every number of seeds,
:mod:`harness.report.stats`); the CSV holds the same numbers in separate columns (mean,
half-width, low, high, n, and for paired differences the one-sample p-value) at full
precision.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import math
import re
from dataclasses import dataclass, field
from typing import Any

from harness.report.stats import Interval

__all__ = ["COSTS", "DYNAMICS", "Cost", "Dynamic", "Row", "Run", "Spec",
           "cell", "cost_table", "declared_primary", "eval_finals", "late_means", "metric_spec",
           "paired_table", "quality_table", "render_csv", "start_table", "step_table", "table"]

_KINDS = ("pass", "mean", "maj")  # column order within an eval set
_NONE = Interval(math.nan, math.nan, math.nan, 0, "none")


@dataclass(frozen=True)
class Run:
    run_id: str  # the id in the store the board reads
    algorithm: str
    variant: str
    seed: str
    temperature: str
    baseline: str
    metrics: dict[str, float]
    config: dict[str, str] = field(default_factory=dict)  # params minus seed, non-semantic keys
    origin_id: str = ""  # the id shown: the original run's, for runs imported from an export
    sweep: str = ""  # the named sweep that launched it (tag rlbench.sweep)
    commit: str = ""  # the code it ran (tag rlbench.git_commit)
    select: str = ""  # its value of the board's selection key
    overrides: tuple[str, ...] | None = None  # the Hydra overrides it was launched with
    select_key: str = ""  # the config key of the selection (left out of ``config``), if a param
    marks: frozenset[float] = frozenset()  # its trainer.eval_at_tokens (equal-compute marks)
    # the seed it trained with (tag rlbench.train_seed), where that is not ``seed``, the label
    # it is paired on (block_seed: an A/A control's runs); "" where they are one
    train_seed: str = ""

    @property
    def label(self) -> str:
        return f"{self.algorithm}@{self.variant}" if self.variant else self.algorithm

    @property
    def shown_id(self) -> str:
        return self.origin_id or self.run_id


@dataclass(frozen=True)
class Spec:
    """A metric of each run's evaluations: a quality metric ``<eval_set>/<kind>_at_<k>`` (pass,
    mean, maj: higher is better), or ``<eval_set>/<kind>`` (``k`` = 0), another evaluation
    metric a plan declares as its primary with its direction (``plan.better``), e.g.
    ``heldout/tool_calls_per_traj`` lower."""

    eval_set: str
    kind: str  # pass | mean | maj, or the declared metric's own name (k = 0)
    k: int = 0
    lower_is_better: bool = False

    @property
    def name(self) -> str:
        return f"{self.eval_set}/{self.kind}_at_{self.k}" if self.k else \
            f"{self.eval_set}/{self.kind}"

    @property
    def title(self) -> str:
        return f"{self.eval_set} {self.kind}@{self.k}" if self.k else \
            f"{self.eval_set} {self.kind}"

    def sort_key(self) -> tuple[str, int, int]:
        return (self.eval_set, _KINDS.index(self.kind) if self.kind in _KINDS else len(_KINDS),
                self.k)


@dataclass(frozen=True)
class Cost:
    """A cost column: ``final/<key>``; ``lower_is_best`` columns bold their minimum."""

    key: str
    title: str
    fmt: str
    lower_is_best: bool
    optional: bool  # shown in markdown only when some run logged it


SPEC_RE = re.compile(r"^final/(.+)/(pass|mean|maj)_at_(\d+)$")


def specs_of(rows: list[Row], skip: str | None = None) -> list[Spec]:
    """Every quality metric the rows' runs logged (``final/<set>/<kind>_at_<k>``), but those of
    eval set ``skip`` (a board's selection split, never reported)."""
    found = {Spec(m.group(1), m.group(2), int(m.group(3)))
             for row in rows for r in row.runs.values() for key in r.metrics
             if (m := SPEC_RE.match(key)) and m.group(1) != skip}
    return sorted(found, key=Spec.sort_key)


def metric_spec(name: str, lower_is_better: bool = False) -> Spec:
    """``<eval set>/<metric>`` as a :class:`Spec`: a quality metric ``<kind>_at_<k>`` (pass,
    mean, maj), else any other evaluation metric (``k`` = 0) of the given direction."""
    if m := SPEC_RE.match(f"final/{name}"):
        return Spec(m.group(1), m.group(2), int(m.group(3)))
    eval_set, _, metric = name.rpartition("/")
    return Spec(eval_set, metric, 0, lower_is_better)


def primary_spec(specs: list[Spec], declared: str | None = None,
                 better: str | None = None) -> Spec | None:
    """The plan's declared metric: a quality metric when logged (else None), any other
    ``<eval set>/<metric>`` as a :class:`Spec` of its declared direction (``better``; whether
    the runs logged it is :func:`declared_primary`'s to say); undeclared, the first eval set
    (by name) at pass@1, else its smallest pass@k, else its first metric."""
    if declared is not None:
        spec = metric_spec(declared, better == "lower")
        return spec if not spec.k or spec in specs else None
    if not specs:
        return None
    first = [s for s in specs if s.eval_set == specs[0].eval_set]
    return min(first, key=lambda s: (s.kind != "pass", s.k != 1, s.k))


def declared_primary(history: Any, rows: list[Row], specs: list[Spec], declared: str | None,
                     better: str | None) -> tuple[Spec | None, list[Spec]]:
    """The primary (:func:`primary_spec`) and the specs a page shows: a declared evaluation
    metric other than pass/mean/maj@k is read into the runs (:func:`eval_finals`) and shown
    after the quality metrics, or is None when no run logged it."""
    prim = primary_spec(specs, declared, better)
    if prim is None or prim.k:
        return prim, specs
    return (prim, [*specs, prim]) if eval_finals(history, rows, prim) else (None, specs)


def eval_finals(history: Any, rows: list[Row], spec: Spec) -> bool:
    """Put ``final/<spec>`` (the run's last evaluation of it: ``eval/<spec>`` at its highest
    step, MLflow's latest value, as collect.py's ``last_evaluation`` reads a quality metric) and
    ``start/<spec>`` (its step-0 evaluation, from ``history(run_id, metric)``, {step: value})
    into each run's metrics: a run's summary holds only the quality metrics (harness/summary.py),
    and a declared primary may be any evaluation metric. True when some run logged it."""
    found = False
    for row in rows:
        for run in row.runs.values():
            last = run.metrics.get(f"eval/{spec.name}")
            if last is None:
                continue
            found = True
            run.metrics[f"final/{spec.name}"] = float(last)
            first = history(run.run_id, f"eval/{spec.name}").get(0)
            if first is not None:
                run.metrics[f"start/{spec.name}"] = float(first)
    return found


COSTS = (
    Cost("steps", "steps", ".1f", False, False),
    Cost("tokens_total", "tokens generated", ",.0f", True, False),
    Cost("tokens_trained", "tokens trained", ",.0f", True, True),
    Cost("wall_s", "wall s", ".1f", True, False),
    Cost("peak_mem_mb", "peak mem MiB", ",.0f", True, True),
    Cost("peak_gpu_mem_mb", "peak GPU mem MiB", ",.0f", True, True),
)


@dataclass(frozen=True)
class Dynamic:
    """A training-dynamics column: per seed, the mean of step metric ``metric`` over the run's
    last ``window`` logged steps (None: the board's ``final_window``; 0: every step), stored as
    ``final/<key>``, never bolded (higher is not better). ``paired`` columns sit next to the
    quality metrics and are paired against the baseline like them; the others (the step size)
    have their own table."""

    key: str
    metric: str  # a step metric; ``*`` matches an eval set name (the sets' values are averaged)
    title: str
    window: int | None = None
    paired: bool = True
    fmt: str = ".3f"


DYNAMICS = (Dynamic("token_entropy", "rollout/entropy", "final token entropy"),
            # evaluations: the last one, as every "final" quality metric
            Dynamic("tool_calls_per_traj", "eval/*/tool_calls_per_traj",
                    "tool calls per trajectory", window=1),
            Dynamic("grad_norm", "actor/grad_norm", "pre-clip grad norm", window=0,
                    paired=False),
            Dynamic("grad_clipped", "actor/grad_clipped_frac", "clipped steps", window=0,
                    paired=False))


@dataclass
class Row:
    """One leaderboard row: one configuration (an algorithm with its variant, at one sampling
    temperature, at one value of the selection key), over seeds."""

    key: str  # shown and used in pairings: label, plus " T=<temperature>" when ambiguous
    label: str  # algorithm or algorithm@variant
    algorithm: str
    variant: str
    temperature: str
    runs: dict[str, Run]  # seed -> run
    select: str = ""  # value of the board's selection key
    baseline: str = ""  # key of the row paired differences are taken against
    baseline_via: str = ""  # tag | pairs | default
    baseline_note: str = ""  # why a wanted baseline was not paired (no runs, ambiguous)
    final: dict[str, Interval] = field(default_factory=dict)
    start: dict[str, Interval] = field(default_factory=dict)
    delta: dict[str, Interval] = field(default_factory=dict)
    vs: dict[str, Interval] = field(default_factory=dict)
    cost: dict[str, Interval] = field(default_factory=dict)
    budget: dict[str, Interval] = field(default_factory=dict)  # at the common token budget
    budget_seeds: dict[str, dict[str, float]] = field(default_factory=dict)  # its values by seed
    style_index: int = 0  # this row's line style among its algorithm's rows

    @property
    def seeds(self) -> list[str]:
        def key(seed: str) -> tuple[int, float, str]:
            try:
                return (0, float(seed), seed)
            except ValueError:
                return (1, 0.0, seed)

        return sorted(self.runs, key=key)

    def per_seed(self, key: str) -> dict[str, float]:
        """seed -> the runs' metric ``key`` (seeds that did not log it, or logged nan, left out);
        ``budget/<spec>``: each run's value at the common token budget (runs read there)."""
        if key.startswith("budget/"):
            return dict(self.budget_seeds.get(key.removeprefix("budget/"), {}))
        return {s: r.metrics[key] for s, r in self.runs.items()
                if key in r.metrics and not math.isnan(r.metrics[key])}

    @property
    def run_ids(self) -> list[tuple[str, str]]:
        """(seed, shown run id) in seed order."""
        return [(s, self.runs[s].shown_id) for s in self.seeds]

    @property
    def store_ids(self) -> list[str]:
        return [self.runs[s].run_id for s in self.seeds]

    @property
    def config(self) -> dict[str, str]:
        return next(iter(self.runs.values())).config if self.runs else {}

    def knob(self, key: str) -> str:
        """A config value of the row; the selection key's is the row's selected value."""
        run = next(iter(self.runs.values()), None)
        if run is not None and key == run.select_key:
            return run.select
        return self.config.get(key, "?")


# ---------------------------------------------------------------------------------- cells

def _fmt(x: float, fmt: str, signed: bool = False) -> str:
    return format(x, ("+" if signed else "") + fmt)


def cell(iv: Interval, fmt: str = ".3f", signed: bool = False) -> str:
    """``mean ± half (n)`` (Student-t), ``mean ± n/a (1)``, or ``—`` when nothing was
    logged."""
    if iv.n == 0 or math.isnan(iv.mean):
        return "—"
    m = _fmt(iv.mean, fmt, signed)
    half = "n/a" if math.isnan(iv.half_width) else _fmt(iv.half_width, fmt)
    return f"{m} ± {half} ({iv.n})"


def _bold_column(cells: list[str], ivs: list[Interval], lower: bool) -> list[str]:
    """Bold every cell whose mean equals the column's best (ties all bold), among the cells
    measured on at least two seeds: one seed has no spread, so it is never "best"."""
    means = [iv.mean for iv in ivs if iv.n >= 2 and not math.isnan(iv.mean)]
    if not means:
        return cells
    best = min(means) if lower else max(means)
    return [f"**{c}**" if iv.n >= 2 and iv.mean == best else c for c, iv in zip(cells, ivs)]


def markdown_table(header: list[str], columns: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in zip(*columns)]
    return lines


def _head(rows: list[Row]) -> list[list[str]]:
    return [[str(i) for i in range(1, len(rows) + 1)], [r.key for r in rows]]


def shown_dynamics(rows: list[Row], paired: bool = True) -> list[Dynamic]:
    return [d for d in DYNAMICS if d.paired == paired
            and any(d.key in r.final and r.final[d.key].n for r in rows)]


def quality_table(rows: list[Row], specs: list[Spec]) -> list[str]:
    cols = [*_head(rows), [r.temperature or "?" for r in rows], [str(len(r.runs)) for r in rows]]
    for s in specs:
        ivs = [r.final.get(s.name, _NONE) for r in rows]
        cols.append(_bold_column([cell(iv) for iv in ivs], ivs, s.lower_is_better))
    dyn = shown_dynamics(rows)
    cols += [[cell(r.final[d.key]) for r in rows] for d in dyn]
    return markdown_table(
        ["#", "row", "T", "seeds", *(s.title for s in specs), *(d.title for d in dyn)], cols)


def paired_names(rows: list[Row], specs: list[Spec]) -> list[tuple[str, str]]:
    """(metric key, title) of the paired columns: the quality specs and the paired dynamics."""
    return [(s.name, s.title) for s in specs] + [(d.key, d.title) for d in shown_dynamics(rows)]


def paired_table(rows: list[Row], specs: list[Spec], confidence: float) -> list[str]:
    cols = [*_head(rows), [r.baseline or ("— (" + r.baseline_note + ")" if r.baseline_note
                                          else "—") for r in rows]]
    names = paired_names(rows, specs)
    for name, _ in names:
        col = []
        for r in rows:
            iv = r.vs.get(name)
            col.append("—" if iv is None else cell(iv, signed=True))
        cols.append(col)
    return markdown_table(["#", "row", "baseline", *(f"Δ {t}" for _, t in names)], cols)


def start_table(rows: list[Row], specs: list[Spec]) -> list[str]:
    cols = _head(rows)
    for s in specs:
        col = []
        for r in rows:
            st, d = r.start.get(s.name), r.delta.get(s.name)
            col.append("—" if st is None or st.n == 0 or d is None
                       else f"{st.mean:.3f} → {cell(d, signed=True)}")
        cols.append(col)
    return markdown_table(["#", "row", *(s.title for s in specs)], cols)


def learning_check(rows: list[Row], specs: list[Spec]) -> list[str]:
    """Whether each baseline row learns: on how many seeds its final pass@1 is above its step-0
    evaluation, and the seeds where it is not (a testbed where the baseline does not improve
    over its warm start cannot show a method improving on it: issues 35, 36). On a board
    without pairings (one algorithm), every row is checked."""
    bases = [r for r in rows if any(o.baseline == r.key for o in rows)] or \
        [r for r in rows if not r.baseline]
    lines = []
    for row in bases:
        for s in (s for s in specs if s.kind == "pass" and s.k == 1):
            fin, start = row.per_seed(f"final/{s.name}"), row.per_seed(f"start/{s.name}")
            change = {k: fin[k] - start[k] for k in row.seeds if k in fin and k in start}
            head = f"- Learning check: baseline `{row.key}`, {s.title}"
            if not change:
                lines.append(f"{head}: no step-0 evaluation, not checked "
                             "(`trainer.eval_at_start`).")
                continue
            worse = [f"{k} ({v:+.3f})" for k, v in change.items() if not v > 0]
            unread = [k for k in row.seeds if k not in change]  # no final or no step-0 value
            where = "".join([
                f"; not on seed{'s' * (len(worse) > 1)} {', '.join(worse)}" if worse else "",
                f"; seed{'s' * (len(unread) > 1)} {', '.join(unread)} not checked (no final "
                "or step-0 value)" if unread else ""]) or " (every seed)"
            lines.append(f"{head}: above its step-0 value on {len(change) - len(worse)} of "
                         f"{len(row.seeds)} seeds{where}.")
    return ["", *lines] if lines else []


def step_table(rows: list[Row]) -> list[str]:
    """Learning rate, clip threshold, mean pre-clip gradient norm, share of clipped steps."""
    dyn = shown_dynamics(rows, paired=False)
    cols = [*_head(rows), [r.knob("trainer.optim.lr") for r in rows],
            [r.knob("trainer.optim.grad_clip") for r in rows]]
    cols += [[cell(r.final.get(d.key, _NONE), d.fmt) for r in rows] for d in dyn]
    return markdown_table(["#", "row", "lr", "grad clip", *(d.title for d in dyn)], cols)


def shown_costs(rows: list[Row]) -> list[Cost]:
    return [c for c in COSTS
            if not c.optional or any(r.cost.get(c.key) and r.cost[c.key].n for r in rows)]


def cost_table(rows: list[Row]) -> list[str]:
    cols = _head(rows)
    for c in shown_costs(rows):
        ivs = [r.cost[c.key] for r in rows]
        cells = [cell(iv, c.fmt) for iv in ivs]
        cols.append(_bold_column(cells, ivs, True) if c.lower_is_best else cells)
    return markdown_table(["#", "row", *(c.title for c in shown_costs(rows))], cols)


def budget_table(rows: list[Row], specs: list[Spec]) -> list[str]:
    """Each quality spec at the common token budget, with the training step and tokens of the
    evaluations it was read at."""
    pass_specs = [s for s in specs if s.kind == "pass"]
    cols = [*_head(rows), [cell(r.budget.get("step", _NONE), ".1f") for r in rows],
            [cell(r.budget.get("tokens", _NONE), ",.0f") for r in rows]]
    for s in pass_specs:
        ivs = [r.budget.get(s.name, _NONE) for r in rows]
        cols.append(_bold_column([cell(iv) for iv in ivs], ivs, False))
    return markdown_table(["#", "row", "step", "tokens", *(s.title for s in pass_specs)], cols)


# ---------------------------------------------------------------------------------- csv

def _num(x: float) -> str:
    """Full precision without float noise: 6 decimals, trailing zeros dropped; nan -> 'nan'."""
    if math.isnan(x):
        return "nan"
    s = f"{x:.6f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _iv_cols(prefix: str, ci: str, iv: Interval | None, n_name: str = "n") -> dict[str, str]:
    iv = iv or _NONE
    return {f"{prefix}_mean": _num(iv.mean), f"{prefix}_{ci}": _num(iv.half_width),
            f"{prefix}_low": _num(iv.low), f"{prefix}_high": _num(iv.high),
            f"{prefix}_{n_name}": str(iv.n)}


def _vs_cols(prefix: str, ci: str, row: Row, name: str) -> dict[str, str]:
    vs = row.vs.get(name)
    return {**_iv_cols(prefix, ci, vs, n_name="pairs"),
            f"{prefix}_excludes_zero": str(int(vs is not None and vs.excludes_zero)),
            f"{prefix}_p": _num(vs.p if vs else math.nan)}


def table(rows: list[Row], specs: list[Spec], confidence: float) -> list[dict[str, str]]:
    """The CSV's rows as ordered dicts of strings (also logged to MLflow as a table)."""
    ci = f"ci{round(confidence * 100):d}"
    out = []
    for r in rows:
        d = {"row": r.key, "algorithm": r.algorithm, "variant": r.variant,
             "temperature": r.temperature, "selected": r.select, "baseline": r.baseline,
             "baseline_via": r.baseline_via, "n_seeds": str(len(r.runs)),
             "seeds": ";".join(r.seeds)}
        for s in specs:
            n = s.name
            d |= _iv_cols(f"{n}/final", ci, r.final.get(n))
            start = r.start.get(n)
            d |= {f"{n}/start_mean": _num(start.mean if start else math.nan),
                  f"{n}/start_n": str(start.n if start else 0)}
            d |= _iv_cols(f"{n}/delta_start", ci, r.delta.get(n))
            d |= _vs_cols(f"{n}/vs_baseline", ci, r, n)
            if s.kind == "pass":
                d |= _iv_cols(f"{n}/at_budget", ci, r.budget.get(n))
        for dyn in DYNAMICS:
            d |= _iv_cols(f"{dyn.key}/final", ci, r.final.get(dyn.key))
            if dyn.paired:
                d |= _vs_cols(f"{dyn.key}/vs_baseline", ci, r, dyn.key)
        for c in COSTS:
            d |= _iv_cols(c.key, ci, r.cost.get(c.key))
        d |= _iv_cols("budget_step", ci, r.budget.get("step"))
        d |= _iv_cols("budget_tokens", ci, r.budget.get("tokens"))
        d["run_ids"] = ";".join(rid for _, rid in r.run_ids)
        out.append(d)
    return out


def render_csv(records: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    if records:
        w = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(records)
    return buf.getvalue()


def late_means(history: Any, rows: list[Row], window: int) -> None:
    """Put ``final/<dynamics key>`` = mean of the step metric over the run's last ``window``
    (or the dynamic's own; 0 = all) logged steps into each run's metrics, averaged over the eval
    sets a ``*`` pattern matches (a run's own summary, if it logged one, wins). ``history(run_id,
    metric)`` is the metric's {step: value}, so runs logged before the summary existed get it."""
    for row in rows:
        for run in row.runs.values():
            for d in DYNAMICS:
                names = [m for m in run.metrics if fnmatch.fnmatchcase(m, d.metric)]
                if f"final/{d.key}" in run.metrics or not names:
                    continue
                means = []
                size = window if d.window is None else d.window
                for name in sorted(names):
                    by_step = history(run.run_id, name)
                    tail = [by_step[s] for s in sorted(by_step)[-size if size else 0:]]
                    if tail:
                        means.append(sum(tail) / len(tail))
                if means:
                    run.metrics[f"final/{d.key}"] = float(sum(means) / len(means))
