"""MLflow extras a run logs on request, the checkpoints a finished run keeps, the warm start kept
out of final/wall_s, and the engine not importing the CLI."""

from __future__ import annotations

import re
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from harness.checkpoint import prune_checkpoints
from harness.tracking import Tracker
from tests.conftest import make_config

ROOT = Path(__file__).resolve().parents[1]


def test_prune_keeps_only_the_newest_checkpoints(tmp_path):
    for step in (1, 2, 3):
        (tmp_path / "checkpoints" / f"step_{step:07d}").mkdir(parents=True)
    prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_0000003"]


def test_log_model_dir_logs_the_weights_without_the_trainer_state(tmp_path):
    ckpt = tmp_path / "step_0000002"
    ckpt.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "trainer_state.json",
                 "engine_state.pt"):
        (ckpt / name).write_text("x")
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}", "t")
    tracker.start("r", {})
    tracker.log_model_dir(ckpt)
    tracker.end("FINISHED")
    files = {a.path for a in MlflowClient(tracker.uri).list_artifacts(tracker.run_id, "model")}
    assert files == {"model/config.json", "model/model.safetensors", "model/tokenizer.json"}


def test_system_metrics_are_logged_when_asked(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}", "t")
    tracker.start("r", {})
    tracker.start_system_metrics(interval_s=0.5)
    time.sleep(3)
    tracker.end("FINISHED")
    metrics = MlflowClient(tracker.uri).get_run(tracker.run_id).data.metrics
    assert any(k.startswith("system/cpu_utilization") for k in metrics), sorted(metrics)


def test_the_warm_start_is_reported_apart_from_the_runs_wall_time(tmp_path, model_cache,
                                                                   tiny_model_path, monkeypatch):
    from harness import trainer as trainer_mod

    def slow_resolve(model_cfg, task, **kw):
        time.sleep(4.0)  # a warm start that takes 4 s
        return tiny_model_path

    real_get = trainer_mod.MODELS.get
    monkeypatch.setattr(trainer_mod.MODELS, "get",
                        lambda name: slow_resolve if name == "tiny" else real_get(name))
    cfg = make_config(tmp_path, model_cache, "trainer.steps=1", "trainer.eval_every=0",
                      "trainer.checkpoint_every=0", "data.prompts_per_step=2", "rollout.n=2",
                      "tracking.log_datasets=false")
    start = time.perf_counter()
    summary = trainer_mod.train(cfg)
    total = time.perf_counter() - start
    assert summary["final/warm_start_s"] >= 4.0
    assert summary["final/wall_s"] + summary["final/warm_start_s"] <= total


def test_the_engine_never_imports_the_cli_package():
    offenders = []
    for path in (ROOT / "harness").rglob("*.py"):
        if "cli" in path.relative_to(ROOT / "harness").parts:
            continue
        if re.search(r"^\s*(from|import)\s+harness\.cli\b", path.read_text(), re.MULTILINE):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders
