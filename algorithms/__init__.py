"""Built-in algorithms, loaded through the ``rlbench.algorithms`` entry point.

Importing this package registers every built-in bundle and its building blocks. Each module
documents one method family and imports only from ``harness`` (never from a sibling module), so
a bundle can be read, copied or removed on its own.
"""

from algorithms import dapo, grpo, maxrl, reinforce_pp, rloo

# Registers the shared building blocks the yaml files name: ``ppo_clip`` and the ``group`` rollout.
from harness import policy_loss, rollout  # noqa: F401

__all__ = ["dapo", "grpo", "maxrl", "reinforce_pp", "rloo"]
