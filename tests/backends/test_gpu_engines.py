"""The GPU engines on a small random Qwen3 checkpoint (marked ``gpu``; skipped without CUDA,
the vLLM test also without vllm). Megatron's full forward vs the transformers model, one
optimizer step and the weight export, and vLLM's sampled log-probs vs the trainer's on the
same tokens. ``benchmarks/gpu_check.sh`` runs these first."""

from __future__ import annotations

import pytest
import torch

from harness.backends.random_model import write_random_model
from harness.batch import RolloutBatch
from harness.cli import compose_config
from harness.types import SamplingParams, Trajectory

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def random_qwen3(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_random_model(tmp_path_factory.mktemp("rand") / "qwen3", hidden_size=256,
                                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                                  intermediate_size=512))


def test_random_model_writes_a_loadable_qwen3_checkpoint(random_qwen3: str) -> None:
    from transformers import AutoConfig

    from harness.backends.convert import arch_from_hf_config

    spec = arch_from_hf_config(AutoConfig.from_pretrained(random_qwen3))
    assert spec.qk_norm and spec.head_dim == 32 != 256 // 4


def random_batch(pad_id: int, rows: int = 4, seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(rows):
        p, r = 5 + i, 12 - i  # ragged prompts and responses
        trajs.append(Trajectory(prompt_ids=torch.randint(5, 99, (p,), generator=g).tolist(),
                                response_ids=torch.randint(5, 99, (r,), generator=g).tolist(),
                                logprobs=torch.zeros(r), group_id=i // 2))
    return RolloutBatch.from_trajectories(trajs, pad_id)


@pytest.fixture(scope="module")
def engines(random_qwen3: str):
    from harness.backends.hf import HFEngine
    from harness.backends.megatron_engine import MegatronEngine

    cfg = compose_config(["backend=vllm_megatron"])
    meg = MegatronEngine(random_qwen3, cfg.backend, 0, cfg.trainer.optim, total_steps=4)
    hf_cfg = compose_config(["backend=hf", "backend.device=cuda"]).backend
    hf = HFEngine(random_qwen3, hf_cfg, 0)
    return cfg, meg, hf


def _masked_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    d = (a.float().cpu() - b.float().cpu()).abs() * mask
    return float(d.sum() / mask.sum()), float(d.max())


@pytest.mark.gpu
@needs_cuda
def test_megatron_forward_matches_hf(engines) -> None:
    _, meg, hf = engines
    batch = random_batch(hf.pad_token_id)
    mask = batch["response_mask"]
    mean, worst = _masked_diff(meg.logprobs(batch, 0.8, 0), hf.logprobs(batch, 0.8, 0), mask)
    assert mean < 0.05 and worst < 0.5, (mean, worst)  # bf16 Megatron vs fp32 transformers
    _, ent_m = meg.forward(batch, 0.8)
    _, ent_h = hf.forward(batch, 0.8)
    assert _masked_diff(ent_m.detach(), ent_h.detach(), mask)[0] < 0.05


@pytest.mark.gpu
@needs_cuda
def test_megatron_step_then_export_reproduces_its_logprobs_in_hf(engines) -> None:
    from transformers import AutoModelForCausalLM

    _, meg, hf = engines
    batch = random_batch(hf.pad_token_id, seed=1)
    mask = batch["response_mask"].cuda()
    meg.train_mode(True)
    logp, _ = meg.forward(batch, 1.0, with_entropy=False)
    meg.backward(-(logp * mask).sum() / mask.sum())
    grad_norm = meg.optimizer_step()
    meg.train_mode(False)
    assert grad_norm > 0 and grad_norm == grad_norm
    exported = dict(meg.export_hf_weights())
    model = AutoModelForCausalLM.from_pretrained(hf.model_path, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(
        {k: v.float().cpu() for k, v in exported.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.model.load_state_dict(model.state_dict())
    mean, _ = _masked_diff(meg.logprobs(batch, 1.0, 0), hf.logprobs(batch, 1.0, 0), mask.cpu())
    assert mean < 0.05


@pytest.mark.gpu
@needs_cuda
def test_vllm_logprobs_agree_with_the_trainer(engines, random_qwen3: str) -> None:
    pytest.importorskip("vllm", reason="vllm not installed (pip install -e '.[gpu]')")
    from harness.backends.vllm_engine import VLLMEngine

    cfg, meg, hf = engines
    vllm_engine = VLLMEngine(random_qwen3, cfg.backend, 0)
    vllm_engine.update_weights(meg)
    prompts = [random_batch(hf.pad_token_id, rows=1, seed=s).trajectories[0].prompt_ids
               for s in range(4)]
    trajs = vllm_engine.generate(prompts, SamplingParams(n=4, temperature=1.0,
                                                         max_new_tokens=24))
    assert len(trajs) == 16 and all(len(t.response_ids) > 0 for t in trajs)
    batch = RolloutBatch.from_trajectories(trajs, hf.pad_token_id)
    mean, worst = _masked_diff(meg.logprobs(batch, 1.0, 0), batch["rollout_logprobs"],
                               batch["response_mask"])
    assert mean < 0.05, (mean, worst)
    vllm_engine.sleep()
    vllm_engine.update_weights(meg)  # wake from level 2 with the trainer's weights
    assert len(vllm_engine.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=8))) == 2
