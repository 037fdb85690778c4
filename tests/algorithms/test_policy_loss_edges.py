"""Edges of the PPO clipped surrogate (harness/policy_loss.py): the keys it requires, the
log-ratio clamp on both sides, small positive advantages and the dual clip's boundary, the
per-side clip metrics and which clip knobs are accepted."""

from __future__ import annotations

import math

import pytest
import torch

from harness.algorithm import Aggregator
from harness.batch import RolloutBatch
from harness.policy_loss import LOG_RATIO_CLAMP, PPOClipLoss, token_advantages
from harness.typed_config import ConfigError
from harness.types import Trajectory

AGG = Aggregator("token-mean", 1.0, 1)


def batch(old, adv, mask=None, drop=()):
    old = torch.as_tensor(old, dtype=torch.float64)
    tensors = {"old_logprobs": old, "advantages": torch.as_tensor(adv, dtype=torch.float64),
               "response_mask": torch.ones_like(old) if mask is None else mask}
    for k in drop:
        del tensors[k]
    return RolloutBatch(tensors, [Trajectory([], []) for _ in range(old.shape[0])])


def one_token(log_ratio: float, A: float, loss: PPOClipLoss):
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    logp = (old + log_ratio).clone().requires_grad_(True)
    value, metrics = loss(batch(old, [A]), logp, None, AGG)
    value.backward()
    return value.item(), logp.grad.item(), metrics


def test_token_advantages_must_match_the_log_probs_shape():
    with pytest.raises(ValueError, match=r"^advantages of shape \(2, 3\), logp \(2, 4\)$"):
        token_advantages(torch.zeros(2, 3), torch.zeros(2, 4))
    same = torch.ones(2, 4)
    assert token_advantages(same, torch.zeros(2, 4)) is same


@pytest.mark.parametrize("key", ["old_logprobs", "advantages", "response_mask"])
def test_the_loss_names_itself_and_the_missing_key(key):
    mb = batch([[-1.0]], [1.0], drop=(key,))
    with pytest.raises(KeyError, match=rf"stage 'ppo_clip loss' needs batch keys \['{key}'\]"):
        PPOClipLoss()(mb, torch.tensor([[-1.0]], dtype=torch.float64), None, AGG)


@pytest.mark.parametrize("log_ratio", [-30.0, 30.0])
def test_the_log_ratio_is_clamped_on_both_sides(log_ratio):
    _, _, metrics = one_token(log_ratio, 1.0, PPOClipLoss(dual_clip_c=None))
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.copysign(LOG_RATIO_CLAMP, log_ratio))


def test_a_small_positive_advantage_is_not_dual_clipped():
    value, grad, metrics = one_token(0.0, 0.5, PPOClipLoss())
    assert value == pytest.approx(-0.5)
    assert grad == pytest.approx(-0.5)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0


def test_the_dual_clip_is_inactive_where_the_loss_equals_its_bound():
    old = torch.tensor(-1.0, dtype=torch.float64)
    r = torch.exp((old + math.log(2.0)) - old)  # the ratio exactly as the loss computes it
    loss = PPOClipLoss(dual_clip_c=float(r))  # bound -A c == the loss r at A = -1
    value, _, metrics = one_token(math.log(2.0), -1.0, loss)
    assert value == pytest.approx(2.0)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    _, _, above = one_token(math.log(2.5), -1.0, loss)
    assert above["actor/pg_clipfrac_lower"] == 1.0


def test_clip_side_metrics_count_only_clipped_tokens_on_their_side():
    loss = PPOClipLoss(dual_clip_c=None)
    _, _, high = one_token(math.log(1.5), 1.0, loss)
    assert (high["actor/clip_high_frac"], high["actor/clip_low_frac"]) == (1.0, 0.0)
    _, _, low = one_token(math.log(0.5), -1.0, loss)
    assert (low["actor/clip_high_frac"], low["actor/clip_low_frac"]) == (0.0, 1.0)
    _, _, inside = one_token(0.0, 1.0, loss)
    assert (inside["actor/clip_high_frac"], inside["actor/clip_low_frac"]) == (0.0, 0.0)


def test_zero_clip_bounds_and_a_dual_clip_just_above_one_are_accepted():
    PPOClipLoss(clip_low=0.0, clip_high=0.0)
    PPOClipLoss(dual_clip_c=1.5)
    with pytest.raises(ConfigError, match=r"dual_clip_c must be > 1 \(or null\), got 1.0"):
        PPOClipLoss(dual_clip_c=1.0)


@pytest.mark.parametrize("knobs", [{"clip_low": -0.1}, {"clip_high": -0.1}])
def test_negative_clip_bounds_are_refused_naming_both_knobs(knobs):
    with pytest.raises(ConfigError, match=r"^algorithm\.loss\.clip_low/clip_high must be >= 0, "
                                          r"got -?0\.\d+/-?0\.\d+$"):
        PPOClipLoss(**knobs)
