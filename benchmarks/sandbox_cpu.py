"""CPU fairness between sandboxes (issue 30, item 5): an honest CPU-bound program in sandbox B,
alone and beside CPU attacks in sandbox A, with the per-sandbox ``cpu`` cgroup off, with equal
weight only, and with equal weight plus a quota of one CPU (what sandboxes get now).

Attacks in A (each started when its program is loaded, running until it is unloaded):
``setsid`` - ``--spinners`` processes that each call ``os.setsid()`` and spin (each session was a
scheduler autogroup of its own, with the weight of a whole session); ``fork`` - the same without
``setsid``; ``threads`` - that many threads in one process hashing 1 MiB blocks (hashlib releases
the GIL, so they really run in parallel; ``--threads``, 11 by default: with the server, its
init and the candidate's main thread that is what ``max_procs=16`` allows).

Part 1 times one call of B (``work(n)``, ~``--seconds`` alone) with two ForkServers, median of
``--repeat``. Part 2 grades a heavier honest program (3 tests of ~``--heavy`` s each, within the
default budget of 5 + 3 x 3 = 14 s and 10 s per call) with a ``CodeGrader`` of 2 workers, alone
and side by side with the ``setsid`` attack (whose tests sleep until its budget is spent).

    python benchmarks/sandbox_cpu.py            # every mode; --modes off quota to pick
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import statistics
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from harness.sandbox import Limits, cgroup, probe
from harness.sandbox.layers import forced
from harness.sandbox.remote import ForkServer
from tasks.code.grading import CodeGrader, GraderConfig

WORK = "def work(n):\n    s = 0\n    for i in range(n):\n        s += i * i % 7\n    return s\n"

ATTACKS = {
    "setsid": "import os\nfor _ in range({n}):\n    if os.fork() == 0:\n        os.setsid()\n"
              "        while True:\n            pass\n",
    "fork": "import os\nfor _ in range({n}):\n    if os.fork() == 0:\n        while True:\n"
            "            pass\n",
    "threads": "import hashlib, threading\ndef spin():\n    b = b'x' * (1 << 20)\n"
               "    while True:\n        hashlib.sha256(b).digest()\n"
               "for _ in range({n}):\n    threading.Thread(target=spin, daemon=True).start()\n",
}
ATTACK_TAIL = "import time\ndef f(x):\n    time.sleep(x)\n    return x\n"


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """``off``: no cpu group (as before); ``shares``: cpu group, equal weight, no quota;
    ``quota``: as shipped (equal weight, at most one CPU per sandbox)."""
    iso = probe()
    be = iso.cgroups
    if be is None or "cpu" not in be.parents:
        if name != "off":
            raise SystemExit(f"no cpu controller here ({iso.describe()}): only --modes off")
        yield
        return
    if name == "off":
        stripped = dataclasses.replace(be, parents={k: v for k, v in be.parents.items()
                                                    if k != "cpu"})
        with forced(dataclasses.replace(iso, cgroups=stripped)):
            yield
        return
    defaults = cgroup.Group.__init__.__kwdefaults__
    saved = dict(defaults)
    if name == "shares":
        defaults["cpus"] = None
    try:
        yield
    finally:
        defaults.update(saved)


def calibrate(server: ForkServer, seconds: float) -> int:
    ns = server.load(WORK, timeout=60, cpu_s=600, call_timeout=60).namespace()
    n = 200_000
    while True:
        start = time.perf_counter()
        ns["work"](n)
        took = time.perf_counter() - start
        if took > 0.2:
            return int(n * seconds / took)
        n *= 4


def time_calls(server: ForkServer, n: int, repeat: int) -> float:
    ns = server.load(WORK, timeout=60, cpu_s=600, call_timeout=600).namespace()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        ns["work"](n)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def part1(name: str, args: argparse.Namespace, n: int) -> None:
    with mode(name):
        a, b = ForkServer(Limits(), tag="cpu-attacker"), ForkServer(Limits(), tag="cpu-honest")
        try:
            alone = time_calls(b, n, args.repeat)
            row = [f"alone {alone:5.2f} s"]
            for attack, src in ATTACKS.items():
                count = args.threads if attack == "threads" else args.spinners
                a.load(src.format(n=count) + ATTACK_TAIL, timeout=30, cpu_s=600,
                       call_timeout=600)
                time.sleep(1.0)  # every spinner running
                beside = time_calls(b, n, args.repeat)
                stats = a.box.group.stats() if a.box.group else {}
                a.unload()
                time.sleep(0.5)  # the killed spinners reaped (they count against max_procs)
                row.append(f"{attack} {beside:5.2f} s ({beside / alone:4.1f}x"
                           + (f", A throttled {stats['cpu_throttled_us'] / 1e6:.1f} s"
                              if stats.get("cpu_throttled_us") else "") + ")")
            load = Path("/proc/loadavg").read_text().split()[0]
            print(f"  [{name:6}] B " + " | ".join(row) + f"  (load {load})", flush=True)
        finally:
            a.close()
            b.close()


def part2(name: str, args: argparse.Namespace, n_heavy: int) -> None:
    honest_units = [f"assert work({n_heavy} + {i}) >= 0" for i in range(3)]
    honest = ({"kind": "functional", "units": honest_units}, WORK)
    attack_units = ["assert f(9) == 9", "assert f(9) == 9", "assert f(9) == 9"]
    attack = ({"kind": "functional", "units": attack_units},
              ATTACKS["setsid"].format(n=args.spinners) + ATTACK_TAIL)
    config = GraderConfig(workers=2, cache_size=0, stop_on_first_failure=False,
                          allow_weaker_isolation=True)
    with mode(name):
        grader = CodeGrader(config)
        try:
            alone = grader.grade_many([honest])[0]
            both = grader.grade_many([attack, honest])[1]
        finally:
            grader.close()
    print(f"  [{name:6}] heavy honest program: alone {alone.passed}/{alone.total} in "
          f"{alone.seconds:.1f} s; beside setsid spinners {both.passed}/{both.total} "
          f"({both.status}) in {both.seconds:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["off", "shares", "quota"])
    parser.add_argument("--spinners", type=int, default=12)
    parser.add_argument("--threads", type=int, default=11,
                        help="threads of the threads attack (max_procs=16 leaves room for 11)")
    parser.add_argument("--seconds", type=float, default=0.8)
    parser.add_argument("--heavy", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-grader", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with contextlib.redirect_stderr(io.StringIO()):
        iso = probe()
    print(f"isolation: {iso.describe()}")
    server = ForkServer(Limits(), tag="cpu-calibrate")
    try:
        n = calibrate(server, args.seconds)
        n_heavy = int(n * args.heavy / args.seconds)
    finally:
        server.close()
    print(f"B: work({n}) (~{args.seconds} s alone); {args.spinners} spinners in A", flush=True)
    for name in args.modes:
        part1(name, args, n)
    if not args.skip_grader:
        print(f"heavy honest program: 3 x work({n_heavy}) (~{args.heavy} s each alone), "
              "budget 14 s, 10 s per call", flush=True)
        for name in args.modes:
            part2(name, args, n_heavy)


if __name__ == "__main__":
    main()
