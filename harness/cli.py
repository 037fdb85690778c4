"""The ``rlbench`` command line.

    rlbench demo                                   the embedded default main job
    rlbench list [algorithms|tasks|models|backends]
    rlbench pretrain model=tiny task=countdown     warm-start (and cache) the tiny model
    rlbench train algorithm=grpo task=countdown model=tiny seed=0 [key=value ...]
    rlbench sweep algorithm=grpo,dr_grpo seed=0,1,2 [hydra/launcher=joblib ...]   (multirun)
    rlbench sweep sweep=countdown_baselines        a named sweep from conf/sweep/
    rlbench eval [checkpoint=<dir> | run_id=<mlflow run id>] [key=value ...]   (MLflow-logged)
    rlbench board [--experiment NAME] [--out DIR] [--tracking-uri URI] [--baseline ALG]
                  [--config conf/board/default.yaml] [--variant FIELD] [--allow-dirty]
                  [--no-export] [--no-mlflow]
    rlbench ui [--port 5000]                       MLflow UI on 127.0.0.1
    rlbench train|sweep track=lantern [key=value ...]   a track outside the LLM loop (its own
    rlbench board --track lantern                        Hydra config, e.g. conf/lantern/)

``train`` and ``sweep`` are Hydra apps: every ``key=value`` is a Hydra override, and sweeps use
Hydra's launchers (basic, joblib, submitit_local / submitit_slurm, ray). A cell whose MLflow run
FINISHED with the same config hash is skipped; a killed one continues from its checkpoint.
Exit status: 0 ok, 1 failed run, 2 bad input (unknown name, bad key or value, missing path),
128+N killed by signal N.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
LIST_KINDS = ("algorithms", "tasks", "models", "backends")


def plugin_searchpath() -> list[str]:
    """Config packages of installed plugins (entry-point group ``rlbench.conf``, values such as
    ``my_plugin.conf``), so a plugin's ``algorithm/<name>.yaml`` joins the config groups."""
    return sorted(f"pkg://{ep.value}" for ep in entry_points(group="rlbench.conf"))


def with_searchpath(overrides: list[str]) -> list[str]:
    paths = plugin_searchpath()
    if not paths or any(o.startswith("hydra.searchpath") for o in overrides):
        return overrides
    return [*overrides, f"hydra.searchpath=[{','.join(paths)}]"]


def compose_config(overrides: list[str]) -> Any:
    """The resolved config for ``overrides`` through Hydra's compose API (no run dir)."""
    from hydra import compose, initialize_config_dir

    from harness.config import register_schema

    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=with_searchpath(overrides))


