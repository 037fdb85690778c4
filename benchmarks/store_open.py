"""Opening a new SQLite store: MLflow building its schema against a copy of the cached template
(``harness.tracking.schema_template``), side by side in one process, alternating.

Every sweep's first cell, every board built from exports (``rlbench board --runs``, so
``benchmarks/rebuild_boards.py``), ``rlbench demo`` and most tests open a store that does not
exist yet. Each open here is timed from a path with no file to a store holding one experiment
with one finished run; the template is built before the clock starts (once per MLflow version):

    python benchmarks/store_open.py               # 5 stores each way
    python benchmarks/store_open.py --stores 10
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _open(uri: str, template: bool) -> float:
    from mlflow.tracking import MlflowClient

    from harness.tracking import open_client

    t0 = time.perf_counter()
    client = open_client(uri) if template else MlflowClient(uri)
    run = client.create_run(client.create_experiment("bench"))
    client.set_terminated(run.info.run_id)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", type=int, default=5, help="new stores opened each way")
    args = parser.parse_args(argv)
    logging.disable(logging.INFO)  # MLflow's "Creating initial MLflow database tables..."
    from harness.tracking import schema_template

    if schema_template() is None:
        print("no schema template could be made (cache not writable?)", file=sys.stderr)
        return 1
    times: dict[str, list[float]] = {"MLflow builds the schema": [], "copy of the template": []}
    with tempfile.TemporaryDirectory() as tmp:
        _open(f"sqlite:///{Path(tmp) / 'warm.db'}", False)  # imports, before the clock
        for i in range(args.stores):
            for label, template in (("MLflow builds the schema", False),
                                    ("copy of the template", True)):
                uri = f"sqlite:///{Path(tmp) / f'{i}-{int(template)}.db'}"
                times[label].append(_open(uri, template))
    print(f"| path | median s (of {args.stores}) | min s | max s |\n|---|---|---|---|")
    for label, ts in times.items():
        print(f"| {label} | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} |")
    ratio = (statistics.median(times["copy of the template"])
             / statistics.median(times["MLflow builds the schema"]))
    print(f"\nratio template/MLflow: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
