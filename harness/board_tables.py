"""Leaderboard tables: the rows ``harness.board`` computes, rendered as markdown and CSV.

Markdown cells read ``mean ± half-width (n)`` (a Student-t interval) or ``mean [low, high] (n)``
(a percentile bootstrap, used from ``bootstrap_min_n`` seeds on); the CSV holds the same numbers
in separate columns (mean, half-width, low, high, n) at full precision.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import math
from dataclasses import dataclass, field
from typing import Any

from harness.stats import Interval

__all__ = ["COSTS", "DYNAMICS", "MARK", "Cost", "Dynamic", "Row", "Run", "Spec", "cell",
           "footer", "late_means", "notes_text", "quality_table", "render_csv", "render_markdown",
           "table"]

MARK = "†"  # paired difference whose CI excludes 0
_KINDS = ("pass", "mean", "maj")  # column order within an eval set


@dataclass(frozen=True)
class Run:
    run_id: str
    algorithm: str
    variant: str
    seed: str
    temperature: str
    baseline: str
    metrics: dict[str, float]


@dataclass(frozen=True)
class Spec:
    """A quality metric: ``final/<eval_set>/<kind>_at_<k>``."""

    eval_set: str
    kind: str  # pass | mean | maj
    k: int

    @property
    def name(self) -> str:
        return f"{self.eval_set}/{self.kind}_at_{self.k}"

    @property
    def title(self) -> str:
        return f"{self.eval_set} {self.kind}@{self.k}"

    def sort_key(self) -> tuple[str, int, int]:
        return (self.eval_set, _KINDS.index(self.kind), self.k)


@dataclass(frozen=True)
class Cost:
    """A cost column: ``final/<key>``; ``lower_is_best`` columns bold their minimum."""

    key: str
    title: str
    fmt: str
    lower_is_best: bool
    optional: bool  # shown in markdown only when some run logged it


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
    last ``final_window`` logged steps (board config), stored as ``final/<key>``; shown next to
    the quality metrics and paired against the baseline like them, never bolded (higher is not
    better)."""

    key: str
    metric: str  # a step metric; ``*`` matches an eval set name (the sets' values are averaged)
    title: str
    window: int | None = None  # last N logged points; None: the board's final_window


DYNAMICS = (Dynamic("token_entropy", "rollout/entropy", "final token entropy"),
            # evaluations: the last two, as every "final" quality metric
            Dynamic("tool_calls_per_traj", "eval/*/tool_calls_per_traj",
                    "tool calls per trajectory", window=2))


@dataclass
class Row:
    """One leaderboard row: an algorithm (with its variant) at one sampling temperature."""

    key: str  # shown and used in pairings: label, plus " T=<temperature>" when ambiguous
    label: str  # algorithm or algorithm@variant
    algorithm: str
    variant: str
    temperature: str
    runs: dict[str, Run]  # seed -> run
    baseline: str = ""  # key of the row paired differences are taken against
    baseline_via: str = ""  # tag | pairs | default
    baseline_note: str = ""  # why a wanted baseline was not paired (no runs, ambiguous)
    final: dict[str, Interval] = field(default_factory=dict)
    start: dict[str, Interval] = field(default_factory=dict)
    delta: dict[str, Interval] = field(default_factory=dict)
    vs: dict[str, Interval] = field(default_factory=dict)
    cost: dict[str, Interval] = field(default_factory=dict)
    color: str = "C0"

    @property
    def seeds(self) -> list[str]:
        def key(seed: str) -> tuple[int, float, str]:
            try:
                return (0, float(seed), seed)
            except ValueError:
                return (1, 0.0, seed)

        return sorted(self.runs, key=key)

    @property
    def run_ids(self) -> list[tuple[str, str]]:
        return [(s, self.runs[s].run_id) for s in self.seeds]


# ---------------------------------------------------------------------------------- markdown

def _fmt(x: float, fmt: str, signed: bool = False) -> str:
    return format(x, ("+" if signed else "") + fmt)


