"""Image inputs for the engines: prompt encoding, per-row pixel inputs, multimodal positions.

How images flow (docs/multimodal.md):

1. ``engine.encode_prompt(example)`` with ``example.images`` returns a
   :class:`~harness.types.MultimodalPrompt`: the prompt token ids (image placeholders already
   expanded to one token per image embedding) that *carries* its pixel inputs
   (``mm_inputs``: ``pixel_values`` and, for Qwen2.5-VL, ``image_grid_thw``) and the raw
   images (for vLLM). It is a ``list[int]``, so every caller that passes prompt ids on
   (rollout strategies, evaluation) passes the pixels on without knowing about them.
2. The rollout engine prefills with those tensors and stores the *same tensor objects* on each
   sampled :class:`~harness.types.Trajectory` (``mm_inputs``).
3. Training forwards (old log-probs, reference, loss) gather them back from the batch's
   trajectories with :func:`collate_mm` (concatenated along dim 0 in row order, the order the
   placeholder tokens appear in), never re-processing the images.

Two kinds of vision-language models are served by the same code: the tiny VLM
(:mod:`harness.models.tiny_vlm`, placeholders + ``pixel_values`` [n, 3, S, S], ordinary 1-D
positions) and Qwen2.5-VL (processor chat template, ``pixel_values`` [patches, C*T*P*P] +
``image_grid_thw``, 3-D multimodal RoPE positions from the model's ``get_rope_index``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from harness.types import Example, MultimodalPrompt


def is_vision_config(config: Any) -> bool:
    """A Hugging Face VLM with a vision tower config (Qwen2.5-VL and the like)."""
    return getattr(config, "vision_config", None) is not None


def is_tiny_vlm_config(config: Any) -> bool:
    from harness.models.tiny_vlm import MODEL_TYPE

    return getattr(config, "model_type", None) == MODEL_TYPE


def _chat_messages(example: Example) -> list[dict[str, Any]]:
    """Chat messages with one ``{"type": "image"}`` entry per image at the start of the first
    user turn (the image before the text)."""
    images = [{"type": "image"} for _ in example.images or []]
    if isinstance(example.prompt, str):
        return [{"role": "user", "content": [*images, {"type": "text", "text": example.prompt}]}]
    messages = [dict(m) for m in example.prompt]
    for m in messages:
        if m.get("role") == "user":
            content = m.get("content")
            text = [{"type": "text", "text": content}] if isinstance(content, str) else content
            m["content"] = [*images, *text]
            break
    return messages


def encode_multimodal(example: Example, tokenizer: Any, processor: Any, config: Any
                      ) -> MultimodalPrompt:
    """Prompt ids with image placeholders plus the pixel inputs of ``example.images``."""
    images = list(example.images or [])
    if is_tiny_vlm_config(config):
        from harness.models.tiny_vlm import encode_prompt

        ids, mm = encode_prompt(tokenizer, config, example)
        return MultimodalPrompt(ids, mm_inputs=mm, images=images)
    if processor is None:
        raise ValueError(f"example {example.id!r} has images but the model has no processor")
    text = processor.apply_chat_template(_chat_messages(example), add_generation_prompt=True,
                                         tokenize=False)
    out = processor(text=[text], images=[im.convert("RGB") for im in images],
                    return_tensors="pt")
    mm = {k: out[k] for k in ("pixel_values", "image_grid_thw") if k in out}
    return MultimodalPrompt(out["input_ids"][0].tolist(), mm_inputs=mm, images=images)


def collate_mm(rows: Sequence[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor] | None:
    """One model call's pixel inputs: each key concatenated along dim 0 over the rows that have
    images, in row order (the order of their placeholder tokens); None when no row has any."""
    present = [r for r in rows if r]
    if not present:
        return None
    return {k: torch.cat([r[k] for r in present]) for k in present[0]}


def mm_position_ids(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    mm: dict[str, torch.Tensor] | None) -> torch.Tensor | None:
    """3-D multimodal RoPE positions [3, B, L] for models that need them (Qwen2.5-VL, from
    its own ``get_rope_index``); None for models with ordinary positions (the tiny VLM)."""
    inner = getattr(model, "model", None)
    if mm is None or "image_grid_thw" not in mm or not hasattr(inner, "get_rope_index"):
        return None
    token_types = (input_ids == model.config.image_token_id).int()
    pos, _ = inner.get_rope_index(input_ids, mm_token_type_ids=token_types,
                                  image_grid_thw=mm["image_grid_thw"],
                                  attention_mask=attention_mask)
    return pos
