"""The off-policy testbed in its phases (conf/sweep/testbed_offpolicy_tuning.yaml, then
conf/sweep/testbed_offpolicy.yaml, then its controls), into one MLflow experiment:

1. tuning: every row at each learning rate of the grid on the tuning seeds;
2. reported: every row on the reported seeds at the rate its tuning seeds chose — the board's own
   choice (harness/report/collect.py with conf/board/offpolicy_tuned.yaml), one multirun per
   chosen rate;
3. controls (docs/analysis.md, Controls): GRPO at a tenth of its chosen rate on the reported
   seeds (sweep=testbed_offpolicy_control_lr_div10, the positive control) and GRPO at its rate
   on seeds of its own paired by block_seed (sweep=testbed_offpolicy_control_aa, the A/A).

Every phase skips the cells that already FINISHED (a rerun continues a killed sweep). Run it from
a clean clone of one commit with the store outside the repository:

    python benchmarks/offpolicy_testbed.py --tracking-uri sqlite:////abs/path/mlruns.db
    python benchmarks/offpolicy_testbed.py --phase report --dry-run   # print the commands only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOARD_CONFIG = ROOT / "conf" / "board" / "offpolicy_tuned.yaml"
EXPERIMENT = "testbed_offpolicy_tuned"


def _sweep(uri: str, jobs: int, *overrides: str, dry_run: bool) -> None:
    cmd = [sys.executable, "-m", "harness.cli", "sweep", *overrides, f"tracking.uri={uri}",
           "hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}", "backend.threads=1",
           "trainer.status_every=20"]
    print("+ " + " ".join(cmd[1:]), flush=True)
    if not dry_run:
        subprocess.run(cmd, cwd=ROOT, check=True)


def chosen_rates(uri: str) -> dict[str, list[str]]:
    """learning rate -> the algorithm overrides (``algorithm=...``) whose rows chose it."""
    from mlflow.tracking import MlflowClient

    from harness.report.collect import collect
    from harness.report.config import load_config

    cfg = load_config(BOARD_CONFIG)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        raise SystemExit(f"no experiment {EXPERIMENT!r} at {uri}: run the tuning phase first")
    groups, _ = collect(client, exp.experiment_id, cfg)
    by_rate: dict[str, list[str]] = defaultdict(list)
    for group in groups.values():
        for label, row in sorted(group.choices.items()):
            runs = [r for r in row.runs.values() if r.overrides]
            algo = next((o for r in runs for o in r.overrides or ()
                         if o.startswith("algorithm=")), None)
            if algo is None:
                raise SystemExit(f"row {label}: its runs recorded no algorithm override")
            print(f"{label}: lr {row.select}", flush=True)
            by_rate[row.select].append(algo.partition("=")[2])
    return dict(by_rate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracking-uri", required=True,
                        help="an MLflow store outside the repository, e.g. sqlite:////abs/x.db")
    parser.add_argument("--jobs", type=int, default=2, help="parallel cells (default 2)")
    parser.add_argument("--phase", choices=("tune", "report", "controls", "all"), default="all")
    parser.add_argument("--dry-run", action="store_true", help="print the sweeps, run none")
    args = parser.parse_args(argv)
    if args.phase in ("tune", "all"):
        _sweep(args.tracking_uri, args.jobs, "sweep=testbed_offpolicy_tuning",
               dry_run=args.dry_run)
    rates = chosen_rates(args.tracking_uri) if args.phase != "tune" else {}
    if args.phase in ("report", "all"):
        for rate, algorithms in sorted(rates.items()):
            _sweep(args.tracking_uri, args.jobs, "sweep=testbed_offpolicy",
                   f"algorithm={','.join(algorithms)}", f"trainer.optim.lr={rate}",
                   dry_run=args.dry_run)
    if args.phase in ("controls", "all"):
        grpo = next((r for r, algorithms in rates.items() if "grpo" in algorithms), None)
        if grpo is None:
            raise SystemExit("no rate chosen for grpo: run the tuning phase first")
        _sweep(args.tracking_uri, args.jobs, "sweep=testbed_offpolicy_control_aa",
               f"trainer.optim.lr={grpo}", dry_run=args.dry_run)
        _sweep(args.tracking_uri, args.jobs, "sweep=testbed_offpolicy_control_lr_div10",
               f"trainer.optim.lr={float(grpo) / 10:g}", dry_run=args.dry_run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