def cell(iv: Interval, fmt: str = ".3f", signed: bool = False) -> str:
    """``mean ± half (n)`` (t), ``mean [low, high] (n)`` (bootstrap), ``mean ± n/a (1)``, or
    ``—`` when nothing was logged."""
    if iv.n == 0 or math.isnan(iv.mean):
        return "—"
    m = _fmt(iv.mean, fmt, signed)
    if iv.method == "bootstrap":
        return f"{m} [{_fmt(iv.low, fmt, signed)}, {_fmt(iv.high, fmt, signed)}] ({iv.n})"
    half = "n/a" if math.isnan(iv.half_width) else _fmt(iv.half_width, fmt)
    return f"{m} ± {half} ({iv.n})"


def _best(values: list[float], lower: bool) -> float:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan
    return min(finite) if lower else max(finite)


def _bold_column(cells: list[str], means: list[float], lower: bool) -> list[str]:
    """Bold every cell whose mean equals the column's best (ties all bold)."""
    best = _best(means, lower)
    return [f"**{c}**" if not math.isnan(best) and m == best else c for c, m in zip(cells, means)]


def _table(header: list[str], columns: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in zip(*columns)]
    return lines


def quality_table(rows: list[Row], specs: list[Spec]) -> list[str]:
    cols = [[str(i) for i in range(1, len(rows) + 1)], [r.key for r in rows],
            [r.temperature or "?" for r in rows], [str(len(r.runs)) for r in rows]]
    for s in specs:
        ivs = [r.final.get(s.name, Interval(math.nan, math.nan, math.nan, 0, "none"))
               for r in rows]
        cols.append(_bold_column([cell(iv) for iv in ivs], [iv.mean for iv in ivs], False))
    dyn = _shown_dynamics(rows)
    cols += [[cell(r.final[d.key]) for r in rows] for d in dyn]
    return _table(["#", "row", "T", "seeds", *(s.title for s in specs), *(d.title for d in dyn)],
                  cols)


def _shown_dynamics(rows: list[Row]) -> list[Dynamic]:
    return [d for d in DYNAMICS if any(d.key in r.final and r.final[d.key].n for r in rows)]


def paired_table(rows: list[Row], specs: list[Spec]) -> list[str]:
    cols = [[str(i) for i in range(1, len(rows) + 1)], [r.key for r in rows],
            [r.baseline or ("— (" + r.baseline_note + ")" if r.baseline_note else "—")
             for r in rows]]
    dyn = _shown_dynamics(rows)
    for name in [s.name for s in specs] + [d.key for d in dyn]:
        col = []
        for r in rows:
            iv = r.vs.get(name)
            text = "—" if iv is None else cell(iv, signed=True)
            col.append(text + (MARK if iv is not None and iv.excludes_zero else ""))
        cols.append(col)
    return _table(["#", "row", "baseline", *(f"Δ {s.title}" for s in specs),
                   *(f"Δ {d.title}" for d in dyn)], cols)


def start_table(rows: list[Row], specs: list[Spec]) -> list[str]:
    cols = [[str(i) for i in range(1, len(rows) + 1)], [r.key for r in rows]]
    for s in specs:
        col = []
        for r in rows:
            st, d = r.start.get(s.name), r.delta.get(s.name)
            col.append("—" if st is None or st.n == 0 or d is None
                       else f"{st.mean:.3f} → {cell(d, signed=True)}")
        cols.append(col)
    return _table(["#", "row", *(s.title for s in specs)], cols)


def shown_costs(rows: list[Row]) -> list[Cost]:
    return [c for c in COSTS
            if not c.optional or any(r.cost.get(c.key) and r.cost[c.key].n for r in rows)]


def cost_table(rows: list[Row]) -> list[str]:
    costs = shown_costs(rows)
    cols = [[str(i) for i in range(1, len(rows) + 1)], [r.key for r in rows]]
    for c in costs:
        ivs = [r.cost[c.key] for r in rows]
        cells = [cell(iv, c.fmt) for iv in ivs]
        cols.append(_bold_column(cells, [iv.mean for iv in ivs], True) if c.lower_is_best
                    else cells)
    return _table(["#", "row", *(c.title for c in costs)], cols)


