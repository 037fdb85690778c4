"""Hugging Face <-> Megatron-core weight conversion for dense Qwen2 / Qwen3 / Llama models.

Plain tensor functions, no megatron import, so the whole layer is unit-tested on a CPU. The
Megatron engine loads a Hugging Face checkpoint through :func:`hf_to_mcore` (then slices its
tensor-parallel shard with :func:`split_tp`), and hands weights to vLLM or to ``save_pretrained``
through :func:`mcore_to_hf` after :func:`merge_tp` gathered the shards.

Names (``local`` layer spec; the Transformer Engine spec folds the two pre-norms into the next
linear, see :data:`TE_NORM_NAMES`)::

    embedding.word_embeddings.weight                      model.embed_tokens.weight
    decoder.layers.{i}.input_layernorm.weight             model.layers.{i}.input_layernorm.weight
    decoder.layers.{i}.self_attention.linear_qkv.{w,b}    ...self_attn.{q,k,v}_proj.{w,b}  (fused)
    decoder.layers.{i}.self_attention.{q,k}_layernorm.w   ...self_attn.{q,k}_norm.weight   (Qwen3)
    decoder.layers.{i}.self_attention.linear_proj.weight  ...self_attn.o_proj.weight
    decoder.layers.{i}.pre_mlp_layernorm.weight           ...post_attention_layernorm.weight
    decoder.layers.{i}.mlp.linear_fc1.weight              ...mlp.{gate,up}_proj.weight     (fused)
    decoder.layers.{i}.mlp.linear_fc2.weight              ...mlp.down_proj.weight
    decoder.final_layernorm.weight                        model.norm.weight
    output_layer.weight (absent when tied)                lm_head.weight

Fused layouts. ``linear_qkv`` is g blocks, one per KV group, each holding that group's r = n/g
query heads, then its key head, then its value head (d rows each) -- not [Q; K; V].
``linear_fc1`` is [gate; up]. Under tensor parallelism qkv is split in plain dim-0 chunks (so
merging is concatenation), but each fc1 shard is [gate_t; up_t] (mcore's stride 2), so a naive
concatenation of fc1 shards interleaves gate and up: :func:`merge_tp` undoes that.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ArchSpec:
    """What the converter needs to know about a dense decoder."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads


SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")


def arch_from_hf_config(config: Any) -> ArchSpec:
    """The :class:`ArchSpec` of a transformers config (Qwen2, Qwen3, Llama, Mistral)."""
    model_type = getattr(config, "model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"no Megatron conversion for model_type={model_type!r}; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)} (use backend=hf)")
    if model_type == "mistral" and getattr(config, "sliding_window", None):
        raise ValueError("sliding-window attention (Mistral v0.1/v0.2) has no Megatron mapping "
                         "here; use backend=vllm_hf")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ArchSpec(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        vocab_size=config.vocab_size,
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        # transformers hard-codes bias=True on Qwen2's q/k/v; the others follow attention_bias
        qkv_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        qk_norm=model_type == "qwen3",
    )


# -- fused layouts --------------------------------------------------------------------------------
def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: ArchSpec) -> torch.Tensor:
    """HF q/k/v projections (weights [rows, H] or biases [rows]) -> Megatron's grouped layout."""
    g, d = spec.num_kv_heads, spec.head_dim
    tail = q.shape[1:]
    blocks = torch.cat([q.reshape(g, spec.group_size * d, *tail), k.reshape(g, d, *tail),
                        v.reshape(g, d, *tail)], dim=1)
    return blocks.reshape(-1, *tail)


def split_qkv(fused: torch.Tensor, spec: ArchSpec) -> tuple[torch.Tensor, ...]:
    """Inverse of :func:`fuse_qkv`."""
    g, d, r = spec.num_kv_heads, spec.head_dim, spec.group_size
    tail = fused.shape[1:]
    blocks = fused.reshape(g, (r + 2) * d, *tail)
    q, k, v = blocks.split([r * d, d, d], dim=1)
    return (q.reshape(g * r * d, *tail), k.reshape(g * d, *tail), v.reshape(g * d, *tail))


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.cat([gate, up], dim=0)


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = fc1.chunk(2, dim=0)
    return gate, up


