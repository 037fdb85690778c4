"""The suite's aggregate board: which algorithm is best across tasks, and how sure we are.

Cross-task aggregates use ``rliable`` (Agarwal et al., "Deep RL at the Edge of the Statistical
Precipice", NeurIPS 2021), the field's standard tool, not hand-written statistics:

* **Per-task normalised score** of a run: ``(x - W) / (1 - W)``, where ``x`` is the run's final
  value of the task's primary metric (the board's: the first eval set's pass@1) and ``W`` the
  warm start's value of it, the mean of the step-0 evaluations (``start/<metric>``) of every run
  of the task. Why this normalisation: every algorithm on a task starts from the same warm start,
  so ``W`` is the natural zero (0 = no gain, negative = the algorithm lost what the warm start
  had), and tasks differ in the room the warm start leaves (0.1 -> 0.2 on a hard task is not the
  same achievement as 0.8 -> 0.9 on an easy one); dividing by the headroom ``1 - W`` makes 1 mean
  "solved everything the warm start could not" on every task. Raw scores, or a fixed min-max range
  borrowed from elsewhere, would let the easiest task dominate the aggregate. ``W`` is one number
  per task (the mean over all of the task's runs), not per run, so a seed's noisy step-0 sample
  does not move its own normalisation.
* **IQM and mean** of the normalised scores over all runs x tasks, with **stratified-bootstrap**
  confidence intervals (runs resampled within each task; ``rliable.library.
  get_interval_estimates``).
* **Probability of improvement** of each algorithm over GRPO, ``P(X > Y)`` averaged over tasks
  (``rliable.metrics.probability_of_improvement``), with its stratified-bootstrap interval.
* **Performance profiles**: the fraction of runs above each normalised score tau, with bands, as
  a PNG (``rliable.library.create_performance_profile``, ``rliable.plot_utils``).

Only algorithms that ran on every task of the suite enter the aggregate (ARPO and AEPO run on the
agentic task only: an aggregate over fewer tasks would not be comparable); they are listed with
their tasks. Each algorithm contributes the seeds it ran on every task. Runs come from
:func:`harness.report.collect.collect`, so a row is one configuration as on every board; and where
a cell (algorithm x task x seed) has several FINISHED runs the aggregate refuses (exit 2, naming
the runs) rather than pick one.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.report.config import BoardConfig, BoardError
from harness.report.tables import Row

BASELINE = "grpo"
OUT_NAME = "aggregate"


@dataclass
class TaskScores:
    """The normalised scores of one task (one board group)."""

    task: str  # "<task>-<variant> / <model>"
    metric: str  # the primary metric, e.g. heldout/pass_at_1
    warm_start: float  # W
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # algorithm -> seed -> s


@dataclass
class Aggregate:
    tasks: list[TaskScores]
    algorithms: list[str]  # aggregated: ran on every task
    partial: dict[str, list[str]]  # not aggregated: algorithm -> its tasks
    seeds: dict[str, list[str]]  # algorithm -> the seeds it ran on every task
    iqm: dict[str, tuple[float, float, float]]  # algorithm -> (point, low, high)
    mean: dict[str, tuple[float, float, float]]
    poi: dict[str, tuple[float, float, float]]  # P(algorithm > GRPO)
    matrices: dict[str, np.ndarray]  # algorithm -> (runs, tasks) normalised scores


def normalise(x: float, warm_start: float) -> float:
    """Gain over the warm start relative to its headroom: ``(x - W) / (1 - W)``."""
    if not warm_start < 1.0:
        raise BoardError(f"warm-start score {warm_start} leaves no headroom (1 - W <= 0)")
    return (x - warm_start) / (1.0 - warm_start)


def task_scores(title: str, rows: list[Row], duplicates: list, cfg: BoardConfig) -> TaskScores:
    """Normalised final scores of one board group; refuses duplicated cells and an algorithm
    with several rows (configurations) on the task."""
    from harness.report.board import _primary, _specs

    if duplicates:
        cells = "; ".join(f"{row.key} seed {seed}: runs {', '.join(r.shown_id[:8] for r in runs)}"
                          for row, seed, runs in duplicates)
        raise BoardError(f"{title}: the suite aggregate needs one FINISHED run per cell and "
                         f"these cells have several ({cells}); delete or move all but one, the "
                         "aggregate does not choose between them")
    by_alg: dict[str, list[Row]] = {}
    for row in rows:
        by_alg.setdefault(row.algorithm, []).append(row)
    several = {a: [r.key for r in rs] for a, rs in by_alg.items() if len(rs) > 1}
    if several:
        raise BoardError(f"{title}: the suite aggregate needs one row per algorithm and task; "
                         f"{'; '.join(f'{a}: rows {ks}' for a, ks in sorted(several.items()))}")
    prim = _primary(_specs(rows, cfg))
    if prim is None:
        raise BoardError(f"{title}: no final/<set>/pass_at_<k> metric was logged")
    final, start = f"final/{prim.name}", f"start/{prim.name}"
    starts = [r.metrics[start] for row in rows for r in row.runs.values()
              if start in r.metrics and not math.isnan(r.metrics[start])]
    if not starts:
        raise BoardError(f"{title}: no run logged {start} (the warm start's evaluation at "
                         "step 0), so scores cannot be normalised")
    W = float(np.mean(starts))
    out = TaskScores(title, prim.name, W)
    for row in rows:
        out.scores[row.algorithm] = {s: normalise(r.metrics[final], W)
                                     for s, r in row.runs.items() if final in r.metrics}
    return out


def aggregate(tasks: list[TaskScores], reps: int = 2000, seed: int = 0,
              confidence: float = 0.95) -> Aggregate:
    """rliable's IQM, mean and probability of improvement over GRPO, with stratified-bootstrap
    intervals, over the algorithms that ran on every task."""
    from rliable import library as rly
    from rliable import metrics

    names = sorted({a for t in tasks for a in t.scores})
    complete = [a for a in names if all(t.scores.get(a) for t in tasks)]
    partial = {a: [t.task for t in tasks if t.scores.get(a)] for a in names if a not in complete}
    seeds: dict[str, list[str]] = {}
    matrices: dict[str, np.ndarray] = {}
    for a in complete:
        common = set.intersection(*(set(t.scores[a]) for t in tasks))
        if not common:
            partial[a] = [t.task for t in tasks]
            continue
        seeds[a] = sorted(common, key=lambda s: (len(s), s))
        matrices[a] = np.array([[t.scores[a][s] for t in tasks] for s in seeds[a]])
    complete = [a for a in complete if a in matrices]

    def iqm_and_mean(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)])

    point, ci = rly.get_interval_estimates(
        matrices, iqm_and_mean, reps=reps, confidence_interval_size=confidence,
        random_state=np.random.RandomState(seed)) if matrices else ({}, {})
    iqm = {a: (float(point[a][0]), float(ci[a][0, 0]), float(ci[a][1, 0])) for a in matrices}
    mean = {a: (float(point[a][1]), float(ci[a][0, 1]), float(ci[a][1, 1])) for a in matrices}
    poi: dict[str, tuple[float, float, float]] = {}
    if BASELINE in matrices:
        pairs = {a: (matrices[a], matrices[BASELINE]) for a in matrices if a != BASELINE}
        if pairs:
            p_point, p_ci = rly.get_interval_estimates(
                pairs, metrics.probability_of_improvement, reps=reps,
                confidence_interval_size=confidence, random_state=np.random.RandomState(seed))
            poi = {a: (float(np.squeeze(p_point[a])), float(np.squeeze(p_ci[a])[0]),
                       float(np.squeeze(p_ci[a])[1])) for a in pairs}
    return Aggregate(tasks, complete, partial, seeds, iqm, mean, poi, matrices)


def performance_profile(agg: Aggregate, path: Path, reps: int = 2000, seed: int = 0) -> Path:
    """Fraction of runs with a normalised score above tau, per algorithm, with bands (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly
    from rliable import plot_utils

    from harness.report.plots import style

    values = np.concatenate([m.ravel() for m in agg.matrices.values()])
    tau = np.linspace(min(float(values.min()), 0.0), max(float(values.max()), 1.0), 81)
    np.random.seed(seed)  # rliable's profile bootstrap draws from numpy's global generator
    profiles, cis = rly.create_performance_profile(agg.matrices, tau, reps=reps)
    fig, ax = plt.subplots(figsize=(8, 5))
    plot_utils.plot_performance_profiles(
        profiles, tau, performance_profile_cis=cis, ax=ax,
        colors={a: style(a).color for a in agg.matrices},
        xlabel=r"normalised score $\tau$ = (x - W) / (1 - W)",
        ylabel=r"fraction of runs with score > $\tau$")
    ax.legend([a for a in profiles], loc="upper right", fontsize=8)
    ax.set_title(f"Performance profiles over {len(agg.tasks)} tasks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _iv(t: tuple[float, float, float] | None) -> str:
    return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]" if t else "—"


def render(agg: Aggregate, head: list[str], confidence: float, reps: int) -> tuple[str, str]:
    """(markdown, csv) of the aggregate board."""
    pct = f"{confidence:.0%}"
    order = sorted(agg.algorithms, key=lambda a: -agg.iqm[a][0])
    lines = ["# Suite aggregate", "", *head,
             f"- Normalised score per task: (x - W) / (1 - W), x = the run's final primary "
             f"metric, W = the warm start's (mean step-0 evaluation of the task's runs); "
             f"harness/report/aggregate.py says why. Intervals: {pct} stratified bootstrap "
             f"(rliable, {reps} resamples).", "",
             "| task | primary metric | W (warm start) |", "| --- | --- | --- |"]
    lines += [f"| {t.task} | {t.metric} | {t.warm_start:.3f} |" for t in agg.tasks]
    lines += ["", f"## Across {len(agg.tasks)} tasks", "",
              f"| algorithm | seeds | IQM [{pct}] | mean [{pct}] | P(> {BASELINE}) [{pct}] |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a} | {len(agg.seeds[a])} | {_iv(agg.iqm[a])} | {_iv(agg.mean[a])} | "
              f"{_iv(agg.poi.get(a))} |" for a in order]
    if BASELINE not in agg.matrices:
        lines += ["", f"No {BASELINE} runs on every task: no probability of improvement."]
    lines += ["", "P(> grpo) is the probability that a run of the algorithm beats a run of GRPO "
              "on a task, averaged over tasks; 0.5 = no difference.", "",
              "## Per task (mean normalised score over seeds)", "",
              "| algorithm | " + " | ".join(t.task for t in agg.tasks) + " |",
              "| --- | " + " | ".join("---" for _ in agg.tasks) + " |"]
    names = sorted({a for t in agg.tasks for a in t.scores})
    for a in names:
        cells = [f"{np.mean(list(t.scores[a].values())):.3f} (n={len(t.scores[a])})"
                 if t.scores.get(a) else "—" for t in agg.tasks]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    if agg.partial:
        lines += ["", "Not in the aggregate (did not run on every task): " + "; ".join(
            f"{a} ({', '.join(ts)})" for a, ts in sorted(agg.partial.items())) + "."]
    if agg.matrices:
        lines += ["", "![performance profiles](performance_profile.png)"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["algorithm", "seeds", "iqm", "iqm_low", "iqm_high", "mean", "mean_low",
                     "mean_high", "poi_vs_grpo", "poi_low", "poi_high"])
    for a in order:
        p = agg.poi.get(a, (math.nan,) * 3)
        writer.writerow([a, len(agg.seeds[a]), *(f"{v:.6g}" for v in (*agg.iqm[a],
                         *agg.mean[a], *p))])
    return "\n".join(lines) + "\n", buf.getvalue()


def write_aggregate(agg: Aggregate, out: Path, head: list[str], confidence: float,
                    reps: int) -> list[Path]:
    d = out / OUT_NAME
    d.mkdir(parents=True, exist_ok=True)
    md, table = render(agg, head, confidence, reps)
    (d / "aggregate.md").write_text(md)
    (d / "aggregate.csv").write_text(table)
    files = [d / "aggregate.md", d / "aggregate.csv"]
    if agg.matrices:
        files.append(performance_profile(agg, d / "performance_profile.png", reps))
    return files
