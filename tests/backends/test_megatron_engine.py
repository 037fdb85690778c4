"""CPU-checkable pieces of the megatron train engine: the attention mask it builds for a
left-padded RL batch, and the CUDA guard (no GPU and no ``backend.device=cpu``: a clear error
naming backend=hf and the CPU mode, raised before megatron-core is imported). The engine itself
runs on CPU in tests/backends/test_megatron_cpu.py."""

from __future__ import annotations

import sys

import pytest
import torch

from harness.backends.megatron_engine import causal_padding_mask


def test_mask_is_causal_and_hides_left_padding() -> None:
    attn = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    masked = causal_padding_mask(attn)
    assert masked.shape == (2, 1, 5, 5) and masked.dtype == torch.bool
    allowed = ~masked[:, 0]
    # row 0: query 4 sees keys 2..4 only (0, 1 are padding), never the future
    assert allowed[0, 4].tolist() == [False, False, True, True, True]
    assert allowed[0, 2].tolist() == [False, False, True, False, False]
    # row 1: right padding is simply in the future of every real token
    assert allowed[1, 3].tolist() == [True, True, True, True, False]
    # a padding query keeps its diagonal, so no softmax row is all -inf
    assert bool(allowed[0, 0, 0]) and allowed.any(-1).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_choosing_megatron_without_cuda_says_use_backend_hf_or_the_cpu_mode() -> None:
    from harness.backends.megatron_engine import MegatronEngine
    from harness.cli import compose_config

    backend = compose_config(["backend=vllm_megatron"]).backend  # device: cuda
    with pytest.raises(RuntimeError, match=r"backend=hf.*backend.device=cpu"):
        MegatronEngine("unused", backend_cfg=backend, seed=0)
    assert "vllm" not in sys.modules
