"""bf16 training in the transformers engine keeps fp32 master weights: AdamW steps fp32 copies
and the bf16 model gets them rounded. Stepped in bf16 directly, an update smaller than half a
bf16 ulp of its weight rounds away (lr 1e-5 against weights ~0.02, whose ulp is ~1.2e-4), so
a run would not train at all; with master weights, small steps add up as they do in fp32."""

from __future__ import annotations

import pytest
import torch

from harness.backends.hf import HFEngine
from harness.cli import compose_config
from tests.megatron_cpu import SHAPES, policy_step, ragged_batch

LR, STEPS = 1e-5, 10


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from harness.backends.random_model import write_random_model

    return str(write_random_model(tmp_path_factory.mktemp("bf16") / "m", seed=0,
                                  **SHAPES["qwen3_untied"]))


def trained(path: str, dtype: str) -> tuple[HFEngine, dict[str, torch.Tensor]]:
    cfg = compose_config(["backend=hf", "backend.device=cpu", f"backend.dtype={dtype}",
                          "backend.threads=1", f"trainer.optim.lr={LR}"])
    engine = HFEngine(path, cfg.backend, 0, cfg.trainer.optim, total_steps=STEPS)
    before = {k: v.detach().float().clone() for k, v in engine.model.named_parameters()}
    for _ in range(STEPS):
        policy_step(engine, ragged_batch(engine.pad_token_id))
    return engine, before


def mean_move(engine: HFEngine, before: dict[str, torch.Tensor]) -> float:
    """Mean |w_after - w_before| over the matrices (norm weights start at 1: ulp 2^-7)."""
    moves = [(p.detach().float() - before[k]).abs().mean()
             for k, p in engine.model.named_parameters() if p.dim() == 2]
    return float(torch.stack(moves).mean())


def test_small_bf16_updates_survive_through_fp32_master_weights(model_path: str) -> None:
    fp32, fp32_before = trained(model_path, "float32")
    bf16, bf16_before = trained(model_path, "bfloat16")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    moved_fp32, moved_bf16 = mean_move(fp32, fp32_before), mean_move(bf16, bf16_before)
    assert moved_fp32 > 0.5 * STEPS * LR  # Adam moves each weight ~lr per step
    # the bf16 model moved about as far as the fp32 one (not ~0: nothing rounded away)
    assert 0.7 * moved_fp32 < moved_bf16 < 1.3 * moved_fp32
    # and the masters hold the unrounded fp32 weights that the bf16 model rounds
    for p, m in zip(bf16.model.parameters(), bf16.masters):
        assert m.dtype == torch.float32 and torch.equal(p.detach(), m.to(torch.bfloat16))


def test_fp32_training_keeps_no_master_copy(model_path: str) -> None:
    cfg = compose_config(["backend=hf", "backend.device=cpu", "backend.threads=1"])
    engine = HFEngine(model_path, cfg.backend, 0, cfg.trainer.optim)
    assert engine.masters is None
    params = list(engine.model.parameters())
    assert [p for g in engine.optimizer.param_groups for p in g["params"]] == params


def test_bf16_checkpoints_keep_the_fp32_masters(model_path: str, tmp_path) -> None:
    engine, _ = trained(model_path, "bfloat16")
    engine.save(tmp_path / "ckpt")
    cfg = compose_config(["backend=hf", "backend.device=cpu", "backend.dtype=bfloat16",
                          "backend.threads=1", f"trainer.optim.lr={LR}"])
    resumed = HFEngine(model_path, cfg.backend, 0, cfg.trainer.optim, total_steps=STEPS)
    resumed.load(tmp_path / "ckpt")
    for a, b in zip(engine.masters, resumed.masters):
        assert torch.equal(a, b)
