"""The suite's aggregate board: which algorithm is best across tasks, and how sure we are.

**Score.** On task ``t``, algorithm ``a``'s score on seed ``s`` is its paired
effect against GRPO in units of the task's seed-to-seed noise::

    d(a, t, s) = (x(a, t, s) - x(grpo, t, s)) / sigma_t
    sigma_t^2  = sum over the task's rows r and their seeds s of (x(r, t, s) - mean_r)^2
                 / sum over rows of (n_r - 1)

``x`` is a run's final value of the task's primary metric (the board's: the first eval set's
pass@1) and ``sigma_t`` the task's pooled within-row standard deviation over seeds (every
algorithm's row on the task; rows with one seed add nothing), the root mean squared error of a
one-way ANOVA of the final scores by row. It is the standardised mean difference of Cohen's d with
the pooled SD of all the task's rows (Cohen, "Statistical Power Analysis for the Behavioral
Sciences", 1988; Hedges & Olkin, "Statistical Methods for Meta-Analysis", 1985). Why:

* **Each task's noise counts once.** A headroom score, ``(x - W) / (1 - W)`` with ``W`` the warm
  start's value, divides by the headroom: at ``W = 0.98`` it multiplies noise by 50, and on the
  committed suite the tasks' seed SDs of such scores for GRPO differ 26x (countdown 0.005,
  agentic 0.131), so the noisiest task dominates the pooled mean and the IQM trims it. In units
  of ``sigma_t``, one unit means "one seed-SD of this task" on every task, whatever its level or
  headroom; ``W`` is not used.
* **Paired per seed.** Runs of one seed share the data order and sampling state, so the per-seed
  difference removes noise the seed puts into both (as the per-task boards' paired tables do).
* **Pooled over the task's rows, not GRPO's seeds alone.** With 3-5 seeds GRPO's SD has 2-4
  degrees of freedom and is often several-fold too small by chance (with 2, it is below 0.32x the
  true SD one time in ten), which would blow a task up as the headroom did; k rows give k(n-1)
  degrees of freedom. It is one number per task, the same for every algorithm, so it does not
  reorder the algorithms on a task.
* **GRPO is the reference** (score 0 by construction, reported as such, not as a row with an
  interval), and a score below 0 (worse than GRPO on that seed) is kept as it is.

Failure modes, and what this module does about them:

* Pooling assumes the rows have similar seed noise. A row with a collapsing seed inflates
  ``sigma_t`` and shrinks every effect on the task; rows without spread deflate it. The task table
  prints ``sigma_t`` and its degrees of freedom, and the raw per-task means, to check by.
* ``sigma_t = 0`` (every row gives one value on every seed) or no row with two seeds: there is no
  noise to scale by, and dividing by 0 (or by a floor picked here) would let that task dominate;
  :class:`TaskScores` refuses (:class:`BoardError` naming the task).
* A task without GRPO runs has no reference: refused, naming the task.
* The score ranks algorithms against GRPO, not against the warm start: on a task where every row
  ends below the warm start it ranks how much each lost. ``W`` (the mean step-0 value
  ``start/<metric>`` of the task's runs) is computed only to flag such a task on the page, and to
  show it.

**Aggregates** use ``rliable`` (Agarwal et al., "Deep RL at the Edge of the Statistical
Precipice", NeurIPS 2021): the IQM and mean of ``d`` over seeds x tasks with stratified-bootstrap
percentile intervals (seeds resampled within each task; ``rliable.library.get_interval_estimates``);
the probability of improvement over GRPO, ``P(X > Y)`` (ties count half: the Mann-Whitney U
statistic over the pairs of runs) averaged over tasks, on the raw final scores, since it is
scale-free (``rliable.metrics.probability_of_improvement``); and performance profiles of ``d``.

Only algorithms that ran on every task, on seeds GRPO also ran on every task, enter the aggregate
(ARPO and AEPO run on the agentic task only: an aggregate over fewer tasks would not be
comparable); the others are listed with their tasks. Runs come from
:func:`harness.report.collect.collect`, so a row is one configuration as on every board; where a
cell (algorithm x task x seed) has several FINISHED runs the aggregate refuses (exit 2, naming the
runs) rather than pick one.

**Reproducibility.** rliable 1.2.0's bootstraps draw their indices with ``np.random.choice``, the
global generator, and ignore their ``random_state`` argument (``StratifiedBootstrap.
update_indices``; arch's own generator is only used by the methods rliable overrides). Every
rliable call here therefore runs inside :func:`_seeded`, which seeds the global generator and
restores the caller's state afterwards: one seed gives the same numbers bit for bit, and the
caller's random stream is left as it was.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.report.config import BoardConfig, BoardError
from harness.report.tables import Row

__all__ = ["BASELINE", "OUT_NAME", "Aggregate", "TaskScores", "aggregate", "performance_profile",
           "render", "task_scores", "write_aggregate"]

BASELINE = "grpo"
OUT_NAME = "aggregate"


def _seed_key(s: str) -> tuple[int, str]:
    return len(s), s  # "2" before "10"


@dataclass
class TaskScores:
    """The final scores of one task (one board group) and its noise scale ``sd`` (sigma_t),
    computed on construction; refuses a task whose scale is 0 or cannot be estimated."""

    task: str  # "<task>-<variant> / <model>"
    metric: str  # the primary metric, e.g. heldout/pass_at_1
    warm_start: float  # W, for the regression flag and display only (nan: no start/ logged)
    finals: dict[str, dict[str, float]] = field(default_factory=dict)  # alg -> seed -> x
    sd: float = field(init=False)
    df: int = field(init=False)

    def __post_init__(self) -> None:
        rows = [np.array(list(v.values()), dtype=float) for v in self.finals.values() if v]
        self.df = sum(r.size - 1 for r in rows)
        if self.df == 0:
            raise BoardError(f"{self.task}: no row has two seeds, so the task's seed noise (the "
                             "suite score's unit) cannot be estimated; run more seeds or leave "
                             "the task out of the suite")
        # all-equal rows are tested on the values: a sum of squares can round to 1e-33, not 0
        if all(np.ptp(r) == 0 for r in rows):
            raise BoardError(f"{self.task}: every row gives the same final {self.metric} on "
                             "every seed, so the task's seed noise (the suite score's unit) is "
                             "0; leave the task out of the suite or evaluate on more problems")
        self.sd = math.sqrt(sum(float(((r - r.mean()) ** 2).sum()) for r in rows) / self.df)

    @property
    def regressed(self) -> bool:
        """Every row's mean final score is below the warm start W (False when W is unknown)."""
        means = [np.mean(list(v.values())) for v in self.finals.values() if v]
        return not math.isnan(self.warm_start) and all(m < self.warm_start for m in means)

    def effects(self, algorithm: str) -> dict[str, float]:
        """``(x(algorithm, s) - x(grpo, s)) / sd`` over the seeds both ran."""
        a, b = self.finals.get(algorithm, {}), self.finals.get(BASELINE, {})
        return {s: (a[s] - b[s]) / self.sd for s in sorted(set(a) & set(b), key=_seed_key)}


