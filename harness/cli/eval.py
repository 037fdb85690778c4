"""rlbench eval: evaluate a model or a checkpoint on a task's whole eval suite, without
training, and log the result to MLflow.

    rlbench eval run_id=<id> [key=value ...]         the latest checkpoint of a training run
    rlbench eval checkpoint=<dir> [key=value ...]    a checkpoint dir, or a run's output dir
    rlbench eval task=... model=... [key=value ...]  the configured model itself (RL's start)

The task (with its variant and eval sets) and the model config are those the run was trained
with (read from the checkpoint, or from the run's logged config); task=<name> or task.* overrides
on the command line replace or amend them. What is evaluated is exactly one of:

* ``checkpoint=<dir>`` - a checkpoint directory, or an output directory (its latest checkpoint);
* ``run_id=<id>`` - the latest checkpoint of an MLflow training run (its ``rlbench.output_dir``);
* neither - the configured model itself (``model=tiny``: the warm-started tiny model for the task;
  ``model=hf model.path=...``: your model), i.e. the starting point of RL.

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

import json
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.checkpoint import latest_checkpoint
from harness.config import compose_config
from harness.evaluation import check_eval_sets, evaluate
from harness.prompts import fit_data
from harness.registry import BACKENDS, MODELS, TASKS
from harness.typed_config import ConfigError, build

EVAL_KIND = "eval"


def _client(tracking_uri: str | None) -> Any:
    from harness.tracking import open_client, resolve_tracking_uri

    return open_client(resolve_tracking_uri(tracking_uri))


def get_run(run_id: str, tracking_uri: str | None) -> Any:
    """The MLflow run ``run_id``; an unknown id is a :class:`ConfigError` naming the store."""
    from mlflow.exceptions import MlflowException

    from harness.tracking import resolve_tracking_uri

    try:
        return _client(tracking_uri).get_run(run_id)
    except MlflowException:
        raise ConfigError(
            f"run_id={run_id}: no such run in {resolve_tracking_uri(tracking_uri)}; the run id "
            "is printed at the end of a training run (and listed by rlbench ui); another store: "
            "tracking.uri=<uri>") from None


def checkpoint_of_run(run_id: str, tracking_uri: str | None) -> Path:
    run = get_run(run_id, tracking_uri)
    output_dir = run.data.tags.get("rlbench.output_dir")
    if not output_dir:
        raise ConfigError(f"run_id={run_id}: the run has no rlbench.output_dir tag (not a "
                          "training run?); evaluate a checkpoint with checkpoint=<dir>")
    try:
        return latest_checkpoint(Path(output_dir), key=f"run {run_id}'s output dir")
    except FileNotFoundError as exc:
        raise ConfigError(f"run_id={run_id}: {exc}") from None


def source_config(kind: str, value: str, path: str, tracking_uri: str | None
                  ) -> dict[str, Any] | None:
    """The resolved config the evaluated weights were trained with: the checkpoint's own copy,
    else the run's ``config.yaml`` artifact; None when neither is there."""
    state = Path(path) / "trainer_state.json"
    if state.is_file():
        config = json.loads(state.read_text()).get("config")
        if config:
            return config
    if kind == "run_id":
        import tempfile

        try:
            with tempfile.TemporaryDirectory() as tmp:
                local = _client(tracking_uri).download_artifacts(value, "config.yaml", tmp)
                return OmegaConf.to_container(OmegaConf.load(local), resolve=False)
        except Exception:  # an older run without the artifact
            return None
    return None


def eval_config(overrides: list[str], kind: str, value: str, path: str | None) -> DictConfig:
    """The config to evaluate with: the command line's, with the task, model and data (prompt
    fitting: harness/prompts.py) of the source run (unless the command line chooses them:
    task=<name>, model=<name>; task.* / model.* / data.* keys given on the command line are
    applied on top)."""
    cfg = compose_config(overrides)
    if path is None:
        return cfg
    source = source_config(kind, value, path, cfg.tracking.uri)
    if source is None:
        return cfg
    for group in ("task", "model", "data"):
        if any(o.lstrip("+~").startswith(f"{group}=") for o in overrides) or group not in source:
            continue
        node = OmegaConf.create(source[group])
        mine = [o for o in overrides if o.lstrip("+").startswith(f"{group}.")]
        if mine:
            dotlist = [o.lstrip("+")[len(group) + 1:] for o in mine if not o.startswith("~")]
            node = OmegaConf.merge(node, OmegaConf.from_dotlist(dotlist))
        if group in ("model", "data"):  # typed nodes: merged into their schema
            from harness.config import DataConfig, ModelConfig

            schema = ModelConfig if group == "model" else DataConfig
            node = OmegaConf.merge(OmegaConf.structured(schema), node)
        OmegaConf.set_struct(cfg, False)
        cfg[group] = node
    return cfg


