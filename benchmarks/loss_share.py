"""The algorithm's own share of one RL step: advantage + loss (+ any per-mini-batch pass).

For each algorithm, runs a few tiny-Countdown steps with the default tiny recipe (tracking off)
and times, per step, what the algorithm adds on top of generation and the model's
forward/backward: ``compute_advantages`` (``time/adv``), the loss functions called on each
micro-batch (``Algorithm.loss``: policy loss, KL, entropy, metrics) and, where an algorithm has
one, its per-mini-batch preparation (``prepare_minibatch``, e.g. LPO's no-grad first pass). The
goal for a new algorithm is a share of at most 3% of the step on the tiny model.

    python benchmarks/loss_share.py                          # every registered algorithm
    python benchmarks/loss_share.py grpo lpo_fwd --steps 8   # some of them

Run by hand; figures go in the issue note, never into a test.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch


def _timed(fn: Callable[..., Any], bucket: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket.append(time.perf_counter() - t0)

    return wrapper


def measure(name: str, steps: int, warmup: int, threads: int, overrides: list[str]) -> dict:
    from harness.cli import compose_config
    from harness.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = compose_config([f"algorithm={name}", "tracking.enabled=false",
                              f"backend.threads={threads}", f"trainer.output_dir={out}",
                              "trainer.status_every=0", *overrides])
        trainer = Trainer(cfg)
        trainer._t_start = time.perf_counter()
        trainer.setup()
        alg = trainer.algorithm
        loss_t: list[float] = []
        prep_t: list[float] = []
        alg.loss = _timed(alg.loss, loss_t)
        if hasattr(alg, "prepare_minibatch"):
            alg.prepare_minibatch = _timed(alg.prepare_minibatch, prep_t)
        rows = []
        for i in range(warmup + steps):
            loss_t.clear()
            prep_t.clear()
            m = trainer.train_step()
            if i >= warmup:
                own = m.get("time/adv", 0.0) + sum(loss_t) + sum(prep_t)
                rows.append((own, m["time/step"], m.get("time/adv", 0.0), sum(loss_t),
                             sum(prep_t)))
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    return {"algorithm": name, "share": med(0) / med(1), "step": med(1), "adv": med(2),
            "loss": med(3), "prepare": med(4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("algorithms", nargs="*")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args, overrides = parser.parse_known_args()
    import algorithms  # noqa: F401
    from harness.registry import ALGORITHMS

    torch.set_num_threads(args.threads)
    names = args.algorithms or ALGORITHMS.names()
    print(f"{'algorithm':<14} {'share':>7} {'step s':>8} {'adv ms':>8} {'loss ms':>8} "
          f"{'prepare ms':>10}")
    for name in names:
        r = measure(name, args.steps, args.warmup, args.threads, overrides)
        print(f"{r['algorithm']:<14} {100 * r['share']:6.2f}% {r['step']:8.3f} "
              f"{1e3 * r['adv']:8.2f} {1e3 * r['loss']:8.2f} {1e3 * r['prepare']:10.2f}",
              flush=True)


if __name__ == "__main__":
    main()