def _fail(message: str, code: int = 2) -> None:
    print(f"rlbench: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _guarded(fn: Any, *args: Any) -> Any:
    """Turn bad input into a one-line error and exit 2; interrupts into 128+signal."""
    from omegaconf.errors import OmegaConfBaseException

    from harness.components import ConfigError
    from harness.registry import RegistryError
    from harness.trainer import RunInterrupted

    try:
        return fn(*args)
    except (ConfigError, RegistryError, FileNotFoundError, OmegaConfBaseException) as exc:
        _fail(str(exc))
    except RunInterrupted as exc:
        print(f"rlbench: {exc}; the MLflow run is marked KILLED", file=sys.stderr)
        raise SystemExit(128 + int(exc.signum)) from None
    return None


def _cap_threads(cfg: Any, hydra_cfg: Any) -> None:
    """Parallel jobs of a local launcher share the cores: with ``backend.threads=0`` (torch's
    default, every core) each joblib worker would start one thread per core and they would fight.
    Give each job cores // n_jobs threads instead."""
    import os

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


def _train_job(cfg: Any) -> Any:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from harness.trainer import train

    hydra_cfg = HydraConfig.get()
    _cap_threads(cfg, hydra_cfg)
    # the job's own overrides, so a board can tell whether its named sweep alone reproduces it
    with open_dict(cfg.tracking.tags):
        cfg.tracking.tags["rlbench.overrides"] = json.dumps(list(hydra_cfg.overrides.task))
    return _guarded(train, cfg, hydra_cfg.runtime.output_dir)


def _prepare_tracking(overrides: list[str]) -> None:
    """Create the MLflow store and experiment once, before parallel jobs race to create them.
    Sweep values (``a,b``) are left out: only the tracking settings matter here."""
    from harness.tracking import Tracker

    fixed = [o for o in overrides if "," not in o.partition("=")[2] and not o.startswith("hydra")]
    try:
        cfg = compose_config(fixed)
    except Exception:  # Hydra reports bad overrides itself, naming the key
        return
    if cfg.tracking.enabled:
        Tracker(cfg.tracking.uri, cfg.tracking.experiment)


def _preflight(overrides: list[str]) -> None:
    """Compose the config once before Hydra's app runs, so that an unknown option, key or type
    exits 2 with Hydra's message (which names the key) instead of Hydra's generic exit 1."""
    import difflib

    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    try:
        compose_config(overrides)
    except MissingConfigException as exc:
        hint = ""
        missing = (exc.missing_cfg_file or "").rpartition("/")[2]
        close = difflib.get_close_matches(missing, exc.options or [], n=1)
        if close:
            hint = f"\nDid you mean {close[0]!r}?"
        _fail(f"{exc}{hint}")
    except (HydraException, OmegaConfBaseException) as exc:
        _fail(str(exc))


def run_hydra(overrides: list[str], multirun: bool) -> None:
    import hydra

    from harness.config import register_schema

    register_schema()
    if multirun:
        _prepare_tracking(overrides)
    else:
        _preflight(overrides)
    argv = ["rlbench", *(["--multirun"] if multirun else []), *with_searchpath(overrides)]
    saved, sys.argv = sys.argv, argv
    try:
        hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(
            _train_job
        )()
    finally:
        sys.argv = saved


def cmd_list(kind: str | None) -> None:
    from harness.registry import ALGORITHMS, BACKENDS, TASKS

    kinds = [kind] if kind else list(LIST_KINDS)
    for k in kinds:
        print(f"{k}:")
        if k == "algorithms":
            for name in ALGORITHMS.names():
                print(f"  {name:<20} {_first_line(ALGORITHMS.get(name).__doc__)}")
        elif k == "tasks":
            for name in TASKS.names():
                print(f"  {name:<20} {_first_line(TASKS.get(name).__doc__)}")
        elif k == "models":
            for path in sorted((CONF_DIR / "model").glob("*.yaml")):
                print(f"  {path.stem:<20} {_first_line(path.read_text().lstrip('# '))}")
        elif k == "backends":
            for path in sorted((CONF_DIR / "backend").glob("*.yaml")):
                print(f"  {path.stem:<20} {_first_line(path.read_text().lstrip('# '))}")
            print(f"  engines: {', '.join(BACKENDS.names())}")


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


def cmd_pretrain(overrides: list[str], force: bool) -> None:
    from harness.components import build
    from harness.config import validate_config
    from harness.registry import MODELS, TASKS

    cfg = compose_config(overrides)
    validate_config(cfg)
    task = build(TASKS, cfg.task, "task")
    path = MODELS.get(cfg.model.source)(cfg.model, task, progress=True, force=force)
    print(path)


def cmd_eval(overrides: list[str]) -> None:
    import json

    from harness.eval_cli import evaluate_checkpoint

    target = [o for o in overrides if o.startswith(("checkpoint=", "run_id="))]
    if len(target) > 1:
        _fail("eval takes at most one of checkpoint=<dir> or run_id=<mlflow run id> "
              "(neither: the configured model itself)")
    rest = [o for o in overrides if o not in target]
    key, _, value = target[0].partition("=") if target else ("model", "", "")
    metrics = evaluate_checkpoint(key, value, compose_config(rest))
    print(json.dumps(metrics, indent=2, sort_keys=True))


def split_track(overrides: list[str]) -> tuple[str | None, list[str]]:
    """``track=<name>`` picks a track outside the LLM training loop (``harness.registry.TRACKS``);
    the other overrides go to that track's own Hydra config."""
    tracks = [o for o in overrides if o.startswith("track=")]
    if not tracks:
        return None, overrides
    return tracks[-1].partition("=")[2], [o for o in overrides if not o.startswith("track=")]


def cmd_board(args: argparse.Namespace) -> None:
    from harness.report.board import build_leaderboards
    from harness.tracking import resolve_tracking_uri

    if args.track:  # a track's board has its own default experiment and output dir
        from harness.registry import TRACKS

        for path in TRACKS.get(args.track).build_board(
                resolve_tracking_uri(args.uri), args.experiment, args.out,
                log_to_mlflow=args.mlflow):
            print(path)
        return
    args.experiment = args.experiment or "rlbench"
    args.out = args.out or "leaderboards"
    written = build_leaderboards(resolve_tracking_uri(args.uri), args.experiment, args.out,
                                 baseline=args.baseline, config=args.config,
                                 log_to_mlflow=args.mlflow, variant=tuple(args.variant),
                                 allow_dirty=args.allow_dirty, export=args.export)
    for path in written:
        print(path)


def cmd_ui(args: argparse.Namespace) -> None:
    import subprocess

    from harness.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(args.uri)
    print(f"MLflow UI for {uri} on http://127.0.0.1:{args.port}  (Ctrl-C to stop)")
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--host", "127.0.0.1", "--port", str(args.port)]
    try:
        raise SystemExit(subprocess.call(cmd))
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="rlbench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="pretrain, sweep the baselines over seeds, build leaderboards")
    p = sub.add_parser("list", help="registered algorithms, tasks, models, backends")
    p.add_argument("kind", nargs="?", choices=LIST_KINDS)
    for name in ("train", "sweep", "eval"):
        sub.add_parser(name, help=f"{name} (Hydra overrides follow)", add_help=False)
    p = sub.add_parser("pretrain", help="warm-start and cache the tiny model")
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p = sub.add_parser("board", help="leaderboards from MLflow runs")
    p.add_argument("--experiment", default=None, help="default: rlbench (a track: its own)")
    p.add_argument("--out", default=None, help="default: leaderboards (a track: its own)")
    p.add_argument("--tracking-uri", "--uri", dest="uri", default=None,
                   help="tracking URI (default: as for runs)")
    p.add_argument("--baseline", default=None,
                   help="default baseline for paired differences (default: the board config's)")
    p.add_argument("--config", default=None,
                   help="board config: baseline and pairings (default conf/board/default.yaml)")
    p.add_argument("--no-mlflow", dest="mlflow", action="store_false",
                   help="do not log the leaderboards as MLflow runs")
    p.add_argument("--variant", action="append", default=[], metavar="FIELD",
                   help="a run field (params.<key> or tags.<tag>) whose value joins the row "
                        "label, splitting rows on it (repeatable)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="build from a checkout with uncommitted changes (the board says so)")
    p.add_argument("--no-export", dest="export", action="store_false",
                   help="do not write runs.jsonl.gz (the runs behind each board)")
    p.add_argument("--track", default=None,
                   help="the leaderboard of a track outside the LLM loop (e.g. lantern)")
    p = sub.add_parser("ui", help="MLflow UI on 127.0.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--uri", default=None)

    if argv and argv[0] in ("train", "sweep", "eval"):
        command, overrides = argv[0], argv[1:]
        if any(o in ("-h", "--help") for o in overrides):
            print(__doc__)
            return
        track, overrides = split_track(overrides)
        if command == "eval":
            _guarded(cmd_eval, overrides)
        elif track is not None:
            from harness.registry import TRACKS

            _guarded(lambda: TRACKS.get(track).run_hydra(overrides, command == "sweep"))
        else:
            run_hydra(overrides, multirun=command == "sweep")
        return
    args, rest = parser.parse_known_args(argv)
    if args.command == "pretrain":
        _guarded(cmd_pretrain, rest, args.force)
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "list":
        cmd_list(args.kind)
    elif args.command == "board":
        _guarded(cmd_board, args)
    elif args.command == "ui":
        cmd_ui(args)
    elif args.command == "demo":
        from harness.demo import run_demo

        _guarded(run_demo)


if __name__ == "__main__":
    main()
