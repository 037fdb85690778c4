"""``rlbench board``: leaderboards from MLflow queries (built by :mod:`harness.report.board`)."""

from __future__ import annotations

import argparse


def cmd_board(args: argparse.Namespace) -> None:
    from harness.report.board import build_leaderboards
    from harness.tracking import resolve_tracking_uri

    if args.track:  # a track's board has its own default experiment and output dir
        from harness.registry import TRACKS

        for path in TRACKS.get(args.track).build_board(
                resolve_tracking_uri(args.uri), args.experiment, args.out,
                log_to_mlflow=args.mlflow, allow_dirty=args.allow_dirty):
            print(path)
        return
    args.experiment = args.experiment or "rlbench"
    args.out = args.out or "leaderboards"
    written = build_leaderboards(resolve_tracking_uri(args.uri), args.experiment, args.out,
                                 baseline=args.baseline, config=args.config,
                                 log_to_mlflow=args.mlflow, variant=tuple(args.variant),
                                 allow_dirty=args.allow_dirty, export=args.export,
                                 suite=args.suite, suite_reps=args.suite_reps)
    for path in written:
        print(path)
