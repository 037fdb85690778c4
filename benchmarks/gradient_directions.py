"""Gradient directions of paired algorithms on the same batches, in a trainer recipe (issue 20).

GRPO trains the warm-started tiny model on tiny Countdown (the driver). Each step's rollout batch
is walked through the recipe's epochs x mini-batches in the order ``Trainer.update`` walks it; at
each optimizer step every algorithm below computes its gradient on that mini-batch at the current
weights (through ``Trainer.update`` with the optimizer step replaced by a probe), then GRPO's own
update is applied. Printed per optimizer-step position within a batch (position 0 is on-policy:
pi_theta = pi_old): the cosine between the gradients of each pair, and each algorithm's gradient
norm before clipping, as mean [min, max] over the probed steps.

    python benchmarks/gradient_directions.py                      # default recipe (on-policy)
    python benchmarks/gradient_directions.py trainer=offpolicy    # the off-policy recipe
    python benchmarks/gradient_directions.py --steps 10 --seed 1 trainer=offpolicy

Options: ``--steps`` (RL steps probed, default 5), ``--seed`` (default 0), ``--threads``
(default 1); any ``key=value`` is a Hydra override of the driver's config (the recipe). The
tiny model is built and cached on first use (``$RLBENCH_CACHE``, else ``~/.cache/rlbench``).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Callable

import torch

from harness.algorithm import build_algorithm
from harness.cli import compose_config
from harness.trainer import Trainer

# (label, algorithm config option): every algorithm whose gradient is probed
ALGORITHMS = (("grpo", "grpo"), ("maxrl", "maxrl"), ("dr_grpo", "dr_grpo"), ("cispo", "cispo"),
              ("gppo", "gppo"), ("lpo_rev@sigma_g", "lpo_rev"), ("lpo_fwd@sigma_g", "lpo_fwd"),
              ("lpo_rev@one", "lpo_tau/rev_one"))
# the pairs the LPO paper's paired-temperature protocol compares, and the clip variants
PAIRS = (("lpo_rev@sigma_g", "grpo"), ("lpo_fwd@sigma_g", "maxrl"), ("lpo_fwd@sigma_g", "grpo"),
         ("lpo_rev@one", "dr_grpo"), ("cispo", "grpo"), ("gppo", "grpo"))


def _flat_grads(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in params]).double()


def probe(overrides: list[str], steps: int, seed: int,
          algorithms: tuple[tuple[str, str], ...] = ALGORITHMS,
          pairs: tuple[tuple[str, str], ...] = PAIRS,
          rewards: Callable[[torch.Tensor], torch.Tensor] | None = None,
          ) -> dict[tuple[int, str], list[float]]:
    """{(position, quantity): values over steps}; quantity ``cos <a> | <b>`` (nan when either
    gradient is 0) or ``norm <a>``. ``algorithms`` must include ``grpo`` (the driver).
    ``rewards`` maps the verifier's rewards to others (a test gives every group a signal)."""
    cfg = compose_config(["algorithm=grpo", f"seed={seed}", "tracking.enabled=false",
                          "trainer.status_every=0", *overrides])
    tr = Trainer(cfg)
    tr._t_start = 0.0
    tr.setup()
    max_new = cfg.rollout.max_new_tokens
    algos = {label: build_algorithm(compose_config([f"algorithm={opt}", *overrides]).algorithm,
                                    max_new)
             for label, opt in algorithms}
    driver = tr.algorithm
    params = [p for p in tr.engine.model.parameters() if p.requires_grad]
    real_step = tr.engine.optimizer_step
    tc = cfg.trainer
    epochs, mini = tc.epochs, tc.mini_batch_size
    out: dict[tuple[int, str], list[float]] = defaultdict(list)
    grads: dict[str, torch.Tensor] = {}

    def capture(label: str) -> float:
        g = _flat_grads(params)
        grads[label] = g
        for p in params:
            p.grad = None
        return float(g.norm())

    tc.epochs, tc.mini_batch_size = 1, 0  # update() below gets one mini-batch at a time
    for _ in range(steps):
        batch = tr.algorithm.rollout(_context(tr))
        if rewards is not None:
            batch["rewards"] = rewards(batch["rewards"])
        batch["old_logprobs"] = tr.old_logprobs(batch, tc.micro_batch_size or len(batch))
        prepared = {}
        for label, algo in algos.items():
            b = batch.select(torch.arange(len(batch)))
            algo.compute_advantages(b)
            prepared[label], _ = algo.select_training_rows(b)
            assert len(prepared[label]) == len(batch), f"{label} dropped rows"
        position = 0
        for _epoch in range(epochs):
            splits = {label: list(b.split(mini or len(b))) for label, b in prepared.items()}
            for j in range(len(splits["grpo"])):
                current = position == 0  # old log-probs are the current weights' only before
                for label, algo in algos.items():  # the first optimizer step of the batch
                    tr.algorithm = algo
                    tr.engine.optimizer_step = lambda label=label: capture(label)
                    tr.update(splits[label][j], old_is_current=current)
                    out[position, f"norm {label}"].append(float(grads[label].norm()))
                for a, b in pairs:
                    ga, gb = grads[a], grads[b]
                    norms = float(ga.norm() * gb.norm())
                    cos = float(ga @ gb) / norms if norms > 0 else math.nan
                    out[position, f"cos {a} | {b}"].append(cos)
                tr.algorithm, tr.engine.optimizer_step = driver, real_step
                tr.update(splits["grpo"][j], old_is_current=current)  # GRPO's real step
                position += 1
        tr.rollout_engine.update_weights(tr.engine)
    return out


def _context(tr: Trainer):
    from harness.rollout import RolloutContext

    return RolloutContext(engine=tr.rollout_engine, task=tr.task, draw_prompts=tr.sampler.draw,
                          prompts_per_step=tr.cfg.data.prompts_per_step, sampling=tr.sampling,
                          shape_rewards=tr.algorithm.shape_rewards)


def report(out: dict[tuple[int, str], list[float]]) -> str:
    positions = sorted({p for p, _ in out})
    names = sorted({q for _, q in out}, key=lambda q: (not q.startswith("cos"), q))
    lines = [f"{'quantity':<32}" + "".join(f"{'pos ' + str(p):>24}" for p in positions)]
    for q in names:
        cells = []
        for p in positions:
            v = out.get((p, q), [])
            fmt = ".4f" if q.startswith("cos") else ".3f"
            v = [x for x in v if not math.isnan(x)]  # no signal in that mini-batch
            cells.append(f"{sum(v) / len(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]" if v
                         else "-")
        lines.append(f"{q:<32}" + "".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args, overrides = ap.parse_known_args()
    torch.set_num_threads(args.threads)
    out = probe(overrides, args.steps, args.seed)
    n = len(next(iter(out.values())))
    print(f"recipe overrides: {' '.join(overrides) or '(default)'}; {args.steps} steps, seed "
          f"{args.seed}; mean [min, max] over {n} probed optimizer steps per position")
    print(report(out))



if __name__ == "__main__":
    main()
