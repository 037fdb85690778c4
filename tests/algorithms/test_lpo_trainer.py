"""LPO (spec §1.9) in the real trainer: the two-pass surrogate across micro-batches gives the
gradient of the whole-group objective in one forward, and a two-step run finishes with its
metrics logged. The maths on a toy model is in test_lpo.py."""

from __future__ import annotations

import math

import pytest
import torch
from mlflow.tracking import MlflowClient

from algorithms.lpo import lpo_group_loss, sequence_scores
from tests.helpers import make_config, rollout_batch

# -- the real trainer: two passes across micro-batches, and an end-to-end run ---------------------
SMALL = ["trainer.steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=0",
         "data.prompts_per_step=4", "rollout.n=4", "task.tiny.eval.heldout.limit=8",
         "task.tiny.eval.heldout.n=2", "task.tiny.eval.heldout.k=[1,2]", "tracking.log_samples=0"]


@pytest.mark.parametrize("name", ["lpo_fwd", "lpo_rev"])
def test_trainer_update_gradient_equals_direct_autograd_on_whole_groups(tmp_path, model_cache,
                                                                       name):
    cfg = make_config(tmp_path, model_cache, *SMALL, f"algorithm={name}",
                      "tracking.enabled=false", "trainer.micro_batch_size=3")
    tr, batch = rollout_batch(cfg, 4)
    old = tr.engine.logprobs(batch, 1.0, 0)
    g = torch.Generator().manual_seed(0)
    batch["old_logprobs"] = old + 0.5 * torch.randn(old.shape, generator=g) * batch["response_mask"]
    batch["rewards"] = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 1, 0])
    tr.algorithm.compute_advantages(batch)
    params = [p for p in tr.engine.model.parameters() if p.requires_grad]
    captured = []

    def capture():
        captured.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                         for p in params])
        for p in params:
            p.grad = None
        return 0.0

    tr.engine.optimizer_step = capture
    metrics = tr.update(batch)
    assert metrics["actor/trained_frac"] == pytest.approx(0.75)  # one constant group skipped
    assert "lpo/kl_target" in metrics and "lpo/c_abs_max" in metrics
    # direct autograd of 1/G Σ_x L(x) over the whole batch in one forward
    logp, _ = tr.engine.forward(batch, 1.0)
    s = sequence_scores(logp, batch["old_logprobs"], batch["response_mask"])
    gi = batch["group_index"]
    L = lpo_group_loss(s, batch["advantages"], gi, 4, name[-3:])
    active = torch.zeros(4).index_add_(0, gi, batch["advantages"].abs()) > 0
    (L * active).sum().div(4).backward()
    direct = [p.grad.clone() for p in params]
    num = sum(float((a - b).square().sum()) for a, b in zip(captured[0], direct))
    den = sum(float(b.square().sum()) for b in direct)
    assert den > 0 and num <= 1e-8 * den


@pytest.mark.parametrize("name", ["lpo_fwd", "lpo_rev"])
@pytest.mark.slow
def test_end_to_end_two_step_run_finishes(tmp_path, model_cache, name):
    from harness.trainer import Trainer

    cfg = make_config(tmp_path, model_cache, *SMALL, f"algorithm={name}",
                      "trainer.micro_batch_size=3")
    summary = Trainer(cfg).fit()
    assert summary["final/steps"] == 2
    client = MlflowClient(cfg.tracking.uri)
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["algorithm.name"] == name
    for key in ("lpo/c_abs_max", "lpo/c_abs_mean", "lpo/c_sum", "lpo/kl_target",
                "lpo/p_entropy"):
        assert math.isfinite(run.data.metrics[key]), key
