"""A board's declared plan applied: which comparisons are confirmatory, their test, their power,
and what else a reader must know before reading them (harness/report/analysis.py has the
statistics; conf/board/*.yaml declares the plan).

The plan, printed at the top of every board before any number:

* **Primary metric**: the plan's (default: the first eval set's pass@1), of the last evaluation
  of each run (the model training ended with; harness/report/collect.py ``last_evaluation``).
* **Comparisons**: each row against its declared baseline (the pairing config), nothing else.
  Rows whose runs are the baseline's bit for bit are labelled identical and not tested. The
  board's sensitivity controls are tested apart and never reach :func:`judge`
  (harness/report/controls.py).
* **Test**: the seed-blocked model with single-step max-|t| adjustment (Dunnett's many-to-one
  test when there is one baseline), its assumptions checked and printed.
* **Power**: the family's minimum detectable effect (MDE) at the board's seeds; the effect each
  named sweep declares it is powered for (``plan.detect``). A board is **descriptive only** when
  its sweep declares no effect, its MDE is above the declared one, or a selection (e.g. the
  learning rate) was made on the seeds it reports: then no comparison is marked.

Secondary metrics (pass@k, entropy, length, tokens) keep their paired intervals but no marks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from harness.report.analysis import Analysis, analyse, identical_to, seeds_needed
from harness.report.config import BoardConfig
from harness.report.tables import Row, Spec

__all__ = ["SIG_MARK", "Verdict", "judge", "plan_lines", "primary_section"]

SIG_MARK = "‡"  # a confirmatory comparison significant after the family's adjustment
_FACTORS = (("model.pretrain.seed", "warm start"), ("split_seed", "data split"))


@dataclass
class Verdict:
    """The plan's outcome on one board group."""

    metric: Spec | None
    analysis: Analysis
    identical: dict[str, str] = field(default_factory=dict)  # row key -> its baseline's key
    detect: float | None = None  # the declared effect (None: no sweep declares one)
    sweeps: list[str] = field(default_factory=list)
    descriptive: str = ""  # why the board is descriptive only ("" = confirmatory)
    start_sd: float = math.nan  # SD across seeds of the warm start's score (evaluation noise)
    sampling_se: float = math.nan  # mean logged sampling SE of the final evaluations
    seed_var: float = math.nan  # pooled within-row variance of the final scores over seeds
    factors: list[str] = field(default_factory=list)
    at: str = "last evaluation"  # which evaluation of each run the primary is read at

    @property
    def confirmatory(self) -> bool:
        return not self.descriptive and bool(self.analysis.comparisons)

    def mark(self, row_key: str) -> str:
        comp = next((c for c in self.analysis.comparisons if c.row == row_key), None)
        return SIG_MARK if comp and self.confirmatory and comp.significant else ""


def _factors(rows: list[Row]) -> list[str]:
    """Whether the warm start and the data split were one for every run or drawn per seed."""
    runs = [r for row in rows for r in row.runs.values()]
    lines = []
    for suffix, what in _FACTORS:
        keys = sorted({k for r in runs for k in r.config if k == suffix or
                       k.endswith("." + suffix)})
        for key in keys:
            by_seed: dict[str, set[str]] = {}
            for r in runs:
                by_seed.setdefault(r.seed, set()).add(r.config.get(key, "(not set)"))
            values = set().union(*by_seed.values())
            if len(values) == 1:
                lines.append(f"one {what} for every run (`{key}` = {next(iter(values))}): "
                             "every interval is conditional on it")
            else:
                lines.append(f"the {what} varies across runs (`{key}`: "
                             f"{len(values)} values over {len(by_seed)} seeds)")
    return lines


