"""``rlbench pretrain``: warm-start (and cache) the tiny model for a task, printing its path."""

from __future__ import annotations

from harness.config import compose_config


def cmd_pretrain(overrides: list[str], force: bool) -> None:
    from harness.config import validate_config
    from harness.registry import MODELS, TASKS
    from harness.typed_config import build

    cfg = compose_config(overrides)
    validate_config(cfg)
    task = build(TASKS, cfg.task, "task")
    path = MODELS.get(cfg.model.source)(cfg.model, task, progress=True, force=force)
    print(path)
