"""``rlbench eval``: evaluate a checkpoint (or an MLflow run's latest checkpoint) on the task's
eval sets with the task's protocol, outside training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.checkpoint import latest_checkpoint
from harness.components import build
from harness.evaluation import evaluate
from harness.registry import BACKENDS, TASKS


def checkpoint_of_run(run_id: str, tracking_uri: str | None) -> Path:
    from mlflow.tracking import MlflowClient

    from harness.tracking import resolve_tracking_uri

    client = MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri))
    run = client.get_run(run_id)
    output_dir = run.data.tags.get("rlbench.output_dir")
    if not output_dir:
        raise FileNotFoundError(f"run {run_id} has no rlbench.output_dir tag")
    return latest_checkpoint(Path(output_dir))


def evaluate_checkpoint(kind: str, value: str, cfg: Any) -> dict[str, float]:
    path = checkpoint_of_run(value, cfg.tracking.uri) if kind == "run_id" else latest_checkpoint(
        Path(value)
    )
    task = build(TASKS, cfg.task, "task")
    engine = BACKENDS.get(cfg.backend.rollout)(
        str(path), cfg.backend, cfg.seed, attn_implementation=cfg.model.attn_implementation
    )
    metrics, _ = evaluate(engine, task, cfg.seed, step=0)
    return {"checkpoint": str(path), **metrics}
