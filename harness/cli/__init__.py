"""The ``rlbench`` command line (``rlbench --help``). One module per concern:

* :mod:`.main` - the entry point and the table of subcommands;
* :mod:`.hydra_app` - ``train`` and ``sweep`` (Hydra apps), preflight checks, ``--cfg``;
* :mod:`.eval` - ``eval`` of a run, a checkpoint or a model;
* :mod:`.listing` - ``list`` and ``pretrain``; :mod:`.board` - ``board``;
* :mod:`.ui` - ``ui``; :mod:`.demo` - ``demo``; :mod:`.errors` - exit-2 messages.

The engine (the rest of ``harness``) never imports this package.
"""

from harness.cli.main import main
from harness.config import compose_config  # the historical home of compose_config

__all__ = ["compose_config", "main"]
