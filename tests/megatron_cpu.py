"""Helpers for the Megatron-on-CPU tests (not a test module): small random checkpoints, the
config of megatron's CPU mode, a world of one for in-process tests, and the worker of the
two-process tensor-parallel test (spawned, so it lives in an importable module)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from harness.batch import RolloutBatch
from harness.types import Trajectory

# ``backend.device=cpu`` runs megatron-core in fp32 with the non-distributed optimizer
CPU_MEGATRON = ["backend=vllm_megatron", "backend.device=cpu", "backend.dtype=float32",
                "backend.megatron.use_distributed_optimizer=false", "backend.threads=1"]
CPU_HF = ["backend=hf", "backend.device=cpu", "backend.dtype=float32", "backend.threads=1"]
# Qwen3: qk norm, head_dim 16 != hidden / heads, untied; Qwen2: qkv bias, tied embeddings
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3_untied": dict(architecture="qwen3", hidden_size=48, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, intermediate_size=96,
                         tie_word_embeddings=False),
    "qwen2_tied": dict(architecture="qwen2", hidden_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, intermediate_size=96, tie_word_embeddings=True),
}
TOL = 1e-5


def write_model(root: Path, name: str, seed: int = 0) -> str:
    from harness.backends.random_model import write_random_model

    return str(write_random_model(root / name, seed=seed, max_position_embeddings=256,
                                  **SHAPES[name]))


def ragged_batch(pad_id: int, rows: int = 4, seed: int = 0) -> RolloutBatch:
    """Left-padded prompts and right-padded responses of different lengths."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(rows):
        p, r = 3 + 2 * i, 9 - 2 * i
        trajs.append(Trajectory(prompt_ids=torch.randint(5, 90, (p,), generator=g).tolist(),
                                response_ids=torch.randint(5, 90, (r,), generator=g).tolist(),
                                logprobs=torch.zeros(r), group_id=i // 2))
    return RolloutBatch.from_trajectories(trajs, pad_id)


def masked_max(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a.detach().float().cpu() - b.detach().float().cpu()).abs() * mask).max())


def policy_step(engine: Any, batch: RolloutBatch) -> float:
    """One optimizer step on -mean log pi(response) (a stand-in policy-gradient loss)."""
    mask = batch["response_mask"].to(engine.device)
    engine.train_mode(True)
    logp, _ = engine.forward(batch, 1.0, with_entropy=False)
    engine.backward(-(logp * mask).sum() / mask.sum())
    norm = engine.optimizer_step()
    engine.train_mode(False)
    return norm


def optim_overrides() -> list[str]:
    """An lr at which two steps move log-probs far past the tolerance, and a clip norm below
    every gradient norm, so clipping is part of what is compared (Adam's first step is blind to
    a rescaled gradient; the second is not, when the two steps are clipped differently)."""
    return ["trainer.optim.lr=1e-3", "trainer.optim.grad_clip=0.5"]


def two_steps(engine: Any, pad_id: int) -> list[float]:
    return [policy_step(engine, ragged_batch(pad_id, seed=s)) for s in (1, 2)]


def tp_worker(rank: int, tp: int, rdv: str, jobs: list[tuple[str, str]]) -> None:
    """One rank of a TP run, for each (model path, output file) of ``jobs`` in turn (one spawn
    serves several models: the imports are most of a worker's time). Per model: log-probs and
    entropy of the ragged batch, the exported HF weights, two training steps, then the log-probs
    and exported weights after them; rank 0 saves them."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from harness.backends.megatron_engine import MegatronEngine
    from harness.cli import compose_config

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(tp))
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=tp)
    cfg = compose_config([*CPU_MEGATRON, f"backend.megatron.tensor_parallel_size={tp}",
                          *optim_overrides()])
    try:
        for model_path, out in jobs:
            parallel_state.initialize_model_parallel(tp, 1)
            engine = MegatronEngine(model_path, cfg.backend, 0, cfg.trainer.optim, total_steps=4)
            assert engine.tp == tp and engine.vocab_padded % tp == 0
            batch = ragged_batch(engine.pad_token_id)
            logp, entropy = engine.forward(batch, 0.7)
            exported = {k: v.clone() for k, v in engine.export_hf_weights()}
            grad_norms = two_steps(engine, engine.pad_token_id)
            after = engine.logprobs(batch, 1.0, 2)
            exported_after = dict(engine.export_hf_weights())
            if rank == 0:
                torch.save({"logp": logp.detach(), "entropy": entropy, "exported": exported,
                            "grad_norms": grad_norms, "logp_after": after,
                            "exported_after": exported_after}, out)
            dist.barrier()
            parallel_state.destroy_model_parallel()
    finally:
        dist.destroy_process_group()
