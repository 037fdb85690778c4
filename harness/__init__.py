"""rlbench's engine: registry, config, backends, trainer, evaluation, tracking, leaderboards."""

import harness.backends  # registers the built-in backends, lazily
import harness.models  # noqa: F401  (registers the built-in model sources, lazily)
from harness.registry import ROLLOUTS

# lazily, like the backends: `rlbench --help`, `list`, `board` and `export` need no torch
ROLLOUTS.register("group", "harness.rollout:GroupRollout")

__version__ = "0.1.0"
