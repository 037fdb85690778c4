"""A preallocated KV cache and the incremental forward that writes into it (HF engine rollout).

transformers' ``DynamicCache`` grows each layer's keys and values by ``torch.cat`` at every
decoded token, copying the whole cache (O(L^2) bytes over a response); on the tiny CPU model
that copying and the per-call mask construction dominate a decode step. :class:`KVCache` holds
``[B, H_kv, S_max, D]`` key and value buffers per layer, allocated once for prompt + response,
and a step writes one column. :class:`CachedDecoder` runs the model's own modules (embedding,
norms, q/k/v/o projections, MLP, rotary embedding, LM head) around an attention that reads the
filled part of the buffers: the same arithmetic as transformers' eager attention (scores + an
additive mask of the dtype's minimum, fp32 softmax), so the sampled ids, log-probs and entropies
match the ``DynamicCache`` path (``tests/test_kv_decode.py``).

Covered: decoder-only Qwen2 / Llama / Qwen3 (q/k norms) text models with full attention and a
rotary embedding that does not depend on the sequence length. Anything else (VLMs, sliding
windows, dynamic RoPE) keeps the ``DynamicCache`` path (:func:`supports`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_TYPES = ("qwen2", "llama", "qwen3")


def supports(model: Any) -> bool:
    """Whether :class:`CachedDecoder` reproduces ``model``'s forward."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in _TYPES:
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return False
    inner = getattr(model, "model", None)
    return inner is not None and hasattr(inner, "layers") and hasattr(inner, "rotary_emb")


class KVCache:
    """Per-layer key/value buffers [B, H_kv, S_max, D] and the key-validity mask [B, S_max]."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (batch, kv_heads, max_len, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.valid = torch.zeros((batch, max_len), dtype=torch.bool, device=device)
        self.length = 0  # columns filled
        self.max_len = max_len

    def repeat_interleave(self, n: int, extra: int = 0) -> KVCache:
        """Each row ``n`` times (a prompt's samples share its prefill), with ``extra`` more free
        columns; one copy of the filled part."""
        filled = self.length
        out = KVCache.__new__(KVCache)
        out.max_len = self.max_len + extra
        B, H, _, D = self.keys[0].shape
        out.keys, out.values = [], []
        for k, v in zip(self.keys, self.values):
            for src, dst in ((k, out.keys), (v, out.values)):
                buf = src.new_empty((B * n, H, out.max_len, D))
                buf[:, :, :filled] = src[:, :, :filled].repeat_interleave(n, 0)
                dst.append(buf)
        out.valid = self.valid.new_zeros((B * n, out.max_len))
        out.valid[:, :filled] = self.valid[:, :filled].repeat_interleave(n, 0)
        out.length = filled
        return out


class CachedDecoder:
    """The model's forward over a :class:`KVCache`: ``step(ids, pos, valid)`` appends
    ``ids.shape[1]`` columns and returns the last position's logits [B, V]."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.inner = model.model
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scaling = self.head_dim ** -0.5
        self.groups = self.heads // self.kv_heads

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = next(self.model.parameters())
        return KVCache(len(self.inner.layers), batch, self.kv_heads, max_len, self.head_dim,
                       p.dtype, p.device)

    def step(self, cache: KVCache, ids: torch.Tensor, pos: torch.Tensor,
             valid: torch.Tensor | None = None) -> torch.Tensor:
        """Feed ``ids`` [B, t] at rotary positions ``pos`` [B, t]; ``valid`` [B, t] marks the real
        (non-padding) tokens (default: all). Returns the logits of the last column."""
        t = ids.shape[1]
        start, end = cache.length, cache.length + t
        if end > cache.max_len:
            raise ValueError(f"KV cache of {cache.max_len} columns cannot take {end}")
        cache.valid[:, start:end] = True if valid is None else valid.bool()
        x = self.inner.embed_tokens(ids)
        cos, sin = self.inner.rotary_emb(x, pos)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, t, D]
        # additive mask as transformers' eager attention builds it: causal within the new
        # columns, padding keys masked, the dtype's minimum where masked
        keys_ok = cache.valid[:, None, None, :end]
        if t > 1:
            causal = torch.ones((t, end), dtype=torch.bool, device=ids.device).tril(start)
            keys_ok = keys_ok & causal
        mask = torch.zeros(keys_ok.shape, dtype=x.dtype, device=x.device).masked_fill(
            ~keys_ok, torch.finfo(x.dtype).min)
        for i, layer in enumerate(self.inner.layers):
            h = layer.input_layernorm(x)
            x = x + self._attention(layer.self_attn, h, cos, sin, mask, cache, i, start, end)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.inner.norm(x[:, -1])
        cache.length = end
        return self.model.lm_head(x)

    def _attention(self, attn: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   mask: torch.Tensor, cache: KVCache, layer: int, start: int, end: int
                   ) -> torch.Tensor:
        B, t, _ = h.shape
        shape = (B, t, -1, self.head_dim)
        q = attn.q_proj(h).view(shape)
        k = attn.k_proj(h).view(shape)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        cache.keys[layer][:, :, start:end] = k
        cache.values[layer][:, :, start:end] = v
        keys = cache.keys[layer][:, :, :end]
        values = cache.values[layer][:, :, :end]
        if self.groups > 1:
            keys = keys.repeat_interleave(self.groups, 1)
            values = values.repeat_interleave(self.groups, 1)
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.scaling + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, values).transpose(1, 2).reshape(B, t, -1)
        return attn.o_proj(out)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
