"""MLflow tracking: the system of record for every run.

The tracking URI is ``tracking.uri`` when set, else ``$MLFLOW_TRACKING_URI`` (MLflow's own
convention), else a SQLite file ``mlruns.db`` in the working directory (embedded, no server).
Params are the flattened resolved config; metrics are logged in batches (one call per step);
a run always ends with a status: FINISHED, FAILED or KILLED (Ctrl-C / SIGTERM), never RUNNING.

What MLflow users expect besides: the source tags MLflow's own fluent API sets
(``mlflow.source.name``, ``mlflow.source.type``, ``mlflow.source.git.commit`` / ``.branch`` /
``.dirty``, ``mlflow.user``); the train pool and every eval set as dataset inputs
(``log_input``: name, digest, size; context ``train`` / ``eval``); evaluation samples as MLflow
tables (the UI's artifact table view); optionally MLflow's system metrics
(``tracking.system_metrics``, needs psutil) and the final weights as the artifact ``model``
(``tracking.log_model``). Experiments are created tagged as model-development experiments,
so MLflow 3's UI opens them on the runs view rather than the GenAI traces view.

Under load (the cells of a sweep, or two sweeps, on one store): a database store that does not
exist yet is created once (:func:`open_client`: under a file lock on this host, and retried when
another host created it at the same moment; a new SQLite store is a copy of an empty one MLflow
built once per MLflow version, :func:`schema_template`); a locked SQLite database or two cells
inserting one dataset row are retried (:func:`with_retries`); which process trains a cell is
settled by a claim in the store (:mod:`harness.claims`). What this process sent is counted
(``Tracker.sent``) and written to the run's output dir as ``logged.json``, so a store can be
audited against it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness.config import cache_home, flatten

MAX_PARAM_VALUE = 6000
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")

HASH_TAG = "rlbench.config_hash"  # a cell's config hash (harness/cell_plan.py)


def resolve_tracking_uri(uri: str | None) -> str:
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlruns.db'}"


# database stores the client itself creates (MLflow builds their schema on first use)
DATABASE_SCHEMES = ("sqlite:", "postgresql", "mysql", "mssql")
# what a process sees while another one is creating the same store's schema
SCHEMA_RACE = ("already exists", "out-of-date database schema", "duplicate key",
               "unique constraint", "locked", "no such table", "does not exist")


def open_client(uri: str) -> Any:
    """An ``MlflowClient`` on ``uri`` whose store exists. MLflow creates a database store's tables
    on first use without a lock, so several processes opening a new store at once (the first
    launch of a sweep) made all but one fail (``table ... already exists``). Here the first use
    happens under a file lock (beside an SQLite file; in the temp dir for a database server, which
    covers the processes of this host) and, for processes on other hosts, is retried until the
    winner's schema is complete."""
    from filelock import FileLock
    from mlflow.tracking import MlflowClient

    if not uri.startswith(DATABASE_SCHEMES):
        return MlflowClient(tracking_uri=uri)  # a tracking server creates its own store
    db = None
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):].split("?", 1)[0])
        if db.exists() and not os.access(db.parent, os.W_OK):
            return MlflowClient(tracking_uri=uri)  # a read-only store exists: nothing to create
        db.parent.mkdir(parents=True, exist_ok=True)
        lock = f"{db}.lock"
    else:
        lock = str(Path(tempfile.gettempdir()) /
                   f"rlbench-store-{hashlib.sha256(uri.encode()).hexdigest()[:16]}.lock")
    with FileLock(lock, timeout=600):
        if db is not None and (not db.exists() or db.stat().st_size == 0):
            _copy_template(db)
        for attempt in range(30):
            try:
                return MlflowClient(tracking_uri=uri)  # builds the store (and its schema)
            except Exception as exc:
                if not any(s in str(exc).lower() for s in SCHEMA_RACE) or attempt == 29:
                    raise
                time.sleep(min(0.2 * (attempt + 1), 2.0))
    raise AssertionError("unreachable")


