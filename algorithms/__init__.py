"""Built-in algorithms, loaded through the ``rlbench.algorithms`` entry point.

Importing this package registers every built-in bundle and its building blocks: every module in
this directory is imported, so adding an algorithm is one module here plus one yaml in
``conf/algorithm/`` -- nothing to list. Each module documents one method family and imports only
from ``harness`` (never from a sibling module), so a bundle can be read, copied or removed on its
own.
"""

import importlib
import pkgutil

# Registers the shared building blocks the yaml files name: ``ppo_clip`` and the ``group`` rollout.
from harness import policy_loss, rollout  # noqa: F401

__all__ = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
for _name in __all__:
    importlib.import_module(f"{__name__}.{_name}")
