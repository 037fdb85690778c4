"""Import guards and refusals of the GPU backends on a machine without CUDA: importing the
harness (and even looking the GPU engines up) imports neither vLLM nor megatron-core, and
choosing them fails at config validation with a message that says to use backend=hf -- except
Megatron training in its CPU mode (``backend.device=cpu``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.cli import compose_config
from harness.config import validate_config
from harness.typed_config import ConfigError

PROBE = """
import sys
import harness, harness.cli, harness.trainer, harness.config, harness.backends
from harness.registry import BACKENDS
BACKENDS.get("vllm"); BACKENDS.get("megatron")
print(sorted(m for m in sys.modules if m == "vllm" or m.startswith(("vllm.", "megatron"))))
"""


@pytest.mark.slow
def test_importing_the_harness_imports_neither_vllm_nor_megatron() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
@pytest.mark.parametrize("backend", ["vllm_megatron", "vllm_hf"])
def test_gpu_backends_without_cuda_fail_naming_backend_hf(backend: str) -> None:
    cfg = compose_config([f"backend={backend}"])
    with pytest.raises(ConfigError, match="use backend=hf"):
        validate_config(cfg)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_megatron_training_passes_validation_in_its_cpu_mode_and_vllm_does_not() -> None:
    cpu = ["backend=vllm_megatron", "backend.device=cpu", "backend.dtype=float32"]
    validate_config(compose_config([*cpu, "backend.rollout=hf"]))  # megatron's CPU mode
    with pytest.raises(ConfigError, match=r"backend.rollout='vllm' needs a CUDA GPU"):
        validate_config(compose_config(cpu))  # vLLM has no CPU mode
    with pytest.raises(ConfigError, match=r"backend.train='megatron' needs a CUDA GPU"):
        validate_config(compose_config(["backend=vllm_megatron", "backend.rollout=hf"]))


def test_rollout_correction_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"rollout_correction\.mode"):
        validate_config(compose_config(["trainer.rollout_correction.mode=tis"]))
    with pytest.raises(ConfigError, match=r"rollout_correction\.cap"):
        validate_config(compose_config(["trainer.rollout_correction.mode=token_truncate",
                                        "trainer.rollout_correction.cap=0"]))
    validate_config(compose_config(["trainer.rollout_correction.mode=sequence_mask"]))


def test_every_gpu_model_config_composes_without_downloading() -> None:
    names = ["qwen3_1p7b_base", "qwen3_4b_base", "qwen3_8b_base", "qwen3_14b_base",
             "qwen2p5_vl_3b_instruct", "llama3p1_8b_instruct", "deepseek_r1_distill_qwen_1p5b",
             "mistral_7b_instruct"]
    for name in names:
        cfg = compose_config([f"model={name}"])
        assert cfg.model.name == name and cfg.model.source == "hf"
        assert "/" in cfg.model.path and cfg.model.task_variant == "full"