def notes_text(confidence: float, bootstrap_min_n: int, resamples: int, seed: int,
               config: str, default: str, final_window: int = 10) -> dict[str, str]:
    """The explanation above each markdown table."""
    pct = f"{round(confidence * 100):d}%"
    rule = (f"a Student-t {pct} interval over seeds (`mean ± half-width (n)`, n = seeds that "
            f"logged it; `n/a` with one seed); with {bootstrap_min_n} or more, a {pct} "
            f"percentile bootstrap (`mean [low, high] (n)`, {resamples:,} resamples, seed {seed})")
    return {
        "quality": (
            "Final value (mean of the last two evaluations) per seed, then its mean over seeds "
            f"with {rule}. pass@k is the unbiased Codex estimator (Chen et al., 2021) over n "
            "samples per problem; mean@n is the mean reward over all n samples; maj@k the "
            "majority vote. **Bold**: the best mean in the column. Rows are ranked by the "
            "primary metric; T is the sampling temperature. Final token entropy: per seed, the "
            f"mean of `rollout/entropy` (mean per-token full-vocabulary entropy of the training "
            f"rollouts) over the run's last {final_window} logged steps, never bolded. Tool calls "
            "per trajectory (multi-turn tasks): `eval/<set>/tool_calls_per_traj` (calls per "
            "sampled trajectory, answered or not) averaged over the last two evaluations (and "
            "over the eval sets), never bolded."),
        "paired": (
            "Δ = row − baseline, per seed, over the seeds both have (n = pairs), with the same "
            f"interval; {MARK} marks an interval that excludes 0. The baseline is the runs' "
            "`rlbench.baseline` tag, else the pairing config's `pairs` entry for "
            f"`algorithm@variant` or `algorithm` (`{config}`), else `{default}`; among "
            "several rows of that name, the one at the same temperature."),
        "start": ("Mean step-0 value → mean per-seed change (final − start), with its "
                  "interval."),
        "cost": (
            "Summary metrics, mean over seeds with the same intervals: updates (`final/steps`), "
            "tokens generated in training rollouts (`final/tokens_total`), tokens that went "
            "through a backward pass (`final/tokens_trained`), wall seconds (`final/wall_s`), "
            "peak resident memory (`final/peak_mem_mb`) and peak GPU memory "
            "(`final/peak_gpu_mem_mb`); a column appears when some run logged it. **Bold**: "
            "the lowest."),
    }


def footer(rows: list[Row], superseded: list[Run], excluded: dict[str, int]) -> list[str]:
    """The runs behind each row, superseded runs, and the excluded-runs footnote."""
    lines = ["<details><summary>MLflow runs behind each row</summary>", ""]
    for r in rows:
        ids = ", ".join(f"seed {s}: `{rid}`" for s, rid in r.run_ids)
        lines.append(f"- **{r.key}** (temperature {r.temperature or '?'}): {ids}")
    if superseded:
        lines += ["", "Superseded (an older FINISHED run of the same row and seed; not "
                  "counted):", ""]
        lines += [f"- {r.algorithm}{'@' + r.variant if r.variant else ''} seed {r.seed}: "
                  f"`{r.run_id}`"
                  for r in sorted(superseded, key=lambda r: (r.algorithm, r.variant, r.run_id))]
    lines += ["", "</details>"]
    excl = sum(excluded.values())
    if excl:
        statuses = ", ".join(f"{s}: {c}" for s, c in sorted(excluded.items()))
        lines += ["", f"[^excluded]: {excl} non-FINISHED runs excluded ({statuses})."]
    return lines


