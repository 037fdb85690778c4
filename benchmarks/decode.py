"""Decode throughput of the HF engine's sampling loop against a minimal pure-torch reference loop,
and multi-turn rollout throughput on the agentic tiny task, old (DynamicCache) vs new
(preallocated) KV cache. One process, interleaved repeats, medians.

    python benchmarks/decode.py --threads 2
    python benchmarks/decode.py --threads 2 --skip-multiturn
    python benchmarks/decode.py --threads 2 --compile        # also time torch.compile'd reference

Single-turn: ``--prompts`` Countdown prompts x ``--n`` samples, left-padded, ``--new-tokens``
tokens per row for every side (the engine's EOS is switched off for the measurement so that all
sides decode the same number of tokens). Sides:

* ``engine``: ``HFEngine.generate`` with ``backend.kv_cache=static`` (harness/backends/kv_decode.py)
  -- shared prefill, per-token log-prob and entropy, stop-string bookkeeping;
* ``engine (dynamic)``: the same loop over transformers' ``DynamicCache`` (the old path);
* ``reference``: the loop written below from the model's weight tensors alone (embedding, RMS
  norm, rotary, attention over a preallocated cache, SiLU MLP, tied head), shared prefill,
  multinomial sampling and nothing else.

Multi-turn: GRPO's group rollout on ``task=agentic_qa`` from the 500-step warm start
(docs/tasks/agentic_qa.md), the same prompts and generator seed on both sides (so both sample the
same trajectories), trajectories/s with ``kv_cache`` dynamic vs static.

A benchmark, not a test: times depend on the machine and its load; ratios measured side by side
are what the issue quotes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F


# -- the reference loop ------------------------------------------------------------------------
class Reference:
    """Qwen2/Llama decoding from raw weights with a preallocated KV cache."""

    def __init__(self, model: Any) -> None:
        cfg = model.config
        sd = {k: v.detach() for k, v in model.state_dict().items()}
        self.L = cfg.num_hidden_layers
        self.H = cfg.num_attention_heads
        self.Hkv = getattr(cfg, "num_key_value_heads", None) or self.H
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.eps = cfg.rms_norm_eps
        self.emb = sd["model.embed_tokens.weight"]
        self.head = sd.get("lm_head.weight", self.emb)
        self.norm = sd["model.norm.weight"]
        self.inv_freq = model.model.rotary_emb.inv_freq.detach().float()
        self.layers = []
        for i in range(self.L):
            def g(name: str, prefix: str = f"model.layers.{i}.") -> torch.Tensor | None:
                return sd.get(prefix + name)

            self.layers.append({
                "ln1": g("input_layernorm.weight"), "ln2": g("post_attention_layernorm.weight"),
                "q": g("self_attn.q_proj.weight"), "qb": g("self_attn.q_proj.bias"),
                "k": g("self_attn.k_proj.weight"), "kb": g("self_attn.k_proj.bias"),
                "v": g("self_attn.v_proj.weight"), "vb": g("self_attn.v_proj.bias"),
                "o": g("self_attn.o_proj.weight"),
                "gate": g("mlp.gate_proj.weight"), "up": g("mlp.up_proj.weight"),
                "down": g("mlp.down_proj.weight")})

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                start: int, bias: torch.Tensor) -> torch.Tensor:
        """ids/pos [B, t]; kc/vc [L, B, Hkv, S, D]; bias [B, 1, t, start+t] additive mask."""
        B, t = ids.shape
        end = start + t
        x = F.embedding(ids, self.emb)
        freqs = pos[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        half = self.D // 2
        for i, w in enumerate(self.layers):
            h = self.rms(x, w["ln1"])
            q = F.linear(h, w["q"], w["qb"]).view(B, t, self.H, self.D).transpose(1, 2)
            k = F.linear(h, w["k"], w["kb"]).view(B, t, self.Hkv, self.D).transpose(1, 2)
            v = F.linear(h, w["v"], w["vb"]).view(B, t, self.Hkv, self.D).transpose(1, 2)
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), -1) * sin
            kc[i, :, :, start:end], vc[i, :, :, start:end] = k, v
            keys, values = kc[i, :, :, :end], vc[i, :, :, :end]
            if self.Hkv != self.H:
                keys = keys.repeat_interleave(self.H // self.Hkv, 1)
                values = values.repeat_interleave(self.H // self.Hkv, 1)
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
            x = x + F.linear(a.transpose(1, 2).reshape(B, t, -1), w["o"])
            h = self.rms(x, w["ln2"])
            x = x + F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
        return F.linear(self.rms(x[:, -1], self.norm), self.head)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, T: int, temperature: float,
                 gen: torch.Generator, pad: int) -> torch.Tensor:
        U, P = len(prompts), max(map(len, prompts))
        ids = torch.full((U, P), pad, dtype=torch.long)
        valid = torch.zeros((U, P), dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, P - len(p):], valid[i, P - len(p):] = torch.tensor(p), True
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        dt = self.emb.dtype
        kc = torch.empty((self.L, U, self.Hkv, P, self.D), dtype=dt)
        vc = torch.empty_like(kc)
        ok = valid[:, None, None, :] & torch.ones((P, P), dtype=torch.bool).tril()
        bias = torch.zeros(ok.shape, dtype=dt).masked_fill(~ok, torch.finfo(dt).min)
        logits = self.forward(ids, pos, kc, vc, 0, bias).repeat_interleave(n, 0)
        N = U * n
        kfull = torch.empty((self.L, N, self.Hkv, P + T, self.D), dtype=dt)
        vfull = torch.empty_like(kfull)
        kfull[:, :, :, :P] = kc.repeat_interleave(n, 1)
        vfull[:, :, :, :P] = vc.repeat_interleave(n, 1)
        keys_ok = torch.cat([valid.repeat_interleave(n, 0), torch.ones((N, T), dtype=torch.bool)],
                            1)
        step_bias = torch.zeros((N, 1, 1, P + T), dtype=dt).masked_fill(
            ~keys_ok[:, None, None], torch.finfo(dt).min)
        next_pos = pos[:, -1:].repeat_interleave(n, 0) + 1
        out = torch.empty((N, T), dtype=torch.long)
        for t in range(T):
            probs = (logits / temperature).softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=gen)
            out[:, t] = nxt[:, 0]
            if t == T - 1:
                break
            logits = self.forward(nxt, next_pos, kfull, vfull, P + t,
                                  step_bias[..., : P + t + 1])
            next_pos = next_pos + 1
        return out


# -- single turn -------------------------------------------------------------------------------
def single_turn(args: argparse.Namespace) -> None:
    from omegaconf import OmegaConf

    from harness.backends.hf import HFEngine
    from harness.cli import compose_config
    from harness.registry import MODELS, TASKS
    from harness.typed_config import build
    from harness.types import SamplingParams

    cfg = compose_config([f"backend.threads={args.threads}", "backend.device=cpu"])
    task = build(TASKS, cfg.task, "task")
    path = MODELS.get(cfg.model.name)(cfg.model, task, progress=False)
    engine = HFEngine(path, OmegaConf.merge(cfg.backend, {"gen_batch_size": 0}), seed=0,
                      attn_implementation=cfg.model.get("attn_implementation"))
    torch.set_num_threads(args.threads)
    engine.eos_token_ids = []  # every side decodes exactly --new-tokens tokens per row
    examples = task.train_examples()[: args.prompts]
    prompts = [engine.encode_prompt(ex) for ex in examples]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens,
                            entropy=True)
    ref = Reference(engine.model)
    tokens = len(prompts) * args.n * args.new_tokens

    def run_engine(kind: str) -> float:
        engine.kv_cache = kind
        t0 = time.perf_counter()
        engine.generate(prompts, params, torch.Generator().manual_seed(0))
        return time.perf_counter() - t0

    def run_ref(model: Reference | Any) -> float:
        t0 = time.perf_counter()
        model.generate(prompts, args.n, args.new_tokens, 1.0, torch.Generator().manual_seed(0),
                       engine.pad_token_id)
        return time.perf_counter() - t0

    sides: dict[str, Any] = {
        "reference (pure torch, preallocated)": lambda: run_ref(ref),
        "engine (kv_cache=static)": lambda: run_engine("static"),
        "engine (kv_cache=dynamic, old)": lambda: run_engine("dynamic"),
    }
    if args.compile:
        compiled = Reference(engine.model)
        compiled.forward = torch.compile(compiled.forward, dynamic=True)
        t0 = time.perf_counter()
        run_ref(compiled)
        print(f"torch.compile of the reference forward: first call (compile) "
              f"{time.perf_counter() - t0:.1f} s")
        sides["reference, torch.compile'd"] = lambda: run_ref(compiled)
    for fn in sides.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            times[name].append(fn())
    print(f"\nsingle-turn decode: {len(prompts)} prompts x {args.n} samples x "
          f"{args.new_tokens} tokens, {args.threads} threads, median of {args.repeats} "
          f"(load {os.getloadavg()[0]:.2f})")
    ref_tps = tokens / statistics.median(times["reference (pure torch, preallocated)"])
    for name, ts in times.items():
        tps = tokens / statistics.median(ts)
        print(f"  {name:<40} {tps:10.0f} tokens/s   {tps / ref_tps:5.2f} x reference")


# -- multi turn --------------------------------------------------------------------------------
def multi_turn(args: argparse.Namespace) -> None:
    from harness.cli import compose_config
    from harness.rollout import RolloutContext, sample_groups
    from harness.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        recipe = ([f"model.pretrain.steps={args.agentic_pretrain_steps}",
                   "model.pretrain.batch_size=64"] if args.agentic_pretrain_steps > 0 else [])
        cfg = compose_config(["algorithm=grpo", "task=agentic_qa", "model=tiny",
                              "tracking.enabled=false", f"backend.threads={args.threads}",
                              *recipe, f"trainer.output_dir={out}",
                              *([f"data.prompts_per_step={args.multiturn_prompts}"]
                                if args.multiturn_prompts > 0 else [])])
        trainer = Trainer(cfg)
        trainer.setup()
        engine = trainer.engine
        torch.set_num_threads(args.threads)
        rounds = [trainer.sampler.draw(cfg.data.prompts_per_step)
                  for _ in range(args.multiturn_steps)]

        def run(kind: str, examples: list[Any], seed: int) -> tuple[float, int]:
            engine.kv_cache = kind
            ctx = RolloutContext(engine=engine, task=trainer.task, draw_prompts=lambda k: [],
                                 prompts_per_step=len(examples), sampling=trainer.sampling)
            engine.generator.manual_seed(seed)
            t0 = time.perf_counter()
            batch = sample_groups(ctx, examples)
            return time.perf_counter() - t0, len(batch)

        run("static", rounds[0], 0)  # warm-up
        rates: dict[str, list[float]] = {"dynamic": [], "static": []}
        for seed, examples in enumerate(rounds):
            for kind in rates:
                wall, n = run(kind, examples, seed)
                rates[kind].append(n / wall)
        d, s = statistics.median(rates["dynamic"]), statistics.median(rates["static"])
        print(f"\nmulti-turn rollout, agentic_qa, warm start {cfg.model.pretrain.steps} x "
              f"{cfg.model.pretrain.batch_size}, "
              f"{cfg.data.prompts_per_step} prompts x {cfg.rollout.n}, median of "
              f"{args.multiturn_steps} (load {os.getloadavg()[0]:.2f})")
        print(f"  kv_cache=dynamic (old)  {d:8.2f} trajectories/s")
        print(f"  kv_cache=static         {s:8.2f} trajectories/s   {s / d:5.2f} x old")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=12)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--skip-multiturn", action="store_true")
    p.add_argument("--skip-single", action="store_true")
    p.add_argument("--multiturn-steps", type=int, default=3)
    p.add_argument("--multiturn-prompts", type=int, default=0,
                   help="prompts per multi-turn rollout (0 = the task's data.prompts_per_step)")
    p.add_argument("--agentic-pretrain-steps", type=int, default=500,
                   help="warm start steps at batch 64 (docs/tasks/agentic_qa.md); 0 = the "
                   "default tiny recipe")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_single:
        single_turn(args)
    if not args.skip_multiturn:
        multi_turn(args)


if __name__ == "__main__":
    main()
