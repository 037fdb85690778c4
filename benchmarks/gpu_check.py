"""GPU check of rlbench's engines, for the GPU machine this project can use (one H200; its own
Python 3.12 image with torch 2.11 and transformers 5.17, no vLLM, no package registry).

``benchmarks/gpu_check.sh`` runs it there (docs/gpu.md: how the wheels it needs are carried);
``GPU_CHECK_SMOKE=1`` dry-runs every phase on a CPU at toy sizes (CI does,
tests/backends/test_gpu_check.py).
``run --out DIR`` runs the phases below, each in its own process (megatron-core and vLLM keep
process-wide state) under one time budget (``GPU_CHECK_BUDGET_S``, default 540 s), and writes
``DIR/summary.json`` and ``DIR/gpu_check.log``:

* ``env``: device, versions, which optional packages import, the measured bf16 matmul rate.
* ``gpu_tests``: ``pytest -m gpu tests/backends/test_gpu_engines.py``.
* ``build``: a random checkpoint of Qwen3-0.6B's shape (28 layers, hidden 1024, 16/8 heads,
  full 151936 vocabulary, tied embeddings; rlbench's character tokenizer, nothing downloaded).
* ``hf_grpo``: GRPO steps with the transformers engine in bf16 (fp32 master weights) on
  Countdown. ``megatron_grpo``: the same with megatron-core training (TP 1, bf16, distributed
  optimizer), the transformers engine sampling from the weights Megatron pushes after every update
  (the stand-in for vLLM here). Both: rollout tokens/s, trained tokens/s, MFU = 6 N_matmul
  FLOPs per trained token over the update time against 790 TFLOP/s (the bf16 matmul rate
  measured on this machine: docs/gpu.md), the first step left out as warm-up.
* ``logprob_gap``: a few supervised steps make the random model's outputs peaked on fixed
  sequences (a near-uniform model agrees with anything); then log-probs and entropy of the
  transformers and Megatron engines on those sequences and on held-out ones, in bf16 and fp32,
  with transformers bf16 vs fp32 as the scale of bf16 noise.
* ``vllm``: skipped without vLLM (the reason is recorded); with it, GRPO steps with
  ``vllm_hf`` and ``vllm_megatron``.

Each phase also reports the distributions its process imported; the summary lists those neither
on the machine's image nor carried as wheels (``not_on_image``), which must stay empty.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check_image import loaded_distributions, not_on_image

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the repo, not benchmarks/, is the import root
    sys.path.insert(0, str(REPO))

SMOKE = bool(os.environ.get("GPU_CHECK_SMOKE"))
PEAK_TFLOPS = 790.0  # bf16 8192^3 matmul through torch on this H200: 769-798 TF/s measured
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", "540"))
MODEL = (dict(architecture="qwen3", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
              head_dim=16, intermediate_size=128, vocab_size=1024, tie_word_embeddings=True)
         if SMOKE else
         dict(architecture="qwen3", hidden_size=1024, num_layers=28, num_heads=16,
              num_kv_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
              tie_word_embeddings=True))
GRPO_SIZES = {"smoke": dict(prompts=4, n=2, max_new_tokens=8, steps=2, micro=4),
              "full": dict(prompts=32, n=8, max_new_tokens=256, steps=4, micro=16)}
GRPO = GRPO_SIZES["smoke" if SMOKE else "full"]
GAP = (dict(sequences=4, prompt_tail=32, sft_steps=20, lr=3e-2, micro=4, entropy=0.5) if SMOKE
       else dict(sequences=64, prompt_tail=0, sft_steps=60, lr=3e-4, micro=16, entropy=0.3))
# (phase, seconds it may take at most); the budget caps the sum
PHASES = [("env", 60), ("gpu_tests", 150), ("build", 90), ("hf_grpo", 150),
          ("megatron_grpo", 180), ("logprob_gap", 150), ("vllm", 240)]
DEPENDS = {"hf_grpo": "build", "megatron_grpo": "build", "logprob_gap": "build", "vllm": "build"}
VLLM_MISSING = ("vllm is not importable here: its 0.32.0 wheel is 326 MB and pins torch 2.13, "
                "while this image has torch 2.11 and takes at most 64 MiB of wheels per call")


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def register_components() -> None:
    """Built-in algorithms and tasks register through entry points when rlbench is installed;
    here the repo may only be on PYTHONPATH, so import them (idempotent when installed)."""
    import algorithms  # noqa: F401
    import tasks  # noqa: F401
    from harness.backends.hf import HFEngine
    from harness.registry import BACKENDS

    class HFReceiver(HFEngine):
        """The transformers engine as a rollout engine with its own weights, pushed by the
        train engine after every update (Megatron's ``export_hf_weights``: TP shards gathered,
        fused layouts split) -- the stand-in for vLLM where vLLM cannot be installed."""

        receives_weights = True

        def __init__(self, model_path: str, backend_cfg: Any, seed: int, **_: Any) -> None:
            super().__init__(model_path, backend_cfg, seed)

        @torch.no_grad()
        def update_weights(self, train_engine: Any) -> None:
            from harness.backends.vllm_engine import hf_weights

            own = dict(self.model.named_parameters())
            seen = set()
            for name, tensor in hf_weights(train_engine):
                own[name].copy_(tensor)
                seen.add(name)
            if set(own) - seen:
                raise RuntimeError(f"weights not pushed: {sorted(set(own) - seen)[:5]}")

    if "hf_receiver" not in BACKENDS:
        BACKENDS.register("hf_receiver", HFReceiver)


# -- phases (each runs in its own process) ---------------------------------------------------------
def phase_env(work: Path) -> dict[str, Any]:
    import transformers

    out: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "transformers": transformers.__version__, "smoke": SMOKE,
                           "device": (torch.cuda.get_device_name() if torch.cuda.is_available()
                                      else "cpu")}
    for mod in ("megatron.core", "omegaconf", "hydra", "vllm"):
        out[mod] = importlib.util.find_spec(mod.split(".")[0]) is not None
    if torch.cuda.is_available():
        out["gpu_memory_gb"] = torch.cuda.get_device_properties(0).total_memory / 2**30
        out["bf16_matmul_tflops"] = matmul_tflops()
    return out


def matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    """This GPU's dense bf16 rate: n^3 matmuls of random data, ``reps`` timed after three
    warm-ups (how the 790 TF/s that MFU is quoted against was measured)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    end.synchronize()
    tflops = 2 * n**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return tflops


