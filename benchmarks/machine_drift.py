"""The same cells on two machines: how far apart their results land.

A cell repeats bit for bit on one machine; on another CPU torch's kernels (chosen by the vector
instruction set, tag ``rlbench.cpu``) round differently, the warm start and every step differ at
float level, and RL training amplifies that into another path. This reads two exports (``rlbench
export`` files or folders of them), pairs their FINISHED training runs by config hash (the same
cell), and prints per cell the first logged values of a training metric (how close the paths
start) and the final primary metric on each machine, then the mean absolute difference of the
finals beside the seed-to-seed standard deviation of the same rows (how large the machine's
share of the noise is).

    python benchmarks/machine_drift.py benchmarks/data/suite-ef56388.jsonl.gz leaderboards/suite
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

# the final metric read per task: the board's primary, the first evaluation set's pass@1
# (countdown, code, agentic: heldout; math: arith; geometry3k: generated)
PRIMARY = ("final/heldout/pass_at_1", "final/arith/pass_at_1", "final/generated/pass_at_1")
STEP_METRIC = "actor/pg_loss"


def _runs(path: str) -> dict[str, dict]:
    p = Path(path)
    files = sorted(p.rglob("runs.jsonl.gz")) if p.is_dir() else [p]
    out: dict[str, dict] = {}
    for f in files:
        for r in read_export(f):
            if r["status"] == "FINISHED" and r["tags"].get("rlbench.kind") == "train":
                out[r["tags"]["rlbench.config_hash"]] = r
    return out


def _value(metric: object) -> float | None:
    """An export holds a metric's history as [step, value, timestamp] triples."""
    if isinstance(metric, list):
        return float(metric[-1][1]) if metric else None
    return None if metric is None else float(metric)  # type: ignore[arg-type]


def _first(metric: object, n: int = 2) -> list[float]:
    return [float(v[1]) for v in metric[:n]] if isinstance(metric, list) else []


def primary(run: dict) -> tuple[str, float] | None:
    for key in PRIMARY:
        value = _value(run["metrics"].get(key))
        if value is not None:
            return key, value
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="an export (file or folder) from one machine")
    parser.add_argument("b", help="an export of the same cells from another")
    args = parser.parse_args(argv)
    a, b = _runs(args.a), _runs(args.b)
    shared = sorted(set(a) & set(b), key=lambda h: (a[h]["tags"].get("rlbench.task", ""),
                                                     a[h]["tags"].get("rlbench.algorithm", ""),
                                                     a[h]["tags"].get("rlbench.seed", "")))
    if not shared:
        print(f"no cell of {args.a} is in {args.b}", file=sys.stderr)
        return 2
    print("| task | algorithm | seed | cpu a | cpu b | commit a | commit b | "
          f"{STEP_METRIC} steps 1-2 a | b | final a | final b |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    diffs: dict[str, list[float]] = defaultdict(list)
    for h in shared:
        ra, rb = a[h], b[h]
        pa, pb = primary(ra), primary(rb)
        if pa is None or pb is None:
            continue
        t = ra["tags"]
        diffs[t.get("rlbench.task", "")].append(abs(pa[1] - pb[1]))
        first = [", ".join(f"{v:.6g}" for v in _first(r["metrics"].get(STEP_METRIC)))
                 for r in (ra, rb)]
        cpu = [r["tags"].get("rlbench.cpu", "?") for r in (ra, rb)]
        commit = [r["tags"].get("rlbench.git_commit", "")[:7] for r in (ra, rb)]
        print(f"| {t.get('rlbench.task')} | {t.get('rlbench.algorithm')} | "
              f"{t.get('rlbench.seed')} | {cpu[0]} | {cpu[1]} | {commit[0]} | {commit[1]} | "
              f"{first[0]} | {first[1]} | {pa[1]:.4f} | {pb[1]:.4f} |")
    print()
    print("| task | cells | mean abs(final a - final b) | seed SD of final a (same rows) |")
    print("|---|---|---|---|")
    for task, d in sorted(diffs.items()):
        by_row: dict[str, list[float]] = defaultdict(list)
        for r in a.values():
            p = primary(r)
            if r["tags"].get("rlbench.task") == task and p is not None:
                by_row[r["tags"].get("rlbench.algorithm", "")].append(p[1])
        sds = [statistics.stdev(v) for v in by_row.values() if len(v) > 1]
        sd = f"{statistics.mean(sds):.4f}" if sds else "n/a"
        print(f"| {task} | {len(d)} | {statistics.mean(d):.4f} | {sd} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
