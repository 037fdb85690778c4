"""Grading throughput of the math task: answers per second through extraction + math-verify in
worker processes (:class:`harness.mathgrade.grading.MathGrader`), on typical answers.

Typical answers: for every problem of the chosen eval sets (default MATH500 + GSM8K + AMC23 +
AIME24), one response whose final ``\\boxed{}`` holds the gold answer and ``--wrong`` responses
whose boxed answer is another problem's gold (the usual wrong answer: well-formed, of the same
kind). Every (gold, answer) pair is distinct, so the parent's result cache never hits in the
"cold" pass; the "cached" pass regrades the same responses (RL groups repeat answers). Worker
start-up is excluded (a warm-up call starts the pool first) and printed separately.

    python benchmarks/math_grading.py --workers 2
    python benchmarks/math_grading.py --workers 2 --sets math500 --wrong 3 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from harness.mathgrade.grading import GraderConfig
from harness.types import Example
from tasks.math.datasets import load
from tasks.math.task import MathTask


def build_items(sets: list[str], wrong: int, seed: int) -> tuple[list[Example], list[str]]:
    rng = random.Random(seed)
    rows = [(name, r) for name in sets for r in load(name)]
    golds = [r["gold"] for _, r in rows]
    examples, responses = [], []
    for name, r in rows:
        ex = Example(id=f"{name}-{r['index']}", prompt="", answer={"gold": r["gold"]})
        others = [g for g in rng.sample(golds, min(len(golds), 4 * wrong + 4))
                  if g != r["gold"]][:wrong]
        for answer in [r["gold"], *others]:
            examples.append(ex)
            responses.append(f"Reasoning ... so the answer is $\\boxed{{{answer}}}$.")
    return examples, responses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sets", nargs="+", default=["math500", "gsm8k", "amc23", "aime24"])
    p.add_argument("--wrong", type=int, default=1, help="wrong answers per problem")
    p.add_argument("--repeat", type=int, default=3, help="cold passes (fresh grader each)")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    examples, responses = build_items(args.sets, args.wrong, args.seed)
    print(f"{len(responses)} responses ({', '.join(args.sets)}; 1 right + {args.wrong} wrong per "
          f"problem), {args.workers} workers, {os.cpu_count()} CPUs, load avg "
          f"{os.getloadavg()[0]:.1f}")
    cold, cached = [], []
    for rep in range(args.repeat):
        task = MathTask(MathTask.Config(
            variant="full", grader=GraderConfig(workers=args.workers, timeout_s=args.timeout)))
        t0 = time.perf_counter()
        task.verify_batch(examples[:1], ["\\boxed{0}"])  # starts the pool
        startup = time.perf_counter() - t0
        t0 = time.perf_counter()
        scores = task.verify_batch(examples, responses)
        cold.append(len(responses) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        task.verify_batch(examples, responses)
        cached.append(len(responses) / (time.perf_counter() - t0))
        n = len(scores)
        right = sum(s.correct for s in scores[:: args.wrong + 1])
        false_pos = sum(s.correct for i, s in enumerate(scores) if i % (args.wrong + 1))
        fails = task.grader.counts
        print(f"pass {rep}: start-up {startup:.2f} s, cold {cold[-1]:.0f} answers/s, cached "
              f"{cached[-1]:.0f} answers/s; gold graded correct {right}/{n // (args.wrong + 1)}, "
              f"wrong answers graded correct {false_pos}; timeouts {fails['timeout']}, errors "
              f"{fails['error'] + fails['gold_error']}, killed {fails['killed']}")
        task.grader.close()
    print(f"median cold throughput: {statistics.median(cold):.0f} answers/s "
          f"(cached: {statistics.median(cached):.0f} answers/s)")


if __name__ == "__main__":
    main()