def phase_build(work: Path) -> dict[str, Any]:
    from harness.backends.random_model import count_parameters, write_random_model

    t0 = time.perf_counter()
    path = write_random_model(work / "model", dtype=torch.bfloat16, device=device(), **MODEL)
    return {"model": str(path), "seconds": time.perf_counter() - t0, **count_parameters(path)}


def grpo_overrides(backend: str, model: str, out_dir: Path) -> list[str]:
    gpu = torch.cuda.is_available()
    common = [
        "model.source=hf", f"model.path={model}", "model.name=gpu_check",
        "model.task_variant=full", "model.attn_implementation=null", "task=countdown",
        "algorithm=grpo", f"data.prompts_per_step={GRPO['prompts']}", f"rollout.n={GRPO['n']}",
        f"rollout.max_new_tokens={GRPO['max_new_tokens']}", f"trainer.steps={GRPO['steps']}",
        "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.skip_zero_gradient=false",
        f"trainer.micro_batch_size={GRPO['micro']}", "trainer.old_logprobs=recompute",
        "tracking.enabled=false", f"trainer.output_dir={out_dir}", "trainer.status_every=0",
    ]
    if backend == "hf":
        return [*common, "backend=hf", f"backend.device={device()}", "backend.dtype=bfloat16"]
    if backend == "megatron":  # no vLLM here: the transformers engine samples
        meg = ["backend=vllm_megatron", "backend.rollout=hf_receiver"]
        if gpu:
            return [*common, *meg, "backend.dtype=bfloat16"]
        return [*common, *meg, "backend.device=cpu", "backend.dtype=float32",
                "backend.megatron.use_distributed_optimizer=false"]
    return [*common, f"backend={backend}"]  # vllm_hf, vllm_megatron


