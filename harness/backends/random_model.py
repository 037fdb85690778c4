"""A randomly initialised Qwen-architecture checkpoint on disk, for GPU checks without a download.

Saved in Hugging Face format with rlbench's character tokenizer (so ``from_pretrained``, vLLM
and the Megatron converter load it like any real checkpoint); its size is chosen by the caller:
small for unit tests, a few hundred million parameters for throughput and MFU figures. The
vocabulary may be larger than the tokenizer (``vocab_size``: e.g. Qwen's 151936, so that the
embedding, the output layer and the softmax cost what they cost in the real model); ids past
the tokenizer decode to nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def write_random_model(path: str | Path, *, architecture: str = "qwen3", hidden_size: int = 256,
                       num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                       head_dim: int | None = None, intermediate_size: int = 512,
                       tie_word_embeddings: bool = False, max_position_embeddings: int = 4096,
                       vocab_size: int | None = None, dtype: torch.dtype = torch.float32,
                       device: str = "cpu", seed: int = 0) -> Path:
    """Write the model (initialised on ``device``, saved in ``dtype``) and the tokenizer to
    ``path``; returns it."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    from harness.models.tiny import build_char_tokenizer, save_tokenizer

    tokenizer = build_char_tokenizer()
    common: dict[str, Any] = dict(
        vocab_size=vocab_size or len(tokenizer), hidden_size=hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    if architecture == "qwen3":
        config = Qwen3Config(**common, head_dim=head_dim or hidden_size // num_heads)
    elif architecture == "qwen2":
        config = Qwen2Config(**common)
    else:
        raise ValueError(f"architecture={architecture!r}: qwen2 | qwen3")
    if config.vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size={config.vocab_size} < the tokenizer's {len(tokenizer)}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to(dtype)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path


def count_parameters(path: str | Path) -> dict[str, int]:
    """Parameter counts of a saved model: ``total``, ``non_embedding`` (without the input
    embedding and an untied output layer) and ``matmul`` (the weights every token multiplies:
    non-embedding plus the output layer, tied or not -- what 6 N FLOPs per token counts)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    head = 0 if model.config.tie_word_embeddings else model.get_output_embeddings().weight.numel()
    return {"total": total, "non_embedding": total - embed - head,
            "matmul": total - embed - head + embed}