def cmd_eval(overrides: list[str]) -> None:
    """``rlbench eval [checkpoint=<dir> | run_id=<id>] [key=value ...]``; prints the metrics."""
    from harness.cli.errors import fail

    target = [o for o in overrides if o.startswith(("checkpoint=", "run_id="))]
    if len(target) > 1:
        fail("eval takes at most one of checkpoint=<dir> or run_id=<mlflow run id> "
             "(neither: the configured model itself)")
    rest = [o for o in overrides if o not in target]
    kind, _, value = target[0].partition("=") if target else ("model", "", "")
    if kind != "model" and not value:
        fail(f"{kind}= needs a value: {kind}=<{'dir' if kind == 'checkpoint' else 'run id'}>")
    path = None
    if kind == "run_id":
        path = str(checkpoint_of_run(value, compose_config(rest).tracking.uri))
    elif kind == "checkpoint":
        path = str(latest_checkpoint(Path(value), key="checkpoint"))
    cfg = eval_config(rest, kind, value, path)
    metrics = evaluate_checkpoint(kind, value, cfg, path)
    print(json.dumps(metrics, indent=2, sort_keys=True))


def _source_tags(kind: str, value: str, cfg: Any) -> dict[str, str]:
    """algorithm / seed / temperature of what is evaluated (the training run's, if known)."""
    if kind == "run_id":
        tags = get_run(value, cfg.tracking.uri).data.tags
        return {"rlbench.algorithm": tags.get("rlbench.algorithm", "unknown"),
                "rlbench.seed": tags.get("rlbench.seed", str(cfg.seed)),
                "rlbench.temperature": tags.get("rlbench.temperature", ""),
                "rlbench.source_run_id": value}
    if kind == "checkpoint":
        return {"rlbench.algorithm": "checkpoint", "rlbench.seed": str(cfg.seed),
                "rlbench.temperature": ""}
    return {"rlbench.algorithm": "base", "rlbench.seed": str(cfg.seed),
            "rlbench.temperature": ""}


def evaluate_checkpoint(kind: str, value: str, cfg: Any, path: str | None = None
                        ) -> dict[str, Any]:
    """Evaluate ``kind`` (``checkpoint`` | ``run_id`` | ``model``) on ``cfg.task``'s eval sets;
    returns the metrics (plus ``checkpoint`` and, when logged, ``run_id``). ``path``: the
    checkpoint directory when the caller has already found it."""
    task = build(TASKS, cfg.task, "task")
    check_eval_sets(task)
    if not task.eval_sets():
        raise ConfigError(f"task={cfg.task.name} has no eval sets to evaluate on (task=custom: "
                          "+task.eval.<name>.path=<file>)")
    if path is not None:
        pass
    elif kind == "run_id":
        path = str(checkpoint_of_run(value, cfg.tracking.uri))
    elif kind == "checkpoint":
        path = str(latest_checkpoint(Path(value), key="checkpoint"))
    elif kind == "model":
        path = MODELS.get(cfg.model.source)(cfg.model, task)
    else:
        raise ConfigError(f"cannot evaluate {kind!r}: use checkpoint=, run_id= or a model")
    if cfg.backend.threads > 0:
        import torch

        torch.set_num_threads(cfg.backend.threads)
    start = time.perf_counter()
    engine = BACKENDS.get(cfg.backend.rollout)(
        path, cfg.backend, cfg.seed, attn_implementation=cfg.model.attn_implementation
    )
    data = fit_data(cfg, engine, path, task, train=False)  # before a run is opened
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
        metrics, samples, problems = evaluate(engine, task, cfg.seed, step=0,
                                              samples_to_keep=cfg.tracking.log_samples,
                                              desc=f"eval {Path(path).name}",
                                              sets=data.eval_sets)
        metrics.update(data.metrics)
        summary = {"final/" + k[len("eval/"):]: v for k, v in metrics.items()
                   if k.startswith("eval/") and any(
                       f"/{m}_at_" in k for m in ("pass", "mean", "maj"))}
        summary["final/wall_s"] = time.perf_counter() - start
        if tracker is not None:
            subset = {k: cfg[k] for k in ("task", "model", "backend", "data", "seed")}
            tracker.log_params(OmegaConf.create(subset))
            tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
            tracker.log_metrics({**metrics, **summary}, step=0)
            if samples:
                tracker.log_table(samples, "samples/eval.json")
            tracker.log_jsonl(problems, "evals/step_000000.jsonl")
        status = "FINISHED"
    finally:
        if tracker is not None:
            tracker.end(status)
    out: dict[str, Any] = {"checkpoint": path, **metrics}
    if tracker is not None:
        out["run_id"] = tracker.run_id
    return out
