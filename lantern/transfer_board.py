"""The LANTERN track's leaderboard: MLflow runs -> ``leaderboards/lantern/`` (never typed by hand).

    rlbench board --track lantern [--experiment lantern] [--out leaderboards/lantern]

Reads the FINISHED runs tagged ``rlbench.kind=lantern`` of the experiment, groups them by target
task (``rlbench.task``) and writes, per task, ``<task>/leaderboard.md`` / ``.csv`` (one row per
agent: seeds, episodes and environment steps to the success threshold, how many seeds reached it,
normalised area under the eval-success curve, final success — each the mean with a 95% interval
over seeds, Student-t at every number of seeds as ``harness.report.stats.interval`` — and
the paired difference per seed against Q-learning from scratch, ``†`` when its interval excludes
0) and ``<task>/success.png`` (greedy eval success vs episode, mean over seeds with a min-max
band); then ``README.md``, the index over tasks with the
semantic similarity of each task's sources. A seed that never reached the threshold counts the
whole budget (a lower bound: such cells carry ``*``). Each task's leaderboard is also logged as an
MLflow run (``rlbench.kind=leaderboard``, ``harness.report.mlflow_log``).

Provenance, as for every board (``harness.report.provenance``): a checkout with uncommitted
changes is refused unless ``allow_dirty`` (then the index says so); the index names the commit
the board was built at and the two commands that reproduce it; each task's runs are exported
beside its page (``runs.jsonl.gz``). A (task, agent, seed) cell run more than once is never
pooled: the newest FINISHED run is used and the others are listed on the task's page.
"""

from __future__ import annotations

import csv
import io
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from mlflow.tracking import MlflowClient

from harness.report import provenance
from harness.report.collect import start_order
from harness.report.mlflow_log import log_leaderboard
from harness.report.plots import align
from harness.report.provenance import export_runs
from harness.report.stats import Interval, interval, paired_interval

BASELINES = ("qlearning", "qlearning_opt")  # Q-learning from scratch: Q₀ = 0 and optimistic
ORDER = ("qlearning", "qlearning_opt", "qlearning_opt_aa", "single_best", "uniform", "lantern",
         "lantern_and", "lantern_transplant")
# qlearning_opt_aa: the A/A control (conf/lantern/sweep/targets_aa.yaml), qlearning_opt on seeds
# of its own paired by block seed
COLORS = {"qlearning": "tab:gray", "qlearning_opt": "black", "qlearning_opt_aa": "tab:brown",
          "single_best": "tab:blue",
          "uniform": "tab:green", "lantern": "tab:red", "lantern_and": "tab:purple",
          "lantern_transplant": "tab:orange"}
METRICS = (  # column, metric, digits
    ("episodes to threshold", "final/episodes_to_threshold", 1),
    ("env steps to threshold", "final/steps_to_threshold", 0),
    ("AUC", "final/auc", 3),
    ("final success", "final/success", 3),
)


def _runs(client: MlflowClient, exp_id: str) -> list:
    out, token = [], None
    while True:
        page = client.search_runs([exp_id], "tags.`rlbench.kind` = 'lantern' and "
                                  "attributes.status = 'FINISHED'", max_results=1000,
                                  page_token=token)
        out += list(page)
        token = page.token
        if not token:
            return out


def _fmt(iv: Interval, digits: int, star: bool = False) -> str:
    mark = "*" if star else ""
    if iv.n < 2:
        return f"{iv.mean:.{digits}f}{mark} (n={iv.n})"
    return f"{iv.mean:.{digits}f}{mark} [{iv.low:.{digits}f}, {iv.high:.{digits}f}]"


def _order(labels: list[str]) -> list[str]:
    return sorted(labels, key=lambda x: (ORDER.index(x) if x in ORDER else len(ORDER), x))


