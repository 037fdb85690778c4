"""The tiny vision-language model: a patch-embedding vision encoder feeding the tiny Qwen2 LM.

Architecture (transformers style, so the engine and trainer serve it exactly as Qwen2.5-VL):

* :class:`TinyVLMConfig` extends ``Qwen2Config`` (the language model's fields) with the vision
  fields ``image_size``, ``patch_size``, ``vision_hidden_size``, ``vision_layers``,
  ``vision_heads`` and ``image_token_id`` (model type ``rlbench_tiny_vlm``, registered with
  ``AutoConfig`` / ``AutoModelForCausalLM``, so ``from_pretrained`` loads it).
* :class:`TinyVisionEncoder`: a ``patch_size`` x ``patch_size`` convolution (one linear map per
  non-overlapping patch) to ``vision_hidden_size``, a learned position embedding per patch,
  ``vision_layers`` pre-norm transformer encoder layers, then LayerNorm + a two-layer MLP
  projector to the LM's hidden size: one embedding per patch, (image_size / patch_size)^2 per
  image.
* :class:`TinyVLMForCausalLM` is a ``Qwen2ForCausalLM`` whose ``forward`` also takes
  ``pixel_values`` [n_images, 3, S, S]: the embeddings of the ``<image>`` placeholder tokens in
  ``input_ids`` are replaced, in order, by the patch embeddings (``masked_scatter``, as
  Qwen2.5-VL does); a call whose ids hold no placeholder (a decode step) ignores the pixels.
  The ``<image>`` logit is pinned to :data:`NEVER_LOGIT`, so the policy can never sample a
  placeholder into a response (which the training forward would then try to fill with
  pixels); rollout and training see the same constrained distribution. Both steps are the
  methods of :class:`harness.backends.kv_decode.ImagePromptLM` (``image_mask``,
  ``embed_inputs``, ``constrain_logits``), which ``forward`` itself uses: with them the model
  takes the text models' preallocated-cache decode and shared-prefix training forward.
* Prompts: ``num_image_tokens`` ``<image>`` tokens per image, then the prompt text in the
  character tokenizer (:func:`encode_prompt`); pixels are ink, 1 - RGB / 255
  (:func:`pixels_of`).

:func:`resolve_tiny_vlm` builds, warm-starts (:mod:`harness.models.pretrain`, pixels included)
and caches it under a key that hashes the recipe, the warm-start pairs *and their image bytes*.
The vision hyper-parameters live in :data:`VISION` (the model config schema has no vision
section yet); the image size is taken from the task's warm-start images.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from harness.task import Task
from harness.types import Example

IMAGE_TOKEN = "<image>"
NEVER_LOGIT = -1.0e4  # the <image> logit: probability 0 at any sampling temperature, finite so
                      # that p * log p stays 0 in entropies
MODEL_TYPE = "rlbench_tiny_vlm"


@dataclasses.dataclass(frozen=True)
class VisionArch:
    """Vision-encoder hyper-parameters of the tiny VLM (part of the cache key)."""

    patches_per_side: int = 4  # patch_size = image_size // patches_per_side
    hidden_size: int = 96
    layers: int = 2
    heads: int = 4


VISION = VisionArch()


class TinyVLMConfig(Qwen2Config):
    model_type = MODEL_TYPE

    def __init__(self, image_size: int = 32, patch_size: int = 8, vision_hidden_size: int = 96,
                 vision_layers: int = 2, vision_heads: int = 4, image_token_id: int | None = None,
                 **kwargs: Any) -> None:
        self.image_size = image_size
        self.patch_size = patch_size
        self.vision_hidden_size = vision_hidden_size
        self.vision_layers = vision_layers
        self.vision_heads = vision_heads
        self.image_token_id = image_token_id
        super().__init__(**kwargs)

    @property
    def num_image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class TinyVisionEncoder(nn.Module):
    """Patches -> linear embedding + position -> transformer layers -> MLP projector."""

    def __init__(self, config: TinyVLMConfig) -> None:
        super().__init__()
        d = config.vision_hidden_size
        self.patch_embed = nn.Conv2d(3, d, config.patch_size, stride=config.patch_size)
        self.position = nn.Parameter(torch.zeros(1, config.num_image_tokens, d))
        self.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(d, config.vision_heads, 4 * d, dropout=0.0,
                                        activation="gelu", batch_first=True, norm_first=True)
             for _ in range(config.vision_layers)])
        self.norm = nn.LayerNorm(d)
        self.proj = nn.Sequential(nn.Linear(d, config.hidden_size), nn.GELU(),
                                  nn.Linear(config.hidden_size, config.hidden_size))

    def reset_parameters(self) -> None:
        """PyTorch's default initialisation for every layer (fan-in scaled), not the LM's
        N(0, 0.02): stacked 0.02-std layers would start the image signal and its gradient
        near zero, and the LM would learn to ignore the picture."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        with torch.no_grad():
            self.position.normal_(0.0, 0.02)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[n, 3, S, S] -> [n, num_image_tokens, hidden]."""
        x = self.patch_embed(pixel_values).flatten(2).transpose(1, 2) + self.position
        for layer in self.layers:
            x = layer(x)
        return self.proj(self.norm(x))


class TinyVLMForCausalLM(Qwen2ForCausalLM):
    config_class = TinyVLMConfig

    def __init__(self, config: TinyVLMConfig) -> None:
        super().__init__(config)
        self.vision = TinyVisionEncoder(config)
        self.post_init()
        self.vision.reset_parameters()  # after post_init's N(0, 0.02) pass over every Linear

    # -- the image-prompt contract (harness.backends.kv_decode.ImagePromptLM): the fast decode
    # and shared-prefix training paths build the prompt embeddings and constrain the logits
    # through these, as ``forward`` does, so the three paths cannot drift apart
    def image_mask(self, input_ids: torch.Tensor) -> torch.Tensor:
        """True at the ``<image>`` placeholders, the positions patch embeddings replace."""
        return input_ids == self.config.image_token_id

    def embed_inputs(self, input_ids: torch.Tensor,
                     pixel_values: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings [B, L, hidden] of ``input_ids`` with the placeholders replaced, in
        order, by the patch embeddings of ``pixel_values`` [n_images, 3, S, S]; ids without a
        placeholder (a decode step) ignore the pixels."""
        embeds = self.get_input_embeddings()(input_ids)
        mask = self.image_mask(input_ids)
        if pixel_values is None or not bool(mask.any()):
            return embeds
        feats = self.vision(pixel_values.to(embeds.dtype))
        feats = feats.reshape(-1, feats.shape[-1])
        if int(mask.sum()) != feats.shape[0]:
            raise ValueError(f"{int(mask.sum())} <image> tokens but {feats.shape[0]} "
                             "patch embeddings")
        return embeds.masked_scatter(mask[..., None], feats)

    def constrain_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [..., V] with the ``<image>`` logit pinned to :data:`NEVER_LOGIT` (the
        placeholder is never a next token, see the module doc)."""
        index = torch.tensor([self.config.image_token_id], device=logits.device)
        return logits.index_fill(-1, index, NEVER_LOGIT)

    def forward(self, input_ids: torch.Tensor | None = None,
                pixel_values: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """Qwen2's forward over :meth:`embed_inputs` (the ``<image>`` placeholders hold the
        patch embeddings of ``pixel_values``, images in placeholder order), logits through
        :meth:`constrain_logits`. Given ``inputs_embeds`` are taken as they are."""
        if inputs_embeds is None:
            inputs_embeds = self.embed_inputs(input_ids, pixel_values)
        out = super().forward(input_ids=None, inputs_embeds=inputs_embeds, **kwargs)
        if out.logits is not None:
            out.logits = self.constrain_logits(out.logits)
        return out


AutoConfig.register(MODEL_TYPE, TinyVLMConfig, exist_ok=True)
AutoModelForCausalLM.register(TinyVLMConfig, TinyVLMForCausalLM, exist_ok=True)


# -- prompts and pixels ------------------------------------------------------------------------
def pixels_of(images: list[Any], image_size: int) -> torch.Tensor:
    """[n, 3, S, S] float32 "ink" in [0, 1] (1 - RGB / 255) from PIL images (converted to RGB,
    resized to S): a white background is exactly 0, so the patches without a stroke embed to
    the same bias and the strokes carry all the signal (with background at a constant 1 the
    stroke pixels were a small change on a large constant, and the LM never found them)."""
    rows = []
    for image in images:
        image = image.convert("RGB")
        if image.size != (image_size, image_size):
            image = image.resize((image_size, image_size))
        rows.append(torch.from_numpy(np.asarray(image, dtype=np.float32).copy()))
    return (1.0 - torch.stack(rows).permute(0, 3, 1, 2) / 255.0).contiguous()


def encode_prompt(tokenizer: Any, config: TinyVLMConfig, example: Example) -> tuple[
        list[int], dict[str, torch.Tensor]]:
    """``num_image_tokens`` placeholders per image, then the prompt text; and the pixels."""
    images = list(example.images or [])
    text = example.prompt if isinstance(example.prompt, str) else "\n".join(
        str(m.get("content", "")) for m in example.prompt)
    ids = [config.image_token_id] * (config.num_image_tokens * len(images))
    ids += tokenizer.encode(text, add_special_tokens=False)
    return ids, {"pixel_values": pixels_of(images, config.image_size)}


# -- building and caching ----------------------------------------------------------------------
def build_tiny_vlm(arch: Any, tokenizer: Any, image_size: int, seed: int,
                   vision: VisionArch = VISION) -> TinyVLMForCausalLM:
    """A freshly initialised tiny VLM; ``tokenizer`` must already hold ``<image>``."""
    if image_size % vision.patches_per_side:
        raise ValueError(f"image_size {image_size} is not a multiple of "
                         f"{vision.patches_per_side} patches per side")
    config = TinyVLMConfig(
        image_size=image_size, patch_size=image_size // vision.patches_per_side,
        vision_hidden_size=vision.hidden_size, vision_layers=vision.layers,
        vision_heads=vision.heads, image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vocab_size=len(tokenizer), hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers, num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads, intermediate_size=arch.intermediate_size,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return TinyVLMForCausalLM(config).float()


def build_vlm_tokenizer() -> Any:
    """The tiny model's character tokenizer plus the ``<image>`` placeholder token."""
    from harness.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    return tokenizer


