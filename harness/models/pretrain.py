"""Supervised warm start: next-token cross-entropy on (prompt, reference completion) pairs.

Only completion tokens (and the final EOS) are trained on; the prompt is context. For the tiny
vision-language model the prompt starts with its image placeholders and each step also feeds the
rows' pixels (``pixel_values``), the same preprocessing the engine uses at rollout. A fixed number
of AdamW steps with linear warm-up keeps the result reproducible (same seed, same weights),
unlike a wall-clock budget.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.progress import Progress

IGNORE = -100


# a vision-language model's prompt encoder: (tokenizer, model config, example) -> (ids, pixels)
MultimodalEncoder = Callable[[Any, Any, Any], tuple[list[int], dict[str, torch.Tensor]]]


def encode_pairs(tokenizer: Any, pairs: list[tuple[Any, str]], vision: Any = None,
                 encode_prompt: MultimodalEncoder | None = None) -> tuple[torch.Tensor, ...]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (prompt masked). With a
    vision-language model's config ``vision`` and its ``encode_prompt`` (the tiny VLM's),
    prompts start with the image placeholders and a fourth tensor holds each row's pixels
    [N, n_images, 3, S, S]."""
    rows, pixels = [], []
    for example, completion in pairs:
        if vision is not None:
            if encode_prompt is None:
                raise ValueError("a vision-language model's warm start needs its encode_prompt")
            prompt, mm = encode_prompt(tokenizer, vision, example)
            pixels.append(mm["pixel_values"])
        else:
            prompt = tokenizer.encode(example.prompt, add_special_tokens=False)
        answer = [*tokenizer.encode(completion, add_special_tokens=False), tokenizer.eos_token_id]
        rows.append((prompt, answer))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    for i, (p, a) in enumerate(rows):
        seq = p + a
        ids[i, : len(seq)] = torch.as_tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(p) : len(seq)] = torch.as_tensor(a)
    if vision is not None:
        if len({tuple(x.shape) for x in pixels}) != 1:
            raise ValueError("warm-start pairs must all carry the same number of images")
        return ids, mask, labels, torch.stack(pixels)
    return ids, mask, labels


def with_noise_prefixes(pairs: list[tuple[Any, str]], cfg: Any) -> list[tuple[Any, str]]:
    """``cfg.prefix_fraction`` of the text prompts get 1..``prefix_max_words`` words drawn from
    ``cfg.prefix_words`` in front (seeded by ``cfg.seed``); the completions are unchanged."""
    words = list(getattr(cfg, "prefix_words", None) or [])
    if not words:
        return pairs
    rng = random.Random(cfg.seed)
    out = []
    for example, completion in pairs:
        if isinstance(example.prompt, str) and rng.random() < cfg.prefix_fraction:
            count = rng.randint(1, cfg.prefix_max_words)
            prefix = " ".join(rng.choice(words) for _ in range(count))
            example = dataclasses.replace(example, prompt=prefix + cfg.prefix_separator
                                          + example.prompt)
        out.append((example, completion))
    return out


def supervised_warmstart(
    model: torch.nn.Module,
    tokenizer: Any,
    pairs: list[tuple[Any, str]],
    cfg: Any,
    progress: bool = True,
    encode_prompt: MultimodalEncoder | None = None,
) -> dict[str, Any]:
    if not pairs:
        raise ValueError("warm-start needs at least one (prompt, completion) pair")
    pairs = with_noise_prefixes(pairs, cfg)
    vision = model.config if getattr(model.config, "image_token_id", None) is not None else None
    ids, mask, labels, *pixels = encode_pairs(tokenizer, pairs, vision, encode_prompt)
    gen = torch.Generator().manual_seed(cfg.seed)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = max(cfg.warmup_steps, 1)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / warmup))
    model.train()
    start = time.perf_counter()
    losses: list[float] = []
    bar = Progress(cfg.steps, "warm-start", unit="steps") if progress else None
    for _ in range(cfg.steps):
        idx = torch.randint(len(pairs), (min(cfg.batch_size, len(pairs)),), generator=gen)
        width = int(mask[idx].sum(-1).max())
        extra = {"pixel_values": pixels[0][idx].flatten(0, 1)} if pixels else {}
        out = model(input_ids=ids[idx, :width], attention_mask=mask[idx, :width],
                    labels=labels[idx, :width], **extra)
        optim.zero_grad(set_to_none=True)
        out.loss.backward()
        optim.step()
        sched.step()
        losses.append(float(out.loss.detach()))
        if bar is not None:
            bar.update(1, loss=f"{losses[-1]:.3f}")
    if bar is not None:
        bar.close()
    model.eval()
    return {
        "examples": len(pairs),
        "steps": cfg.steps,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "seconds": round(time.perf_counter() - start, 2),
    }
