"""MLflow extras a run logs on request, the checkpoints a finished run keeps, the warm start kept
out of final/wall_s, and the engine not importing the CLI."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.checkpoint import prune_checkpoints
from harness.tracking import Tracker
from tests.helpers import make_config

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
def test_system_metrics_are_logged_when_asked(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}", "t")
    tracker.start("r", {})
    tracker.start_system_metrics(interval_s=0.5)
    time.sleep(3)
    tracker.end("FINISHED")
    metrics = MlflowClient(tracker.uri).get_run(tracker.run_id).data.metrics
    assert any(k.startswith("system/cpu_utilization") for k in metrics), sorted(metrics)


@pytest.mark.slow
def test_the_warm_start_is_reported_apart_from_the_runs_wall_time(tmp_path, model_cache,
                                                                   tiny_model_path, monkeypatch):
    from harness import trainer as trainer_mod

    def slow_resolve(model_cfg, task, **kw):
        time.sleep(1.0)  # a warm start that takes 1 s (the cached model takes ~0)
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
    assert summary["final/warm_start_s"] >= 1.0
    assert summary["final/wall_s"] + summary["final/warm_start_s"] <= total


def test_the_engine_never_imports_the_cli_package():
    offenders = []
    for path in (ROOT / "harness").rglob("*.py"):
        if "cli" in path.relative_to(ROOT / "harness").parts:
            continue
        if re.search(r"^\s*(from|import)\s+harness\.cli\b", path.read_text(), re.MULTILINE):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_evaluation_runs_in_the_engines_batches_and_times_each_set(tmp_path):
    """Evaluation calls generate in the engine's own generation batches (progress between
    them), and time/eval_<set> is the set's own duration."""

    from harness.evaluation import evaluate
    from harness.task import EvalProtocol, EvalSet
    from harness.types import Example, Score, Trajectory

    class Engine:
        device = "cpu"
        gen_batch_size = 8  # 2 prompts x 4 samples per call

        def __init__(self):
            self.calls = []

        def encode_prompt(self, ex):
            return [int(ex.id)]

        def generate(self, prompts, params, generator=None):
            self.calls.append(len(prompts))
            return [Trajectory(prompt_ids=p, response_ids=[1], text=str(p[0]))
                    for p in prompts for _ in range(params.n)]

    class Task:
        def tool_env(self):
            return None

        def eval_sets(self):
            return [EvalSet("s", [Example(str(i), "") for i in range(5)],
                            EvalProtocol(n=4, k=[1]))]

        def verify_batch(self, examples, responses):
            return [Score(float(r == "0"), r == "0", True) for r in responses]

    engine = Engine()
    start = time.perf_counter()
    metrics, _, _ = evaluate(engine, Task(), seed=0, step=0)
    assert engine.calls == [2, 2, 1]
    assert metrics["eval/s/pass_at_1"] == 0.2
    assert 0 <= metrics["time/eval_s"] <= time.perf_counter() - start
