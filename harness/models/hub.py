"""``model=hf``: any causal LM in Hugging Face format, from a local directory or the local
Hugging Face cache. rlbench downloads nothing (the CLI also sets ``HF_HUB_OFFLINE=1``): a hub id
whose files are not cached is refused at once, naming it and the command that fetches it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.task import Task
from harness.typed_config import ConfigError


def model_dir(model_cfg: Any) -> str:
    """The local directory of ``model.path``: the path itself, or the snapshot of a hub id in
    the local Hugging Face cache (looked up, never fetched). Called by the CLI's preflight
    (``harness.models.check_model_for_task``) and again when the run resolves its model. Raises
    :class:`ConfigError` when it is not set, names a directory without ``config.json`` or an
    uncached hub id; :class:`FileNotFoundError` when a local path does not exist."""
    spec = str(model_cfg.path or "").strip()
    if not spec:
        raise ConfigError(f"model.path is not set for model={model_cfg.name}: give a local "
                          "model directory or a hub id already in the Hugging Face cache, e.g. "
                          "model.path=/models/Qwen3-0.6B")
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.path={spec!r} has no config.json: not a Hugging Face "
                              "model directory (save one with model.save_pretrained(dir))")
        return str(path.resolve())
    if spec.startswith(("/", ".", "~")) or spec.count("/") != 1:
        raise FileNotFoundError(f"model.path={spec!r} does not exist (a local directory, or a "
                                "hub id org/name already in the Hugging Face cache)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(spec, local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        raise ConfigError(
            f"model.path={spec!r} is not a local directory and not in the Hugging Face cache; "
            f"rlbench downloads nothing: give a local path or pre-fetch it "
            f"(huggingface-cli download {spec})") from None


def resolve_hf(model_cfg: Any, task: Task, progress: bool = True, force: bool = False) -> str:
    """``model=hf``'s model: :func:`model_dir` (nothing is built for it)."""
    return model_dir(model_cfg)
