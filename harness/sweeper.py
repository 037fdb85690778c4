"""``hydra/sweeper=compatible``: the basic sweeper, less the incompatible algorithm x task cells.

A plain sweep over an incompatible pair is refused (exit 2, ``harness.compat``). A sweep that
means "every compatible pair" (``conf/sweep/suite.yaml``) selects this sweeper instead: it expands
the same cross-product as the basic sweeper, composes each cell, and drops the cells whose
algorithm cannot run on their task, so the launcher (joblib, Ray, submitit) gets only runnable
cells. The dropped pairs are logged. ``rlbench sweep`` counts and preflights the same cells
(:func:`harness.cli.hydra_app.preflight`).

Hydra instantiates sweepers only from its plugin namespace, so :func:`register` files the class
under :data:`TARGET` with Hydra's plugin registry before Hydra runs (the sweeper runs in the
launching process only; launcher workers never instantiate it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hydra.types import RunMode

log = logging.getLogger("rlbench")

TARGET = "hydra_plugins.rlbench.CompatibleSweeper"
BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


@dataclass
class CompatibleSweeperConf:
    _target_: str = TARGET
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


def is_compatible_sweeper(hydra_cfg: Any) -> bool:
    return str(hydra_cfg.sweeper.get("_target_", "")) == TARGET


def _sweep(self: Any, arguments: list[str]) -> Any:
    """The basic sweeper's ``sweep``, its cross-product filtered by :func:`_runnable`."""
    original = self.split_arguments

    def split(overrides: Any, max_batch_size: int | None) -> list[list[list[str]]]:
        cells = [c for batch in original(overrides, None) for c in batch]
        kept = [c for c in cells if _runnable(self, c)]
        log.info("sweep: %d of %d cells are compatible pairs (%d dropped)",
                 len(kept), len(cells), len(cells) - len(kept))
        n = max_batch_size or len(kept) or 1
        return [kept[i:i + n] for i in range(0, len(kept), n)]

    self.split_arguments = split
    return type(self).__mro__[1].sweep(self, arguments)


def _runnable(self: Any, cell: list[str]) -> bool:
    from harness.compat import check

    cfg = self.hydra_context.config_loader.load_configuration(
        config_name=self.config.hydra.job.config_name, overrides=list(cell),
        run_mode=RunMode.MULTIRUN)
    verdict = check(cfg.algorithm, str(cfg.task.name), cfg.task)
    if not verdict.ok:
        log.info("sweep: dropped %s: %s", " ".join(cell), verdict.reason)
    return verdict.ok


def sweeper_class() -> type:
    """``CompatibleSweeper``: a subclass of the basic sweeper *as Hydra's plugin registry holds
    it*. Hydra's plugin scan re-executes its core plugin modules, rebinding ``BasicSweeper`` to a
    new class, so a subclass made at import time would fail BasicSweeper's own ``super()``."""
    from hydra.core.plugins import Plugins

    base = Plugins.instance().class_name_to_class[BASIC]
    return type("CompatibleSweeper", (base,), {
        "__doc__": "The basic sweeper's cells, less those whose algorithm cannot run on their "
                   "task.", "__module__": __name__, "sweep": _sweep})


def register() -> None:
    """File the sweeper with Hydra's plugin registry and its config as ``hydra/sweeper=compatible``
    (idempotent)."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    registry = Plugins.instance().class_name_to_class
    if getattr(registry.get(TARGET), "__mro__", (None, None))[1] is not registry[BASIC]:
        # Hydra instantiates from the class's import path: the module must hold it by name
        registry[TARGET] = globals()["CompatibleSweeper"] = sweeper_class()
    ConfigStore.instance().store(group="hydra/sweeper", name="compatible",
                                 node=CompatibleSweeperConf, provider="rlbench")
