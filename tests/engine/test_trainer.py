"""Tiny end-to-end runs of the trainer (in-process): tracking, checkpoints, resume, and the
update's invariances."""

from __future__ import annotations

import json

import pytest
import torch
from mlflow.tracking import MlflowClient

from harness.trainer import PromptSampler, Trainer
from tests.helpers import SMALL, make_config, rollout_batch


@pytest.mark.slow
def test_a_tiny_run_finishes_and_logs_everything(tmp_path, model_cache):
    cfg = make_config(tmp_path, model_cache, *SMALL)
    summary = Trainer(cfg).fit()
    assert summary["final/steps"] == 3 and summary["final/tokens_total"] > 0
    client = MlflowClient(cfg.tracking.uri)
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.name"] == "grpo"
    assert run.data.tags["rlbench.task_variant"] == "tiny"
    metrics = run.data.metrics
    for key in ("eval/heldout/pass_at_1", "eval/heldout/pass_at_4", "eval/heldout/mean_at_4",
                "final/heldout/pass_at_1", "start/heldout/pass_at_1", "rollout/reward_mean",
                "rollout/zero_var_group_frac", "rollout/parse_fail_rate", "rollout/entropy",
                "rollout/truncation_rate", "rollout/tokens_total", "actor/lr", "time/gen",
                "time/reward", "time/adv", "time/update", "time/wall"):
        assert key in metrics, key
    evals = client.get_metric_history(run.info.run_id, "eval/heldout/pass_at_1")
    assert sorted(m.step for m in evals) == [0, 2, 3]
    final = sorted(evals, key=lambda m: m.step)
    assert metrics["final/heldout/pass_at_1"] == final[-1].value  # the trained model alone
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"manifest.json", "config.yaml", "samples"} <= artifacts
    manifest = json.loads(client.download_artifacts(run.info.run_id, "manifest.json",
                                                     str(tmp_path)) and
                          (tmp_path / "manifest.json").read_text())
    assert len(manifest["dataset_hash"]) == 64 and manifest["seed"] == 0
    assert manifest["packages"]["torch"] and "commit" in manifest["git"]
    ckpt = tmp_path / "out" / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == "step_0000003"


@pytest.mark.slow
def test_resume_continues_the_same_run_from_its_checkpoint(tmp_path, model_cache):
    first = make_config(tmp_path, model_cache, *SMALL, "trainer.steps=2")
    Trainer(first).fit()
    again = make_config(tmp_path, model_cache, *SMALL, "trainer.steps=4",
                        f"trainer.resume={tmp_path / 'out'}")
    summary = Trainer(again).fit()
    assert summary["final/steps"] == 4
    client = MlflowClient(first.tracking.uri)
    runs = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "rollout/reward_mean")]
    assert sorted(steps) == [1, 2, 3, 4]


def _prepared_trainer(tmp_path, model_cache, *overrides):
    cfg = make_config(tmp_path, model_cache, *SMALL, "tracking.enabled=false",
                      "data.prompts_per_step=8", *overrides)
    tr, batch = rollout_batch(cfg, 8)
    batch["old_logprobs"] = tr.engine.logprobs(batch, 1.0, 0)
    # make sure both zero- and non-zero-advantage groups exist
    batch["rewards"] = (torch.arange(len(batch)) % 3 == 0).float() * (batch["group_index"] % 2)
    tr.algorithm.compute_advantages(batch)
    return tr, batch


def _gradient_of_update(tr, batch, **trainer_overrides):
    """The accumulated gradient each optimizer step would apply (Adam would amplify float
    noise in near-zero gradients, so the gradient is what is compared)."""
    captured = []

    def capture() -> float:
        captured.append([
            p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in tr.engine.model.parameters()
        ])
        tr.engine.model.zero_grad(set_to_none=True)
        return 0.0

    tr.engine.optimizer_step = capture
    for key, value in trainer_overrides.items():
        tr.cfg.trainer[key] = value
    tr.update(batch)
    return [g for step in captured for g in step]


def test_skipping_zero_gradient_samples_does_not_change_the_update(tmp_path, model_cache):
    tr, batch = _prepared_trainer(tmp_path, model_cache)
    assert (batch["advantages"] == 0).any() and (batch["advantages"] != 0).any()
    skipped = _gradient_of_update(tr, batch, skip_zero_gradient=True)
    full = _gradient_of_update(tr, batch, skip_zero_gradient=False)
    assert any(g.abs().max() > 0 for g in full)
    for a, b in zip(skipped, full, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_micro_batching_does_not_change_the_update(tmp_path, model_cache):
    tr, batch = _prepared_trainer(tmp_path, model_cache)
    whole = _gradient_of_update(tr, batch, micro_batch_size=0)
    micro = _gradient_of_update(tr, batch, micro_batch_size=5)
    assert any(g.abs().max() > 0 for g in whole)
    for a, b in zip(whole, micro, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_prompt_sampler_state_round_trips():
    from harness.types import Example

    examples = [Example(id=str(i), prompt=str(i)) for i in range(5)]
    a = PromptSampler(examples, seed=1)
    a.draw(7)
    b = PromptSampler(examples, seed=1)
    b.load_state_dict(a.state_dict())
    assert [e.id for e in a.draw(6)] == [e.id for e in b.draw(6)]
    assert sorted(e.id for e in PromptSampler(examples, 1).draw(5)) == ["0", "1", "2", "3", "4"]
