"""Built-in tasks, loaded through the ``rlbench.tasks`` entry point.

Importing this package registers every built-in task and the verifiers that tasks own: every
sub-package here is imported, and each one's ``__init__`` imports its ``task`` module (the task
class and its config) and any module that registers a verifier. Adding a task is one sub-package
here plus one yaml in ``conf/task/`` -- nothing to list (docs/adding-a-task.md). A task imports
only from ``harness`` (never from another task or an algorithm).
"""

import importlib
import pkgutil

__all__ = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)
for _name in __all__:
    importlib.import_module(f"{__name__}.{_name}")
