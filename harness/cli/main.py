"""The ``rlbench`` entry point: one subcommand per module of this package.

Each subcommand is a ``Command`` in :data:`COMMANDS`: a name, a help line, a function that adds its
arguments to its argparse parser, and a function that runs it. ``train``, ``sweep`` and ``eval``
take Hydra overrides (``key=value``) and are parsed by Hydra, not argparse. A new subcommand is a
module with those two functions and one line in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass

from harness.cli.errors import guarded

USAGE = """\
rlbench: a benchmark harness for RL with verifiable rewards.

  rlbench demo                                  the default job: warm start, 18 runs, leaderboard
  rlbench list [algorithms|tasks|models|backends|verifiers|matrix]
  rlbench pretrain model=tiny task=countdown    warm-start (and cache) the tiny model
  rlbench train algorithm=grpo task=countdown model=tiny seed=0 [key=value ...]
  rlbench sweep algorithm=grpo,dr_grpo seed=0,1,2 [hydra/launcher=joblib ...]
  rlbench sweep sweep=countdown_baselines       a named sweep from conf/sweep/
  rlbench eval run_id=<id> | checkpoint=<dir> [key=value ...]
  rlbench board [--experiment NAME] [--out DIR]  leaderboards from MLflow runs
  rlbench board --suite --experiment suite      ... and the suite's cross-task aggregate
  rlbench board ... --runs leaderboards/NAME     ... from a committed board's exported runs
  rlbench export --experiment NAME --out F      a store's finished runs, to carry elsewhere
  rlbench import --runs F --experiment NAME     ... loaded into this store: a sweep skips them
  rlbench claims [--out docs/claims.md]         the claims ledger from the committed boards
  rlbench ui [--port 5000]                      the MLflow UI on 127.0.0.1 (runs view)
  rlbench train|sweep track=lantern ...         a track outside the LLM loop