def schema_template() -> Path | None:
    """An empty MLflow SQLite store with every schema migration applied and no experiment in it,
    built by MLflow (``_initialize_tables``, what ``SqlAlchemyStore`` runs on an empty database)
    once per MLflow version under the rlbench cache (``$RLBENCH_CACHE``, else ~/.cache/rlbench).
    Why: a new store runs MLflow's ~70 alembic migrations, about 2 s of CPU per store, paid by
    every sweep cell's first store, every board built from exports and most tests; a copy of the
    template opens in milliseconds. MLflow adds the Default experiment on first open, with the
    artifact location and time a store it built itself would have. None when the template
    cannot be made (read-only cache, another MLflow): the store is then built as before."""
    import mlflow
    from filelock import FileLock

    root = cache_home() / "mlflow"
    path = root / f"schema-{mlflow.__version__}.db"
    if path.exists():
        return path
    try:
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock", timeout=600):
            if not path.exists():
                from mlflow.store.db.utils import _initialize_tables
                from sqlalchemy import create_engine

                partial = root / f".schema-{os.getpid()}.partial"
                partial.unlink(missing_ok=True)
                engine = create_engine(f"sqlite:///{partial}")
                try:
                    try:
                        _initialize_tables(engine)
                    finally:
                        engine.dispose()
                    os.replace(partial, path)  # complete or absent, never half-built
                finally:
                    partial.unlink(missing_ok=True)
    except Exception:  # an optimisation only: MLflow builds the schema itself below
        return None
    return path


def _copy_template(db: Path) -> None:
    """Make the new SQLite store ``db`` a copy of :func:`schema_template` (no-op without one).
    The copy is linked into place, so a store that appeared meanwhile is never overwritten."""
    template = schema_template()
    if template is None:
        return
    partial = db.with_name(f".{db.name}.{os.getpid()}.partial")
    try:
        shutil.copyfile(template, partial)
        db.unlink(missing_ok=True)  # an empty file (touched, not built) is no store
        os.link(partial, db)
    except OSError:
        pass  # e.g. no hard links on this file system: MLflow builds the store instead
    finally:
        partial.unlink(missing_ok=True)


