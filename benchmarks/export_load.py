"""Loading an export into a store and reading it back: MLflow's client calls against the bulk
rows of harness/report/metric_rows.py, side by side in one process on one committed export.

``rlbench board --runs`` (and so ``benchmarks/rebuild_boards.py`` and the committed-board tests)
loads every run of an export into a temporary SQLite store, and a board writes its export by
reading every history back. This times both halves both ways on fresh stores, alternating the
two paths ``--repeats`` times, and checks they leave the same store (the export bytes):

    python benchmarks/export_load.py                                   # lpo-lr-tuned's runs
    python benchmarks/export_load.py --runs leaderboards/testbed-offpolicy --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _once(export: Path, bulk: bool, tmp: Path, n: int) -> tuple[float, float, bytes]:
    from mlflow.tracking import MlflowClient

    from harness.report import provenance

    real = provenance.is_database
    provenance.is_database = real if bulk else (lambda uri: False)
    try:
        uri = f"sqlite:///{tmp / f'{n}-{int(bulk)}.db'}"
        client = MlflowClient(uri)
        client.search_experiments()  # the store is migrated before the clock starts
        t0 = time.perf_counter()
        provenance.import_runs(export, uri, "bench")
        t1 = time.perf_counter()
        exp = client.get_experiment_by_name("bench").experiment_id
        ids = [r.info.run_id for r in client.search_runs([exp], max_results=50000)]
        out = provenance.export_runs(client, ids, tmp / f"{n}-{int(bulk)}.jsonl.gz")
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, out.read_bytes()
    finally:
        provenance.is_database = real


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="leaderboards/lpo-lr-tuned",
                        help="an export or a folder holding one runs.jsonl.gz")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    from harness.report.provenance import read_export

    path = ROOT / args.runs if not os.path.isabs(args.runs) else Path(args.runs)
    export = path if path.is_file() else next(path.glob("**/runs.jsonl.gz"))
    records = read_export(export)
    points = sum(len(h) for r in records for h in r["metrics"].values())
    print(f"{export.relative_to(ROOT) if export.is_relative_to(ROOT) else export}: "
          f"{len(records)} runs, {points:,} metric points; load {os.getloadavg()[0]:.2f}")
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.repeats):
            outs = {}
            for bulk in (False, True):
                load, read, outs[bulk] = _once(export, bulk, Path(tmp), n)
                times[bulk].append((load, read))
            assert outs[True] == outs[False], "the two paths exported different bytes"
    print("| path | load s | read back s |\n|---|---|---|")
    for bulk, name in ((False, "MlflowClient (log_batch, get_metric_history)"),
                       (True, "bulk rows (metric_rows.py)")):
        load = statistics.median(t[0] for t in times[bulk])
        read = statistics.median(t[1] for t in times[bulk])
        print(f"| {name} | {load:.1f} | {read:.1f} |")
    slow, fast = times[False], times[True]
    print(f"ratio bulk/client (medians): load "
          f"{statistics.median(t[0] for t in fast) / statistics.median(t[0] for t in slow):.3f}, "
          f"read back "
          f"{statistics.median(t[1] for t in fast) / statistics.median(t[1] for t in slow):.3f}; "
          "exports identical")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
