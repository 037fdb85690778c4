"""Loss aggregation (spec §0.2, §9.7 item 4): padding invariance, micro-batch split invariance of
the loss, its gradient and the metrics, and finiteness on degenerate batches for every mode."""

from __future__ import annotations

import math

import pytest
import torch

import algorithms  # noqa: F401  (registers estimators and ppo_clip)
from harness.algorithm import AGG_MODES, Aggregator, build_algorithm
from harness.batch import RolloutBatch
from harness.policy_loss import PPOClipLoss
from harness.registry import ADVANTAGES
from harness.typed_config import build
from harness.types import Score, Trajectory

L_MAX = 16
ESTIMATORS = [
    {"name": "grpo"},
    {"name": "dr_grpo"},
    {"name": "rloo"},
    {"name": "maxrl"},
    {"name": "reinforce_pp"},
    {"name": "reinforce_pp", "baseline": "group_mean"},
]


def random_batch(lengths, seed=0, token_adv=False) -> tuple[RolloutBatch, torch.Tensor]:
    """A mini-batch with old log-probs, advantages and per-token features x [B, T, D]; the
    policy's log-probs are ``old + x @ theta`` for a small parameter ``theta``."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(max(lengths), 1)
    mask = torch.zeros(B, T)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    adv = torch.randn((B, T) if token_adv else (B,), generator=g)
    tensors = {
        "old_logprobs": -torch.rand(B, T, generator=g) * 3,
        "advantages": adv,
        "response_mask": mask,
        "ref_logprobs": -torch.rand(B, T, generator=g) * 3,
    }
    x = torch.randn(B, T, 3, generator=g)
    return RolloutBatch(tensors, [Trajectory([], []) for _ in range(B)]), x


def logp_of(batch: RolloutBatch, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    return batch["old_logprobs"] + x @ theta


def pad_columns(
    batch: RolloutBatch, x: torch.Tensor, extra: int
) -> tuple[RolloutBatch, torch.Tensor]:
    """Append ``extra`` padding columns filled with garbage (the mask is 0 there)."""
    B = len(batch)
    tensors = {}
    for k, v in batch.tensors.items():
        if v.dim() == 2:
            fill = torch.zeros(B, extra) if k == "response_mask" else torch.full((B, extra), -7.0)
            tensors[k] = torch.cat([v, fill], dim=1)
        else:
            tensors[k] = v
    return RolloutBatch(tensors, batch.trajectories), torch.cat([x, torch.randn(B, extra, 3)], 1)


LENGTHS = [5, 1, 8, 3, 8, 2, 6]  # unequal token counts per sequence and per micro-batch
THETA = torch.tensor([0.3, -0.2, 0.1])


@pytest.mark.parametrize("mode", AGG_MODES)
def test_loss_is_unchanged_by_extra_padding_columns(mode):
    batch, x = random_batch(LENGTHS)
    loss = PPOClipLoss()
    agg = Aggregator.for_batch(mode, batch, L_MAX)
    base, _ = loss(batch, logp_of(batch, x, THETA), None, agg)
    padded, xp = pad_columns(batch, x, 9)
    agg_p = Aggregator.for_batch(mode, padded, L_MAX)
    value, _ = loss(padded, logp_of(padded, xp, THETA), None, agg_p)
    assert value.item() == pytest.approx(base.item(), rel=1e-6)


def test_seq_mean_token_sum_norm_divides_by_config_l_max_not_padded_width():
    batch, _ = random_batch([2, 3])
    per_token = torch.ones(2, 3)
    agg = Aggregator("seq-mean-token-sum-norm", 5.0, 2, L_max=L_MAX)
    assert agg(per_token, batch["response_mask"]).item() == pytest.approx(5 / (2 * L_MAX))


def split_loss(batch, x, theta, mode, sizes, per_micro_totals=False, algo=None):
    """Sum of micro-batch losses (and metrics) for micro-batches of the given sizes."""
    mini_agg = Aggregator.for_batch(mode, batch, L_MAX)
    total, metrics, start = 0.0, {}, 0
    for size in sizes:
        idx = list(range(start, start + size))
        start += size
        mb, xm = batch.select(idx), x[idx]
        agg = Aggregator.for_batch(mode, mb, L_MAX) if per_micro_totals else mini_agg
        logp = logp_of(mb, xm, theta)
        entropy = (xm[..., 0] * theta[0]).exp()  # depends on theta: the entropy term has a gradient
        if algo is None:
            value, m = PPOClipLoss()(mb, logp, entropy, agg)
        else:
            value, m = algo.loss(mb, logp, entropy, agg)
        total = total + value
        for k, v in m.items():
            metrics[k] = metrics.get(k, 0.0) + v
    return total, metrics


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_loss_gradient_and_metrics_are_invariant_to_micro_batch_split(mode, token_adv):
    batch, x = random_batch(LENGTHS, seed=1, token_adv=token_adv)
    results = []
    for sizes in ([7], [3, 4], [1, 2, 4], [1] * 7):
        theta = THETA.clone().requires_grad_(True)
        value, metrics = split_loss(batch, x, theta, mode, sizes)
        (grad,) = torch.autograd.grad(value, theta)
        results.append((value.item(), grad, metrics))
    v0, g0, m0 = results[0]
    assert g0.abs().sum() > 0
    for v, g, m in results[1:]:
        assert v == pytest.approx(v0, rel=1e-5, abs=1e-7)
        assert torch.allclose(g, g0, rtol=1e-5, atol=1e-7)
        assert m.keys() == m0.keys()
        for k in m0:
            assert m[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k


@pytest.mark.parametrize("mode", AGG_MODES)
def test_bundle_loss_with_kl_and_entropy_is_invariant_to_micro_batch_split(mode):
    node = {"name": "grpo", "agg": mode, "kl": {"coef": 0.1}, "entropy_coef": 0.01}
    algo = build_algorithm(node, max_new_tokens=L_MAX)
    batch, x = random_batch(LENGTHS, seed=2)
    grads, values = [], []
    for sizes in ([7], [2, 5], [4, 1, 2]):
        theta = THETA.clone().requires_grad_(True)
        value, metrics = split_loss(batch, x, theta, mode, sizes, algo=algo)
        assert "actor/kl" in metrics and "actor/entropy" in metrics
        grads.append(torch.autograd.grad(value, theta)[0])
        values.append(value.item())
    for v, g in zip(values[1:], grads[1:], strict=True):
        assert v == pytest.approx(values[0], rel=1e-5)
        assert torch.allclose(g, grads[0], rtol=1e-5, atol=1e-7)


def test_token_mean_with_per_micro_batch_normalisers_would_change_the_loss():
    # The reason the Aggregator takes mini-batch totals: normalising each micro-batch by its own
    # token count weights the tokens of short micro-batches more.
    batch, x = random_batch(LENGTHS, seed=3)
    right, _ = split_loss(batch, x, THETA, "token-mean", [3, 4])
    wrong, _ = split_loss(batch, x, THETA, "token-mean", [3, 4], per_micro_totals=True)
    assert abs(right.item() - wrong.item()) > 1e-3


def scored_batch(rewards, groups, lengths) -> RolloutBatch:
    trajs = [
        Trajectory([1, 2], list(range(3, 3 + n)), group_id=gid,
                   score=Score(reward=r, correct=r > 0, parsed=True))
        for r, gid, n in zip(rewards, groups, lengths, strict=True)
    ]
    batch = RolloutBatch.from_trajectories(trajs, pad_id=0)
    batch["old_logprobs"] = -torch.ones_like(batch["response_mask"])
    return batch


DEGENERATE = {
    "empty_responses": ([1.0, 0.0, 1.0], [0, 0, 1], [0, 0, 0]),
    "group_of_one": ([1.0], [0], [4]),
    "all_equal": ([1.0, 1.0, 1.0, 1.0], [0, 0, 1, 1], [2, 0, 3, 1]),
}


@pytest.mark.parametrize("case", sorted(DEGENERATE))
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: "-".join(map(str, e.values())))
def test_every_estimator_and_agg_mode_gives_a_finite_loss_on_degenerate_batches(
    estimator, mode, case
):
    batch = scored_batch(*DEGENERATE[case])
    batch["advantages"] = build(ADVANTAGES, estimator, "algorithm.advantage")(batch)
    logp = (batch["old_logprobs"] + 0.1).requires_grad_(True)
    agg = Aggregator.for_batch(mode, batch, L_MAX)
    value, metrics = PPOClipLoss()(batch, logp, None, agg)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(logp.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())