@dataclass
class Aggregate:
    tasks: list[TaskScores]
    algorithms: list[str]  # scored: every task, seeds shared with GRPO (GRPO itself excluded)
    partial: dict[str, list[str]]  # not scored: algorithm -> the tasks it ran on
    seeds: dict[str, list[str]]  # algorithm -> its seeds paired with GRPO's on every task
    iqm: dict[str, tuple[float, float, float]]  # algorithm -> (point, low, high)
    mean: dict[str, tuple[float, float, float]]
    poi: dict[str, tuple[float, float, float]]  # P(algorithm > GRPO), raw final scores
    matrices: dict[str, np.ndarray]  # algorithm -> (seeds, tasks) scores d


def task_scores(title: str, rows: list[Row], duplicates: list, cfg: BoardConfig) -> TaskScores:
    """Final scores of one board group; refuses duplicated cells and an algorithm with several
    rows (configurations) on the task."""
    from harness.report.tables import primary_spec, specs_of

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
    prim = primary_spec(specs_of(rows, cfg.select.eval_set if cfg.select else None))
    if prim is None:
        raise BoardError(f"{title}: no final/<set>/pass_at_<k> metric was logged")
    final, start = f"final/{prim.name}", f"start/{prim.name}"
    starts = [r.metrics[start] for row in rows for r in row.runs.values()
              if not math.isnan(r.metrics.get(start, math.nan))]
    finals = {row.algorithm: {s: r.metrics[final] for s, r in row.runs.items()
                              if not math.isnan(r.metrics.get(final, math.nan))} for row in rows}
    return TaskScores(title, prim.name, float(np.mean(starts)) if starts else math.nan,
                      {a: v for a, v in finals.items() if v})


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """numpy's global generator seeded with ``seed`` inside, the caller's state restored after
    (rliable draws from it; see the module docstring)."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def aggregate(tasks: list[TaskScores], reps: int = 2000, seed: int = 0,
              confidence: float = 0.95) -> Aggregate:
    """rliable's IQM and mean of the scores and probability of improvement over GRPO, with
    stratified-bootstrap intervals (``reps`` resamples, seeded with ``seed``), over the
    algorithms that ran on every task on seeds GRPO ran too. Refuses a task without GRPO."""
    from rliable import library as rly
    from rliable import metrics

    missing = [t.task for t in tasks if not t.finals.get(BASELINE)]
    if missing:
        raise BoardError(f"the suite score is the paired effect against {BASELINE}, and these "
                         f"tasks have no {BASELINE} runs: {'; '.join(missing)}")
    names = sorted({a for t in tasks for a in t.finals} - {BASELINE})
    partial = {a: [t.task for t in tasks if a in t.finals] for a in names}
    seeds: dict[str, list[str]] = {}
    matrices: dict[str, np.ndarray] = {}
    pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # raw final scores, for P(X > Y)
    for a in names:
        if not tasks or len(partial[a]) < len(tasks):
            continue
        common = set.intersection(*(set(t.effects(a)) for t in tasks))
        if not common:
            continue
        seeds[a] = sorted(common, key=_seed_key)
        matrices[a] = np.array([[t.effects(a)[s] for t in tasks] for s in seeds[a]])
        pairs[a] = tuple(np.array([[t.finals[b][s] for t in tasks] for s in seeds[a]])
                         for b in (a, BASELINE))
        del partial[a]

    def iqm_and_mean(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)])

    iqm: dict[str, tuple[float, float, float]] = {}
    mean: dict[str, tuple[float, float, float]] = {}
    poi: dict[str, tuple[float, float, float]] = {}
    if matrices:
        with _seeded(seed):
            point, ci = rly.get_interval_estimates(matrices, iqm_and_mean, reps=reps,
                                                   confidence_interval_size=confidence)
        with _seeded(seed):
            p_point, p_ci = rly.get_interval_estimates(
                {a: list(p) for a, p in pairs.items()}, metrics.probability_of_improvement,
                reps=reps, confidence_interval_size=confidence)
        iqm = {a: (float(point[a][0]), float(ci[a][0, 0]), float(ci[a][1, 0])) for a in matrices}
        mean = {a: (float(point[a][1]), float(ci[a][0, 1]), float(ci[a][1, 1]))
                for a in matrices}
        poi = {a: (float(np.squeeze(p_point[a])), float(np.squeeze(p_ci[a])[0]),
                   float(np.squeeze(p_ci[a])[1])) for a in pairs}
    return Aggregate(tasks, list(matrices), partial, seeds, iqm, mean, poi, matrices)


def performance_profile(agg: Aggregate, path: Path, reps: int = 2000, seed: int = 0) -> Path:
    """Fraction of runs with a score above tau, per algorithm, with bands (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import library as rly
    from rliable import plot_utils

    from harness.report.plots import style

    values = np.concatenate([m.ravel() for m in agg.matrices.values()])
    tau = np.linspace(min(float(values.min()), -1.0), max(float(values.max()), 1.0), 81)
    with _seeded(seed):
        profiles, cis = rly.create_performance_profile(agg.matrices, tau, reps=reps)
    fig, ax = plt.subplots(figsize=(8, 5))
    plot_utils.plot_performance_profiles(
        profiles, tau, performance_profile_cis=cis, ax=ax,
        colors={a: style(a).color for a in agg.matrices},
        xlabel=rf"score $\tau$ = (x - x$_{{{BASELINE}}}$) / $\sigma_{{task}}$ (same seed)",
        ylabel=r"fraction of runs with score > $\tau$")
    ax.axvline(0.0, color="grey", linewidth=0.8, linestyle=":")
    # the lines carry their algorithm's label; a list of names would label the first artists,
    # the interval bands included, so every other name went to a band of another algorithm
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"Performance profiles over {len(agg.tasks)} tasks ({BASELINE} = 0)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _iv(t: tuple[float, float, float] | None, fmt: str = ".3f") -> str:
    return f"{t[0]:{fmt}} [{t[1]:{fmt}}, {t[2]:{fmt}}]" if t else "—"


def _per_task(agg: Aggregate, names: list[str],
              value: Callable[[TaskScores, str], str]) -> list[str]:
    lines = ["| algorithm | " + " | ".join(t.task for t in agg.tasks) + " |",
             "| --- | " + " | ".join("---" for _ in agg.tasks) + " |"]
    return lines + [f"| {a} | " + " | ".join(value(t, a) for t in agg.tasks) + " |"
                    for a in names]


def _effect_cell(t: TaskScores, a: str) -> str:
    d = t.effects(a) if a in t.finals else {}
    return f"{np.mean(list(d.values())):+.2f} (n={len(d)})" if d else "—"


def _final_cell(t: TaskScores, a: str) -> str:
    x = t.finals.get(a)
    return f"{np.mean(list(x.values())):.3f} (n={len(x)})" if x else "—"


def render(agg: Aggregate, head: list[str], confidence: float, reps: int) -> tuple[str, str]:
    """(markdown, csv) of the aggregate board; GRPO, the reference, is in neither table of
    intervals (its score is 0 by construction)."""
    pct = f"{confidence:.0%}"
    order = sorted(agg.algorithms, key=lambda a: -agg.iqm[a][0])
    flagged = [t.task for t in agg.tasks if t.regressed]
    lines = ["# Suite aggregate", "", *head,
             f"- Score of a run: its paired effect against {BASELINE} in units of the task's seed "
             f"noise, d = (x - x_{BASELINE}) / σ: x = the run's final primary metric, x_{BASELINE} "
             f"= {BASELINE}'s on the same seed, σ = the task's pooled within-row standard "
             "deviation of x over seeds (all its rows). 0 = as good as "
             f"{BASELINE}, +1 = one seed-SD better, below 0 = worse; the warm start's score is not "
             "used. harness/report/aggregate.py says why and when it fails. Intervals: "
             f"{pct} stratified bootstrap over seeds within tasks (rliable, {reps} resamples, "
             "seeded).", "",
             "| task | primary metric | σ (df) | W (warm start) | every row below W |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {t.task} | {t.metric} | {t.sd:.4f} ({t.df}) | "
              f"{'—' if math.isnan(t.warm_start) else f'{t.warm_start:.3f}'} | "
              f"{'⚠ yes' if t.regressed else 'no'} |" for t in agg.tasks]
    if flagged:
        lines += ["", f"⚠ On {'; '.join(flagged)} every algorithm ends below the warm start "
                  "(W, the mean step-0 value of the task's runs): its scores rank how much each "
                  f"lost against {BASELINE}, not what any gained."]
    lines += ["", f"## Across {len(agg.tasks)} tasks", "",
              f"{BASELINE} is the reference: its score is 0 by construction, so it has no row "
              "here.", ""]
    if order:
        lines += [f"| algorithm | seeds | IQM [{pct}] | mean [{pct}] | P(> {BASELINE}) "
                  f"[{pct}] |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {a} | {len(agg.seeds[a])} | {_iv(agg.iqm[a], '+.2f')} | "
                  f"{_iv(agg.mean[a], '+.2f')} | {_iv(agg.poi.get(a))} |" for a in order]
        lines += ["", f"IQM and mean are over seeds x tasks of d; seeds: those the algorithm "
                  f"shares with {BASELINE} on every task. P(> {BASELINE}) is the probability that "
                  f"a run of the algorithm beats a run of {BASELINE} on a task (raw final scores, "
                  "ties count half), averaged over tasks; 0.5 = no difference."]
    else:
        lines += [f"No algorithm besides {BASELINE} ran on every task with {BASELINE}'s seeds: "
                  "nothing to compare."]
    names = sorted({a for t in agg.tasks for a in t.finals})
    lines += ["", f"## Per task: mean d over seeds (n = pairs with {BASELINE})", "",
              *_per_task(agg, [a for a in names if a != BASELINE], _effect_cell),
              "", "## Per task: mean final primary metric over seeds", "",
              *_per_task(agg, names, _final_cell)]
    if agg.partial:
        lines += ["", f"Not in the aggregate (not on every task, or no seed shared with "
                  f"{BASELINE} on every task): " + "; ".join(
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
    """``<out>/aggregate/``: aggregate.md, aggregate.csv and, when any algorithm is scored,
    performance_profile.png."""
    d = out / OUT_NAME
    d.mkdir(parents=True, exist_ok=True)
    md, table = render(agg, head, confidence, reps)
    (d / "aggregate.md").write_text(md)
    (d / "aggregate.csv").write_text(table)
    files = [d / "aggregate.md", d / "aggregate.csv"]
    if agg.matrices:
        files.append(performance_profile(agg, d / "performance_profile.png", reps))
    return files
