"""``rlbench board``: leaderboards from MLflow queries (built by :mod:`harness.report.board`).

``--runs PATH`` builds from exported runs (``runs.jsonl.gz``, or every one under a committed
board's folder) loaded into a fresh temporary MLflow store, so a committed board can be rebuilt
from the clone alone: ``rlbench board <the command printed on it> --runs leaderboards/<name>``.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

from harness.report.config import BoardError


def exports(paths: list[str]) -> list[Path]:
    found: dict[Path, Path] = {}  # a folder and a file inside it name one export once
    for raw in paths:
        path = Path(raw)
        files = sorted(path.glob("**/runs.jsonl.gz")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise BoardError(f"--runs {raw}: no runs.jsonl.gz there; give an export written by "
                             "rlbench board or rlbench export, or a folder holding some")
        found.update((f.resolve(), f) for f in files if f.resolve() not in found)
    return list(found.values())


def load_exports(paths: list[str], uri: str, experiment: str) -> None:
    from harness.report.provenance import import_runs

    for export in exports(paths):
        try:  # a run in two exports (a store that imported another's runs) is one run
            import_runs(export, uri, experiment, skip_present=True)
        # a damaged or foreign file fails anywhere in gzip, json or MLflow's own checks (some
        # raise a bare Exception); the message keeps the cause
        except Exception as exc:
            raise BoardError(f"--runs {export}: not a runs export written by rlbench board "
                             f"({type(exc).__name__}: {str(exc)[:200]})") from None


def cmd_board(args: argparse.Namespace) -> None:
    from harness.report.board import build_leaderboards
    from harness.tracking import resolve_tracking_uri

    if args.runs:
        if args.track:
            raise BoardError(f"--runs builds an rlbench board; track {args.track!r} has its "
                             "own (drop --runs)")
        if args.uri:
            raise BoardError("--runs loads the exports into a fresh store of its own; "
                             "drop --tracking-uri")
        if not args.experiment:  # an export does not hold it; the pages and Reproduce line do
            raise BoardError("--runs needs --experiment: the name on the board's page "
                             "(`Experiment:`), e.g. --experiment code-tiny")
    if args.track:  # a track's board has its own default experiment and output dir
        from harness.registry import TRACKS

        for path in TRACKS.get(args.track).build_board(
                resolve_tracking_uri(args.uri), args.experiment, args.out,
                log_to_mlflow=args.mlflow, allow_dirty=args.allow_dirty):
            print(path)
        return
    args.experiment = args.experiment or "rlbench"
    args.out = args.out or "leaderboards"
    with contextlib.ExitStack() as stack:
        uri = resolve_tracking_uri(args.uri)
        if args.runs:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rlbench-board-"))
            uri = f"sqlite:///{Path(tmp) / 'runs.db'}"
            load_exports(args.runs, uri, args.experiment)
        written = build_leaderboards(uri, args.experiment, args.out,
                                     baseline=args.baseline, config=args.config,
                                     # a temporary store is deleted: nothing to log into
                                     log_to_mlflow=args.mlflow and not args.runs,
                                     variant=tuple(args.variant),
                                     allow_dirty=args.allow_dirty, export=args.export,
                                     suite=args.suite, suite_reps=args.suite_reps,
                                     runs=tuple(args.runs))
    for path in written:
        print(path)