def grpo_steps(backend: str, work: Path) -> dict[str, Any]:
    from harness.backends.random_model import count_parameters
    from harness.cli import compose_config
    from harness.trainer import Trainer

    register_components()
    model = str(work / "model")
    tr = Trainer(compose_config(grpo_overrides(backend, model, work / f"run_{backend}")))
    tr._t_start = time.perf_counter()
    tr.setup()
    trained = {"tokens": 0.0, "attention_flops": 0.0}
    forward = tr.engine.forward
    # causal attention, forward + backward: 3 x (QK^T + AV) = 6 L d_attn l^2 per row of l tokens
    attn_per_l2 = 6.0 * MODEL["num_layers"] * MODEL["num_heads"] * MODEL["head_dim"]

    def counting_forward(mb: Any, *args: Any, **kwargs: Any) -> Any:  # forward + backward
        if torch.is_grad_enabled():
            lengths = mb["attention_mask"].sum(-1).double()
            trained["tokens"] += float(lengths.sum())
            trained["attention_flops"] += attn_per_l2 * float((lengths**2).sum())
        return forward(mb, *args, **kwargs)

    tr.engine.forward = counting_forward
    steps = []
    for step in range(GRPO["steps"]):
        before = dict(trained)
        sync()
        m = tr.train_step()
        sync()
        m["trained_tokens"] = trained["tokens"] - before["tokens"]
        m["attention_flops"] = trained["attention_flops"] - before["attention_flops"]
        steps.append(m)
        print(f"[gpu_check {backend}] step {step}: gen {m.get('time/gen', 0):.2f}s update "
              f"{m.get('time/update', 0):.2f}s sync {m.get('time/sync', 0):.2f}s", flush=True)
    push = push_check(tr) if tr.separate_engines else None
    timed = steps[1:]  # the first step compiles kernels and warms the allocator
    n_matmul = count_parameters(model)["matmul"]
    gen_s = sum(m["time/gen"] for m in timed)
    update_s = sum(m["time/update"] for m in timed)
    tokens = sum(m["trained_tokens"] for m in timed)
    dense = 6.0 * n_matmul * tokens
    attention = sum(m["attention_flops"] for m in timed)
    return {
        "backend": backend, "steps_timed": len(timed),
        "rollout_tokens_per_s": sum(m["rollout/tokens"] for m in timed) / gen_s,
        "trained_tokens_per_s": tokens / update_s,
        "update_s_per_step": update_s / len(timed),
        "old_logprob_s_per_step": sum(m.get("time/old_logprob", 0.0) for m in timed) / len(timed),
        "sync_s_per_step": sum(m.get("time/sync", 0.0) for m in timed) / len(timed),
        "step_s": sum(m["time/step"] for m in timed) / len(timed),
        "mfu": dense / update_s / (PEAK_TFLOPS * 1e12),
        "mfu_with_attention": (dense + attention) / update_s / (PEAK_TFLOPS * 1e12),
        "attention_flops_share": attention / (dense + attention),
        "peak_tflops": PEAK_TFLOPS, "n_matmul": n_matmul,
        "grad_norm": [m.get("actor/grad_norm") for m in steps], "push_check": push,
        "logprob_abs_diff_mean": [m.get("rollout_corr/logprob_abs_diff_mean") for m in steps],
        "peak_gpu_mem_gb": (torch.cuda.max_memory_allocated() / 2**30
                            if torch.cuda.is_available() else 0.0),
    }


@torch.no_grad()
def push_check(tr: Any) -> dict[str, float]:
    """Does the sampling engine get the train engine's weights? (Random-model GRPO steps may
    have all-zero advantages, so the steps above need not move the weights.) One supervised
    step, then the trainer's push: the sampler's weights must move, and equal the export."""
    sampler, engine = tr.rollout_engine, tr.engine
    before = {k: v.detach().float().clone() for k, v in sampler.model.named_parameters()}
    batch = next(gap_batches(engine.pad_token_id)[0].split(GRPO["micro"]))
    mask = batch["response_mask"].to(engine.device)
    with torch.enable_grad():
        engine.train_mode(True)
        logp, _ = engine.forward(batch, 1.0, with_entropy=False)
        engine.backward(-(logp * mask).sum() / mask.sum())
        engine.optimizer_step()
        engine.train_mode(False)
    sampler.update_weights(engine)
    exported = dict(engine.export_hf_weights())
    own = dict(sampler.model.named_parameters())
    return {"moved": max(float((own[k].float() - before[k]).abs().max()) for k in own),
            "vs_export": max(float((own[k].float() - v.float().to(own[k].device)).abs().max())
                             for k, v in exported.items())}


def gap_batches(pad_id: int) -> tuple[Any, Any]:
    """Countdown prompts, each followed by a fixed answer built from its numbers (the
    "response": what the model is trained on, or only scored on). ``trained`` gets memorised,
    so its log-probs are peaked; ``held_out`` shares the format but not the numbers."""
    from harness.batch import RolloutBatch
    from harness.cli import compose_config
    from harness.models.tiny import build_char_tokenizer
    from harness.registry import TASKS
    from harness.typed_config import build
    from harness.types import Trajectory

    register_components()
    task = build(TASKS, compose_config(["task=countdown", "model.task_variant=full"]).task,
                 "task")
    tok, n = build_char_tokenizer(), GAP["sequences"]
    trajs = []
    for i, ex in enumerate(task.train_examples()[: 2 * n]):
        a, b, c = ex.answer["numbers"][:3]
        answer = f"{a} + {b} - {c}</think> <answer> {a} + {b} - {c} </answer>"
        response = tok.encode(answer, add_special_tokens=False)
        prompt = tok.encode(ex.prompt, add_special_tokens=False)[-GAP["prompt_tail"]:]
        trajs.append(Trajectory(prompt_ids=prompt, response_ids=response,
                                logprobs=torch.zeros(len(response)), group_id=i))
    return (RolloutBatch.from_trajectories(trajs[:n], pad_id),
            RolloutBatch.from_trajectories(trajs[n:], pad_id))