def judge(rows: list[Row], prim: Spec | None, cfg: BoardConfig, *,
          selected_on_reported: bool = False, edges: dict[str, str] | None = None,
          at: str = "last evaluation") -> Verdict:
    """Test the board's declared comparisons on ``prim`` and decide whether the board is
    confirmatory (see the module docstring). Each run's primary is its last evaluation, or with
    ``plan.read: budget`` its evaluation at the common token budget (``at`` says which)."""
    plan = cfg.plan
    if prim is None:
        return Verdict(None, Analysis(note="no primary metric"), descriptive="no primary metric")
    by_key = {r.key: r for r in rows}
    key = f"{plan.read}/{prim.name}"
    identical: dict[str, str] = {}
    contrasts = []
    for row in rows:
        base = by_key.get(row.baseline)
        if base is None:
            continue
        if identical_to({s: r.metrics for s, r in row.runs.items()},
                        {s: r.metrics for s, r in base.runs.items()}):
            identical[row.key] = base.key
        elif len(set(row.runs) & set(base.runs)) >= 2:  # one shared seed: nothing to test on
            contrasts.append((row.key, base.key))
    values = {r.key: r.per_seed(key) for r in rows}
    result = analyse(values, contrasts, plan.alpha, plan.power)
    sweeps = sorted({r.sweep for row in rows for r in row.runs.values() if r.sweep})
    declared = [plan.detect[s] for s in sweeps if s in plan.detect]
    detect = min(declared) if declared else None
    # the warm start is one model: a seed's step-0 score is the same on every row, so one value
    # per seed (their mean across rows) enters its spread
    by_seed: dict[str, list[float]] = {}
    for row in rows:
        for s, v in row.per_seed(f"start/{prim.name}").items():
            by_seed.setdefault(s, []).append(v)
    starts = [float(np.mean(v)) for v in by_seed.values()]
    ses = [v for row in rows for v in row.per_seed(f"final/{prim.name}_sampling_se").values()]
    finals = [list(r.per_seed(key).values()) for r in rows]
    dof = sum(len(f) - 1 for f in finals if len(f) > 1)
    verdict = Verdict(prim, result, identical, detect, sweeps,
                      start_sd=float(np.std(starts, ddof=1)) if len(starts) > 1 else math.nan,
                      seed_var=(sum(float(np.var(f, ddof=1)) * (len(f) - 1)
                                    for f in finals if len(f) > 1) / dof) if dof else math.nan,
                      sampling_se=float(np.sqrt(np.mean(np.square(ses)))) if ses else math.nan,
                      factors=_factors(rows), at=at)
    if selected_on_reported:
        verdict.descriptive = ("each row's setting was selected on the seeds this board "
                               "reports, so its results carry the selection's seed noise")
    elif not result.comparisons:
        verdict.descriptive = result.note or "no comparison to test"
    elif detect is None:
        verdict.descriptive = (f"no effect to detect is declared for sweep(s) "
                               f"{', '.join(sweeps) or '(none)'} (plan.detect in {cfg.source})")
    elif result.mde > detect:
        verdict.descriptive = (f"its minimum detectable effect, {result.mde:.3f}, is above the "
                               f"{detect:g} its sweep declares it is powered for")
    if edges:
        verdict.factors.append("chosen at the edge of the grid (the optimum may lie outside "
                               "it): " + ", ".join(f"{k} ({v})" for k, v in sorted(edges.items())))
    return verdict


def plan_lines(v: Verdict, cfg: BoardConfig) -> list[str]:
    """The declared plan and its verdict, for the page's head (before any table)."""
    plan = cfg.plan
    if v.metric is None:
        return []
    a = v.analysis
    lines = [f"- **{'Confirmatory' if v.confirmatory else 'Descriptive only'}**"
             + (f": {v.descriptive}." if v.descriptive else
                f": the family's minimum detectable effect ({a.mde:.3f}) is at or below the "
                f"{v.detect:g} declared for {', '.join(v.sweeps)}."),
             f"- Analysis plan (declared in `{cfg.source}`): primary metric {v.metric.title}"
             + (" (lower is better)" if v.metric.lower_is_better else "")
             + f" of each run's {v.at}; one comparison per row against its baseline; "
             "seed-blocked model (row + seed) with single-step max-|t| adjustment over those "
             f"comparisons (Dunnett's many-to-one test against one baseline), family level "
             f"{plan.alpha:g}; MDE at power {plan.power:g}; secondary metrics descriptive (no "
             "marks)."]
    if v.identical:
        lines.append("- Identical to their baseline in every run (not tested): " + ", ".join(
            f"{r} ≡ {b}" for r, b in sorted(v.identical.items())) + ".")
    lines += [f"- Held fixed: {f}." for f in v.factors]
    return lines


