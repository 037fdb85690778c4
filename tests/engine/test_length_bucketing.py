"""Length-bucketed micro-batches (``trainer.length_bucketing``) leave out padding only: the update
over a real tiny-model rollout gives the same loss metrics and gradients as today's padded
micro-batches, and the micro-batches are narrower."""

import pytest
import torch

from harness.batch import RolloutBatch
from harness.trainer import Trainer
from harness.types import Trajectory
from tests.helpers import make_config


def rollout_batch(tr: Trainer) -> RolloutBatch:
    captured = {}

    def keep(batch: RolloutBatch, old_is_current: bool = False) -> dict[str, float]:
        captured["batch"] = batch
        return {}

    tr.update = keep  # the batch as the trainer hands it to the update
    tr.train_step()
    del tr.update
    return captured["batch"]


def update_grads(tr: Trainer, batch: RolloutBatch, bucketing: bool
                 ) -> tuple[list[list[torch.Tensor]], dict[str, float]]:
    tr.cfg.trainer.length_bucketing = bucketing
    params = list(tr.engine.model.parameters())
    steps: list[list[torch.Tensor]] = []

    def record() -> float:
        steps.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
        tr.engine.model.zero_grad(set_to_none=True)
        return 0.0

    tr.engine.optimizer_step = record  # gradients recorded, weights untouched
    metrics = tr.update(batch, old_is_current=True)
    del tr.engine.optimizer_step
    return steps, metrics


@pytest.mark.parametrize("extra", [[], ["algorithm.entropy_coef=0.01",
                                        "trainer.mini_batch_size=32"]])
@pytest.mark.slow
def test_bucketed_update_equals_the_padded_update(tmp_path, model_cache, extra):
    cfg = make_config(tmp_path, model_cache, "data.prompts_per_step=8", "rollout.n=8",
                      "trainer.micro_batch_size=8", "tracking.enabled=false", *extra)
    tr = Trainer(cfg)
    tr.setup()
    batch = rollout_batch(tr)
    # the tiny fixture model rarely solves a prompt (all-zero advantages train nothing): random
    # advantages make every row carry a gradient
    adv = batch["advantages"]
    batch["advantages"] = torch.randn(adv.shape, generator=torch.Generator().manual_seed(0))
    if adv.dim() == 2:
        batch["advantages"] *= batch["response_mask"]
    lengths = batch["attention_mask"].sum(-1)
    assert lengths.min() < lengths.max()  # there is padding to leave out
    padded, m_padded = update_grads(tr, batch, False)
    bucketed, m_bucketed = update_grads(tr, batch, True)
    assert len(padded) == len(bucketed) >= 1
    assert all(float(g.abs().sum()) > 0 for g in padded[0])
    for step_a, step_b in zip(padded, bucketed, strict=True):
        for a, b in zip(step_a, step_b, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert m_padded.keys() == m_bucketed.keys()
    for key, value in m_padded.items():
        assert m_bucketed[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    # the bucketed micro-batches hold fewer columns in all
    tr.cfg.trainer.length_bucketing = True
    cells = sum(m["attention_mask"].numel() for m in tr._micro_batches(batch))
    assert cells < sum(m["attention_mask"].numel() for m in batch.split(8))


def test_bucketed_split_orders_rows_by_length_and_trims_each_chunk():
    trajs = [Trajectory(prompt_ids=[1] * p, response_ids=[2] * r, group_id=i)
             for i, (p, r) in enumerate([(5, 1), (1, 1), (5, 6), (2, 2)])]
    batch = RolloutBatch.from_trajectories(trajs, pad_id=0)
    chunks = batch.bucketed_split(2)
    assert [c["group_index"].tolist() for c in chunks] == [[1, 0], [3, 2]]
    assert [tuple(c["input_ids"].shape) for c in chunks] == [(2, 6), (2, 11)]
    assert [len(c) for c in batch.bucketed_split(0)] == [4]
