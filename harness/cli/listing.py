"""``rlbench list`` (what is registered, plugins included, and the algorithm x task compatibility
matrix) and ``rlbench pretrain``."""

from __future__ import annotations

from harness.config import CONF_DIR, compose_config


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


def cmd_list(kind: str | None) -> None:
    from harness.cli.main import LIST_KINDS
    from harness.registry import ALGORITHMS, BACKENDS, TASKS, VERIFIERS

    for k in [kind] if kind else list(LIST_KINDS):
        print(f"{k}:")
        if k in ("algorithms", "tasks", "verifiers"):
            registry = {"algorithms": ALGORITHMS, "tasks": TASKS, "verifiers": VERIFIERS}[k]
            for name in registry.names():
                print(f"  {name:<20} {_first_line(registry.get(name).__doc__)}")
        elif k in ("models", "backends"):
            for path in sorted((CONF_DIR / k[:-1]).glob("*.yaml")):
                print(f"  {path.stem:<20} {_first_line(path.read_text().lstrip('# '))}")
            if k == "backends":
                print(f"  engines: {', '.join(BACKENDS.names())}")
        elif k == "matrix":  # algorithm x task: what each needs, what each offers
            from harness.compat import format_matrix

            print("\n".join(f"  {line}" for line in format_matrix(CONF_DIR).splitlines()))


def cmd_pretrain(overrides: list[str], force: bool) -> None:
    from harness.components import build
    from harness.config import validate_config
    from harness.registry import MODELS, TASKS

    cfg = compose_config(overrides)
    validate_config(cfg)
    task = build(TASKS, cfg.task, "task")
    path = MODELS.get(cfg.model.source)(cfg.model, task, progress=True, force=force)
    print(path)
