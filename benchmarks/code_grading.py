"""Grading throughput of the code task: programs per second on the HumanEval reference solutions.

Every program goes through the full path (sandbox, fresh forked process per program, judge-side
tests): the 164 HumanEval references are graded ``--repeat`` times with the result cache off, on
``--workers`` sandboxes, each time with the isolation this machine offers now ("new": namespaces,
an unprivileged host uid, a cgroup per sandbox - docs/sandbox.md) and, in the same process and
alternating, with the isolation before issue 17 ("old": bubblewrap started by the grader's own
uid, so host root under a root grader; rlimits only, no cgroup). One fresh sandbox + interpreter
launch per program (``--cold``) is timed the same way.

    python benchmarks/code_grading.py --workers 2 --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import time
import warnings

from harness.sandbox import Isolation, probe, run_python
from harness.sandbox.layers import forced
from tasks.code import datasets
from tasks.code.grading import CodeGrader, GraderConfig

OLD = Isolation("bwrap", 0)  # before issue 17 (as root); a non-root grader had its own uid


def _old() -> Isolation:
    return OLD if os.geteuid() == 0 else Isolation("bwrap", os.geteuid())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cold", type=int, default=40, help="one-shot launches to time (0: skip)")
    args = parser.parse_args()
    examples = datasets.load("humaneval")
    items = [(ex.answer, ex.meta["reference"]) for ex in examples]
    new = probe()
    old = _old()
    config = GraderConfig(workers=args.workers, cache_size=0, stop_on_first_failure=False,
                          allow_weaker_isolation=True)
    graders = {}
    for name, iso in (("new", new), ("old", old)):
        # the old isolation is weaker on purpose: its warning would only be noise here
        with forced(iso), warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            graders[name] = CodeGrader(config)
            graders[name].grade_many(items[: args.workers])  # start the sandboxes
    seconds = dict.fromkeys(graders, 0.0)
    passed = dict.fromkeys(graders, 0)
    for r in range(args.repeat):
        for name in (("new", "old") if r % 2 == 0 else ("old", "new")):
            start = time.perf_counter()
            passed[name] += sum(x.all_passed for x in graders[name].grade_many(items))
            seconds[name] += time.perf_counter() - start
    for g in graders.values():
        g.close()
    n = len(items) * args.repeat
    print(f"workers={args.workers} cpus={os.cpu_count()} repeat={args.repeat}")
    print(f"new isolation: {new.describe()}")
    print(f"old isolation: {old.describe()}")
    rate = {k: n / seconds[k] for k in graders}
    for name in graders:
        print(f"fork server, {name}: {n} programs ({passed[name]} passed) in "
              f"{seconds[name]:.2f} s = {rate[name]:.1f} programs/s")
    ratio = rate["new"] / rate["old"]
    print(f"new/old throughput: {ratio:.3f} (new is {100 * abs(1 - ratio):.1f}% "
          f"{'slower' if ratio < 1 else 'faster'})")
    if args.cold:
        cold = dict.fromkeys(graders, 0.0)
        for r in range(2):
            for name, iso in ((("new", new), ("old", old)) if r == 0 else
                              (("old", old), ("new", new))):
                with forced(iso), contextlib.redirect_stderr(io.StringIO()):
                    warnings.simplefilter("ignore")
                    start = time.perf_counter()
                    for ex in examples[: args.cold // 2]:
                        run_python(ex.meta["reference"] + "\n" + ex.answer["units"][0])
                    cold[name] += time.perf_counter() - start
        for name in graders:
            print(f"one-shot run_python, {name} (sandbox + interpreter start per program, 1 at "
                  f"a time): {2 * (args.cold // 2) / cold[name]:.1f} programs/s")


if __name__ == "__main__":
    main()
