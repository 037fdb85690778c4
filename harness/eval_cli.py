"""``rlbench eval``: evaluate a model or a checkpoint on a task's whole eval suite, without
training, and log the result to MLflow.

What is evaluated (exactly one):

* ``checkpoint=<dir>`` - a checkpoint directory, or an output directory (its latest checkpoint);
* ``run_id=<id>`` - the latest checkpoint of an MLflow training run (its ``rlbench.output_dir``);
* neither - the configured model itself (``model=tiny``: the warm-started tiny model for the task;
  ``model.source=hf model.path=...``: a local model), i.e. the starting point of RL.

Every eval set of ``task`` is sampled and scored with its own protocol (``n``, ``k``, ``maj_k``,
temperature, top-p, max tokens; :mod:`harness.evaluation`). Unless ``tracking.enabled=false``,
one MLflow run is logged in ``tracking.experiment``, tagged ``rlbench.kind=eval`` with the same
``rlbench.{task,task_variant,model,algorithm,seed,temperature}`` tags a training run has (the
algorithm, seed and temperature of the source run; ``base`` for a bare model) and
``rlbench.variant=eval``, with the metrics ``eval/<set>/...`` and, as a training run's summary,
``final/<set>/...``. ``rlbench board`` therefore shows it as a row ``<algorithm>@eval`` with one
column per eval set, beside (never in place of) the training runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.checkpoint import latest_checkpoint
from harness.components import build
from harness.evaluation import evaluate
from harness.registry import BACKENDS, MODELS, TASKS

EVAL_KIND = "eval"


def _client(tracking_uri: str | None) -> Any:
    from mlflow.tracking import MlflowClient

    from harness.tracking import resolve_tracking_uri

    return MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri))


def checkpoint_of_run(run_id: str, tracking_uri: str | None) -> Path:
    run = _client(tracking_uri).get_run(run_id)
    output_dir = run.data.tags.get("rlbench.output_dir")
    if not output_dir:
        raise FileNotFoundError(f"run {run_id} has no rlbench.output_dir tag")
    return latest_checkpoint(Path(output_dir))


def _source_tags(kind: str, value: str, cfg: Any) -> dict[str, str]:
    """algorithm / seed / temperature of what is evaluated (the training run's, if known)."""
    if kind == "run_id":
        tags = _client(cfg.tracking.uri).get_run(value).data.tags
        return {"rlbench.algorithm": tags.get("rlbench.algorithm", "unknown"),
                "rlbench.seed": tags.get("rlbench.seed", str(cfg.seed)),
                "rlbench.temperature": tags.get("rlbench.temperature", ""),
                "rlbench.source_run_id": value}
    if kind == "checkpoint":
        return {"rlbench.algorithm": "checkpoint", "rlbench.seed": str(cfg.seed),
                "rlbench.temperature": ""}
    return {"rlbench.algorithm": "base", "rlbench.seed": str(cfg.seed),
            "rlbench.temperature": ""}


def evaluate_checkpoint(kind: str, value: str, cfg: Any) -> dict[str, Any]:
    """Evaluate ``kind`` (``checkpoint`` | ``run_id`` | ``model``) on ``cfg.task``'s eval sets;
    returns the metrics (plus ``checkpoint`` and, when logged, ``run_id``)."""
    task = build(TASKS, cfg.task, "task")
    if kind == "run_id":
        path = str(checkpoint_of_run(value, cfg.tracking.uri))
    elif kind == "checkpoint":
        path = str(latest_checkpoint(Path(value)))
    elif kind == "model":
        path = MODELS.get(cfg.model.source)(cfg.model, task)
    else:
        raise ValueError(f"cannot evaluate {kind!r}: use checkpoint=, run_id= or a model")
    if cfg.backend.threads > 0:
        import torch

        torch.set_num_threads(cfg.backend.threads)
    tracker = None
    if cfg.tracking.enabled:
        from harness.tracking import Tracker

        tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
        tags = {"rlbench.kind": EVAL_KIND, "rlbench.variant": EVAL_KIND,
                "rlbench.task": cfg.task.name,
                "rlbench.task_variant": str(cfg.task.get("variant", "")),
                "rlbench.model": cfg.model.name, "rlbench.backend": cfg.backend.name,
                "rlbench.checkpoint": path, **_source_tags(kind, value, cfg),
                **{k: str(v) for k, v in cfg.tracking.tags.items()}}
        name = cfg.tracking.run_name or f"eval-{cfg.task.name}-{cfg.model.name}-{Path(path).name}"
        tracker.start(name, tags)
    status = "FAILED"
    try:
        start = time.perf_counter()
        engine = BACKENDS.get(cfg.backend.rollout)(
            path, cfg.backend, cfg.seed, attn_implementation=cfg.model.attn_implementation
        )
        metrics, samples = evaluate(engine, task, cfg.seed, step=0,
                                    samples_to_keep=cfg.tracking.log_samples)
        summary = {"final/" + k[len("eval/"):]: v for k, v in metrics.items()
                   if k.startswith("eval/") and any(
                       f"/{m}_at_" in k for m in ("pass", "mean", "maj"))}
        summary["final/wall_s"] = time.perf_counter() - start
        if tracker is not None:
            subset = {k: cfg[k] for k in ("task", "model", "backend", "seed")}
            tracker.log_params(OmegaConf.create(subset))
            tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
            tracker.log_metrics({**metrics, **summary}, step=0)
            if samples:
                tracker.log_jsonl(samples, "samples/eval.jsonl")
        status = "FINISHED"
    finally:
        if tracker is not None:
            tracker.end(status)
    out: dict[str, Any] = {"checkpoint": path, **metrics}
    if tracker is not None:
        out["run_id"] = tracker.run_id
    return out