def tiny_vlm_key(model_cfg: Any, task: Task, pairs: list[tuple[Example, str]]) -> str:
    """Hash of the tiny model's recipe, the vision recipe, the warm-start text *and images*."""
    from harness.models.tiny import tiny_model_key

    h = hashlib.sha256(tiny_model_key(model_cfg, task, pairs).encode())
    h.update(json.dumps({"vision": dataclasses.asdict(VISION), "model": MODEL_TYPE}).encode())
    for example, _ in pairs:
        for image in example.images or []:
            rgb = image.convert("RGB")
            h.update(repr(rgb.size).encode())
            h.update(rgb.tobytes())
    return h.hexdigest()[:16]


def resolve_tiny_vlm(model_cfg: Any, task: Task, progress: bool = True,
                     force: bool = False) -> str:
    """Path of the warm-started tiny VLM for ``task`` (built and cached if needed)."""
    from harness.models.tiny import warm_start_cached

    pairs = task.warmstart_examples()
    sizes = {im.size for ex, _ in pairs for im in ex.images or []}
    if len(sizes) != 1:
        raise ValueError(f"tiny_vlm needs warm-start images of one size, got {sorted(sizes)}")
    image_size = next(iter(sizes))[0]

    def build() -> tuple[Any, Any]:
        tokenizer = build_vlm_tokenizer()
        model = build_tiny_vlm(model_cfg.arch, tokenizer, image_size, model_cfg.pretrain.seed)
        return model, tokenizer

    return warm_start_cached(model_cfg, task, pairs, tiny_vlm_key(model_cfg, task, pairs), build,
                             progress, force, encode_prompt=encode_prompt)
