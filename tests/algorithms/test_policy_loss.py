"""``ppo_clip``: value, gradient and metrics case by case (spec §0.3, §9.7)."""

from __future__ import annotations

import math

import pytest
import torch

import algorithms  # noqa: F401  (registers ppo_clip)
from harness.algorithm import Aggregator
from harness.policy_loss import PPOClipLoss
from harness.registry import POLICY_LOSSES
from harness.typed_config import ConfigError, build
from tests.helpers import make_mb

EPS_L, EPS_H, C = 0.2, 0.28, 3.0


def one_token(ratio: float, A: float, loss: PPOClipLoss):
    """Loss, d loss / d logp and metrics for a single token with importance ratio ``ratio``."""
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    logp = (old + math.log(ratio)).clone().requires_grad_(True)
    mask = torch.ones(1, 1, dtype=torch.float64)
    mb = make_mb(old, torch.tensor([A], dtype=torch.float64), mask)
    value, metrics = loss(mb, logp, None, Aggregator("token-mean", 1.0, 1))
    value.backward()
    return value.item(), logp.grad.item(), metrics


def finite_difference(ratio: float, A: float, loss: PPOClipLoss, h: float = 1e-6) -> float:
    def f(lr: float) -> float:
        old = torch.tensor([[-1.0]], dtype=torch.float64)
        ones = torch.ones(1, 1, dtype=torch.float64)
        mb = make_mb(old, torch.tensor([A], dtype=torch.float64), ones)
        return loss(mb, old + lr, None, Aggregator("token-mean", 1.0, 1))[0].item()

    lr = math.log(ratio)
    return (f(lr + h) - f(lr - h)) / (2 * h)


# (ratio, A, expected loss, expected d loss / d logp, clip active, dual clip active)
CASES = {
    "A>0 inside": (1.1, 2.0, -1.1 * 2.0, -1.1 * 2.0, False, False),
    "A>0 above 1+eps_h (clipped)": (1.5, 2.0, -(1 + EPS_H) * 2.0, 0.0, True, False),
    "A>0 below 1-eps_l (not clipped)": (0.5, 2.0, -0.5 * 2.0, -0.5 * 2.0, False, False),
    "A<0 inside": (0.9, -2.0, 0.9 * 2.0, 0.9 * 2.0, False, False),
    "A<0 below 1-eps_l (clipped)": (0.5, -2.0, (1 - EPS_L) * 2.0, 0.0, True, False),
    "A<0 above 1+eps_h, below c": (2.0, -2.0, 2.0 * 2.0, 2.0 * 2.0, False, False),
    "A<0 above c (dual clip)": (5.0, -2.0, C * 2.0, 0.0, False, True),
    "A=0": (1.7, 0.0, 0.0, 0.0, False, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ppo_clip_value_and_gradient_case_by_case(case):
    ratio, A, want_loss, want_grad, clip, dual = CASES[case]
    loss = PPOClipLoss(clip_low=EPS_L, clip_high=EPS_H, dual_clip_c=C)
    value, grad, metrics = one_token(ratio, A, loss)
    assert value == pytest.approx(want_loss, abs=1e-9)
    assert grad == pytest.approx(want_grad, abs=1e-9)
    assert grad == pytest.approx(finite_difference(ratio, A, loss), abs=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(want_loss, abs=1e-9)
    assert metrics["actor/pg_clipfrac"] == float(clip)
    assert metrics["actor/pg_clipfrac_lower"] == float(dual)
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(ratio), abs=1e-9)


def test_without_dual_clip_a_negative_advantage_is_unbounded():
    loss = PPOClipLoss(clip_low=EPS_L, clip_high=EPS_H, dual_clip_c=None)
    value, grad, metrics = one_token(5.0, -2.0, loss)
    assert value == pytest.approx(10.0) and grad == pytest.approx(10.0)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_sequence_advantages_broadcast_like_token_advantages():
    torch.manual_seed(0)
    old = torch.randn(3, 4)
    logp = old + 0.3 * torch.randn(3, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    seq_adv = torch.tensor([1.0, -0.5, 2.0])
    agg = Aggregator("token-mean", float(mask.sum()), 3)
    loss = PPOClipLoss()
    a, ma = loss(make_mb(old, seq_adv, mask), logp, None, agg)
    b, mb = loss(make_mb(old, seq_adv[:, None].expand(3, 4).clone(), mask), logp, None, agg)
    assert torch.allclose(a, b) and ma == mb


def test_masked_tokens_contribute_neither_loss_nor_gradient():
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = PPOClipLoss()
    agg = Aggregator("token-mean", 2.0, 1)
    logp = torch.tensor([[0.1, -0.1, 0.0]], requires_grad=True)
    base, _ = loss(make_mb(old, torch.tensor([1.0]), mask), logp, None, agg)
    base.backward()
    assert logp.grad[0, 2] == 0.0
    moved = torch.tensor([[0.1, -0.1, 30.0]])
    assert loss(make_mb(old, torch.tensor([1.0]), mask), moved, None, agg)[0] == base.detach()


def test_metrics_are_token_weighted_shares_of_the_minibatch():
    old = torch.zeros(2, 3)
    # ratios: row 0 -> [1.5 (clipped), 1.0, pad], row 1 -> [5.0 (dual), 1.0, 1.0]
    logp = torch.log(torch.tensor([[1.5, 1.0, 9.0], [5.0, 1.0, 1.0]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    _, m = PPOClipLoss()(make_mb(old, adv, mask), logp, None, Aggregator("token-mean", 5.0, 2))
    assert m["actor/pg_clipfrac"] == pytest.approx(1 / 5)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)
    assert m["actor/ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(5.0)) / 5, rel=1e-6)


def test_extreme_log_ratio_stays_finite():
    old = torch.tensor([[-200.0, 0.0]])
    logp = torch.tensor([[0.0, -200.0]], requires_grad=True)
    mb = make_mb(old, torch.tensor([-1.0]), torch.ones(1, 2))
    value, metrics = PPOClipLoss(dual_clip_c=None)(mb, logp, None, Aggregator("token-mean", 2.0, 1))
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(logp.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    "knobs, key",
    [
        ({"dual_clip_c": 1.0}, "dual_clip_c"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_high": -0.1}, "clip_high"),
    ],
)
def test_invalid_clip_knobs_raise_config_error(knobs, key):
    with pytest.raises(ConfigError, match=key):
        build(POLICY_LOSSES, {"name": "ppo_clip", **knobs}, "algorithm.loss")
