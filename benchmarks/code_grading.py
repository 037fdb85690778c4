"""Grading throughput of the code task: programs per second on the HumanEval reference solutions.

Every program goes through the full path (bubblewrap sandbox, fresh forked process per program,
judge-side tests): the 164 HumanEval references are graded ``--repeat`` times with the result
cache off, on ``--workers`` sandboxes, and also with one fresh ``bwrap`` + interpreter launch per
program (``--cold``) for comparison.

    python benchmarks/code_grading.py --workers 2 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import time

from harness.sandbox import isolation, run_python
from tasks.code import datasets
from tasks.code.grading import CodeGrader, GraderConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cold", type=int, default=40, help="one-shot launches to time (0: skip)")
    args = parser.parse_args()
    examples = datasets.load("humaneval")
    items = [(ex.answer, ex.meta["reference"]) for ex in examples]
    grader = CodeGrader(GraderConfig(workers=args.workers, cache_size=0,
                                     stop_on_first_failure=False))
    grader.grade_many(items[: args.workers])  # start the sandboxes
    start = time.perf_counter()
    passed = 0
    for _ in range(args.repeat):
        passed += sum(r.all_passed for r in grader.grade_many(items))
    seconds = time.perf_counter() - start
    grader.close()
    n = len(items) * args.repeat
    print(f"isolation={isolation()} workers={args.workers} cpus={os.cpu_count()}")
    print(f"fork server: {n} programs ({passed} passed) in {seconds:.2f} s = "
          f"{n / seconds:.1f} programs/s")
    if args.cold:
        start = time.perf_counter()
        for ex in examples[: args.cold]:
            run_python(ex.meta["reference"] + "\n" + ex.answer["units"][0])
        seconds = time.perf_counter() - start
        print(f"one-shot run_python (bwrap + interpreter start per program, 1 at a time): "
              f"{args.cold / seconds:.1f} programs/s")


if __name__ == "__main__":
    main()
