"""Built-in tasks. Importing this package registers them (entry point ``rlbench.tasks``):
"agentic_qa", "code", "countdown", "custom", "geometry3k", "math"; and the verifiers that tasks
own: "countdown", "code_tests" (the engine's own: "math", "exact_match")."""

from tasks import (  # noqa: F401  (imported to register)
    agentic_qa,
    code,
    countdown,
    custom,
    geometry3k,
    math,
)
from tasks.code import reward as _code_reward  # noqa: F401  (registers "code_tests")
from tasks.countdown import reward as _countdown_reward  # noqa: F401  (registers "countdown")
