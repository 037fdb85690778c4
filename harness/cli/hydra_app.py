"""``rlbench train`` and ``rlbench sweep``: Hydra apps over ``conf/config.yaml``.

Before Hydra runs, every cell is composed and validated here (:func:`preflight`), so a typo, a
wrong type, an unknown option or an inconsistent combination exits 2 with one line naming it
(and, for a sweep, the cell) before any run directory exists. ``--cfg job|hydra|all`` prints the
composed config of the run, or of every cell of a sweep, without running anything. A sweep logs
``k/N cells done`` with an ETA after each cell, from every launcher process, and a summary at the
end. SIGTERM or SIGINT sent to the sweep's process alone reaches its cells too
(:func:`_stop_cells_with_the_sweep`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.cli.errors import fail, guarded, hydra_message
from harness.config import CONF_DIR, compose_config, register_schema, with_searchpath

log = logging.getLogger("rlbench")

CFG_KINDS = ("job", "hydra", "all")
# Hydra flags that take a value (``--cfg job``, ``-p trainer``); ``--info`` takes an optional one
VALUE_FLAGS = {"--cfg", "-c", "--package", "-p"}
OPTIONAL_VALUE_FLAGS = {"--info", "-i"}
CELLS_ENV = "RLBENCH_SWEEP_CELLS"      # N, the number of cells of the running sweep
MARKERS_ENV = "RLBENCH_SWEEP_MARKERS"  # a directory where each finished cell leaves a marker
START_ENV = "RLBENCH_SWEEP_START"      # the sweep's start (epoch seconds), for the ETA
SWEEP_PID_ENV = "RLBENCH_SWEEP_PID"    # the sweep's own process (its workers are others)


def split_flags(args: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """Hydra's command-line flags (``--cfg job``, ``--resolve``, ``--help`` ...) apart from the
    ``key=value`` overrides."""
    flags: dict[str, str | None] = {}
    overrides: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and not arg.startswith(("~", "+")):
            name, eq, value = arg.partition("=")
            if eq:
                flags[name] = value
            elif name in VALUE_FLAGS or name in OPTIONAL_VALUE_FLAGS:
                nxt = args[i + 1] if i + 1 < len(args) else None
                takes = nxt is not None and not nxt.startswith("-") and "=" not in nxt
                if name in VALUE_FLAGS and not takes:
                    fail(f"{name} needs a value: {name} {'|'.join(CFG_KINDS)}"
                         if name in ("--cfg", "-c") else f"{name} needs a value")
                flags[name] = nxt if takes else None
                i += int(takes)
            else:
                flags[name] = None
        else:
            overrides.append(arg)
        i += 1
    return flags, overrides


def split_track(overrides: list[str]) -> tuple[str | None, list[str]]:
    """``track=<name>`` picks a track outside the LLM training loop (``harness.registry.TRACKS``);
    the other overrides go to that track's own Hydra config."""
    tracks = [o for o in overrides if o.startswith("track=")]
    if not tracks:
        return None, overrides
    return tracks[-1].partition("=")[2], [o for o in overrides if not o.startswith("track=")]