# -- names ----------------------------------------------------------------------------------------
# Transformer Engine spec: the pre-attention / pre-MLP norms live inside the next fused linear.
TE_NORM_NAMES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}
_LAYER_PLAIN = {  # Megatron layer-relative name -> HF layer-relative name (one to one)
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_TOP_PLAIN = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_MC_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def _te(name: str, te: bool) -> str:
    return TE_NORM_NAMES.get(name, name) if te else name


def hf_to_mcore(hf: dict[str, torch.Tensor], spec: ArchSpec, te: bool = False
                ) -> dict[str, torch.Tensor]:
    """A full (unsharded) HF state dict -> Megatron names and layouts."""
    out: dict[str, torch.Tensor] = {}
    for mc, name in _TOP_PLAIN.items():
        if mc == "output_layer.weight" and spec.tie_embeddings:
            continue
        out[mc] = hf[name]
    for i in range(spec.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for mc, name in _LAYER_PLAIN.items():
            if "layernorm" in mc and mc.startswith("self_attention.") and not spec.qk_norm:
                continue
            out[dst + _te(mc, te)] = hf[src + name]
        attn = src + "self_attn."
        for kind in ("weight", "bias") if spec.qkv_bias else ("weight",):
            out[dst + f"self_attention.linear_qkv.{kind}"] = fuse_qkv(
                *(hf[f"{attn}{p}_proj.{kind}"] for p in "qkv"), spec)
        out[dst + "mlp.linear_fc1.weight"] = fuse_gate_up(
            hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"])
    return out


def iter_mcore_to_hf(items: Iterable[tuple[str, torch.Tensor]], spec: ArchSpec
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """(Megatron name, full tensor) pairs -> (HF name, tensor) pairs, one layer at a time, so a
    weight sync to vLLM never holds a second copy of the model. ``_extra_state`` entries are
    skipped; a padded vocabulary is cut back to ``spec.vocab_size``."""
    te_back = {v: k for k, v in TE_NORM_NAMES.items()}
    for name, tensor in items:
        if name.endswith("_extra_state"):
            continue
        if name in _TOP_PLAIN:
            if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
                tensor = tensor[: spec.vocab_size]
            yield _TOP_PLAIN[name], tensor
            continue
        m = _MC_LAYER.match(name)
        if m is None:
            raise KeyError(f"unexpected Megatron parameter {name!r}")
        i, rel = m.group(1), te_back.get(m.group(2), m.group(2))
        prefix = f"model.layers.{i}."
        if rel in _LAYER_PLAIN:
            yield prefix + _LAYER_PLAIN[rel], tensor
        elif rel.startswith("self_attention.linear_qkv."):
            kind = rel.rsplit(".", 1)[1]
            for proj, part in zip("qkv", split_qkv(tensor, spec)):
                yield f"{prefix}self_attn.{proj}_proj.{kind}", part
        elif rel == "mlp.linear_fc1.weight":
            gate, up = split_gate_up(tensor)
            yield prefix + "mlp.gate_proj.weight", gate
            yield prefix + "mlp.up_proj.weight", up
        else:
            raise KeyError(f"unexpected Megatron parameter {name!r}")


def mcore_to_hf(mc: dict[str, torch.Tensor], spec: ArchSpec) -> dict[str, torch.Tensor]:
    """A full (unsharded) Megatron state dict -> HF names and layouts."""
    out = dict(iter_mcore_to_hf(mc.items(), spec))
    if spec.tie_embeddings:
        out.setdefault("lm_head.weight", out["model.embed_tokens.weight"])
    return out


# -- tensor parallelism ---------------------------------------------------------------------------
def tp_kind(name: str) -> str:
    """How a Megatron parameter is split over tensor-parallel ranks: ``column`` (dim 0),
    ``fc1`` (dim 0, gate and up halves split separately), ``row`` (dim 1), ``vocab`` (dim 0 of
    the embedding / output layer) or ``replicated`` (norms)."""
    if name.endswith(("word_embeddings.weight", "output_layer.weight")):
        return "vocab"
    if ".linear_qkv." in name and "layer_norm" not in name:
        return "column"
    if name.endswith("linear_fc1.weight"):
        return "fc1"
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return "row"
    return "replicated"


def split_tp(name: str, tensor: torch.Tensor, tp: int) -> list[torch.Tensor]:
    """The ``tp`` shards of a full Megatron tensor, in rank order."""
    kind = tp_kind(name)
    if tp == 1 or kind == "replicated":
        return [tensor] * tp
    if kind == "fc1":
        gate, up = split_gate_up(tensor)
        return [torch.cat([g, u], dim=0) for g, u in zip(gate.chunk(tp, 0), up.chunk(tp, 0))]
    dim = 1 if kind == "row" else 0
    if tensor.shape[dim] % tp:
        raise ValueError(f"{name}: size {tensor.shape[dim]} on dim {dim} not divisible by TP={tp}")
    return list(tensor.chunk(tp, dim=dim))


def merge_tp(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`split_tp`: the full tensor from its shards in rank order."""
    kind = tp_kind(name)
    if len(shards) == 1 or kind == "replicated":
        return shards[0]
    if kind == "fc1":
        halves = [split_gate_up(s) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=1 if kind == "row" else 0)


def padded_vocab_size(vocab_size: int, tp: int, multiple: int = 1) -> int:
    """Megatron splits the vocabulary evenly over TP ranks: round up to ``multiple * tp``. The
    engine masks the logits of padded ids, so the default pads only as far as TP needs."""
    step = multiple * tp
    return -(-vocab_size // step) * step


def pad_vocab(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """Zero rows appended to an embedding / output matrix up to ``size`` rows."""
    if tensor.shape[0] >= size:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(size - tensor.shape[0], *tensor.shape[1:])])
