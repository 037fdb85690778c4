"""Model sources: ``tiny`` (built and warm-started locally), ``tiny_vlm`` (the tiny
vision-language model, likewise) and ``hf`` (a local dir or cached hub id, :mod:`.hub`)."""

from __future__ import annotations

from typing import Any

from harness.registry import MODELS
from harness.typed_config import ConfigError

# model sources that build a text-only model: a task that offers images (harness.compat) is
# refused for them from its declaration, before any data is read or model built
TEXT_ONLY_SOURCES = frozenset({"tiny"})


def _images_refusal(task_name: str, variant: str, model_name: str) -> ConfigError:
    return ConfigError(
        f"task={task_name} (variant {variant}) has images, which model={model_name} (a "
        "text-only tiny model) cannot take: use model=tiny_vlm, or a vision-language model=hf "
        "model.path=<dir>")


def check_model_for_task(model_cfg: Any, task_cfg: Any, *, local_files: bool = True) -> None:
    """The refusals of a model that need no more than the config and, with ``local_files``, the
    file system (``harness.config.validate_config``, so the CLI's preflight, in seconds): a
    text-only model for a task that declares images, and a ``model=hf`` path that is unset,
    missing, not a model directory, or a hub id not in the local Hugging Face cache."""
    from harness.compat import IMAGES, task_offers

    if model_cfg.source in TEXT_ONLY_SOURCES and IMAGES in task_offers(str(task_cfg.name),
                                                                        task_cfg):
        raise _images_refusal(str(task_cfg.name), str(task_cfg.get("variant", "")),
                              str(model_cfg.name))
    if local_files and model_cfg.source == "hf":
        from harness.models.hub import model_dir

        model_dir(model_cfg)


def resolve_tiny(model_cfg: Any, task: Any, progress: bool = True, force: bool = False) -> str:
    """The tiny text model for ``task`` (:func:`harness.models.tiny.resolve_tiny`), refused
    before any warm start when the task's prompts carry images it could never see (a task that
    did not declare them: :func:`check_model_for_task` refused the declared ones)."""
    examples = task.train_examples()
    if examples and examples[0].images:
        raise _images_refusal(task.name, getattr(task.config, "variant", ""), model_cfg.name)
    from harness.models.tiny import resolve_tiny as build

    return build(model_cfg, task, progress=progress, force=force)


MODELS.register("tiny", resolve_tiny)
MODELS.register("hf", "harness.models.hub:resolve_hf")
MODELS.register("tiny_vlm", "harness.models.tiny_vlm:resolve_tiny_vlm")
