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
script then prints the floor of the rlbench / TRL ratio that issue 19 asks to bring to 0.30.
"""

from __future__ import annotations

import argparse
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--trl-step", type=float, default=None, help="TRL's median step, seconds")
    ap.add_argument("--packed", action="store_true", help="train on response tokens only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

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
                          "model=tiny", f"data.prompts_per_step={args.prompts}",
                          f"rollout.n={args.n}"])
    task = build(TASKS, cfg.task, "task")
    path = MODELS.get(cfg.model.source)(cfg.model, task, progress=True)
    eng = HFEngine(path, OmegaConf.structured(BackendConfig(threads=args.threads)), 0,
                   OmegaConf.structured(OptimConfig))
    shapes = linear_shapes(eng.model.config)
    macs = sum(k * n for k, n in shapes)
    T = task.default_max_new_tokens
    prompts = [eng.encode_prompt(e) for e in task.train_examples()[: args.prompts]]
    trajs = eng.generate(prompts, SamplingParams(n=args.n, temperature=1.0, max_new_tokens=T),
                         torch.Generator().manual_seed(0))
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    prompt_tokens = sum(len(p) for p in prompts)
    response_tokens = sum(len(t.response_ids) for t in trajs)
    B, R = batch["responses"].shape
    train_resp = response_tokens if args.packed else B * (R - 1)  # inputs: all but the last

    rows_decode, rows_train = len(trajs), prompt_tokens + train_resp
    s_decode = seconds_per_token(shapes, rows_decode)
    s_prefill = seconds_per_token(shapes, prompt_tokens)
    s_train = seconds_per_token(shapes, train_resp)
    gen = prompt_tokens * s_prefill + response_tokens * s_decode
    update = 3 * (prompt_tokens * s_prefill + train_resp * s_train)
    print(f"model: {macs / 1e6:.2f} M multiply-adds per token in its linear layers; "
          f"{args.threads} threads")
    print(f"batch: {len(prompts)} prompts ({prompt_tokens} tokens) x {args.n}; "
          f"{response_tokens} response tokens of {B} x {R} columns "
          f"({response_tokens / (B * R):.0%} real); training forward over "
          f"{rows_train} tokens{' (packed)' if args.packed else ''}")
    flops = 2 * macs * (prompt_tokens + response_tokens + 3 * rows_train)
    print(f"step floor: generation {gen:.3f} s + update {update:.3f} s = {gen + update:.3f} s "
          f"({flops / 1e9:.1f} GFLOP at {flops / 1e9 / (gen + update):.0f} GFLOP/s)")
    if args.trl_step:
        print(f"rlbench / TRL ratio floor: {(gen + update) / args.trl_step:.3f} "
              f"(issue 19's goal: 0.30)")

    # the demo: 18 cells of trainer.steps steps with evaluations (two workers of one thread:
    # at best twice one thread's throughput), then the warm start (one process, --threads)
    torch.set_num_threads(1)
    s1 = {rows: seconds_per_token(shapes, rows) for rows in
          {rows_decode, prompt_tokens, train_resp, eng.gen_batch_size}}
    torch.set_num_threads(args.threads)
    step1 = (prompt_tokens * s1[prompt_tokens] + response_tokens * s1[rows_decode]
             + 3 * (prompt_tokens * s1[prompt_tokens] + train_resp * s1[train_resp]))
    protocol = cfg.task.tiny.eval.heldout
    evals = 1 + cfg.trainer.steps // cfg.trainer.eval_every
    eval_prompts = [eng.encode_prompt(e) for e in task.eval_sets()[0].examples]
    eval_tokens = (sum(len(p) for p in eval_prompts)
                   + len(eval_prompts) * protocol.n * response_tokens / len(trajs))
    cell = cfg.trainer.steps * step1 + evals * eval_tokens * s1[eng.gen_batch_size]
    _, mask, _ = encode_pairs(eng.tokenizer, task.warmstart_examples())[:3]
    pre = cfg.model.pretrain
    warm = 3 * pre.steps * min(pre.batch_size, len(mask)) * float(mask.sum(-1).float().mean()) \
        * s_train
    cells = 18
    demo = warm + cells * cell / 2
    print(f"demo floor: warm start {warm:.0f} s + {cells} cells x {cell:.1f} s on one thread "
          f"({evals} evaluations of {len(eval_prompts)} x {protocol.n}) over two workers "
          f"= {demo / 60:.1f} min (issue 19's goal: 3.5 min)")

if __name__ == "__main__":
    main()