def _fmt(x: float, spec: str = ".3f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def primary_section(v: Verdict, cfg: BoardConfig) -> list[str]:
    """The confirmatory comparisons table with the model's diagnostics and power."""
    if v.metric is None:
        return []
    a, pct = v.analysis, f"{round((1 - cfg.plan.alpha) * 100)}%"
    lines = ["", "## Primary comparisons", ""]
    if not a.comparisons:
        return [*lines, f"No test: {a.note or v.descriptive}."]
    lines += [f"{v.metric.title} ({v.at}), row − baseline: the seed-blocked model's "
              f"estimate (the paired mean difference when every row has every seed), its {pct} "
              f"simultaneous interval "
              f"(estimate ± {a.critical:.2f} SE: every interval of the family holds together), "
              f"the adjusted p-value and the minimum detectable effect at power "
              f"{cfg.plan.power:g}. Model: {len(a.rows)} rows × {len(a.seeds)} seeds, "
              f"{a.df} residual df, residual SD {a.sigma:.4f}. "
              + (f"{SIG_MARK}: significant for the family at {cfg.plan.alpha:g}."
                 if v.confirmatory else "No marks: the board is descriptive only."), "",
              "| row | baseline | seeds | Δ | interval | adjusted p | MDE |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in sorted(a.comparisons, key=lambda c: c.estimate if v.metric.lower_is_better
                    else -c.estimate):  # the best difference first
        lines.append(f"| {c.row} | {c.baseline} | {c.n} | {c.estimate:+.3f}{v.mark(c.row)} | "
                     f"[{c.low:+.3f}, {c.high:+.3f}] | {_fmt(c.p_adjusted)} | {c.mde:.3f} |")
    checks = [f"equal residual spread across rows: Brown–Forsythe p = {_fmt(a.levene_p)}",
              f"normal residuals: Shapiro–Wilk p = {_fmt(a.shapiro_p)}"]
    doubtful = [c for c, p in zip(checks, (a.levene_p, a.shapiro_p)) if p < 0.05]
    lines += ["", "Assumptions: " + "; ".join(checks) + "."
              + (f" Doubtful ({'; '.join(d.split(':')[0] for d in doubtful)}): read the "
                 "paired intervals of the secondary table beside these." if doubtful else "")]
    if v.detect is not None and a.sigma > 0:
        pairs = [(c.row, c.baseline) for c in a.comparisons]
        need = seeds_needed(a.sigma, pairs, v.detect, cfg.plan.alpha, cfg.plan.power)
        lines += ["", f"Power: with this residual SD, {need or 'more than 200'} seeds per row "
                  f"detect the declared {v.detect:g} at power {cfg.plan.power:g} "
                  f"(`rlbench power` plans from any board's runs)."]
    if not math.isnan(v.start_sd):
        share = v.start_sd ** 2 / v.seed_var if v.seed_var > 0 else math.nan
        lines += ["", f"Evaluation noise: the warm start, one model re-evaluated with each "
                  f"seed's sampling, scores with SD {v.start_sd:.4f} across seeds, "
                  f"{_fmt(100 * share, '.0f')}% of the "
                  + ("final" if cfg.plan.read == "final" else "at-budget")
                  + " scores' variance over seeds (pooled within rows)"
                  + (f"; the final evaluations' own sampling SE is {v.sampling_se:.4f} (logged "
                     f"per evaluation)" if not math.isnan(v.sampling_se) else "")
                  + ". A larger evaluation (more problems or samples) lowers it."]
    return lines
