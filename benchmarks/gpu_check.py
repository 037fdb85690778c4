"""One-GPU check of the GPU backends (issue 9), driven by ``benchmarks/gpu_check.sh``.

Subcommands, each run in its own process (vLLM and megatron-core keep process-wide state):

* ``build OUT``: a random Qwen3-architecture checkpoint (~0.4 B parameters, rlbench's character
  tokenizer; nothing is downloaded).
* ``standalone MODEL OUT.json``: vLLM alone on that model, with the engine's settings, sampling
  the same Countdown prompts the training runs use: generated tokens/s.
* ``train BACKEND MODEL OUT.json``: a few GRPO steps with ``backend=BACKEND`` (vllm_megatron,
  vllm_hf or hf) in-process; the first step is warm-up. Rollout tokens/s, training MFU (6 N
  FLOPs per trained token, N = non-embedding parameters, over the update time, against the
  GPU's dense bf16 peak), and the vLLM-vs-trainer log-prob mismatch (``rollout_corr/*``).
* ``summary DIR``: the table, with the goals (rollout >= 80% of standalone vLLM, MFU >= 40%).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

PROMPTS, N, MAX_TOKENS, STEPS = 64, 8, 256, 4
if os.environ.get("GPU_CHECK_SMOKE"):  # a CPU smoke test of this script's plumbing (hf only)
    PROMPTS, N, MAX_TOKENS, STEPS = 4, 2, 8, 2
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


def peak_flops() -> float:
    if os.environ.get("RLBENCH_PEAK_TFLOPS"):
        return float(os.environ["RLBENCH_PEAK_TFLOPS"]) * 1e12
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    for key, tflops in PEAK_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return 989.0e12


def overrides(backend: str, model: str, out_dir: Path) -> list[str]:
    return [
        f"backend={backend}", f"backend.device={'cuda' if torch.cuda.is_available() else 'cpu'}",
        f"backend.dtype={'bfloat16' if torch.cuda.is_available() else 'float32'}",
        "model.source=hf", f"model.path={model}", "model.name=gpu_check",
        "model.task_variant=full", "model.attn_implementation=null",
        "task=countdown", "algorithm=grpo", f"data.prompts_per_step={PROMPTS}", f"rollout.n={N}",
        f"rollout.max_new_tokens={MAX_TOKENS}", f"trainer.steps={STEPS}", "trainer.eval_every=0",
        "trainer.checkpoint_every=0", "trainer.skip_zero_gradient=false",
        "trainer.micro_batch_size=32", "trainer.old_logprobs=recompute",
        "tracking.enabled=false", f"trainer.output_dir={out_dir}", "trainer.status_every=1",
    ]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def cmd_build(out: str) -> None:
    from harness.backends.random_model import count_parameters, write_random_model

    size = (dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=128) if os.environ.get("GPU_CHECK_SMOKE") else
            dict(hidden_size=1536, num_layers=16, num_heads=12, num_kv_heads=4, head_dim=128,
                 intermediate_size=4096))
    path = write_random_model(out, architecture="qwen3", max_position_embeddings=4096, **size)
    print(json.dumps({"model": str(path), **count_parameters(path)}))


def countdown_prompts(model: str) -> list[list[int]]:
    from harness.cli import compose_config
    from harness.components import build
    from harness.models.tiny import load_tokenizer
    from harness.registry import TASKS

    cfg = compose_config(["task=countdown", "model.task_variant=full"])
    task = build(TASKS, cfg.task, "task")
    tok = load_tokenizer(model)
    return [tok.encode(ex.prompt, add_special_tokens=False)
            for ex in task.train_examples()[:PROMPTS]]


def cmd_standalone(model: str, out: str) -> None:
    from vllm import LLM, SamplingParams

    from harness.backends.vllm_engine import llm_kwargs
    from harness.cli import compose_config

    vcfg = compose_config(["backend=vllm_megatron"]).backend.vllm
    kwargs = llm_kwargs(model, vcfg, seed=0, dtype="bfloat16", max_model_len=None)
    kwargs.update(load_format="auto", enable_sleep_mode=False)
    kwargs.pop("distributed_executor_backend")  # vLLM's own default executor
    llm = LLM(**kwargs)
    prompts = [{"prompt_token_ids": p} for p in countdown_prompts(model)]
    from harness.backends.vllm_engine import eos_ids
    from harness.models.tiny import load_tokenizer

    params = SamplingParams(n=N, temperature=1.0, max_tokens=MAX_TOKENS, logprobs=0,
                            detokenize=False, seed=0,
                            stop_token_ids=eos_ids(model, load_tokenizer(model)))
    llm.generate(prompts[:8], params, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    result = {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall}
    Path(out).write_text(json.dumps(result))
    print(json.dumps(result))


def cmd_train(backend: str, model: str, out: str) -> None:
    from harness.backends.random_model import count_parameters
    from harness.cli import compose_config
    from harness.trainer import Trainer

    cfg = compose_config(overrides(backend, model, Path(out).parent / f"run_{backend}"))
    tr = Trainer(cfg)
    tr._t_start = time.perf_counter()
    tr.setup()
    trained = {"tokens": 0.0}
    forward = tr.engine.forward

    def counting_forward(mb, *args, **kwargs):  # tokens through forward+backward
        if torch.is_grad_enabled():
            trained["tokens"] += float(mb["attention_mask"].sum())
        return forward(mb, *args, **kwargs)

    tr.engine.forward = counting_forward
    steps = []
    for step in range(STEPS):
        before = trained["tokens"]
        sync()
        m = tr.train_step()
        sync()
        m["trained_tokens"] = trained["tokens"] - before
        steps.append(m)
        print(f"[gpu_check {backend}] step {step}: gen {m.get('time/gen', 0):.2f}s "
              f"update {m.get('time/update', 0):.2f}s tokens {m.get('rollout/tokens', 0):.0f}",
              file=sys.stderr, flush=True)
    timed = steps[1:]  # the first step compiles / captures graphs
    n_params = count_parameters(model)["non_embedding"]
    gen_s = sum(m["time/gen"] for m in timed)
    update_s = sum(m["time/update"] for m in timed)
    flops = 6.0 * n_params * sum(m["trained_tokens"] for m in timed)

    def stat(key: str, how=max) -> float | None:
        vals = [m[key] for m in timed if key in m]
        return how(vals) if vals else None

    result = {
        "backend": backend,
        "rollout_tokens_per_s": sum(m["rollout/tokens"] for m in timed) / gen_s,
        "update_s_per_step": update_s / len(timed),
        "sync_s_per_step": sum(m.get("time/sync", 0.0) for m in timed) / len(timed),
        "step_s": sum(m["time/step"] for m in timed) / len(timed),
        "mfu": flops / update_s / peak_flops(),
        "logprob_abs_diff_mean": stat("rollout_corr/logprob_abs_diff_mean",
                                      lambda v: sum(v) / len(v)),
        "logprob_abs_diff_max": stat("rollout_corr/logprob_abs_diff_max"),
        "kl_k3": stat("rollout_corr/kl_k3", lambda v: sum(v) / len(v)),
        "peak_gpu_mem_gb": (torch.cuda.max_memory_allocated() / 2**30
                            if torch.cuda.is_available() else 0.0),
    }
    Path(out).write_text(json.dumps(result))
    print(json.dumps(result))


def cmd_summary(directory: str) -> int:
    d = Path(directory)
    standalone = json.loads((d / "standalone.json").read_text()) if (
        d / "standalone.json").exists() else None
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"\n=== gpu_check on {device}")
    if standalone:
        print(f"standalone vLLM: {standalone['tokens_per_s']:.0f} tokens/s")
    failed = 0
    for backend in ("vllm_megatron", "vllm_hf", "hf"):
        path = d / f"train_{backend}.json"
        if not path.exists():
            print(f"{backend:14s} MISSING (the run failed or timed out; see its log)")
            failed += 1
            continue
        r = json.loads(path.read_text())
        ratio = (r["rollout_tokens_per_s"] / standalone["tokens_per_s"]) if standalone else None
        line = (f"{backend:14s} rollout {r['rollout_tokens_per_s']:.0f} tok/s"
                + (f" ({ratio:.0%} of standalone, goal >= 80%)" if ratio else "")
                + f"  MFU {r['mfu']:.1%} (goal >= 40%)  step {r['step_s']:.1f}s"
                + f"  sync {r['sync_s_per_step']:.2f}s  mem {r['peak_gpu_mem_gb']:.1f} GB")
        if r["logprob_abs_diff_mean"] is not None:
            ok = r["logprob_abs_diff_mean"] < 0.05
            line += (f"\n{'':14s} log-prob |sampler - trainer|"
                     f" mean {r['logprob_abs_diff_mean']:.4f}"
                     f" max {r['logprob_abs_diff_max']:.3f} KL(k3) {r['kl_k3']:.2e}"
                     f" -> {'agree' if ok else 'DISAGREE'} (mean < 0.05)")
            failed += 0 if ok else 1
        print(line)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build").add_argument("out")
    p = sub.add_parser("standalone")
    p.add_argument("model")
    p.add_argument("out")
    p = sub.add_parser("train")
    p.add_argument("backend")
    p.add_argument("model")
    p.add_argument("out")
    sub.add_parser("summary").add_argument("dir")
    args = parser.parse_args()
    if args.cmd == "build":
        cmd_build(args.out)
    elif args.cmd == "standalone":
        cmd_standalone(args.model, args.out)
    elif args.cmd == "train":
        cmd_train(args.backend, args.model, args.out)
    else:
        return cmd_summary(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
