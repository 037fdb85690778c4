"""Built-in tasks. Importing this package registers them (entry point ``rlbench.tasks``):
"agentic_qa", "code", "countdown", "geometry3k", "math"."""

from tasks import (  # noqa: F401  (imported to register)
    agentic_qa,
    code,
    countdown,
    geometry3k,
    math,
)
