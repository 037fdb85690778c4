"""``rlbench export`` and ``rlbench import``: a sweep's finished runs carried to another store.

A sweep continues from its MLflow store (a FINISHED cell is skipped by its config hash, an
unfinished one resumes from its checkpoint), but only where that store is. On machines that are
stopped after a few hours and may not come back:

* ``rlbench export --experiment NAME --out runs.jsonl.gz`` writes the experiment's FINISHED
  training runs (run info, tags, params, every metric's history; the format of a board's
  ``runs.jsonl.gz``) to one file to commit or copy;
* ``rlbench import --runs runs.jsonl.gz --experiment NAME`` loads exports (files, or folders
  holding some) into that experiment of this store, each run once: a run whose original id is
  already there is left out, so importing an export again, or an export of a store that itself
  imported, adds nothing twice;
* ``rlbench sweep ...`` on this store then skips the imported cells (they carry their
  ``rlbench.config_hash`` tag) and trains the rest. A cell that had not finished starts afresh
  here: its checkpoint stays on the machine that wrote it, and runs in other statuses are not
  exported.

Stores that never meet merge at the board: ``rlbench board --runs a.jsonl.gz --runs b.jsonl.gz``
loads several exports into one temporary store and refuses a cell found in more than one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.report.config import BoardError


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", default="rlbench", help="default: rlbench")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the export to write (runs.jsonl.gz: gzipped JSON lines)")
    p.add_argument("--tracking-uri", "--uri", dest="uri", default=None,
                   help="tracking URI (default: as for runs)")


def add_import_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", action="append", required=True, metavar="PATH",
                   help="an export (runs.jsonl.gz) or a folder holding some (repeatable)")
    p.add_argument("--experiment", default="rlbench",
                   help="the experiment to load them into (default: rlbench); a sweep's is "
                        "its tracking.experiment")
    p.add_argument("--tracking-uri", "--uri", dest="uri", default=None,
                   help="tracking URI (default: as for runs)")


def cmd_export(args: argparse.Namespace) -> None:
    from mlflow.entities import ViewType

    from harness.claims import is_claim_experiment
    from harness.report.provenance import export_runs
    from harness.tracking import open_client, resolve_tracking_uri

    uri = resolve_tracking_uri(args.uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):].split("?")[0]).is_file():
        raise BoardError(f"no MLflow store at {uri}: give the one the runs were logged to "
                         "(--tracking-uri, or MLFLOW_TRACKING_URI)")
    client = open_client(uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None or exp.lifecycle_stage != "active":
        names = sorted(e.name for e in client.search_experiments(ViewType.ACTIVE_ONLY)
                       if not is_claim_experiment(e.name))
        raise BoardError(f"--experiment {args.experiment!r}: no such experiment at {uri}; "
                         f"existing: {', '.join(map(repr, names)) or '(none)'}")
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED'",
                              max_results=50000)
    train = [r.info.run_id for r in runs if r.data.tags.get("rlbench.kind", "train") == "train"]
    if not train:
        raise BoardError(f"--experiment {args.experiment!r} at {uri} has no FINISHED training "
                         "runs to export")
    out = Path(args.out)
    if not out.parent.is_dir():
        raise BoardError(f"--out {args.out}: the folder {out.parent} does not exist")
    export_runs(client, train, out)
    print(f"exported {len(train)} FINISHED training run(s) of {args.experiment!r} to {out}")


def cmd_import(args: argparse.Namespace) -> None:
    from harness.cli.board import exports
    from harness.report.provenance import import_runs
    from harness.tracking import open_client, resolve_tracking_uri

    uri = resolve_tracking_uri(args.uri)
    open_client(uri)  # a new store's schema is created under its lock
    loaded = skipped = 0
    for export in exports(args.runs):
        try:
            new, old = import_runs(export, uri, args.experiment, skip_present=True)
        # a damaged or foreign file fails anywhere in gzip, json or MLflow's own checks
        except Exception as exc:
            raise BoardError(f"--runs {export}: not a runs export written by rlbench "
                             f"({type(exc).__name__}: {str(exc)[:200]})") from None
        loaded, skipped = loaded + new, skipped + old
        print(f"{export}: {new} run(s) loaded, {old} already in {args.experiment!r}")
    print(f"imported {loaded} run(s) into {args.experiment!r} at {uri} ({skipped} already "
          "there); a sweep on this store skips their cells")
