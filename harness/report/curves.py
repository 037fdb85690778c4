"""Response curves on a board (issue 36): a final metric read against a numeric key that varies
across one algorithm's rows, declared in the board config before it is read.

The case it was built for: arbitrary-entropy PO claims to hold the policy's entropy at a chosen
target H_target. Its rows differ only in ``algorithm.rollout.target_entropy``; the curve is the
final token entropy against the target. Each row (one value x of the key) gives the per-seed
finals y_{x,s}; the slope of y on x is estimated in the seed-blocked linear model

    y_{x,s} = a_s + b * x + e_{x,s}        (ordinary least squares, a seed fixed effect a_s)

with statsmodels: the estimate b, its standard error, the two-sided interval at the board's
confidence, the p-value for b = 0, and the smallest slope the design detects at the plan's
power, MDE_b = (t_{1-alpha/2, df} + t_{power, df}) * SE(b). Held at the target, b = 1; ignored,
b = 0. The plot shows each row's mean and interval against x, the line y = x (the target itself)
and the baseline row's interval as a band (GRPO's entropy, left alone).

Declared in the board config per named sweep (``curves:``, conf/board/*.yaml); a page draws
the curves of the sweeps its runs came from::

    curves:
      entropy_targets:                      # the named sweep (tag rlbench.sweep)
        - name: entropy_vs_target           # the PNG's name and the section's title
          rows: arbitrary_entropy           # the algorithm whose rows make the curve
          x: algorithm.rollout.target_entropy   # a config key of their runs
          y: token_entropy                  # a final metric (final/<y>)
          baseline: grpo                    # a row drawn as a band (optional)
          identity: true                    # draw y = x (optional)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.report.analysis import identical_to
from harness.report.config import BoardError, CurveSpec
from harness.report.stats import Interval, interval
from harness.report.tables import Row

__all__ = ["Curve", "fit_curve", "plot_curve", "section"]


@dataclass
class Curve:
    """A fitted curve: per x its rows' interval, the slope's estimate and test."""

    spec: CurveSpec
    points: list[tuple[float, str, Interval]]  # (x, row label, interval of y over seeds)
    slope: float = math.nan
    se: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p: float = math.nan
    mde: float = math.nan
    df: int = 0
    n: int = 0  # runs in the fit
    baseline: Interval | None = None
    note: str = ""  # why there is no fit
    # pairs of curve rows whose runs agree bit for bit (e.g. two targets the controller treats
    # alike on every step): separate points in the fit, one computation
    identical: list[tuple[str, str]] = field(default_factory=list)

    @property
    def png(self) -> str:
        return f"{self.spec.name}.png"


def _x_of(row: Row, key: str) -> float | None:
    values = {run.config.get(key) for run in row.runs.values()}
    if len(values) != 1 or None in values:
        return None
    try:
        return float(values.pop())
    except (TypeError, ValueError):
        return None


def fit_curve(rows: list[Row], spec: CurveSpec, confidence: float, power: float) -> Curve:
    """The curve ``spec`` over ``rows`` (a board group's rows, after their final metrics are
    filled). A row of ``spec.rows`` whose runs do not share one numeric ``spec.x`` is refused:
    the curve would mix configurations."""
    import numpy as np
    import statsmodels.formula.api as smf
    from scipy import stats

    metric = f"final/{spec.y}"
    points: list[tuple[float, str, Interval]] = []
    data: list[tuple[float, str, float]] = []
    for row in rows:
        if row.algorithm != spec.rows:
            continue
        x = _x_of(row, spec.x)
        if x is None:
            raise BoardError(f"curve {spec.name}: row {row.label!r} has no single numeric "
                             f"{spec.x} over its runs; a curve row is one value of its key")
        ys = row.per_seed(metric)
        points.append((x, row.label, interval(list(ys.values()), confidence)))
        data += [(x, seed, y) for seed, y in ys.items()]
    points.sort()
    curve = Curve(spec, points)
    mine = sorted((r for r in rows if r.algorithm == spec.rows), key=lambda r: _x_of(r, spec.x))
    runs = {r.label: {s: run.metrics for s, run in r.runs.items()} for r in mine}
    curve.identical = [(a.label, b.label) for i, a in enumerate(mine) for b in mine[i + 1:]
                       if identical_to(runs[a.label], runs[b.label])]
    base = next((r for r in rows if r.label == spec.baseline), None) if spec.baseline else None
    if base is not None:
        curve.baseline = interval(list(base.per_seed(metric).values()), confidence)
    xs = {x for x, _, _ in data}
    seeds = {s for _, s, _ in data}
    curve.n = len(data)
    if len(xs) < 2:
        curve.note = f"{len(xs)} value(s) of {spec.x}: no slope"
        return curve
    import pandas as pd

    frame = pd.DataFrame(data, columns=["x", "seed", "y"])
    formula = "y ~ x + C(seed)" if len(seeds) > 1 else "y ~ x"
    fit = smf.ols(formula, data=frame).fit()
    curve.df = int(fit.df_resid)
    if curve.df < 1:
        curve.note = "no residual degrees of freedom: no test"
        return curve
    curve.slope, curve.se = float(fit.params["x"]), float(fit.bse["x"])
    low, high = fit.conf_int(alpha=1 - confidence).loc["x"]
    curve.low, curve.high, curve.p = float(low), float(high), float(fit.pvalues["x"])
    alpha = 1 - confidence
    curve.mde = float((stats.t.ppf(1 - alpha / 2, curve.df) + stats.t.ppf(power, curve.df))
                      * curve.se)
    if not np.isfinite(curve.slope):
        curve.note = "the fit failed"
    return curve


def plot_curve(curve: Curve, path: Path, ylabel: str) -> None:
    """Deterministic PNG: each row's mean and interval against x, y = x, the baseline band."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.6, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [x for x, _, _ in curve.points]
    if curve.baseline is not None and xs:
        b = curve.baseline
        ax.axhspan(b.low, b.high, color="0.85", label=f"{curve.spec.baseline} (interval)")
        ax.axhline(b.mean, color="0.4", linewidth=1)
    if curve.spec.identity and xs:
        lo, hi = min(xs), max(xs)
        ax.plot([lo, hi], [lo, hi], linestyle="--", color="tab:green", label="y = x (target)")
    ax.errorbar(xs, [iv.mean for _, _, iv in curve.points],
                yerr=[[iv.mean - iv.low for _, _, iv in curve.points],
                      [iv.high - iv.mean for _, _, iv in curve.points]],
                marker="o", color="tab:red", capsize=3, label=curve.spec.rows)
    ax.set(title=f"{curve.spec.name}: slope {curve.slope:+.3f}" if curve.df else
           curve.spec.name, xlabel=curve.spec.x, ylabel=ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def section(curves: list[Curve], confidence: float) -> list[str]:
    """The page's ``## Response curves`` section: per curve its points, the slope's test and
    the plot."""
    if not curves:
        return []
    pct = f"{100 * confidence:g}%"
    lines = ["", "## Response curves", "",
             "Declared in the board config (`curves`, harness/report/curves.py): a final metric "
             "against a key that varies across one algorithm's rows. Slope: the seed-blocked "
             f"linear model y = a_seed + b·x + e (OLS), its {pct} interval, p for b = 0 and "
             "the smallest slope the seeds detect at the plan's power (MDE); b = 1 when y "
             "follows x, 0 when it ignores it."]
    for c in curves:
        lines += ["", f"### {c.spec.name}: `final/{c.spec.y}` against `{c.spec.x}`", "",
                  f"| {c.spec.x} | row | seeds | mean [{pct}] |", "|---|---|---|---|"]
        lines += [f"| {x:g} | {label} | {iv.n} | {iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}] |"
                  for x, label, iv in c.points]
        if c.baseline is not None:
            b = c.baseline
            lines.append(f"| — | {c.spec.baseline} (baseline) | {b.n} | {b.mean:.3f} "
                         f"[{b.low:.3f}, {b.high:.3f}] |")
        lines.append("")
        if c.note:
            lines.append(f"- Slope: none ({c.note}).")
        else:
            lines.append(f"- Slope: **{c.slope:+.3f}** [{c.low:+.3f}, {c.high:+.3f}], "
                         f"SE {c.se:.3f}, p {c.p:.3g}, MDE {c.mde:.3f} ({c.n} runs, "
                         f"{c.df} residual df).")
        if c.identical:
            lines.append("- Identical in every run: " + ", ".join(
                f"{a} ≡ {b}" for a, b in c.identical) + ". Their runs computed the same thing, "
                "yet each row counts as separate points in the fit: its SE and MDE are "
                "optimistic (the design has fewer distinct points than rows).")
        lines += ["", f"![{c.spec.name}]({c.png})"]
    return lines