train and sweep are Hydra apps: every key=value is an override; `rlbench train --help` lists
the config groups, `--cfg job` prints the resolved config. Bring your own model, data and
reward: model=hf model.path=<dir>, task=custom (docs/bring-your-own.md).
Exit status: 0 ok, 1 failed run, 2 bad input, 128+N killed by signal N."""

HYDRA_COMMANDS = ("train", "sweep", "eval")
LIST_KINDS = ("algorithms", "tasks", "models", "backends", "verifiers", "matrix")


@dataclass
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list[str]], None]


# -- list ---------------------------------------------------------------------------------------
def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", nargs="?", choices=LIST_KINDS)


def _list(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.listing import cmd_list

    cmd_list([args.kind] if args.kind else LIST_KINDS)


# -- pretrain -----------------------------------------------------------------------------------
def _pretrain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")


def _pretrain(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.pretrain import cmd_pretrain

    guarded(cmd_pretrain, rest, args.force)


# -- board --------------------------------------------------------------------------------------
def _board_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--suite", action="store_true",
                   help="also the cross-task aggregate (IQM, mean, P(> grpo), performance "
                        "profiles; rliable) in <out>/aggregate, beside the per-task boards")
    p.add_argument("--suite-reps", type=int, default=2000,
                   help="bootstrap resamples of the suite aggregate's intervals (default 2000)")
    p.add_argument("--track", default=None,
                   help="the leaderboard of a track outside the LLM loop (e.g. lantern)")
    p.add_argument("--runs", action="append", default=[], metavar="PATH",
                   help="build from exported runs (a runs.jsonl.gz, or a board folder holding "
                        "some) in a fresh temporary store instead of the tracking URI "
                        "(repeatable; nothing is logged to MLflow)")


def _board(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.board import cmd_board

    guarded(cmd_board, args)


def _power(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.power import cmd_power

    guarded(cmd_power, args)


def _power_arguments(p: argparse.ArgumentParser) -> None:
    from harness.cli.power import add_arguments

    add_arguments(p)


def _claims_arguments(p: argparse.ArgumentParser) -> None:
    from harness.cli.claims import add_arguments

    add_arguments(p)


def _claims(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.claims import cmd_claims

    guarded(cmd_claims, args)


# -- export, import: finished runs carried between stores --------------------------------------
def _export_arguments(p: argparse.ArgumentParser) -> None:
    from harness.cli.transfer import add_export_arguments

    add_export_arguments(p)


def _export(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.transfer import cmd_export

    guarded(cmd_export, args)


def _import_arguments(p: argparse.ArgumentParser) -> None:
    from harness.cli.transfer import add_import_arguments

    add_import_arguments(p)


def _import(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.transfer import cmd_import

    guarded(cmd_import, args)


# -- ui, demo -----------------------------------------------------------------------------------
def _ui_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--uri", default=None, help="tracking URI (default: as for runs)")
    p.add_argument("--experiment", default="rlbench",
                   help="the experiment whose runs the printed URL opens on (default rlbench)")


def _ui(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.ui import cmd_ui

    cmd_ui(args)


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None,
                   help="where the demo writes (default: ./rlbench-demo, untracked)")


def _demo(args: argparse.Namespace, rest: list[str]) -> None:
    from harness.cli.demo import run_demo

    guarded(run_demo, args.dir)


COMMANDS: list[Command] = [
    Command("demo", "warm start, sweep the baselines over seeds, build leaderboards",
            _demo_arguments, _demo),
    Command("list", "registered algorithms, tasks, models, backends, verifiers; the "
            "algorithm x task compatibility matrix",
            _list_arguments, _list),
    Command("pretrain", "warm-start and cache the tiny model", _pretrain_arguments, _pretrain),
    Command("board", "leaderboards from MLflow runs", _board_arguments, _board),
    Command("export", "a store's FINISHED training runs to one file (runs.jsonl.gz)",
            _export_arguments, _export),
    Command("import", "exported runs loaded into this store, once; a sweep skips their cells",
            _import_arguments, _import),
    Command("power", "seeds needed to detect an effect, planned from a pilot's runs",
            _power_arguments, _power),
    Command("claims", "the claims ledger (docs/claims.md) from the claim files and the boards",
            _claims_arguments, _claims),
    Command("ui", "MLflow UI on 127.0.0.1, opening on the runs", _ui_arguments, _ui),
]


def quiet_third_parties() -> None:
    """No downloads and no third-party progress bars: set before transformers or the Hugging
    Face hub are imported (they read these once)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # rlbench downloads nothing
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # "Loading weights" etc.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # not "Creating tables..."


def setup_logging() -> None:
    """Logging of the commands that are not Hydra apps (Hydra configures its own)."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    for name in ("transformers", "huggingface_hub", "mlflow", "alembic", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlbench", description=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in HYDRA_COMMANDS:
        sub.add_parser(name, help=f"{name} (Hydra overrides follow; {name} --help)",
                       add_help=False)
    for command in COMMANDS:
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_third_parties()
    # the command as typed, for MLflow's mlflow.source.name (Hydra rewrites sys.argv)
    os.environ.setdefault("RLBENCH_COMMAND", shlex.join(["rlbench", *argv]))
    if argv and argv[0] in HYDRA_COMMANDS:
        _hydra_command(argv[0], argv[1:])
        return
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "pretrain":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    setup_logging()
    {c.name: c for c in COMMANDS}[args.command].run(args, rest)


def _hydra_command(command: str, args: list[str]) -> None:
    from harness.cli.hydra_app import split_track

    track, args = split_track(args)
    if command == "eval":
        if any(a in ("-h", "--help") for a in args):
            from harness.cli import eval as eval_cli

            print(eval_cli.__doc__)
            return
        setup_logging()
        from harness.cli.eval import cmd_eval

        guarded(cmd_eval, args)
    elif track is not None:
        from harness.registry import TRACKS

        guarded(lambda: TRACKS.get(track).run_hydra(args, command == "sweep"))
    else:
        from harness.cli.hydra_app import run

        run(command, args)
