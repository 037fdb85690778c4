"""What the suite (conf/sweep/suite.yaml) took: measured cell times per recipe, the machine runs'
wall clocks, and the whole suite against the 6-hour target on two workers.

Reads exported runs (``rlbench export`` files, or folders holding some, e.g. leaderboards/suite)
and prints, from the FINISHED training runs of sweep ``suite`` only:

* per recipe (task): cells finished of the suite's, the mean and sum of ``final/wall_s`` (the
  run's own seconds: training and evaluation, without the cached warm start), and the GRPO
  cell's mean;
* per machine run (a gap of more than ``--gap`` minutes between the last run ending and the
  next starting separates two): its workers (the most cells running at once), its wall clock
  from the first run's start to the last run's end, the cells it finished and the
  worker-seconds outside the cells' ``final/wall_s`` (workers x wall clock - their sum: process
  start-up, imports, MLflow set-up, idle tails); a cell resumed in a later machine run counts
  in the one that finished it;
* the projection: the finished cells' seconds plus, for each unfinished cell, the mean of its
  (algorithm, recipe) pair where a seed finished, else the recipe's mean over finished cells
  times the algorithm's mean ratio to GRPO on the other recipes (1 where unknown); divided by
  two workers and the measured overhead share, against 6 hours.

    python benchmarks/suite_wall_time.py leaderboards/suite
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.report.provenance import read_export  # noqa: E402

TARGET_H = 6.0
WORKERS = 2


def exports(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.jsonl.gz")) if p.is_dir() else [p]
    return out


def suite_cells() -> list[tuple[str, str]]:
    """Every (algorithm, task) cell-pair of the suite, as its sweeper launches them."""
    from harness.cli.hydra_app import compatible_cells, expand_cells

    configs: dict = {}
    cells = compatible_cells(expand_cells(["sweep=suite"]), ["sweep=suite"], configs)
    pairs = []
    for cell in cells:
        cfg = configs[tuple(o for o in cell if not o.startswith("seed="))]
        pairs.append((str(cfg.algorithm.name), str(cfg.task.name)))
    return pairs


def workers(cells: list[tuple[float, float, float]]) -> int:
    """A machine run's workers: the most cells running at the midpoint of one of them (a sweep
    started with one worker is not a two-worker sweep that idled half the time). Midpoints, not
    edges: a resumed cell is placed by its last stretch from its seconds, which can overlap its
    neighbour by a few seconds on a one-worker run."""
    mids = [(s + e) / 2 for s, e, _ in cells]
    return max((sum(s <= m < e for s, e, _ in cells) for m in mids), default=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="exports (runs.jsonl.gz) or folders of them")
    parser.add_argument("--gap", type=float, default=10.0, help="minutes between machine runs")
    args = parser.parse_args(argv)
    seen: dict[str, dict] = {}
    for path in exports(args.runs):
        for rec in read_export(path):
            tags = rec["tags"]
            if (rec["status"] == "FINISHED" and tags.get("rlbench.sweep") == "suite"
                    and tags.get("rlbench.kind", "train") == "train"):
                seen.setdefault(rec["run_id"], rec)
    runs = list(seen.values())
    if not runs:
        print("no FINISHED suite runs in", ", ".join(args.runs))
        return 1

    def wall(rec: dict) -> float:
        return float(rec["metrics"]["final/wall_s"][-1][1])

    by_pair: dict[tuple[str, str], list[float]] = defaultdict(list)
    for rec in runs:
        by_pair[(rec["tags"]["rlbench.algorithm"], rec["tags"]["rlbench.task"])].append(wall(rec))
    pairs = suite_cells()
    want = defaultdict(int)
    for pair in pairs:
        want[pair] += 1
    tasks = sorted({t for _, t in pairs})
    commits = sorted({rec["tags"].get("rlbench.git_commit", "?") for rec in runs})
    print(f"{len(runs)} of {len(pairs)} suite cells FINISHED; commits: {', '.join(commits)}")
    print("\n| recipe (task) | cells finished | mean final/wall_s | sum | GRPO cell mean |")
    print("|---|---|---|---|---|")
    task_mean = {}
    for task in tasks:
        ws = [w for (a, t), v in by_pair.items() if t == task for w in v]
        grpo = by_pair.get(("grpo", task), [])
        need = sum(n for (a, t), n in want.items() if t == task)
        task_mean[task] = statistics.mean(ws) if ws else float("nan")
        print(f"| {task} | {len(ws)} of {need} | {task_mean[task]:.1f} | {sum(ws):.0f} | "
              + (f"{statistics.mean(grpo):.1f} ({len(grpo)})" if grpo else "—") + " |")

    # machine runs: clusters of runs separated by more than --gap minutes. A cell killed at a
    # machine run's end and resumed in a later one keeps its MLflow run (and start time): it is
    # placed by its last stretch, end - final/wall_s, in the run that finished it
    def start(rec: dict) -> float:
        s, e = rec["start_time"] / 1e3, rec["end_time"] / 1e3
        return e - wall(rec) if e - s > wall(rec) + args.gap * 60 else s

    spans = sorted((start(rec), rec["end_time"] / 1e3, wall(rec)) for rec in runs)
    machine: list[list[tuple[float, float, float]]] = []
    for s in spans:
        if machine and s[0] - max(e for _, e, _ in machine[-1]) <= args.gap * 60:
            machine[-1].append(s)
        else:
            machine.append([s])
    print("\n| machine run | workers | wall clock h | cells | sum final/wall_s h "
          "| overhead share |")
    print("|---|---|---|---|---|---|")
    worker_s = cell_s = 0.0
    for i, m in enumerate(machine, 1):
        c = max(e for _, e, _ in m) - min(s for s, _, _ in m)
        w = sum(x for *_, x in m)
        n = workers(m)
        worker_s, cell_s = worker_s + n * c, cell_s + w
        print(f"| {i} | {n} | {c / 3600:.2f} | {len(m)} | {w / 3600:.2f} | "
              f"{1 - w / (n * c):.1%} |")
    # the share of worker time no cell used, over every machine run at its own worker count
    overhead = max(0.0, 1 - cell_s / worker_s) if worker_s else 0.0

    # projection of the unfinished cells
    ratio = {}
    for alg in {a for a, _ in pairs}:
        r = [statistics.mean(by_pair[(alg, t)]) / statistics.mean(by_pair[("grpo", t)])
             for t in tasks if by_pair.get((alg, t)) and by_pair.get(("grpo", t))]
        ratio[alg] = statistics.mean(r) if r else 1.0
    done = sum(sum(v) for v in by_pair.values())
    rest = 0.0
    for pair, n in want.items():
        left = n - len(by_pair.get(pair, []))
        if left > 0:
            per = (statistics.mean(by_pair[pair]) if by_pair.get(pair)
                   else task_mean[pair[1]] * ratio[pair[0]])
            rest += left * per
    total = done + rest
    hours = total / WORKERS / 3600 / (1 - overhead)
    print(f"\ncell seconds: {done:.0f} finished + {rest:.0f} projected = {total:.0f} "
          f"({total / 3600:.2f} h one after another)")
    print(f"on {WORKERS} workers with the measured overhead share {overhead:.1%}: "
          f"{hours:.2f} h (target {TARGET_H:.0f} h: {'met' if hours <= TARGET_H else 'not met'}"
          f"{'' if not rest else ', projected'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