def phase_logprob_gap(work: Path) -> dict[str, Any]:
    from harness.backends.hf import HFEngine
    from harness.backends.megatron_engine import MegatronEngine
    from harness.cli import compose_config
    from harness.models.tiny import save_tokenizer

    dev, micro = device(), GAP["micro"]
    cfg = compose_config(["backend=hf", f"backend.device={dev}", "backend.dtype=bfloat16",
                          f"trainer.optim.lr={GAP['lr']}"])
    sft = HFEngine(str(work / "model"), cfg.backend, 0, cfg.trainer.optim,
                   total_steps=GAP["sft_steps"])
    trained, held_out = gap_batches(sft.pad_token_id)
    mask = trained["response_mask"].to(sft.device)
    history: list[float] = []
    for _ in range(GAP["sft_steps"]):  # supervised: -mean log p(response), until peaked
        if history and history[-1] < GAP["entropy"]:
            break
        sft.train_mode(True)
        for mb in trained.split(micro):
            m = mb["response_mask"].to(sft.device)
            logp, _ = sft.forward(mb, 1.0, with_entropy=False)
            sft.backward(-(logp * m).sum() / mask.sum())
        sft.optimizer_step()
        sft.train_mode(False)
        with torch.no_grad():
            _, ent = sft.forward(trained, 1.0)
        history.append(float((ent * mask).sum() / mask.sum()))
        print(f"[gpu_check sft] entropy {history[-1]:.3f}", flush=True)
    peaked = work / "peaked"
    sft.model.save_pretrained(peaked)
    save_tokenizer(sft.tokenizer, peaked)
    del sft
    torch.cuda.empty_cache() if torch.cuda.is_available() else None

    def hf(dtype: str) -> HFEngine:
        c = compose_config(["backend=hf", f"backend.device={dev}", f"backend.dtype={dtype}"])
        return HFEngine(str(peaked), c.backend, 0)

    def megatron(dtype: str) -> MegatronEngine:
        extra = ([] if dev == "cuda" else
                 ["backend.device=cpu", "backend.megatron.use_distributed_optimizer=false"])
        c = compose_config(["backend=vllm_megatron", f"backend.dtype={dtype}", *extra])
        return MegatronEngine(str(peaked), c.backend, 0)

    def scores(engine: Any, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            parts = [engine.forward(mb, 1.0) for mb in batch.split(micro)]
        return (torch.cat([p[0].float().cpu() for p in parts]),
                torch.cat([p[1].float().cpu() for p in parts]))

    engines: dict[str, Any] = {"hf_fp32": hf("float32"), "hf_bf16": hf("bfloat16"),
                               "megatron_fp32": megatron("float32")}
    skipped = {}
    if dev == "cuda":
        engines["megatron_bf16"] = megatron("bfloat16")
    else:
        skipped["megatron_bf16"] = "megatron-core's bf16 needs CUDA"
    out: dict[str, Any] = {"sft_entropy": history, "skipped": skipped}
    for set_name, batch in (("trained", trained), ("held_out", held_out)):
        m = batch["response_mask"]
        got = {name: scores(e, batch) for name, e in engines.items()}
        out[f"{set_name}_entropy_mean"] = float((got["hf_fp32"][1] * m).sum() / m.sum())
        for a, b in (("megatron_bf16", "hf_bf16"), ("megatron_fp32", "hf_fp32"),
                     ("hf_bf16", "hf_fp32"), ("megatron_bf16", "hf_fp32")):
            if a in got and b in got:
                d = (got[a][0] - got[b][0]).abs() * m
                out[f"{set_name}/{a}_vs_{b}"] = {"mean": float(d.sum() / m.sum()),
                                                 "max": float(d.max())}
    return out


def phase_vllm(work: Path) -> dict[str, Any]:
    """Where vLLM is installed (``pip install -e '.[gpu]'`` on another machine); never run yet."""
    return {name: grpo_steps(name, work) for name in ("vllm_hf", "vllm_megatron")}


PHASE_FNS = {"env": phase_env, "build": phase_build, "logprob_gap": phase_logprob_gap,
             "hf_grpo": lambda w: grpo_steps("hf", w),
             "megatron_grpo": lambda w: grpo_steps("megatron", w), "vllm": phase_vllm}


# -- the runner ------------------------------------------------------------------------------------
def run_phase(name: str, limit: float, work: Path, log: Any) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    result_file = work / f"{name}.json"
    result_file.unlink(missing_ok=True)
    if name == "gpu_tests":
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rs", "-p", "no:cacheprovider",
               "tests/backends/test_gpu_engines.py"]
    else:
        cmd = [sys.executable, __file__, "phase", name, str(work), str(result_file)]
    log.write(f"\n===== {name} (limit {limit:.0f} s): {' '.join(cmd)}\n")
    log.flush()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=limit)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = None
    entry: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 1), "rc": rc}
    if rc is None:
        entry.update(status="timeout", reason=f"over its {limit:.0f} s limit")
    elif rc != 0:
        entry.update(status="failed", reason=f"exit {rc}; see gpu_check.log")
    else:
        entry["status"] = "ok"
        if result_file.exists():
            entry["result"] = json.loads(result_file.read_text())
            skipped = entry["result"].get("skipped")
            if isinstance(skipped, str):
                entry.update(status="skipped", reason=skipped)
    return entry


