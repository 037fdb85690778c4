"""Built-in tasks. Importing this package registers them (entry point ``rlbench.tasks``)."""

from tasks import code, countdown, math  # noqa: F401  (registers "code", "countdown", "math")
