"""The arithmetic floor of the CPU testbed: how short an RL step, and ``rlbench demo``, could be if
the tiny model's matrix products were the only work, at the throughput this machine measures for
the model's own matrix shapes.

What it counts
    * Multiply-adds per token of the linear layers, from the model's config: q, k, v, o and gate,
      up, down in every layer, and the (tied) LM head. Attention scores, norms, rotary, sampling,
      the optimizer, the verifier and every Python line are left out, so each floor is a lower
      bound on what any implementation of the same float32 work can reach.
    * One real rollout batch of the default step (``--prompts`` x ``--n`` samples, the task's
      ``max_new_tokens``) from the warm start: the distinct prompts (prefilled once, and run
      once by the shared-prefix training forward), the response tokens (each decoded once: a
      lower bound on the decode rows, since finished rows leave the batch only in steps of a
      quarter) and the padded response columns the training forward runs (``--packed`` counts
      the response tokens alone, as packed micro-batches would).
    * Training: forward + backward = 3 x the forward's multiply-adds.
    * The demo (``sweep=countdown_baselines``): 18 cells, each counted as a GRPO cell (DAPO's
      refills and REINFORCE++'s larger update only add), ``trainer.steps`` steps and an
      evaluation of every held-out problem (``n`` samples, responses as long as the batch's) at
      step 0 and every ``trainer.eval_every`` steps; plus the warm start (``model.pretrain``
      steps x batch x the mean warm-start pair length, 3 x forward).

Throughput: ``F.linear`` timed at every layer shape for the rows each phase feeds it, on this
machine: at ``--threads`` threads for the step and the warm start, at one thread for the demo's
cells (two joblib workers of one thread each, counted at twice one thread's throughput, the
best two processes can do). Run it on a quiet machine.

    python benchmarks/arithmetic_floor.py --threads 2 --trl-step 0.76

``--trl-step``: TRL's median step time from ``benchmarks/step_time.py`` on the same machine; the
script then prints the floor of the rlbench / TRL ratio. ``benchmarks/floor_distance.py`` calls
:func:`measure` and times the step and the demo in the same run, as multiples of these floors.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


def linear_shapes(cfg: Any) -> list[tuple[int, int]]:
    """(in, out) of every linear layer a token goes through, LM head last."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    d = getattr(cfg, "head_dim", None) or h // heads
    layer = [(h, heads * d), (h, kv * d), (h, kv * d), (heads * d, h),
             (h, cfg.intermediate_size), (h, cfg.intermediate_size), (cfg.intermediate_size, h)]
    return layer * cfg.num_hidden_layers + [(h, cfg.vocab_size)]


def seconds_per_token(shapes: list[tuple[int, int]], rows: int, repeats: int = 50) -> float:
    """Wall seconds per token of all ``shapes`` when ``rows`` tokens go through them at once."""
    total = 0.0
    for k, n in shapes:
        x, w = torch.randn(rows, k), torch.randn(n, k)
        for _ in range(5):
            F.linear(x, w)
        t = time.perf_counter()
        for _ in range(repeats):
            F.linear(x, w)
        total += (time.perf_counter() - t) / repeats
    return total / rows


@dataclass
class Floors:
    """What :func:`measure` found: per-token seconds of the linear layers at each phase's rows
    (``two``: ``--threads`` threads; ``one``: one thread, as a demo worker runs), the step's and
    the demo's floors in seconds, and what they were counted from."""

    threads: int
    macs: int
    step_gen: float
    step_update: float
    gflops: float
    demo_warm: float
    demo_cell: float
    cell_gen1: float      # one step's generation on one thread (a demo worker's)
    cell_update1: float   # one step's update on one thread
    cell_eval1: float     # one evaluation on one thread
    step_response_tokens: int  # response tokens of the counted batch (generated and trained)
    demo_cells: int
    evals: int
    eval_problems: int
    eval_n: int
    batch: str

    @property
    def step(self) -> float:
        return self.step_gen + self.step_update

    @property
    def demo(self) -> float:
        """The warm start (one process, ``threads``) and the cells over two one-thread workers."""
        return self.demo_warm + self.demo_cells * self.demo_cell / 2