def cmd_run(out: Path, work: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    start, summary = time.perf_counter(), {"smoke": SMOKE, "budget_s": BUDGET_S, "phases": {}}
    with open(out / "gpu_check.log", "w") as log:
        for name, limit in PHASES:
            left = BUDGET_S - (time.perf_counter() - start)
            need = DEPENDS.get(name)
            if need and summary["phases"][need]["status"] != "ok":
                entry = {"status": "skipped", "reason": f"{need} did not succeed"}
            elif name == "env":  # cheap: in this process
                entry = {"status": "ok", "result": phase_env(work)}
                entry["result"]["not_on_image"] = not_on_image(loaded_distributions())
            elif name == "vllm" and importlib.util.find_spec("vllm") is None:
                entry = {"status": "skipped", "reason": VLLM_MISSING}
            elif left < 20:
                entry = {"status": "skipped", "reason": f"time budget spent ({BUDGET_S:.0f} s)"}
            else:
                entry = run_phase(name, min(limit, left - 10), work, log)
            summary["phases"][name] = entry
            print(f"[gpu_check] {name}: {entry['status']} {entry.get('seconds', '')}"
                  f" {entry.get('reason', '')}", flush=True)
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
    summary["not_on_image"] = sorted({d for e in summary["phases"].values()
                                      for d in e.get("result", {}).get("not_on_image", [])})
    summary["seconds"] = round(time.perf_counter() - start, 1)
    summary["figures"] = figures(summary["phases"])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["figures"], indent=1))
    bad = [n for n, e in summary["phases"].items()
           if e["status"] in ("failed", "timeout") or
           (e["status"] == "skipped" and n != "vllm")]
    return 1 if bad or summary["not_on_image"] else 0


def figures(phases: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers, pulled out of the phase results."""
    out: dict[str, Any] = {}
    measured = phases.get("env", {}).get("result", {}).get("bf16_matmul_tflops")
    for name in ("hf_grpo", "megatron_grpo"):
        r = phases.get(name, {}).get("result")
        if r:
            out[name] = {k: r[k] for k in ("rollout_tokens_per_s", "trained_tokens_per_s",
                                           "mfu", "mfu_with_attention", "step_s",
                                           "sync_s_per_step")}
            if measured:  # the same FLOPs against the rate measured in this run
                out[name]["mfu_vs_measured"] = r["mfu"] * PEAK_TFLOPS / measured
    gap = phases.get("logprob_gap", {}).get("result")
    if gap:
        out["logprob_gap"] = {k: v for k, v in gap.items() if "/" in k or "entropy_mean" in k}
    tests = phases.get("gpu_tests", {})
    out["gpu_tests"] = tests.get("status")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu_check")))
    p.add_argument("--work", type=Path, default=Path("/tmp/rlbench_gpu_check_work"))
    p = sub.add_parser("phase")
    p.add_argument("name", choices=sorted(PHASE_FNS))
    p.add_argument("work", type=Path)
    p.add_argument("result", type=Path)
    args = parser.parse_args()
    if args.cmd == "run":
        return cmd_run(args.out, args.work)
    result = PHASE_FNS[args.name](args.work)
    result["distributions"] = loaded_distributions()
    result["not_on_image"] = not_on_image(result["distributions"])
    args.result.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
