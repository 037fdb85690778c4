"""Sweeps under load (issue 32, item 3): do concurrent ``rlbench train`` cells lose anything?

A Hydra sweep on the joblib, submitit or Ray launcher runs many cells at once against one MLflow
store. This script launches ``--cells`` real ``python -m harness.cli train`` processes at the same
moment against

* ``sqlite``: one SQLite file (the default store, no server), and
* ``server``: an MLflow tracking server (several uvicorn workers) whose backend store is a real
  PostgreSQL 15 cluster started here from the distribution's binaries (a team's set-up),

and checks, cell by cell, that what the cell says it logged is what the store holds. Each cell
writes ``<trainer.output_dir>/logged.json`` at the end of its run::

    {"run_id": "<32 hex>", "metrics": {"<key>": <values logged>}, "params": <params logged>,
     "tags": {"<key>": "<value>"}}

and the store is read back with ``MlflowClient``: every key's ``get_metric_history`` length, the
run's param count, every logged tag with its value; runs are grouped by the tag
``rlbench.config_hash`` (a hash with more than one run is a cell trained twice).

Two more races are measured:

* ``duplicate_launch``: the same cell (same config, its own output dir) launched twice, one second
  apart, while the first still runs. Expected: one run with that config hash, both exit 0, the
  later process says the cell is ``claimed`` by the live one and skips.
* ``fresh_store_race``: N processes open a store that does not exist yet at the same moment
  (MLflow creates the schema with Alembic migrations on first use; on SQLite concurrent
  migrations collide: ``table _alembic_tmp_... already exists``, ``duplicate column name``).

Nothing is downloaded: the tiny model is warm-started locally (a short warm start, as the tests'
``FAST_PRETRAIN``) into a cache shared by all cells, built once before they start.

Usage::

    python benchmarks/store_concurrency.py --store sqlite --cells 8
    python benchmarks/store_concurrency.py --store server --cells 8 --workers 4
    python benchmarks/store_concurrency.py --store both --keep /tmp/concurrency

The same functions back ``tests/engine/test_store_concurrency.py``; starting and stopping PostgreSQL
and the MLflow server is ``benchmarks/stores.py``'s (re-exported here).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _load_stores() -> Any:
    """``stores.py`` beside this file, loaded by path once per process (benchmarks/ is not a
    package: this file runs as a script and the test loads it by path)."""
    name = "rlbench_bench_stores"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("stores.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


_stores = _load_stores()
# re-exported: the test and other callers use them as this module's names
TAIL, PG_USER, PG_DB = _stores.TAIL, _stores.PG_USER, _stores.PG_DB
free_port, _tail, _stop_group = _stores.free_port, _stores._tail, _stores._stop_group
postgres_bin, postgres_unavailable = _stores.postgres_bin, _stores.postgres_unavailable
start_postgres, create_database = _stores.start_postgres, _stores.create_database
start_mlflow_server = _stores.start_mlflow_server

HASH_TAG = "rlbench.config_hash"
# A short warm start of the tiny model (as tests/conftest.py FAST_PRETRAIN); part of the model's
# cache key, so every process here passes the same values and finds the one cached copy.
FAST_PRETRAIN = ("model.pretrain.steps=30", "model.pretrain.batch_size=64")
# One cell: three GRPO steps on tiny Countdown, a small evaluation at steps 0 and 3. About 5 s of
# CPU after imports, so 8 cells overlap for most of their runs on a 2-core machine.
CELL = (
    "algorithm=grpo", "task=countdown", "model=tiny",
    "trainer.steps=3", "trainer.eval_every=3", "trainer.checkpoint_every=3",
    "data.prompts_per_step=4", "rollout.n=4",
    "task.tiny.eval.heldout.limit=8", "task.tiny.eval.heldout.n=4",
    "task.tiny.eval.heldout.k=[1,4]",
    "backend.threads=1", "trainer.status_every=0",
)


# -- helpers ------------------------------------------------------------------------------------
def _cell_env(tracking_uri: str, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env["RLBENCH_CACHE"] = str(cache)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("RLBENCH_COMMAND", None)
    return env


# -- cells --------------------------------------------------------------------------------------
def ensure_model(cache: Path, timeout_s: float = 600) -> None:
    """Warm-start (or find cached) the tiny model in ``cache`` once, before any cell starts, so
    the cells race on the store and not on building the model."""
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, RLBENCH_CACHE=str(cache))
    out = subprocess.run([sys.executable, "-m", "harness.cli", "pretrain", "model=tiny",
                          "task=countdown", *FAST_PRETRAIN], env=env, cwd=cache,
                         capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"rlbench pretrain exited {out.returncode}:\n{out.stderr[-TAIL:]}")


def _launch(tracking_uri: str, cell_dir: Path, cache: Path, overrides: Sequence[str]
            ) -> subprocess.Popen:
    """Start one cell. Its stdout/stderr and command go to ``cell_dir``; its output dir (and
    Hydra's run dir, cli.log) is ``cell_dir/out``, apart, because a cell that skips removes the
    output dir it made."""
    out_dir = cell_dir / "out"
    cell_dir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "harness.cli", "train", *CELL, *FAST_PRETRAIN,
            f"tracking.uri={tracking_uri}", f"trainer.output_dir={out_dir}",
            f"hydra.run.dir={out_dir}", *overrides]
    (cell_dir / "command.json").write_text(json.dumps(args))
    with open(cell_dir / "stdout.log", "wb") as so, open(cell_dir / "stderr.log", "wb") as se:
        return subprocess.Popen(args, stdout=so, stderr=se, cwd=cell_dir,
                                env=_cell_env(tracking_uri, cache), start_new_session=True)


def _wait_all(procs: Sequence[subprocess.Popen], deadline: float) -> list[int | None]:
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            _stop_group(proc, grace_s=10)
            codes.append(None)  # timed out
    return codes


def read_logged(out_dir: Path) -> dict[str, Any] | None:
    """The cell's own record of what it logged, or None when it wrote none."""
    path = Path(out_dir) / "logged.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check_run(client: Any, logged: dict[str, Any], label: str = "") -> dict[str, Any]:
    """Compare one cell's ``logged.json`` record with what the store holds for its run.

    Counts found are capped at the counts expected per key (a key with extra values is listed
    apart, as ``extra``), so ``found == expected`` means nothing was lost."""
    run_id = logged["run_id"]
    res: dict[str, Any] = {"metrics_expected": 0, "metrics_found": 0, "params_expected": 0,
                           "params_found": 0, "tags_expected": 0, "tags_found": 0,
                           "missing": [], "extra": [], "status": None}
    try:
        run = client.get_run(run_id)
    except Exception as exc:
        res["missing"].append(f"{label}run {run_id}: {type(exc).__name__}: {exc}"[:300])
        run = None
    metrics = logged.get("metrics", {})
    res["metrics_expected"] = sum(int(n) for n in metrics.values())
    res["params_expected"] = int(logged.get("params", 0))
    tags = logged.get("tags", {})
    res["tags_expected"] = len(tags)
    if run is None:
        return res
    res["status"] = run.info.status
    for key, n in sorted(metrics.items()):
        got = len(client.get_metric_history(run_id, key))
        res["metrics_found"] += min(got, int(n))
        if got < int(n):
            res["missing"].append(f"{label}metric {key}: {got} of {n} values")
        elif got > int(n):
            res["extra"].append(f"{label}metric {key}: {got} values, {n} logged")
    res["params_found"] = min(len(run.data.params), res["params_expected"])
    if len(run.data.params) < res["params_expected"]:
        res["missing"].append(f"{label}params: {len(run.data.params)} of "
                              f"{res['params_expected']}")
    for key, value in sorted(tags.items()):
        have = run.data.tags.get(key)
        if have == str(value):
            res["tags_found"] += 1
        else:
            res["missing"].append(f"{label}tag {key}: {have!r}, logged {value!r}"[:300])
    if run.info.status != "FINISHED":
        res["missing"].append(f"{label}run {run_id} is {run.info.status}, not FINISHED")
    return res


def runs_by_hash(client: Any, experiment: str) -> dict[str, list[str]]:
    """Training runs of ``experiment`` grouped by their config hash tag (run ids)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}
    groups: dict[str, list[str]] = {}
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        for run in page:
            if run.data.tags.get("rlbench.kind", "train") != "train":
                continue
            groups.setdefault(run.data.tags.get(HASH_TAG, "<no hash>"), []).append(
                run.info.run_id)
        token = page.token
        if not token:
            return groups


def open_store(tracking_uri: str, experiment: str) -> None:
    """Create the store (schema) and the experiment, as the harness does, before the cells start:
    creating a new store from several processes at once is :func:`fresh_store_race`'s subject,
    kept apart so a failure there does not read as a lost run here."""
    from harness.tracking import Tracker

    Tracker(tracking_uri, experiment)


def _prepare(workdir: Path, cache: Path | None, build_model: bool, tracking_uri: str,
             experiment: str) -> tuple[Path, Path]:
    """The resolved workdir and model cache (the tiny model built there when asked), and the
    store and experiment created before any cell starts."""
    workdir = Path(workdir).resolve()
    cache = Path(cache) if cache else workdir / "model-cache"
    if build_model:
        ensure_model(cache)
    open_store(tracking_uri, experiment)
    return workdir, cache


def run_cells(tracking_uri: str, workdir: Path, cells: int = 8, *, cache: Path | None = None,
              experiment: str = "store-concurrency", seed0: int = 0, build_model: bool = True,
              extra: Sequence[str] = (), timeout_s: float = 900) -> dict[str, Any]:
    """Launch ``cells`` ``rlbench train`` processes at once (seeds ``seed0..``) on a store
    created beforehand (:func:`open_store`), wait for all, then compare each cell's
    ``logged.json`` with the store. Returns the totals, what is missing and per-cell details
    (exit code, stderr tail)."""
    from mlflow.tracking import MlflowClient

    workdir, cache = _prepare(workdir, cache, build_model, tracking_uri, experiment)
    t0 = time.monotonic()
    dirs = [workdir / f"cell{i}" for i in range(cells)]
    procs = [_launch(tracking_uri, d, cache,
                     [f"seed={seed0 + i}", f"tracking.experiment={experiment}", *extra])
             for i, d in enumerate(dirs)]
    codes = _wait_all(procs, t0 + timeout_s)
    wall = time.monotonic() - t0

    client = MlflowClient(tracking_uri)
    totals = Counter()
    missing: list[str] = []
    extra_values: list[str] = []
    per_cell = []
    run_ids = set()
    for i, (d, code) in enumerate(zip(dirs, codes)):
        cell = {"cell": i, "exit": code, "stderr_tail": _tail(d / "stderr.log", 1500)}
        if code != 0:
            missing.append(f"cell{i}: exit {code}")
        logged = read_logged(d / "out")
        if logged is None:
            missing.append(f"cell{i}: no logged.json")
        else:
            res = check_run(client, logged, label=f"cell{i} ")
            run_ids.add(logged["run_id"])
            cell.update(run_id=logged["run_id"], status=res["status"])
            for key in ("metrics_expected", "metrics_found", "params_expected", "params_found",
                        "tags_expected", "tags_found"):
                totals[key] += res[key]
            missing += res["missing"]
            extra_values += res["extra"]
        per_cell.append(cell)
    groups = runs_by_hash(client, experiment)
    return {
        "store": tracking_uri, "cells": cells, "exit_codes": codes,
        "runs_found": sum(len(v) for v in groups.values()),
        "distinct_run_ids_logged": len(run_ids),
        **{k: totals[k] for k in ("metrics_expected", "metrics_found", "params_expected",
                                  "params_found", "tags_expected", "tags_found")},
        "missing": missing, "extra": extra_values,
        "cells_trained_twice": sum(1 for v in groups.values() if len(v) > 1),
        "wall_s": round(wall, 1), "per_cell": per_cell,
    }


def duplicate_launch(tracking_uri: str, workdir: Path, copies: int = 2, delay_s: float = 1.0,
                     *, cache: Path | None = None, experiment: str = "duplicate-launch",
                     seed: int = 100, build_model: bool = True, timeout_s: float = 600
                     ) -> dict[str, Any]:
    """Launch one cell ``copies`` times, ``delay_s`` apart (same config, each copy its own output
    dir, which is not part of the cell's identity), into an experiment of its own. Returns the
    runs per config hash, exit codes, stderr tails, whether the first copy was still running when
    each later one started, and which copies said ``claimed``."""
    from mlflow.tracking import MlflowClient

    workdir, cache = _prepare(workdir, cache, build_model, tracking_uri, experiment)
    t0 = time.monotonic()
    procs, first_running = [], []
    dirs = [workdir / f"copy{i}" for i in range(copies)]
    for i, d in enumerate(dirs):
        if i:
            time.sleep(delay_s)
            first_running.append(procs[0].poll() is None)
        procs.append(_launch(tracking_uri, d, cache,
                             [f"seed={seed}", f"tracking.experiment={experiment}"]))
    codes = _wait_all(procs, t0 + timeout_s)
    tails = [_tail(d / "stderr.log", 1500) for d in dirs]
    groups = runs_by_hash(MlflowClient(tracking_uri), experiment)
    return {
        "store": tracking_uri, "copies": copies, "delay_s": delay_s,
        "runs": sum(len(v) for v in groups.values()),
        "runs_per_hash": {k: len(v) for k, v in groups.items()},
        "exit_codes": codes, "first_still_running": first_running,
        "claimed": ["claimed" in _tail(d / "stderr.log", 10**6) for d in dirs],
        "stderr_tails": tails, "wall_s": round(time.monotonic() - t0, 1),
    }


def _error_line(stderr: str) -> str:
    """The exception line of a traceback (``pkg.SomeError: text``), else the last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit)\b.*:", line):
            return line[:300]
    return lines[-1][:300] if lines else "(no output)"


def fresh_store_race(tracking_uri_factory: Callable[[], str], processes: int = 8,
                     experiment: str = "race", timeout_s: float = 180) -> dict[str, Any]:
    """``processes`` processes open the same not-yet-existing store at once (``Tracker``:
    MlflowClient + get-or-create the experiment), as the first cells of a sweep do. The factory
    is called once and returns that store's URI. Returns exit codes and stderr tails."""
    uri = tracking_uri_factory()
    code = ("import sys; from harness.tracking import Tracker; "
            "Tracker(sys.argv[1], sys.argv[2])")
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    t0 = time.monotonic()
    # not the repository as cwd: ``-c`` puts the cwd first on sys.path, ahead of PYTHONPATH
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, experiment], env=env,
                              cwd=tempfile.gettempdir(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(processes)]
    codes, tails = [], []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(1.0, t0 + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop_group(proc, grace_s=10)
            _, err = proc.communicate()
            codes.append(None)
        else:
            codes.append(proc.returncode)
        tails.append(err[-TAIL:])
    errors = Counter(_error_line(t) for c, t in zip(codes, tails) if c != 0)
    return {"store": uri, "processes": processes, "exit_codes": codes,
            "failed": sum(1 for c in codes if c != 0), "errors": dict(errors),
            "stderr_tails": tails, "wall_s": round(time.monotonic() - t0, 1)}


# -- report -------------------------------------------------------------------------------------
def cells_table(results: dict[str, dict[str, Any]]) -> str:
    """A markdown table, one row per store."""
    head = ("| store | cells | runs | metrics exp/found | params exp/found | tags exp/found "
            "| trained twice | failed cells | wall s |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        failed = sum(1 for c in r["exit_codes"] if c != 0)
        lines.append(f"| {name} | {r['cells']} | {r['runs_found']} | {r['metrics_expected']}/"
                     f"{r['metrics_found']} | {r['params_expected']}/{r['params_found']} | "
                     f"{r['tags_expected']}/{r['tags_found']} | {r['cells_trained_twice']} | "
                     f"{failed} | {r['wall_s']} |")
    return "\n".join(lines)


def _print_cells(name: str, r: dict[str, Any]) -> None:
    print(f"\n### {r['cells']} concurrent cells: {name}\n")
    print(cells_table({name: r}))
    if r["missing"]:
        print(f"\nmissing ({len(r['missing'])}):")
        for item in r["missing"][:40]:
            print(f"- {item}")
    if r["extra"]:
        print(f"\nextra values ({len(r['extra'])}): " + "; ".join(r["extra"][:10]))
    for cell in r["per_cell"]:
        if cell["exit"] != 0:
            print(f"\ncell{cell['cell']} exit {cell['exit']}, stderr tail:\n"
                  + "\n".join(cell["stderr_tail"].splitlines()[-8:]))


def _print_duplicate(name: str, d: dict[str, Any]) -> None:
    print(f"\n### same cell launched {d['copies']}x, {d['delay_s']} s apart: {name}\n")
    print("| runs of the cell | runs per hash | exit codes | first still running | said claimed "
          "| wall s |\n|---|---|---|---|---|---|")
    print(f"| {d['runs']} | {d['runs_per_hash']} | {d['exit_codes']} | "
          f"{d['first_still_running']} | {d['claimed']} | {d['wall_s']} |")
    for i, (code, tail) in enumerate(zip(d["exit_codes"], d["stderr_tails"])):
        print(f"\ncopy{i} (exit {code}), last lines:\n"
              + "\n".join(tail.splitlines()[-4:]))


def _print_race(name: str, f: dict[str, Any]) -> None:
    print(f"\n### fresh store opened by {f['processes']} processes at once: {name}\n")
    print(f"exit codes {f['exit_codes']}: {f['failed']} failed ({f['wall_s']} s)")
    for line, n in f["errors"].items():
        print(f"- {n}x {line[:200]}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", choices=("sqlite", "server", "both"), default="both")
    p.add_argument("--cells", type=int, default=8)
    p.add_argument("--workers", type=int, default=4, help="mlflow server workers (default 4)")
    p.add_argument("--copies", type=int, default=2, help="duplicate launch: copies of one cell")
    p.add_argument("--delay", type=float, default=1.0, help="duplicate launch: seconds apart")
    p.add_argument("--race", type=int, default=8, help="fresh store: processes at once")
    p.add_argument("--keep", type=Path, default=None,
                   help="work directory to keep (default: a temporary one, removed)")
    p.add_argument("--json", type=Path, default=None, help="also write all results here")
    args = p.parse_args(argv)

    work = args.keep or Path(tempfile.mkdtemp(prefix="rlbench-concurrency-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "model-cache"
    results: dict[str, Any] = {}
    stops: list[Callable[[], None]] = []
    try:
        t = time.monotonic()
        ensure_model(cache)
        print(f"tiny model ready in {cache} ({time.monotonic() - t:.0f} s)")
        if args.store in ("sqlite", "both"):
            d = work / "sqlite"
            d.mkdir(exist_ok=True)
            uri = f"sqlite:///{d / 'mlruns.db'}"
            results["sqlite_race"] = fresh_store_race(lambda: f"sqlite:///{d / 'fresh.db'}",
                                                      args.race)
            _print_race("SQLite", results["sqlite_race"])
            results["sqlite_cells"] = run_cells(uri, d / "cells", args.cells, cache=cache,
                                                build_model=False)
            _print_cells("SQLite", results["sqlite_cells"])
            results["sqlite_duplicate"] = duplicate_launch(uri, d / "dup", args.copies,
                                                           args.delay, cache=cache,
                                                           build_model=False)
            _print_duplicate("SQLite", results["sqlite_duplicate"])
        if args.store in ("server", "both"):
            d = work / "server"
            t = time.monotonic()
            pg_uri, stop_pg = start_postgres(d)
            stops.append(stop_pg)
            results["postgres_race"] = fresh_store_race(
                lambda: create_database(pg_uri, "fresh"), args.race)
            _print_race("PostgreSQL (direct, no server)", results["postgres_race"])
            base, stop_server = start_mlflow_server(pg_uri, d, workers=args.workers)
            stops.append(stop_server)
            print(f"\nPostgreSQL + mlflow server ({args.workers} workers) up in "
                  f"{time.monotonic() - t:.0f} s: {base}")
            results["server_cells"] = run_cells(base, d / "cells", args.cells, cache=cache,
                                                build_model=False)
            _print_cells(f"mlflow server on PostgreSQL, {args.workers} workers",
                         results["server_cells"])
            results["server_duplicate"] = duplicate_launch(base, d / "dup", args.copies,
                                                           args.delay, cache=cache,
                                                           build_model=False)
            _print_duplicate("mlflow server on PostgreSQL", results["server_duplicate"])
    finally:
        for stop in reversed(stops):
            with contextlib.suppress(Exception):
                stop()
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    ok = all(not r.get("missing") and not r.get("cells_trained_twice")
             for k, r in results.items() if k.endswith("_cells"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