def _plot(path: Path, curves: dict[str, tuple[np.ndarray, np.ndarray]], title: str) -> None:
    """Deterministic PNG (no timestamp metadata): mean line and min-max band per agent."""
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, (x, v) in curves.items():
        color = COLORS.get(label)
        ax.plot(x, v.mean(0), color=color, label=f"{label} (n={v.shape[0]})")
        ax.fill_between(x, v.min(0), v.max(0), color=color, alpha=0.15, linewidth=0)
    ax.set(title=title, xlabel="training episode", ylabel="greedy eval success", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


COMMANDS = ("`rlbench sweep track=lantern sweep=targets` and "
            "`rlbench sweep track=lantern sweep=targets_aa` (the A/A control), "
            "then `rlbench board --track lantern --out leaderboards/lantern`.")


def _cells(runs: list) -> tuple[dict[str, dict[str, object]], list[tuple[str, str, list]]]:
    """label -> seed -> the newest run of that cell, and the cells run more than once as
    (agent, seed, runs newest first)."""
    by_cell: dict[tuple[str, str], list] = defaultdict(list)
    for r in runs:
        by_cell[(r.data.tags["rlbench.agent"], r.data.tags["rlbench.seed"])].append(r)
    by_agent: dict[str, dict[str, object]] = defaultdict(dict)
    duplicates = []
    for (agent, seed), rs in sorted(by_cell.items()):
        rs = sorted(rs, key=start_order, reverse=True)
        by_agent[agent][seed] = rs[0]
        if len(rs) > 1:
            duplicates.append((agent, seed, rs))
    return by_agent, duplicates


def _task_board(client: MlflowClient, task: str, runs: list, out: Path) -> tuple[str, list, dict]:
    by_agent, duplicates = _cells(runs)
    labels = _order(list(by_agent))
    bases = [b for b in BASELINES if b in by_agent]
    header = ["agent", "seeds", "reached"] + [c for c, _, _ in METRICS] + \
        [f"Δ {col} vs {b}" for b in bases for col in ("episodes", "AUC")]
    rows, records = [], []
    for label in labels:
        seeds = by_agent[label]
        val = {m: {s: r.data.metrics.get(m, np.nan) for s, r in seeds.items()}
               for _, m, _ in METRICS}
        reached = [r.data.metrics.get("final/reached", 0.0) for r in seeds.values()]
        censored = sum(1 for x in reached if x < 1)
        cells = [label, str(len(seeds)), f"{int(sum(reached))}/{len(seeds)}"]
        rec = {"agent": label, "seeds": len(seeds), "reached": int(sum(reached))}
        for col, m, d in METRICS:
            iv = interval(list(val[m].values()))
            star = censored > 0 and "threshold" in m
            cells.append(_fmt(iv, d, star))
            rec[col] = iv.mean
            rec[col + " low"], rec[col + " high"] = iv.low, iv.high
        for bname in bases:
            base = by_agent[bname]
            for col, m, d in (("episodes", "final/episodes_to_threshold", 1),
                              ("AUC", "final/auc", 3)):
                if label == bname:
                    cells.append("—")
                    continue
                b = {s: r.data.metrics.get(m, np.nan) for s, r in base.items()}
                iv = paired_interval(val[m], b)
                pct = ""
                if col == "episodes" and np.mean(list(b.values())) > 0:
                    pct = f" ({100 * iv.mean / np.mean(list(b.values())):+.0f}%)"
                cells.append(f"{iv.mean:+.{d}f} [{iv.low:+.{d}f}, {iv.high:+.{d}f}]{pct}"
                             + (" †" if iv.excludes_zero else ""))
                key = f"diff {col} vs {bname}"
                rec[key], rec[key + " low"], rec[key + " high"] = iv.mean, iv.low, iv.high
        rows.append(cells)
        records.append(rec)
    curves = {}
    for label in labels:
        hists = [{int(m.step): m.value for m in client.get_metric_history(r.info.run_id,
                                                                           "eval/success")}
                 for r in by_agent[label].values()]
        aligned = align(hists)
        if aligned is not None:
            curves[label] = aligned
    d = out / task
    d.mkdir(parents=True, exist_ok=True)
    _plot(d / "success.png", curves, f"{task}: greedy eval success")
    any_run = runs[0]
    sims = [r.data.metrics.get("sem/max_sim_mean") for r in runs
            if r.data.metrics.get("sem/max_sim_mean") is not None]
    meta = {"alignment": any_run.data.tags.get("rlbench.alignment", ""),
            "description": any_run.data.params.get("task.description", ""),
            "max_sim": float(np.mean(sims)) if sims else float("nan"),
            "episodes": any_run.data.params.get("train.episodes", "?"),
            "threshold": any_run.data.params.get("eval.threshold", "?")}
    md = [f"# LANTERN track: {task}", "",
          f"Target: *{meta['description']}* — sources {meta['alignment']}; mean best cosine of "
          f"the target's states to the sources' states {meta['max_sim']:.3f}. Budget "
          f"{meta['episodes']} episodes; threshold: greedy eval success ≥ {meta['threshold']}.",
          "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(c) + " |" for c in rows]
    md += ["", "Mean [95% Student-t interval] over seeds. Δ: paired per seed, agent − baseline "
           "(negative episodes = fewer needed; % of the baseline's mean); † the interval "
           "excludes 0. * some seeds never reached the threshold and count the whole budget "
           "(a lower bound).", "", "![success](success.png)", ""]
    if duplicates:
        md += ["## Duplicate runs", "", "Cells run more than once (same agent and seed): the "
               "newest run is used, the others are left out, never pooled.", ""]
        md += [f"- **{agent}** seed {seed}: " + ", ".join(
            f"`{r.info.run_id}`" + (" (used)" if i == 0 else "") for i, r in enumerate(rs))
            for agent, seed, rs in duplicates]
        md.append("")
    (d / "leaderboard.md").write_text("\n".join(md))
    buf = io.StringIO()
    fields = list(dict.fromkeys(k for rec in records for k in rec))  # the baseline lacks Δs
    w = csv.DictWriter(buf, fieldnames=fields, restval="", lineterminator="\n")
    w.writeheader()
    w.writerows(records)
    (d / "leaderboard.csv").write_text(buf.getvalue())
    row_runs = {label: sorted((s, r.info.run_id) for s, r in by_agent[label].items())
                for label in labels}
    summary = {"task": task, **meta, "records": records, "row_runs": row_runs,
               "duplicates": sum(len(rs) - 1 for _, _, rs in duplicates)}
    export = export_runs(client, [r.info.run_id for r in runs], d / "runs.jsonl.gz")
    return "\n".join(md), [d / "leaderboard.md", d / "leaderboard.csv", d / "success.png",
                            export], summary


def _diff(rec: dict, col: str, base: str) -> str:
    key = f"diff {col} vs {base}"
    if key not in rec:
        return "—"
    mark = " †" if rec[key + " low"] > 0 or rec[key + " high"] < 0 else ""
    return f"{rec[key]:+.1f} [{rec[key + ' low']:+.1f}, {rec[key + ' high']:+.1f}]{mark}"


def _commit(run: Any) -> str:
    """``<sha>``, ``<sha>+dirty``, or ``""`` when the run recorded no commit."""
    sha = run.data.tags.get("rlbench.git_commit", "")
    return sha + ("+dirty" if run.data.tags.get("rlbench.git_dirty") == "True" else "")


def _provenance(runs: list) -> str:
    """Which commits the runs came from (tag ``rlbench.git_commit``, ``rlbench.git_dirty``) and
    the summed wall time of their cells (``final/wall_s``)."""
    commits: dict[str, int] = defaultdict(int)
    for r in runs:
        sha = _commit(r)
        commits[(sha[:12] or "unrecorded")
                + (" (uncommitted changes)" if sha.endswith("+dirty") else "")] += 1
    wall = sum(r.data.metrics.get("final/wall_s", 0.0) for r in runs)
    listed = ", ".join(f"`{c}` ({n} runs)" for c, n in sorted(commits.items()))
    return f"Runs from commit {listed}; the cells' wall time sums to {wall / 60:.1f} min."


def build_board(uri: str, experiment: str = "lantern", out: str = "leaderboards/lantern",
                log_to_mlflow: bool = True, allow_dirty: bool = False) -> list[Path]:
    state = provenance.clean_checkout(Path(out), allow_dirty)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise FileNotFoundError(f"no MLflow experiment {experiment!r} at {uri}")
    runs = _runs(client, exp.experiment_id)
    by_task: dict[str, list] = defaultdict(list)
    for r in runs:
        by_task[r.data.tags.get("rlbench.task", "?")].append(r)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    written, index = [], []
    argv = sys.argv[1:] if sys.argv[1:2] == ["board"] else ["board", "--track", "lantern"]
    command = "rlbench " + shlex.join(argv)
    for task in sorted(by_task):
        md, files, summary = _task_board(client, task, by_task[task], root)
        written += files
        index.append(summary)
        if log_to_mlflow:
            fields = list(dict.fromkeys(k for rec in summary["records"] for k in rec))
            recs = [{k: str(rec.get(k, "")) for k in fields} for rec in summary["records"]]
            log_leaderboard(client, exp.experiment_id, name=f"leaderboard-lantern-{task}",
                            group_tags={"rlbench.track": "lantern", "rlbench.task": task},
                            files=files, records=recs, row_runs=summary["row_runs"],
                            info={"experiment": experiment, "command": command}, note=md)
    lines = ["# LANTERN transfer track — leaderboards", "",
             "Generated by `" + command + "` from the MLflow runs of experiment "
             f"`{experiment}` (sweep: `rlbench sweep track=lantern sweep=targets`). Method and "
             "setup: [docs/lantern.md](../../docs/lantern.md).", "",
             "| target task | sources | mean best cosine | agent | episodes to threshold | "
             "reached | AUC | final success | Δ episodes vs qlearning_opt [95%] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in index:
        for rec in s["records"]:
            lines.append(
                f"| [{s['task']}]({s['task']}/leaderboard.md) | {s['alignment']} | "
                f"{s['max_sim']:.3f} | {rec['agent']} | {rec['episodes to threshold']:.1f} | "
                f"{rec['reached']}/{rec['seeds']} | {rec['AUC']:.3f} | "
                f"{rec['final success']:.3f} | {_diff(rec, 'episodes', 'qlearning_opt')} |")
    cells = {(r.data.tags.get("rlbench.task"), r.data.tags.get("rlbench.agent"),
              r.data.tags.get("rlbench.seed")) for r in runs}
    n_dup = sum(s["duplicates"] for s in index)
    lines += ["", f"{len(cells)} (task, agent, seed) cells from {len(runs)} FINISHED runs"
              + (f" ({n_dup} duplicate runs of a cell left out: listed on their task's page)"
                 if n_dup else "") + ". Intervals and paired differences against both "
              "from-scratch baselines: each task's page; the runs behind each page are "
              "exported beside it (`runs.jsonl.gz`).", "",
              f"- Reproduce ({provenance.where(map(_commit, runs))}): {COMMANDS}",
              f"- Board built at commit `{state.describe(allow_dirty)}`.",
              f"- {_provenance(runs)}", ""]
    (root / "README.md").write_text("\n".join(lines))
    written.append(root / "README.md")
    return written
