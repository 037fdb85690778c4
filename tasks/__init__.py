"""Built-in tasks. Importing this package registers them (entry point ``rlbench.tasks``)."""

from tasks import (  # noqa: F401  (registers "agentic_qa", "code", "countdown", "math")
    agentic_qa,
    code,
    countdown,
    math,
)