def get_or_create_experiment(client: Any, name: str, tracking_uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        # keep artifacts next to the database, whatever the cwd of later processes
        db = Path(tracking_uri[len("sqlite:///") :])
        location = (db.parent / "mlartifacts" / name).resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location,
                                        tags=dict([EXPERIMENT_KIND]))
    except Exception:  # a parallel job created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def with_retries(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """SQLite may be locked briefly by a parallel job of the same sweep, and two cells logging
    the same dataset at once race on its unique row (the loser's retry finds it and links it)."""
    for attempt in range(8):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            text = str(exc).lower()
            if ("locked" not in text and "unique constraint" not in text) or attempt == 7:
                raise
            time.sleep(0.2 * (attempt + 1))
    return None


def seed_tags(cfg: Any) -> dict[str, str]:
    """``rlbench.seed``: the seed a board pairs the run on (``block_seed``, else ``seed``: an
    A/A control's runs train on seeds of their own and are paired with the baseline's runs of
    their block); ``rlbench.train_seed``: the seed it trained with. Used by the LLM loop and
    the LANTERN track alike."""
    block = cfg.get("block_seed")
    return {"rlbench.seed": str(cfg.seed if block is None else block),
            "rlbench.train_seed": str(cfg.seed)}


def run_tags(cfg: Any, config_hash: str, output_dir: Path) -> dict[str, str]:
    """The tags of a training run: what a board groups and pairs on (algorithm, task, model,
    seed), the cell's config hash (how a finished cell is found again), and what made the numbers
    (the commit, and the CPU: kernels differ across CPUs, docs/suite.md "Machines"). The user's
    ``tracking.tags`` last."""
    from harness.manifest import cpu_label, git_label  # torch is heavy: only when a run starts

    return {
        "rlbench.algorithm": cfg.algorithm.name, "rlbench.task": cfg.task.name,
        "rlbench.task_variant": str(cfg.task.get("variant", "")),
        "rlbench.model": cfg.model.name, **seed_tags(cfg),
        "rlbench.backend": cfg.backend.name,
        "rlbench.temperature": str(cfg.rollout.temperature),
        "rlbench.output_dir": str(output_dir.resolve()),
        HASH_TAG: config_hash, "rlbench.kind": "train",
        "rlbench.git_commit": git_label(),
        "rlbench.cpu": cpu_label(),
        **{k: str(v) for k, v in cfg.tracking.tags.items()},
    }


def source_tags() -> dict[str, str]:
    """MLflow's source tags for a run started from this process (as ``mlflow.start_run``)."""
    import getpass
    import sys

    from harness.manifest import git_state

    tags = {"mlflow.source.type": "LOCAL",
            "mlflow.source.name": os.environ.get(
                "RLBENCH_COMMAND", " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]))[:500]}
    with contextlib.suppress(KeyError, OSError):
        tags["mlflow.user"] = getpass.getuser()
    git = git_state()
    if git.get("commit"):
        tags["mlflow.source.git.commit"] = git["commit"]
        tags["rlbench.git_dirty"] = str(bool(git.get("dirty"))).lower()
    if git.get("branch"):
        tags["mlflow.source.git.branch"] = git["branch"]
    return tags


class Tracker:
    """A thin wrapper over ``MlflowClient`` for one run (no global MLflow state)."""

    def __init__(self, uri: str | None, experiment: str, enabled: bool = True) -> None:
        self.enabled = enabled
        self.uri = resolve_tracking_uri(uri)
        self.experiment = experiment
        self.run_id: str | None = None
        self._ended = False
        self._system_monitor: Any = None
        # what this process sent: metric values per key, params, tags (written as logged.json)
        self.sent: dict[str, Any] = {"metrics": Counter(), "params": 0, "tags": {}}
        if enabled:
            self.client = open_client(self.uri)
            self.experiment_id = with_retries(get_or_create_experiment, self.client, experiment,
                                              self.uri)

    def start(self, run_name: str, tags: dict[str, str], run_id: str | None = None) -> None:
        if not self.enabled:
            return
        if run_id:  # resuming: reopen the same run
            self.run_id = run_id
            with_retries(self.client.update_run, run_id, status="RUNNING")
            return
        tags = {**source_tags(), **tags}
        run = with_retries(self.client.create_run, self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        self.sent["tags"].update(tags)

    def log_params(self, config: Any) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Param

        flat = flatten(config)
        params = [Param(k, str(v)[:MAX_PARAM_VALUE]) for k, v in sorted(flat.items())]
        for start in range(0, len(params), 100):  # MLflow's batch limit
            with_retries(self.client.log_batch, self.run_id, params=params[start : start + 100])
        self.sent["params"] += len(params)

    def summary_of(self, run_id: str) -> dict[str, float]:
        """The summary metrics (``final/*``, ``start/*``) a finished run logged."""
        metrics = self.client.get_run(run_id).data.metrics
        return {k: v for k, v in metrics.items() if k.startswith(("final/", "start/"))}

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled or not metrics:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(items), 1000):
            with_retries(self.client.log_batch, self.run_id, metrics=items[start : start + 1000])
        self.sent["metrics"].update(metrics.keys())

    def log_text(self, text: str, artifact_path: str) -> None:
        if not self.enabled:
            return
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / Path(artifact_path).name
            target.write_text(text)
            parent = str(Path(artifact_path).parent)
            with_retries(self.client.log_artifact, self.run_id, str(target),
                   None if parent == "." else parent)

    def log_json(self, obj: Any, artifact_path: str) -> None:
        self.log_text(json.dumps(obj, indent=2, default=str), artifact_path)

    def log_jsonl(self, rows: list[dict[str, Any]], artifact_path: str) -> None:
        self.log_text("".join(json.dumps(r, default=str) + "\n" for r in rows), artifact_path)

    def log_table(self, rows: list[dict[str, Any]], artifact_path: str) -> None:
        """Rows as an MLflow table artifact (``.json``; the UI shows it as a table)."""
        if not self.enabled or not rows:
            return
        columns: dict[str, list[Any]] = {k: [] for k in rows[0]}
        for row in rows:
            for k in columns:
                value = row.get(k)
                columns[k].append(value if isinstance(value, (str, int, float, bool))
                                  or value is None else json.dumps(value, default=str))
        with_retries(self.client.log_table, self.run_id, columns, artifact_path)

    def log_datasets(self, task: Any, train: list[Any], eval_sets: list[Any]) -> None:
        """The train pool and each eval set (as fitted to the model: harness/prompts.py) as
        MLflow dataset inputs (name, digest, size)."""
        if not self.enabled:
            return
        from mlflow.entities import Dataset, DatasetInput, InputTag

        from harness.task import example_bytes

        def entity(name: str, examples: list[Any]) -> Dataset:
            h = hashlib.sha256()
            for ex in examples:
                h.update(example_bytes(ex))
            source = json.dumps({"task": task.name,
                                 "variant": str(getattr(task.config, "variant", ""))})
            profile = json.dumps({"num_rows": len(examples)})
            return Dataset(name=name, digest=h.hexdigest()[:16], source_type="code",
                           source=source, profile=profile)

        inputs = [DatasetInput(entity(f"{task.name}/train", train),
                               [InputTag("mlflow.data.context", "train")])]
        inputs += [DatasetInput(entity(f"{task.name}/{es.name}", es.examples),
                                [InputTag("mlflow.data.context", "eval")])
                   for es in eval_sets]
        with_retries(self.client.log_inputs, self.run_id, datasets=inputs)

    def log_model_dir(self, checkpoint: Path) -> None:
        """The model files of a checkpoint (Hugging Face format: weights, config, tokenizer) as
        the artifact ``model``, loadable with ``from_pretrained`` after download."""
        if not self.enabled:
            return
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "model"
            target.mkdir()
            for f in Path(checkpoint).iterdir():
                if f.is_file() and f.name != "trainer_state.json" and not f.name.startswith(
                        ("optimizer", "scheduler", "rng", "engine_state")):
                    (target / f.name).symlink_to(f.resolve())
            with_retries(self.client.log_artifacts, self.run_id, str(target), "model")

    def start_system_metrics(self, interval_s: float = 10.0) -> None:
        """MLflow's system metrics monitor (CPU, memory, disk, network, GPU) on this run, one
        sample every ``interval_s`` seconds."""
        if not self.enabled or self._system_monitor is not None:
            return
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError as exc:
            from harness.typed_config import ConfigError

            raise ConfigError("tracking.system_metrics=true needs psutil (pip install psutil), "
                              f"or set tracking.system_metrics=false ({exc})") from None
        self._system_monitor = SystemMetricsMonitor(self.run_id, sampling_interval=interval_s,
                                                    tracking_uri=self.uri)
        self._system_monitor.start()

    def end(self, status: str, ledger: Path | None = None) -> None:
        """FINISHED | FAILED | KILLED. Idempotent. With ``ledger``, what this process sent is
        added to that file (``logged.json``: the counts of every process of this run)."""
        if not self.enabled or self.run_id is None or self._ended:
            return
        self._ended = True
        if self._system_monitor is not None:
            self._system_monitor.finish()
            self._system_monitor = None
        with_retries(self.client.set_terminated, self.run_id, status=status)
        if ledger is not None:
            self.write_ledger(ledger)

    def write_ledger(self, path: Path) -> None:
        """Merge ``self.sent`` into ``path`` (a resumed run's earlier processes wrote theirs)."""
        old: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            old = json.loads(path.read_text())
        if old.get("run_id") != self.run_id:
            old = {}
        metrics = Counter(old.get("metrics", {}))
        metrics.update(self.sent["metrics"])
        merged = {"run_id": self.run_id, "metrics": dict(sorted(metrics.items())),
                  "params": int(old.get("params", 0)) + self.sent["params"],
                  "tags": {**old.get("tags", {}), **self.sent["tags"]}}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merged, indent=1))