def expand_cells(overrides: list[str]) -> list[list[str]]:
    """The cells of a sweep: the cross-product of the command line's sweep values and of a named
    sweep's ``hydra.sweeper.params``, as Hydra's basic sweeper expands them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    hydra_cfg = compose_config(fixed, return_hydra_config=True).hydra
    params = [f"{k}={v}" for k, v in (hydra_cfg.sweeper.get("params") or {}).items()]
    batches = BasicSweeper.split_arguments(parser.parse_overrides([*params, *overrides]), None)
    return [list(cell) for batch in batches for cell in batch]


def _variant_sections(overrides: list[str], cfg: Any) -> None:
    """``task.full.*`` is read only when ``task.variant=full`` (likewise ``task.tiny.*``): a
    setting in the section not in use would be silently ignored, so it is an error."""
    from harness.typed_config import ConfigError

    variant = cfg.task.get("variant") if cfg.task is not None else None
    if variant is None:
        return
    chosen = any(o.partition("=")[0] == "task.variant" for o in overrides)
    why = "task.variant given" if chosen else f"model={cfg.model.name} picks it"
    for o in overrides:
        key = o.lstrip("+~").partition("=")[0]
        for section in ("tiny", "full"):
            if key.startswith(f"task.{section}.") and variant != section:
                raise ConfigError(
                    f"{key} is set but task.variant={variant} ({why}), so it would be "
                    f"ignored: use task.variant={section}, or task.{variant}.* to configure "
                    f"the variant in use")


# ``rlbench train`` (one cell, in this process): the task and algorithm the preflight built, keyed
# by the cell's overrides, so the run uses them instead of building them a second time
_BUILT: dict[tuple[str, ...], Any] = {}


def check_cell(overrides: list[str], hardware: bool = True) -> Any:
    """Compose and validate one cell (building its task and algorithm); returns the built
    :class:`harness.config.RunParts`. Raises on bad input. ``hardware=False``: not whether
    this machine can run it (``--cfg``: nothing runs)."""
    from harness.config import validate_config

    cfg = compose_config(overrides)
    parts = validate_config(cfg, hardware=hardware)
    _variant_sections(overrides, cfg)
    return parts


def compatible_cells(cells: list[list[str]], overrides: list[str],
                     configs: dict[tuple[str, ...], Any] | None = None) -> list[list[str]]:
    """Under ``hydra/sweeper=compatible`` (the suite), the cells whose algorithm can run on their
    task, as that sweeper launches them; under any other sweeper every cell (an incompatible one
    is then refused by :func:`check_cell`). ``configs`` receives the composed config of each
    kept pair (the cell less its seed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from harness.compat import check
    from harness.sweeper import is_compatible_sweeper

    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    if not cells or not is_compatible_sweeper(compose_config(fixed,
                                                             return_hydra_config=True).hydra):
        return cells
    verdicts: dict[tuple[str, ...], bool] = {}  # seeds do not change a pair: compose once
    kept = []
    for cell in cells:
        key = tuple(o for o in cell if o.partition("=")[0] != "seed")
        if key not in verdicts:
            cfg = compose_config(cell)
            verdicts[key] = check(cfg.algorithm, str(cfg.task.name), cfg.task).ok
            if configs is not None and verdicts[key]:
                configs[key] = cfg
        if verdicts[key]:
            kept.append(cell)
    return kept


def preflight(overrides: list[str], multirun: bool, hardware: bool = True) -> list[list[str]]:
    """Every cell composed and validated; bad input exits 2 naming the key (and the cell).
    ``hardware=False`` (``--cfg``): a GPU backend is not refused on a machine without one."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from harness.registry import RegistryError
    from harness.typed_config import ConfigError

    try:
        cells = expand_cells(overrides) if multirun else [overrides]
    except (HydraException, OmegaConfBaseException) as exc:
        fail(hydra_message(exc, overrides))
    if multirun:
        cells = compatible_cells(cells, overrides)
    for k, cell in enumerate(cells, 1):
        where = f"cell {k}/{len(cells)} ({' '.join(cell)}): " if multirun else ""
        try:
            parts = check_cell(cell, hardware)
            if not multirun:  # the run happens in this process: hand it what was built
                _BUILT[tuple(cell)] = parts
        except (HydraException, OmegaConfBaseException) as exc:
            fail(where + hydra_message(exc, cell))
        except (ConfigError, RegistryError, FileNotFoundError) as exc:
            fail(where + str(exc))
    return cells


def print_cfg(cells: list[list[str]], flags: dict[str, str | None]) -> None:
    """What Hydra's ``--cfg`` prints, for the run or for every cell of a sweep."""
    from omegaconf import OmegaConf

    kind = flags.get("--cfg", flags.get("-c"))
    if kind not in CFG_KINDS:
        fail(f"--cfg {kind}: not a config part; use --cfg job, --cfg hydra or --cfg all")
    package = flags.get("--package", flags.get("-p"))
    for k, cell in enumerate(cells, 1):
        cfg = compose_config(cell, return_hydra_config=kind != "job")
        if kind == "hydra":
            cfg = OmegaConf.create({"hydra": cfg.hydra})
        if package:
            cfg = OmegaConf.select(cfg, package)
            if cfg is None:
                fail(f"--package {package}: no such node in the config")
        if len(cells) > 1:
            print(f"# cell {k}/{len(cells)}: {' '.join(cell)}")
        resolve = "--resolve" in flags
        if not OmegaConf.is_config(cfg):
            text = f"{cfg}\n"
        elif resolve and "hydra" in cfg:
            # Hydra's own part refers to run-time values (job number, output dir) that exist
            # only inside a run: it is shown as written, the rest resolved
            job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            text = (OmegaConf.to_yaml(job, resolve=True) if len(job) else "") + \
                OmegaConf.to_yaml(OmegaConf.create({"hydra": cfg.hydra}))
        else:
            text = OmegaConf.to_yaml(cfg, resolve=resolve)
        print(text, end="" if text.endswith("\n") else "\n")


def _cap_threads(cfg: Any, hydra_cfg: Any) -> None:
    """Parallel jobs of a local launcher share the cores: with ``backend.threads=0`` (torch's
    default, every core) each joblib worker would start one thread per core and they would fight.
    Give each job cores // n_jobs threads instead."""
    from hydra.types import RunMode

    if cfg.backend.threads != 0 or hydra_cfg.mode != RunMode.MULTIRUN:
        return
    launcher = hydra_cfg.launcher
    if "joblib" not in str(launcher.get("_target_", "")):
        return
    cores = os.cpu_count() or 1
    n_jobs = int(launcher.get("n_jobs", -1) or -1)
    jobs = cores if n_jobs <= 0 else min(n_jobs, cores)
    cfg.backend.threads = max(1, cores // jobs)


def _cell_done(outcome: str) -> None:
    """Leave this cell's marker and log how far the sweep is (k of N, ETA)."""
    markers, total = os.environ.get(MARKERS_ENV), int(os.environ.get(CELLS_ENV, "0") or 0)
    if not markers or not Path(markers).is_dir() or not total:
        return
    from hydra.core.hydra_config import HydraConfig

    (Path(markers) / f"{HydraConfig.get().job.num}.{outcome}").touch()
    done = list(Path(markers).iterdir())
    k = len(done)
    elapsed = time.time() - float(os.environ.get(START_ENV, time.time()))
    skipped = sum(p.suffix in (".skipped", ".busy") for p in done)
    failed = sum(p.suffix == ".failed" for p in done)
    ran = k - skipped - failed
    eta = ""
    if k < total and ran:
        eta = f", eta ~{format_seconds(elapsed / max(k, 1) * (total - k))}"
    log.info("sweep: %d/%d cells done (%d skipped, %d failed), %s elapsed%s",
             k, total, skipped, failed, format_seconds(elapsed), eta)


def format_seconds(s: float) -> str:
    s = round(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _train_job(cfg: Any) -> Any:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    from harness.trainer import Trainer

    hydra_cfg = HydraConfig.get()
    _cap_threads(cfg, hydra_cfg)
    # the job's own overrides, so a board can tell whether its named sweep alone reproduces it
    with open_dict(cfg.tracking.tags):
        cfg.tracking.tags["rlbench.overrides"] = json.dumps(list(hydra_cfg.overrides.task))
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    trainer = None
    outcome, stopped = "failed", 0  # stopped: the exit status of a signal that stopped it
    try:
        parts = _BUILT.pop(tuple(hydra_cfg.overrides.task), None)
        trainer = guarded(Trainer, cfg, run_dir, parts)
        summary = guarded(trainer.fit)
        action = trainer.plan.action if trainer.plan else ""
        outcome = {"skip": "skipped", "busy": "busy"}.get(action, "done")
        return summary
    except SystemExit as exc:
        outcome = "bad_input" if exc.code == 2 else "failed"
        if exc.code in (128 + signal.SIGTERM, 128 + signal.SIGINT):
            stopped = int(exc.code)
        raise
    finally:
        if multirun:
            _cell_done("failed" if outcome == "bad_input" else outcome)
        wrote = trainer is not None and trainer.output_dir == run_dir and (
            run_dir / "checkpoints").exists()
        if outcome in ("skipped", "busy", "bad_input") and not wrote:
            # nothing of the run is there (the reason was printed): no empty run directory
            shutil.rmtree(run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):  # and no empty outputs/ either
                run_dir.parent.rmdir()
        if multirun and stopped and os.getpid() != int(os.environ.get(SWEEP_PID_ENV, -1)):
            # a worker process whose cell the sweep's signal stopped (its run is KILLED, its
            # checkpoint written) ends here: otherwise it idles on, holding the sweep's output
            # pipe, until its pool notices the parent is gone
            sys.stderr.flush()
            os._exit(stopped)


def _prepare_tracking(cells: list[list[str]]) -> Any:
    """Create the MLflow store and experiment once, before parallel jobs race to create them."""
    from harness.tracking import Tracker

    cfg = compose_config(cells[0])
    if cfg.tracking.enabled:
        Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    return cfg


def run(command: str, args: list[str]) -> None:
    """``rlbench train|sweep`` with ``args`` (overrides and Hydra flags)."""
    multirun = command == "sweep"
    if not (CONF_DIR / "config.yaml").is_file():  # an install that lost its package data
        fail(f"rlbench's configs are missing: no config.yaml in {CONF_DIR} (conf/ ships with "
             "the package; reinstall rlbench)")
    flags, overrides = split_flags(args)
    register_schema()
    if "--help" in flags or "-h" in flags or "--hydra-help" in flags or "--info" in flags \
            or "-i" in flags:
        _hydra_main(overrides, _flag_args(flags), multirun=False)
        return
    printing = "--cfg" in flags or "-c" in flags  # nothing runs: no hardware needed
    cells = preflight(overrides, multirun, hardware=not printing)
    if printing:
        print_cfg(cells, flags)
        return
    if not multirun:
        _hydra_main(overrides, _flag_args(flags), multirun=False)
        return
    cfg = _prepare_tracking(cells)
    markers = tempfile.mkdtemp(prefix="rlbench-sweep-")
    os.environ.update({CELLS_ENV: str(len(cells)), MARKERS_ENV: markers,
                       START_ENV: str(time.time()), SWEEP_PID_ENV: str(os.getpid())})
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    log.info("sweep: %d cells", len(cells))
    _stop_cells_with_the_sweep()
    try:
        _hydra_main(overrides, _flag_args(flags), multirun=True)
    finally:
        done = [p.suffix for p in Path(markers).iterdir()]
        shutil.rmtree(markers, ignore_errors=True)
        elapsed = format_seconds(time.time() - float(os.environ[START_ENV]))
        # printed, not logged: Hydra's job logging of the last cell owns the handlers by now
        lines = [f"sweep finished in {elapsed}: {len(done)}/{len(cells)} cells "
                 f"({done.count('.done')} trained, {done.count('.skipped')} skipped as "
                 f"FINISHED, {done.count('.busy')} skipped as claimed by another process, "
                 f"{done.count('.failed')} failed)"]
        if cfg.tracking.enabled:
            from harness.tracking import resolve_tracking_uri

            lines.append(f"  MLflow: {resolve_tracking_uri(cfg.tracking.uri)} (experiment "
                         f"{cfg.tracking.experiment!r}); leaderboards: rlbench board "
                         f"--experiment {cfg.tracking.experiment}; browse: rlbench ui")
        print("\n".join(lines), file=sys.stderr, flush=True)


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux /proc; empty elsewhere)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid ...: comm may hold spaces and parentheses
            if int(entry.read_text().rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.parent.name))
    return out


def _stop_cells_with_the_sweep() -> None:
    """Forward SIGTERM/SIGINT from the sweep's process to its children, then end it as the
    signal would. Joblib's loky workers run the cells in child processes: a ``kill <pid>`` of
    the sweep (or a scheduler stopping it) reaches the parent alone, and the orphaned workers
    trained on, unseen, into the next sweep's time and store. Forwarded, each cell stops at a
    step boundary as a run does (a checkpoint, its MLflow run marked KILLED:
    harness/run_status.py) and a rerun of the sweep resumes it. A cell running in this process
    (the basic launcher) has the loop's own handler in place while it trains."""
    def forward(signum: int, _frame: Any) -> None:
        for child in _children(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signum)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            signal.signal(sig, forward)


def _flag_args(flags: dict[str, str | None]) -> list[str]:
    out: list[str] = []
    for name, value in flags.items():
        out += [name] if value is None else [name, value]
    return out


def _hydra_main(overrides: list[str], flags: list[str], multirun: bool) -> None:
    import hydra

    argv = ["rlbench", *(["--multirun"] if multirun else []), *flags,
            *with_searchpath(overrides)]
    saved, sys.argv = sys.argv, argv
    try:
        hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(
            _train_job)()
    finally:
        sys.argv = saved