def render_markdown(title: str, head: list[str], rows: list[Row], specs: list[Spec],
                    plots: list[tuple[str, str]], notes: dict[str, str],
                    footer: list[str]) -> str:
    """The leaderboard page; ``plots`` = (file name, alt text); ``notes`` explain each table."""
    lines = [f"# {title}", "", *head, "", "## Quality (final)", "", notes["quality"], ""]
    lines += quality_table(rows, specs) if specs else ["No `final/<set>/pass_at_<k>` metrics."]
    lines += ["", "## Paired difference vs baseline", "", notes["paired"], ""]
    lines += paired_table(rows, specs)
    lines += ["", "## Change since step 0", "", notes["start"], ""]
    lines += start_table(rows, specs)
    lines += ["", "## Cost", "", notes["cost"], "", *cost_table(rows), "", "## Curves", ""]
    for name, alt in plots:
        lines += [f"![{alt}]({name})", ""]
    lines += footer
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- csv

def _num(x: float) -> str:
    """Full precision without float noise: 6 decimals, trailing zeros dropped; nan -> 'nan'."""
    if math.isnan(x):
        return "nan"
    s = f"{x:.6f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _iv_cols(prefix: str, ci: str, iv: Interval | None, n_name: str = "n") -> dict[str, str]:
    iv = iv or Interval(math.nan, math.nan, math.nan, 0, "none")
    return {f"{prefix}_mean": _num(iv.mean), f"{prefix}_{ci}": _num(iv.half_width),
            f"{prefix}_low": _num(iv.low), f"{prefix}_high": _num(iv.high),
            f"{prefix}_{n_name}": str(iv.n)}


def table(rows: list[Row], specs: list[Spec], confidence: float) -> list[dict[str, str]]:
    """The CSV's rows as ordered dicts of strings (also logged to MLflow as a table)."""
    ci = f"ci{round(confidence * 100):d}"
    out = []
    for r in rows:
        d = {"row": r.key, "algorithm": r.algorithm, "variant": r.variant,
             "temperature": r.temperature, "baseline": r.baseline,
             "baseline_via": r.baseline_via, "n_seeds": str(len(r.runs)),
             "seeds": ";".join(r.seeds)}
        for s in specs:
            n = s.name
            d |= _iv_cols(f"{n}/final", ci, r.final.get(n))
            start = r.start.get(n)
            d |= {f"{n}/start_mean": _num(start.mean if start else math.nan),
                  f"{n}/start_n": str(start.n if start else 0)}
            d |= _iv_cols(f"{n}/delta_start", ci, r.delta.get(n))
            vs = r.vs.get(n)
            d |= _iv_cols(f"{n}/vs_baseline", ci, vs, n_name="pairs")
            d[f"{n}/vs_baseline_excludes_zero"] = str(int(vs is not None and vs.excludes_zero))
        for dyn in DYNAMICS:
            d |= _iv_cols(f"{dyn.key}/final", ci, r.final.get(dyn.key))
            d |= _iv_cols(f"{dyn.key}/vs_baseline", ci, r.vs.get(dyn.key), n_name="pairs")
        for c in COSTS:
            d |= _iv_cols(c.key, ci, r.cost.get(c.key))
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


def late_means(client: Any, rows: list[Row], window: int) -> None:
    """Put ``final/<dynamics key>`` = mean of the step metric over the run's last ``window``
    (or the dynamic's own) logged steps into each run's metrics, averaged over the eval sets a
    ``*`` pattern matches (a run's own summary, if it logged one, wins). The value is read from
    the metric history, so runs logged before the summary existed get it too."""
    for row in rows:
        for run in row.runs.values():
            for d in DYNAMICS:
                names = [m for m in run.metrics if fnmatch.fnmatchcase(m, d.metric)]
                if f"final/{d.key}" in run.metrics or not names:
                    continue
                means = []
                for name in sorted(names):
                    by_step: dict[int, float] = {}
                    for m in sorted(client.get_metric_history(run.run_id, name),
                                    key=lambda m: (m.step, m.timestamp)):
                        by_step[m.step] = m.value  # a step logged twice: the last write wins
                    tail = [by_step[s] for s in sorted(by_step)[-(d.window or window):]]
                    if tail:
                        means.append(sum(tail) / len(tail))
                if means:
                    run.metrics[f"final/{d.key}"] = float(sum(means) / len(means))
