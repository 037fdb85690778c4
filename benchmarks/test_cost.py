"""What the test suite costs the machine: core-seconds per test module, against a wall-time goal.

On a machine the suite keeps busy (two xdist workers on two cores), its wall time is its CPU
work divided by the cores, whatever the scheduling: a goal of ``--minutes`` on ``--cores``
cores is a budget of ``minutes x 60 x cores`` core-seconds. This script measures where those
go: it runs each target alone (``python -m pytest -q TARGET``, no xdist) and reads the
machine's busy time from ``/proc/stat`` (user, nice, system, irq, softirq and steal, every
core) before and after. Machine-wide on purpose: the processes a test starts outside its own
process tree (sandboxes in cgroups of their own, a PostgreSQL cluster, an MLflow or Ray server)
count, which ``getrusage`` of the pytest process does not see. So run it on a quiet machine;
the 1-minute load average before each target is printed beside it.

    python benchmarks/test_cost.py tests/sandbox/test_sandbox_hostile.py tests/engine
    python benchmarks/test_cost.py --whole              # the README's command, -n 2, as one
    python benchmarks/test_cost.py --whole --repeat 3 --minutes 6 --cores 2

Targets are anything pytest takes (a folder, a module, a node id); with none, every test
module under ``tests/`` alone (about as long as the suite on one worker). ``--whole`` runs
``python -m pytest -q -n 2`` once per repeat and reports its wall time and core-seconds.
Linux only (``/proc/stat``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal (guest is within user)
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def busy_seconds() -> float:
    """Busy time of every core since boot, in seconds (``/proc/stat``, USER_HZ ticks)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    return sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def measure(command: Sequence[str]) -> dict[str, float | int | str]:
    """Run ``command`` from the repository root; its exit code, wall seconds and the machine's
    busy core-seconds meanwhile, with the load average before it."""
    load = os.getloadavg()[0]
    busy0, t0 = busy_seconds(), time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    wall, busy = time.monotonic() - t0, busy_seconds() - busy0
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return {"rc": proc.returncode, "wall_s": wall, "core_s": busy, "load_before": load,
            "summary": last}


def modules() -> list[str]:
    """Every test module under tests/ (its `test_*.py` files)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("**/test_*.py"))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", help="pytest targets, each run alone (default: every "
                   "test module)")
    p.add_argument("--whole", action="store_true",
                   help="the README's command (python -m pytest -q -n 2) instead of targets")
    p.add_argument("--repeat", type=int, default=1, help="runs of each (default 1)")
    p.add_argument("--minutes", type=float, default=6.0, help="the wall-time goal (default 6)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="cores the goal is for (default: this machine's)")
    p.add_argument("-m", dest="marker", default=None, help="a pytest -m expression, e.g. "
                   "'not slow'")
    args = p.parse_args(argv)
    if not Path("/proc/stat").exists():
        print("test_cost.py: needs Linux's /proc/stat", file=sys.stderr)
        return 2
    marker = ["-m", args.marker] if args.marker else []
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *marker]
    jobs = ([("whole (-n 2)", [*base, "-n", "2"])] if args.whole else
            [(t, [*base, t]) for t in (args.targets or modules())])
    budget = args.minutes * 60 * args.cores
    print(f"budget: {args.minutes:g} min x {args.cores} cores = {budget:.0f} core-seconds; "
          f"{os.cpu_count()} cores here\n")
    print("| target | run | exit | wall s | core-s | share of budget | load before | pytest |")
    print("|---|---|---|---|---|---|---|---|")
    totals: dict[int, float] = {}
    failed = False
    for run in range(1, args.repeat + 1):
        for name, command in jobs:
            r = measure(command)
            # 5: nothing collected (a -m expression that selects none of a module's tests)
            failed |= r["rc"] not in (0, 5)
            totals[run] = totals.get(run, 0.0) + float(r["core_s"])
            print(f"| {name} | {run} | {r['rc']} | {r['wall_s']:.1f} | {r['core_s']:.1f} | "
                  f"{float(r['core_s']) / budget:.0%} | {r['load_before']:.2f} | "
                  f"{str(r['summary'])[:70]} |", flush=True)
    for run, total in totals.items():
        print(f"\nrun {run}: {total:.0f} core-seconds = {total / budget:.0%} of the budget; "
              f"at least {total / args.cores / 60:.1f} min on {args.cores} busy cores")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
