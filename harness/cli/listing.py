"""``rlbench list``: what is registered (plugins included) and the algorithm x task
compatibility matrix."""

from __future__ import annotations

from collections.abc import Sequence

from harness.config import CONF_DIR


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


def cmd_list(kinds: Sequence[str]) -> None:
    """Print each of ``kinds`` (names in ``rlbench list``'s choices)."""
    from harness.registry import ALGORITHMS, BACKENDS, TASKS, VERIFIERS

    for k in kinds:
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