def measure(threads: int = 2, prompts: int = 32, n: int = 8, packed: bool = False,
            overrides: tuple[str, ...] = ()) -> Floors:
    """Count the multiply-adds of one real batch of the default step and of the demo, and time
    ``F.linear`` at the model's shapes on this machine (see the module docstring); ``overrides``
    are Hydra overrides of the configuration counted."""
    was = torch.get_num_threads()
    torch.set_num_threads(threads)

    from omegaconf import OmegaConf

    from harness.backends.hf import HFEngine
    from harness.batch import RolloutBatch
    from harness.cli import compose_config
    from harness.config import BackendConfig, OptimConfig
    from harness.models.pretrain import encode_pairs
    from harness.registry import MODELS, TASKS
    from harness.typed_config import build
    from harness.types import SamplingParams

    cfg = compose_config(["sweep=countdown_baselines", "algorithm=grpo", "task=countdown",
                          "model=tiny", f"data.prompts_per_step={prompts}", f"rollout.n={n}",
                          *overrides])
    task = build(TASKS, cfg.task, "task")
    path = MODELS.get(cfg.model.source)(cfg.model, task, progress=True)
    eng = HFEngine(path, OmegaConf.structured(BackendConfig(threads=threads)), 0,
                   OmegaConf.structured(OptimConfig))
    shapes = linear_shapes(eng.model.config)
    macs = sum(k * n for k, n in shapes)
    T = task.default_max_new_tokens
    encoded = [eng.encode_prompt(e) for e in task.train_examples()[:prompts]]
    trajs = eng.generate(encoded, SamplingParams(n=n, temperature=1.0, max_new_tokens=T),
                         torch.Generator().manual_seed(0))
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    prompt_tokens = sum(len(p) for p in encoded)
    response_tokens = sum(len(t.response_ids) for t in trajs)
    B, R = batch["responses"].shape
    train_resp = response_tokens if packed else B * (R - 1)  # inputs: all but the last

    rows_decode, rows_train = len(trajs), prompt_tokens + train_resp
    s_decode = seconds_per_token(shapes, rows_decode)
    s_prefill = seconds_per_token(shapes, prompt_tokens)
    s_train = seconds_per_token(shapes, train_resp)
    gen = prompt_tokens * s_prefill + response_tokens * s_decode
    update = 3 * (prompt_tokens * s_prefill + train_resp * s_train)
    flops = 2 * macs * (prompt_tokens + response_tokens + 3 * rows_train)

    # the demo: 18 cells of trainer.steps steps with evaluations (two workers of one thread:
    # at best twice one thread's throughput), then the warm start (one process, ``threads``)
    torch.set_num_threads(1)
    s1 = {rows: seconds_per_token(shapes, rows) for rows in
          {rows_decode, prompt_tokens, train_resp, eng.gen_batch_size}}
    torch.set_num_threads(threads)
    gen1 = prompt_tokens * s1[prompt_tokens] + response_tokens * s1[rows_decode]
    update1 = 3 * (prompt_tokens * s1[prompt_tokens] + train_resp * s1[train_resp])
    step1 = gen1 + update1
    protocol = cfg.task.tiny.eval.heldout
    evals = 1 + cfg.trainer.steps // cfg.trainer.eval_every
    eval_prompts = [eng.encode_prompt(e) for e in task.eval_sets()[0].examples]
    eval_tokens = (sum(len(p) for p in eval_prompts)
                   + len(eval_prompts) * protocol.n * response_tokens / len(trajs))
    eval1 = eval_tokens * s1[eng.gen_batch_size]
    cell = cfg.trainer.steps * step1 + evals * eval1
    _, mask, _ = encode_pairs(eng.tokenizer, task.warmstart_examples())[:3]
    pre = cfg.model.pretrain
    warm = 3 * pre.steps * min(pre.batch_size, len(mask)) * float(mask.sum(-1).float().mean()) \
        * s_train
    torch.set_num_threads(was)
    text = (f"{len(encoded)} prompts ({prompt_tokens} tokens) x {n}; {response_tokens} response "
            f"tokens of {B} x {R} columns ({response_tokens / (B * R):.0%} real); training "
            f"forward over {rows_train} tokens{' (packed)' if packed else ''}")
    return Floors(threads, macs, gen, update, flops / 1e9 / (gen + update), warm, cell, gen1,
                  update1, eval1, response_tokens, 18, evals, len(eval_prompts), protocol.n,
                  text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--trl-step", type=float, default=None, help="TRL's median step, seconds")
    ap.add_argument("--packed", action="store_true", help="train on response tokens only")
    args = ap.parse_args()
    f = measure(args.threads, args.prompts, args.n, args.packed)
    print(f"model: {f.macs / 1e6:.2f} M multiply-adds per token in its linear layers; "
          f"{f.threads} threads")
    print(f"batch: {f.batch}")
    print(f"step floor: generation {f.step_gen:.3f} s + update {f.step_update:.3f} s = "
          f"{f.step:.3f} s (at {f.gflops:.0f} GFLOP/s)")
    if args.trl_step:
        print(f"rlbench / TRL ratio floor: {f.step / args.trl_step:.3f}")
    print(f"demo floor: warm start {f.demo_warm:.0f} s + {f.demo_cells} cells x "
          f"{f.demo_cell:.1f} s on one thread ({f.evals} evaluations of {f.eval_problems} x "
          f"{f.eval_n}) over two workers = {f.demo / 60:.1f} min")


if __name__ == "__main__":
    main()
