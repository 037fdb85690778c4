"""Hugging Face config -> megatron-core ``TransformerConfig`` / ``GPTModel`` arguments.

The mapping is a plain dict built from the transformers config (no megatron import), so it is
unit-tested on any machine; :func:`build_transformer_config` and :func:`layer_spec` import
megatron-core only when called. Every field whose megatron default differs from what a Qwen2 /
Qwen3 / Llama / Mistral checkpoint means is set explicitly (megatron's defaults are GPT-2's:
LayerNorm, biases on every linear, GeLU, dropout 0.1, kv_channels = hidden / heads), because a
silently wrong one still trains -- just a different model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from harness.backends.convert import arch_from_hf_config, padded_vocab_size

# megatron's built-in Llama-3 rope scaling hard-codes these (rotary_pos_embedding._apply_scaling)
_MCORE_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """transformers 5 keeps rope settings in ``rope_parameters`` (there is no ``rope_theta``
    attribute any more); older configs have ``rope_theta`` / ``rope_scaling``."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    legacy = getattr(hf_config, "rope_scaling", None)
    if legacy and "rope_type" not in params:
        params.update(legacy)
    params.setdefault("rope_type", "default")
    return params


def transformer_config_kwargs(
    hf_config: Any, *, tp: int = 1, pp: int = 1, dtype: torch.dtype = torch.bfloat16,
    sequence_parallel: bool = False, recompute_granularity: str | None = None,
    cpu_init: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of ``TransformerConfig`` for a dense HF decoder."""
    spec = arch_from_hf_config(hf_config)
    if spec.num_heads % tp:
        raise ValueError(f"num_attention_heads={spec.num_heads} is not divisible by TP={tp}")
    if spec.num_layers % pp:
        raise ValueError(f"num_hidden_layers={spec.num_layers} is not divisible by PP={pp}")
    half = dtype in (torch.bfloat16, torch.float16)
    kwargs: dict[str, Any] = {
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_heads,
        "num_query_groups": spec.num_kv_heads,
        "kv_channels": spec.head_dim,  # Qwen3: 128 whatever hidden / heads is
        "ffn_hidden_size": hf_config.intermediate_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf_config.rms_norm_eps,
        "add_bias_linear": False,
        "add_qkv_bias": spec.qkv_bias,
        "qk_layernorm": spec.qk_norm,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "rotary_interleaved": False,  # HF's rotate_half
        "apply_rope_fusion": False,
        "masked_softmax_fusion": False,
        "bias_dropout_fusion": False,
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "sequence_parallel": sequence_parallel and tp > 1,
        "variable_seq_lengths": True,  # every RL batch has its own padded width
        # dense models have no MoE, but the default dispatcher rejects variable_seq_lengths
        "moe_token_dispatcher_type": "alltoall",
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        "params_dtype": dtype,
        "pipeline_dtype": dtype if half else torch.float32,
        "use_cpu_initialization": cpu_init,
        "calculate_per_token_loss": False,
    }
    if recompute_granularity:
        kwargs["recompute_granularity"] = recompute_granularity
        if recompute_granularity == "full":
            kwargs["recompute_method"] = "uniform"
            kwargs["recompute_num_layers"] = 1
    return kwargs


def gpt_model_kwargs(hf_config: Any, tp: int = 1) -> dict[str, Any]:
    """Keyword arguments of ``GPTModel`` besides ``config`` and ``transformer_layer_spec``."""
    spec = arch_from_hf_config(hf_config)
    rope = rope_parameters(hf_config)
    kwargs: dict[str, Any] = {
        "vocab_size": padded_vocab_size(spec.vocab_size, tp),
        "max_sequence_length": hf_config.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": int(rope["rope_theta"]),
        "rotary_percent": 1.0,
        "share_embeddings_and_output_weights": spec.tie_embeddings,
        "parallel_output": True,  # logits stay vocab-sharded; log-probs are vocab-parallel
    }
    kind = rope["rope_type"]
    if kind == "llama3":
        for key, value in _MCORE_LLAMA3_ROPE.items():
            if float(rope.get(key, value)) != value:
                raise ValueError(f"llama3 rope {key}={rope[key]} differs from megatron-core's "
                                 f"hard-coded {value}; use backend=hf for this model")
        kwargs["rope_scaling"] = True
        kwargs["rope_scaling_factor"] = float(rope["factor"])
    elif kind != "default":
        raise ValueError(f"rope_type={kind!r} is not mapped to megatron-core; use backend=hf")
    return kwargs


def build_transformer_config(hf_config: Any, **kwargs: Any) -> Any:
    """A megatron-core ``TransformerConfig`` (imports megatron-core)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**transformer_config_kwargs(hf_config, **kwargs))


def layer_spec(hf_config: Any, impl: str = "local") -> Any:
    """The layer spec: ``local`` (pure PyTorch, runs without Transformer Engine; no sequence
    parallel, unfused attention) or ``transformer_engine`` (fused, needs TE)."""
    spec = arch_from_hf_config(hf_config)
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if impl == "local":
        return specs.get_gpt_layer_local_spec(qk_layernorm=spec.qk_norm, normalization="RMSNorm")
    if impl == "transformer_engine":
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_norm)
    raise ValueError(f"backend.megatron.transformer_impl={impl!r}: local | transformer_engine")
