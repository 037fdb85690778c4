"""Model sources: ``tiny`` (built and warm-started locally), ``tiny_vlm`` (the tiny
vision-language model, likewise) and ``hf`` (a local dir or cached hub id, :mod:`.hub`)."""

from __future__ import annotations

from typing import Any

from harness.registry import MODELS
from harness.typed_config import ConfigError


def resolve_tiny(model_cfg: Any, task: Any, progress: bool = True, force: bool = False) -> str:
    """The tiny text model for ``task`` (:func:`harness.models.tiny.resolve_tiny`), refused
    before any warm start when the task's prompts carry images it could never see."""
    examples = task.train_examples()
    if examples and examples[0].images:
        raise ConfigError(
            f"task={task.name} (variant {getattr(task.config, 'variant', '')}) has images, "
            f"which model={model_cfg.name} (a text-only tiny model) cannot take: use "
            "model=tiny_vlm, or a vision-language model=hf model.path=<dir>")
    from harness.models.tiny import resolve_tiny as build

    return build(model_cfg, task, progress=progress, force=force)


MODELS.register("tiny", resolve_tiny)
MODELS.register("hf", "harness.models.hub:resolve_hf")
MODELS.register("tiny_vlm", "harness.models.tiny_vlm:resolve_tiny_vlm")
