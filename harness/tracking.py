"""MLflow tracking: the system of record for every run.

The tracking URI is ``tracking.uri`` when set, else ``$MLFLOW_TRACKING_URI`` (MLflow's own
convention), else a SQLite file ``mlruns.db`` in the working directory (embedded, no server).
Params are the flattened resolved config; metrics are logged in batches (one call per step);
a run always ends with a status: FINISHED, FAILED or KILLED (Ctrl-C / SIGTERM), never RUNNING.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.config import flatten

MAX_PARAM_VALUE = 6000


def resolve_tracking_uri(uri: str | None) -> str:
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlruns.db'}"


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
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # a parallel job created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def _retry(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """SQLite may be locked briefly by a parallel job of the same sweep."""
    for attempt in range(8):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if "locked" not in str(exc).lower() or attempt == 7:
                raise
            time.sleep(0.2 * (attempt + 1))
    return None


class Tracker:
    """A thin wrapper over ``MlflowClient`` for one run (no global MLflow state)."""

    def __init__(self, uri: str | None, experiment: str, enabled: bool = True) -> None:
        self.enabled = enabled
        self.uri = resolve_tracking_uri(uri)
        self.experiment = experiment
        self.run_id: str | None = None
        self._ended = False
        if enabled:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.uri)
            self.experiment_id = _retry(get_or_create_experiment, self.client, experiment, self.uri)

    def start(self, run_name: str, tags: dict[str, str], run_id: str | None = None) -> None:
        if not self.enabled:
            return
        if run_id:  # resuming: reopen the same run
            self.run_id = run_id
            _retry(self.client.update_run, run_id, status="RUNNING")
            return
        run = _retry(self.client.create_run, self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id

    def log_params(self, config: Any) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Param

        flat = flatten(config)
        params = [Param(k, str(v)[:MAX_PARAM_VALUE]) for k, v in sorted(flat.items())]
        for start in range(0, len(params), 100):  # MLflow's batch limit
            _retry(self.client.log_batch, self.run_id, params=params[start : start + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled or not metrics:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(items), 1000):
            _retry(self.client.log_batch, self.run_id, metrics=items[start : start + 1000])

    def log_text(self, text: str, artifact_path: str) -> None:
        if not self.enabled:
            return
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / Path(artifact_path).name
            target.write_text(text)
            parent = str(Path(artifact_path).parent)
            _retry(self.client.log_artifact, self.run_id, str(target),
                   None if parent == "." else parent)

    def log_json(self, obj: Any, artifact_path: str) -> None:
        self.log_text(json.dumps(obj, indent=2, default=str), artifact_path)

    def log_jsonl(self, rows: list[dict[str, Any]], artifact_path: str) -> None:
        self.log_text("".join(json.dumps(r, default=str) + "\n" for r in rows), artifact_path)

    def end(self, status: str) -> None:
        """FINISHED | FAILED | KILLED. Idempotent."""
        if not self.enabled or self.run_id is None or self._ended:
            return
        self._ended = True
        _retry(self.client.set_terminated, self.run_id, status=status)
