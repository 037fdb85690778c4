"""The Megatron train engine on CPU (``backend.device=cpu``: megatron-core 0.16.1 over gloo in
fp32) against the transformers engine, on small random Qwen3 (untied, qk norm) and Qwen2 (tied,
qkv bias) checkpoints: log-probs and entropy on a ragged left-padded batch, the HF -> Megatron
-> HF weight round trip, two clipped AdamW steps, and all of it again at tensor parallel 2 in
two processes. Every comparison is within 1e-5. The CPU mode's refusals are checked too."""

from __future__ import annotations

import pytest
import torch

from harness.cli import compose_config
from tests.megatron_cpu import (
    CPU_HF,
    CPU_MEGATRON,
    SHAPES,
    TOL,
    masked_max,
    optim_overrides,
    ragged_batch,
    two_steps,
    write_model,
)

pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install .[dev])")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="megatron's CPU mode is for machines without a GPU "
                                       "(test_gpu_engines covers the GPU)")
MODELS = sorted(SHAPES)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("megatron_cpu")
    return {name: write_model(root, name) for name in MODELS}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """A gloo world of one (file rendezvous: no port to collide on under pytest -n 2)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    created = not dist.is_initialized()
    if created:
        rdv = tmp_path_factory.mktemp("dist") / "rendezvous"
        dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if created:
        dist.destroy_process_group()


def engines(path: str, optim: bool = False):
    from harness.backends.hf import HFEngine
    from harness.backends.megatron_engine import MegatronEngine

    extra = optim_overrides() if optim else []
    mcfg, hcfg = compose_config([*CPU_MEGATRON, *extra]), compose_config([*CPU_HF, *extra])
    meg = MegatronEngine(path, mcfg.backend, 0, mcfg.trainer.optim if optim else None,
                         total_steps=4)
    hf = HFEngine(path, hcfg.backend, 0, hcfg.trainer.optim if optim else None, total_steps=4)
    return meg, hf


def hf_state(hf) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in hf.model.state_dict().items()}


def max_weight_diff(exported: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
                    tied: bool) -> float:
    # a tied model exports no lm_head (transformers re-ties it to the embedding)
    expected = set(reference) - ({"lm_head.weight"} if tied else set())
    assert set(exported) == expected, set(exported) ^ expected
    return max(float((exported[k].float() - reference[k].float()).abs().max())
               for k in exported)


@pytest.mark.parametrize("name", MODELS)
def test_megatron_logprobs_and_entropy_match_the_hf_engine_on_a_ragged_batch(
        world, models: dict[str, str], name: str) -> None:
    meg, hf = engines(models[name])
    batch = ragged_batch(hf.pad_token_id)
    mask = batch["response_mask"]
    logp_m, ent_m = meg.forward(batch, 0.7)
    logp_h, ent_h = hf.forward(batch, 0.7)
    assert masked_max(logp_m, logp_h, mask) < TOL
    assert masked_max(ent_m, ent_h, mask) < TOL
    # the no-grad path the trainer uses, in micro-batches of 3 (a ragged last one)
    assert masked_max(meg.logprobs(batch, 1.3, 3), hf.logprobs(batch, 1.3, 3), mask) < TOL
    assert float(ent_h[mask.bool()].min()) > 0.1  # not a degenerate (peaked) comparison


@pytest.mark.parametrize("name", MODELS)
def test_hf_to_megatron_to_hf_export_returns_the_checkpoint_weights(
        world, models: dict[str, str], name: str) -> None:
    meg, hf = engines(models[name])
    exported = dict(meg.export_hf_weights())
    assert max_weight_diff(exported, hf_state(hf), SHAPES[name]["tie_word_embeddings"]) == 0.0


@pytest.mark.parametrize("name", MODELS)
def test_two_clipped_megatron_adamw_steps_match_the_hf_engines(
        world, models: dict[str, str], name: str) -> None:
    from transformers import AutoModelForCausalLM

    meg, hf = engines(models[name], optim=True)
    batch = ragged_batch(hf.pad_token_id)
    mask = batch["response_mask"]
    before = hf.logprobs(batch, 1.0, 4)
    norms_m, norms_h = two_steps(meg, meg.pad_token_id), two_steps(hf, hf.pad_token_id)
    assert norms_m == pytest.approx(norms_h, rel=1e-5)
    assert min(norms_h) > 0.5  # every step was clipped (grad_clip=0.5)
    after_m, after_h = meg.logprobs(batch, 1.0, 4), hf.logprobs(batch, 1.0, 4)
    assert masked_max(after_h, before, mask) > 100 * TOL  # the steps did move the policy
    assert masked_max(after_m, after_h, mask) < TOL
    exported = dict(meg.export_hf_weights())
    tied = SHAPES[name]["tie_word_embeddings"]
    assert max_weight_diff(exported, hf_state(hf), tied) < TOL
    # the exported weights reproduce Megatron's log-probs in plain transformers
    model = AutoModelForCausalLM.from_pretrained(models[name], dtype=torch.float32)
    missing, unexpected = model.load_state_dict(exported, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.model.load_state_dict(model.state_dict())
    assert masked_max(hf.logprobs(batch, 1.0, 4), after_m, mask) < TOL


@pytest.fixture(scope="module")
def tp2_results(models: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """Both models through one two-process gloo world at TP=2 (one spawn: imports dominate;
    ~9 s on a 2-core machine, hence the slow mark of its test)."""
    import torch.multiprocessing as mp

    from tests.megatron_cpu import tp_worker

    root = tmp_path_factory.mktemp("tp2")
    jobs = [(models[name], str(root / f"{name}.pt")) for name in MODELS]
    mp.spawn(tp_worker, args=(2, str(root / "rendezvous"), jobs), nprocs=2, join=True)
    return {name: torch.load(out, weights_only=False) for name, (_, out) in zip(MODELS, jobs)}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_tensor_parallel_2_over_two_processes_matches_the_hf_engine(
        tp2_results, models: dict[str, str], name: str) -> None:
    from harness.backends.hf import HFEngine

    got = tp2_results[name]
    hcfg = compose_config([*CPU_HF, *optim_overrides()])
    hf = HFEngine(models[name], hcfg.backend, 0, hcfg.trainer.optim, total_steps=4)
    batch = ragged_batch(hf.pad_token_id)
    mask = batch["response_mask"]
    logp, entropy = hf.forward(batch, 0.7)
    assert masked_max(got["logp"], logp, mask) < TOL
    assert masked_max(got["entropy"], entropy, mask) < TOL
    tied = SHAPES[name]["tie_word_embeddings"]
    assert max_weight_diff(got["exported"], hf_state(hf), tied) == 0.0  # shards merge exactly
    assert got["grad_norms"] == pytest.approx(two_steps(hf, hf.pad_token_id), rel=1e-5)
    assert masked_max(got["logp_after"], hf.logprobs(batch, 1.0, 4), mask) < TOL
    assert max_weight_diff(got["exported_after"], hf_state(hf), tied) < TOL


def test_cpu_mode_refuses_bf16_and_the_distributed_optimizer(models: dict[str, str]) -> None:
    from harness.backends.megatron_engine import MegatronEngine
    from harness.typed_config import ConfigError

    path = models[MODELS[0]]
    bf16 = compose_config([*CPU_MEGATRON, "backend.dtype=bfloat16"]).backend
    with pytest.raises(ConfigError, match=r"backend.dtype=bfloat16 .*backend.dtype=float32"):
        MegatronEngine(path, bf16, 0)
    dist_opt = compose_config([*CPU_MEGATRON,
                               "backend.megatron.use_distributed_optimizer=true"]).backend
    with pytest.raises(ConfigError, match="use_distributed_optimizer=true"):
        MegatronEngine(path, dist_opt, 0)
