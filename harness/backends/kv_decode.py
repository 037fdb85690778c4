"""A preallocated KV cache and the incremental forward that writes into it (HF engine rollout).

transformers' ``DynamicCache`` grows each layer's keys and values by ``torch.cat`` at every
decoded token, copying the whole cache (O(L^2) bytes over a response); on the tiny CPU model
that copying and the per-call mask construction dominate a decode step. :class:`KVCache` holds
``[B, H_kv, S_max, D]`` key and value buffers per layer, allocated once for prompt + response,
and a step writes one column. :class:`CachedDecoder` runs the model's own modules (embedding,
norms, rotary embedding, LM head; the q/k/v and gate/up projection weights concatenated once
per batch, so each is one matmul) around ``scaled_dot_product_attention`` over the filled part of
the buffers with an additive mask of the dtype's minimum (transformers' convention; one fused
op, where eager attention's batched matmuls over [B*H, 1, D] are ~8x slower on a CPU). The
rotary cos/sin and the key mask are tables built once per batch and indexed per step. The
sampled ids, log-probs and entropies match the ``DynamicCache`` path within 1e-5
(``tests/backends/test_kv_decode.py``).

Covered: decoder-only Qwen2 / Llama / Qwen3 (q/k norms) text models with full attention and a
rotary embedding that does not depend on the sequence length, and VLMs with ordinary 1-D
positions whose language model is one of those and whose prompt embeddings come from the
:class:`ImagePromptLM` contract (the tiny VLM): the prefill takes the contract's embeddings (image
placeholders replaced), the returned logits go through its ``constrain_logits``, and a call's
only extra input is ``pixel_values`` (:func:`covers_inputs`). Anything else (Qwen2.5-VL's
``image_grid_thw`` and 3-D RoPE, sliding windows, dynamic RoPE) keeps the ``DynamicCache`` path
(:func:`supports`).

Training reuses the rollout's idea: :func:`shared_prefix_logits` runs the prompt once per
distinct prompt of a micro-batch (a GRPO group's n samples share it) and the responses over
its keys and values, gathered per row, so autograd sums each prompt's gradient over its rows.
With images, rows share a prompt only if their ids, attention mask and pixels are all equal.
On the tiny Countdown step (13 prompt + 12 response columns, 8 samples per prompt) that halves
the update's forward and backward; in float32 log-probs and gradients equal the whole-row
forward's up to summation order (within 1e-5; ``tests/backends/test_shared_prefix.py``). Lower
precision keeps the whole-row forward (see the function).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F

_TYPES = ("qwen2", "llama", "qwen3")


@runtime_checkable
class ImagePromptLM(Protocol):
    """A decoder-only LM (``model.model`` a covered language model, 1-D positions) whose prompt
    embeddings can carry image embeddings. ``pixel_values`` [n_images, ...] holds the images of
    a call in placeholder order, each image filling the same number of placeholders; its
    ``forward`` must equal the language model's over :meth:`embed_inputs`, with its logits
    through :meth:`constrain_logits`, so the fast paths reproduce it from these alone."""

    def image_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        """True [B, L] where an image embedding replaces the token's."""
        ...

    def embed_inputs(self, input_ids: torch.Tensor,
                     pixel_values: torch.Tensor | None = None) -> torch.Tensor:
        """``inputs_embeds`` [B, L, hidden]: token embeddings, images at the placeholders."""
        ...

    def constrain_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [..., V] with the tokens never sampled (image placeholders) pinned."""
        ...


def _language_type(model: Any) -> str | None:
    """The model type whose layers the decoder runs: the config's own, or for an
    :class:`ImagePromptLM` the covered config it derives from (the tiny VLM's ``Qwen2Config``)."""
    if isinstance(model, ImagePromptLM):
        return next((c.model_type for c in type(model.config).__mro__
                     if getattr(c, "model_type", None) in _TYPES), None)
    return getattr(model.config, "model_type", None)


def covers_inputs(model: Any, mm: dict[str, torch.Tensor] | None) -> bool:
    """Whether the fast paths take a call's extra inputs ``mm``: none, or only the
    ``pixel_values`` of an :class:`ImagePromptLM` (anything more, e.g. Qwen2.5-VL's
    ``image_grid_thw`` with its 3-D positions, goes through the model's own forward)."""
    return mm is None or (isinstance(model, ImagePromptLM) and set(mm) == {"pixel_values"})


def supports(model: Any) -> bool:
    """Whether :class:`CachedDecoder` reproduces ``model``'s forward."""
    cfg = model.config
    if _language_type(model) not in _TYPES:
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return False
    inner = getattr(model, "model", None)
    return inner is not None and hasattr(inner, "layers") and hasattr(inner, "rotary_emb")


def shared_prefix_logits(model: Any, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor,
                         T: int, mm: dict[str, torch.Tensor] | None = None
                         ) -> torch.Tensor | None:
    """Logits [B, T, V] predicting the last ``T`` columns of ``ids`` [B, L] from the positions
    before them, as ``model(ids, ..., **mm).logits[:, -T-1:-1]`` but with the first ``L - T``
    columns (the prompt) run once per distinct prompt: equal ids, attention mask and, with
    ``mm``, pixels. ``None`` when no two rows share a prompt, the model is not float32,
    checkpoints its activations (no cache then) or its cache does not expose its layers, or
    when ``mm`` is more than :func:`covers_inputs` takes or its rows do not all hold the same
    number of images: the caller then runs the whole rows. In bf16 the two paths round
    differently (log-probs ~5e-4 apart), which would make a row's log-prob depend on whether
    its micro-batch holds a sibling, so low precision keeps the whole-row forward."""
    P, B = ids.shape[1] - T, ids.shape[0]
    if P < 1 or T < 1 or next(model.parameters()).dtype != torch.float32:
        return None
    if getattr(model, "is_gradient_checkpointing", False) and model.training:
        return None
    key, pixels = [ids[:, :P], attn[:, :P]], None
    if mm is not None:
        if not covers_inputs(model, mm):
            return None
        pixels, counts = mm["pixel_values"], model.image_mask(ids[:, :P]).sum(1)
        # a row's images are its slice of pixel_values only when every row holds k of them
        # (equal placeholder counts, each image the same number of placeholders)
        if pixels.shape[0] == 0 or pixels.shape[0] % B or bool((counts != counts[0]).any()):
            return None
        pixels = pixels.reshape(B, pixels.shape[0] // B, *pixels.shape[1:])
        # same ids with other pictures are another prompt: the images' identity joins the key
        image_id = torch.unique(pixels.flatten(1), dim=0, return_inverse=True)[1]
        key.append(image_id[:, None].to(ids.dtype))
    prompts, inverse = torch.unique(torch.cat(key, 1), dim=0, return_inverse=True)
    U = prompts.shape[0]
    if U == B:
        return None
    first = torch.full((U,), B, dtype=torch.long, device=ids.device).scatter_reduce_(
        0, inverse, torch.arange(B, device=ids.device), "amin")  # a row holding each prompt
    prompt = {"attention_mask": attn[first, :P], "position_ids": pos[first, :P]}
    if pixels is None:
        prompt["input_ids"] = ids[first, :P]
    else:
        prompt["inputs_embeds"] = model.embed_inputs(ids[first, :P], pixels[first].flatten(0, 1))
    out = model(**prompt, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    if not hasattr(cache, "layers"):
        return None
    for layer in cache.layers:  # the prompt's keys/values for each row; backward sums them
        layer.keys, layer.values = layer.keys[inverse], layer.values[inverse]
    head = out.logits[:, -1:][inverse]  # predicts the first response token
    if T == 1:
        return head
    rest = model(input_ids=ids[:, P:-1], attention_mask=attn[:, :-1], position_ids=pos[:, P:-1],
                 past_key_values=cache, use_cache=True).logits
    return torch.cat([head, rest], 1)


class KVCache:
    """Per-layer key/value buffers [B, H_kv, S_max, D], the additive key mask [B, 1, 1, S_max]
    (0 for a real token, the dtype's minimum for padding) and the per-batch tables."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (batch, kv_heads, max_len, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.bias = torch.zeros((batch, 1, 1, max_len), dtype=dtype, device=device)
        self.length = 0  # columns filled
        self.max_len = max_len
        self.cos = self.sin = torch.empty(0)  # [positions, D], set by CachedDecoder.new_cache
        self.weights: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []

    def repeat_interleave(self, n: int, extra: int = 0) -> KVCache:
        """Each row ``n`` times (a prompt's samples share its prefill), with ``extra`` more free
        columns; one copy of the filled part."""
        filled, max_len = self.length, self.max_len + extra
        B, H, _, D = self.keys[0].shape

        def grown(src: torch.Tensor) -> torch.Tensor:
            buf = src.new_empty((B * n, H, max_len, D))
            buf[:, :, :filled] = src[:, :, :filled].repeat_interleave(n, 0)
            return buf

        bias = self.bias.new_zeros((B * n, 1, 1, max_len))
        bias[..., :filled] = self.bias[..., :filled].repeat_interleave(n, 0)
        return self._with([grown(k) for k in self.keys], [grown(v) for v in self.values], bias,
                          max_len)

    def select(self, rows: torch.Tensor) -> KVCache:
        """The cache of ``rows`` only (finished rows dropped from a decode batch); one copy."""
        return self._with([k[rows] for k in self.keys], [v[rows] for v in self.values],
                          self.bias[rows], self.max_len)

    def _with(self, keys: list[torch.Tensor], values: list[torch.Tensor], bias: torch.Tensor,
              max_len: int) -> KVCache:
        """A cache over new buffers, sharing this one's fill level and per-batch tables."""
        out = KVCache.__new__(KVCache)
        out.keys, out.values, out.bias, out.max_len = keys, values, bias, max_len
        out.length, out.cos, out.sin, out.weights = self.length, self.cos, self.sin, self.weights
        return out


class CachedDecoder:
    """The model's forward over a :class:`KVCache`: ``step(cache, ids, pos, valid)`` appends
    ``ids.shape[1]`` columns and returns the last position's logits [B, V]."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.inner = model.model
        # the model's own logit constraint (a VLM's pinned placeholder), applied to every step
        self.constrain = model.constrain_logits if isinstance(model, ImagePromptLM) else None
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads

    @torch.no_grad()
    def new_cache(self, batch: int, max_len: int, max_position: int | None = None) -> KVCache:
        """An empty cache of ``max_len`` columns; rotary tables up to ``max_position`` (default
        ``max_len``); the fused projection weights of the model as it is now."""
        p = next(self.model.parameters())
        cache = KVCache(len(self.inner.layers), batch, self.kv_heads, max_len, self.head_dim,
                        p.dtype, p.device)
        positions = torch.arange(max(max_len, max_position or 0), device=p.device)[None]
        cos, sin = self.inner.rotary_emb(p.new_zeros(1), positions)
        cache.cos, cache.sin = cos[0], sin[0]
        for layer in self.inner.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
            qkv_b = None if biases[0] is None else torch.cat(biases)
            cache.weights.append((qkv, qkv_b, torch.cat([m.gate_proj.weight, m.up_proj.weight])))
        return cache

    def step(self, cache: KVCache, ids: torch.Tensor, pos: torch.Tensor,
             valid: torch.Tensor | None = None, embeds: torch.Tensor | None = None
             ) -> torch.Tensor:
        """Feed ``ids`` [B, t] at rotary positions ``pos`` [B, t]; ``valid`` [B, t] marks the real
        (non-padding) tokens (default: all); ``embeds`` [B, t, hidden], when given, replaces the
        ids' embeddings (a VLM prompt's, from ``embed_inputs``). Returns the logits of the last
        column, through the model's ``constrain_logits`` where it has one."""
        t = ids.shape[1]
        start, end = cache.length, cache.length + t
        if end > cache.max_len:
            raise ValueError(f"KV cache of {cache.max_len} columns cannot take {end}")
        if valid is None:
            cache.bias[..., start:end] = 0.0
        else:
            cache.bias[:, 0, 0, start:end] = torch.where(
                valid.bool(), 0.0, torch.finfo(cache.bias.dtype).min)
        x = self.inner.embed_tokens(ids) if embeds is None else embeds
        cos, sin = cache.cos[pos][:, None], cache.sin[pos][:, None]  # [B, 1, t, D]
        mask = cache.bias[..., :end]
        if t > 1:  # causal within the new columns
            causal = torch.ones((t, end), dtype=torch.bool, device=ids.device).tril(start)
            mask = mask.masked_fill(~causal, torch.finfo(mask.dtype).min)
        for i, layer in enumerate(self.inner.layers):
            qkv, qkv_b, gate_up = cache.weights[i]
            h = layer.input_layernorm(x)
            x = x + self._attention(layer.self_attn, F.linear(h, qkv, qkv_b), cos, sin, mask,
                                    cache, i, start, end)
            h = layer.post_attention_layernorm(x)
            gate, up = F.linear(h, gate_up).chunk(2, dim=-1)
            x = x + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
        x = self.inner.norm(x[:, -1])
        cache.length = end
        logits = self.model.lm_head(x)
        return logits if self.constrain is None else self.constrain(logits)

    def _attention(self, attn: Any, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   mask: torch.Tensor, cache: KVCache, layer: int, start: int, end: int
                   ) -> torch.Tensor:
        B, t, _ = qkv.shape
        qkv = qkv.view(B, t, -1, self.head_dim)
        H, Hkv = self.heads, self.kv_heads
        qk, v = qkv[:, :, : H + Hkv], qkv[:, :, H + Hkv :].transpose(1, 2)
        if hasattr(attn, "q_norm"):  # Qwen3: per-head norms before the rotary embedding
            qk = torch.cat([attn.q_norm(qk[:, :, :H]), attn.k_norm(qk[:, :, H:])], dim=2)
        qk = qk.transpose(1, 2)
        qk = qk * cos + _rotate_half(qk) * sin  # q and k rotated together
        q, k = qk[:, :H], qk[:, H:]
        cache.keys[layer][:, :, start:end] = k
        cache.values[layer][:, :, start:end] = v
        keys = cache.keys[layer][:, :, :end]
        values = cache.values[layer][:, :, :end]
        if self.groups > 1:
            keys = keys.repeat_interleave(self.groups, 1)
            values = values.repeat_interleave(self.groups, 1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                             scale=attn.scaling)
        return attn.o_proj(out.transpose(1, 2).reshape(B, t, -1))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
