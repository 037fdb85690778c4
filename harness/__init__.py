"""rlbench's engine: registry, config, backends, trainer, evaluation, tracking, leaderboards."""

import harness.backends  # registers the built-in backends, lazily
import harness.models  # registers the built-in model sources, lazily
import harness.rollout  # noqa: F401  (registers the `group` rollout strategy)

__version__ = "0.1.0"
