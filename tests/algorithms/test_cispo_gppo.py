"""``gppo`` and ``cispo`` losses: value and gradient case by case against the spec (§0.3 items 3
and 5, testable property 6 and 7), with finite differences of the surrogate each gradient claims
to follow."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.cispo import CISPOLoss
from algorithms.gppo import GPPOLoss
from harness.algorithm import Aggregator
from harness.policy_loss import PPOClipLoss
from harness.registry import ALGORITHMS, POLICY_LOSSES
from harness.typed_config import ConfigError, build
from tests.helpers import make_mb

EPS_L, EPS_H, C = 0.2, 0.28, 3.0


def token(ratio: float, A: float, loss, old: float = -1.0):
    """(value, d value / d logp, metrics) for one token with importance ratio ``ratio``."""
    old_t = torch.tensor([[old]], dtype=torch.float64)
    logp = (old_t + math.log(ratio)).clone().requires_grad_(True)
    mb = make_mb(old_t, torch.tensor([A], dtype=torch.float64),
                 torch.ones(1, 1, dtype=torch.float64))
    value, metrics = loss(mb, logp, None, Aggregator("token-mean", 1.0, 1))
    value.backward()
    return value.item(), logp.grad.item(), metrics


def finite_difference(f, x: float, h: float = 1e-6) -> float:
    return (f(x + h) - f(x - h)) / (2 * h)


GPPO = GPPOLoss(clip_low=EPS_L, clip_high=EPS_H, dual_clip_c=C)
PPO = PPOClipLoss(clip_low=EPS_L, clip_high=EPS_H, dual_clip_c=C)

# (ratio, A, d loss / d log pi expected from GPPO, does GPPO differ from PPO here)
GPPO_CASES = {
    "A>0 inside": (1.1, 2.0, -1.1 * 2.0, False),
    "A>0 above 1+eps_h: keeps (1+eps_h)A": (1.5, 2.0, -(1 + EPS_H) * 2.0, True),
    "A>0 below 1-eps_l: rA": (0.5, 2.0, -0.5 * 2.0, False),
    "A<0 inside": (0.9, -2.0, 0.9 * 2.0, False),
    "A<0 below 1-eps_l: keeps (1-eps_l)A": (0.5, -2.0, (1 - EPS_L) * 2.0, True),
    "A<0 above 1+eps_h, below c: rA": (2.0, -2.0, 2.0 * 2.0, False),
    "A<0 above c: dual clip, 0": (5.0, -2.0, 0.0, False),
    "A=0": (1.7, 0.0, 0.0, False),
}


@pytest.mark.parametrize("case", list(GPPO_CASES))
def test_gppo_has_ppo_value_and_the_spec_gradient(case):
    ratio, A, grad, differs = GPPO_CASES[case]
    value, g, _ = token(ratio, A, GPPO)
    ppo_value, ppo_grad, _ = token(ratio, A, PPO)
    assert value == pytest.approx(ppo_value, abs=1e-12)
    assert g == pytest.approx(grad, abs=1e-9)
    assert (abs(g - ppo_grad) > 1e-6) == differs


@pytest.mark.parametrize("case", list(GPPO_CASES))
def test_gppo_gradient_is_the_finite_difference_of_its_surrogate(case):
    """Outside the clip the value is smooth and GPPO's gradient is its derivative; inside the
    clip the value is flat and the gradient is the derivative of bound * log pi."""
    ratio, A, _, differs = GPPO_CASES[case]
    _, g, _ = token(ratio, A, GPPO)
    if differs:
        bound = (1 + EPS_H) if ratio > 1 else (1 - EPS_L)
        surrogate = lambda lp: -bound * A * lp  # noqa: E731
        assert g == pytest.approx(finite_difference(surrogate, math.log(ratio)), abs=1e-6)
        flat = finite_difference(lambda lr: token(math.exp(lr), A, GPPO)[0], math.log(ratio))
        assert flat == pytest.approx(0.0, abs=1e-6)  # PPO's value: no gradient of its own
    else:
        fd = finite_difference(lambda lr: token(math.exp(lr), A, GPPO)[0], math.log(ratio))
        assert g == pytest.approx(fd, abs=1e-5)


CISPO = CISPOLoss(clip_high=EPS_H, clip_low=None)


@pytest.mark.parametrize(("ratio", "A"), [
    (1.1, 2.0), (1.5, 2.0), (3.0, 2.0), (0.5, 2.0), (0.05, -2.0), (1.5, -2.0), (6.0, -1.0),
])
def test_cispo_gradient_is_minus_clipped_weight_times_advantage_on_every_token(ratio, A):
    value, g, _ = token(ratio, A, CISPO)
    weight = min(ratio, 1 + EPS_H)
    assert g == pytest.approx(-weight * A, abs=1e-9)
    # the finite difference of -sg(r̂) A log pi with r̂ held fixed
    surrogate = lambda lp: -weight * A * lp  # noqa: E731
    assert g == pytest.approx(finite_difference(surrogate, -1.0 + math.log(ratio)), abs=1e-6)
    assert value == pytest.approx(-weight * A * (-1.0 + math.log(ratio)), abs=1e-9)


def test_cispo_keeps_the_gradient_where_ppo_drops_it():
    _, ppo_grad, _ = token(1.5, 2.0, PPO)
    _, cispo_grad, metrics = token(1.5, 2.0, CISPO)
    assert ppo_grad == 0.0 and cispo_grad == pytest.approx(-(1 + EPS_H) * 2.0)
    assert metrics["actor/clip_high_frac"] == 1.0 and metrics["actor/clip_low_frac"] == 0.0


def test_cispo_lower_bound_applies_only_when_set():
    lower = CISPOLoss(clip_high=EPS_H, clip_low=0.2)
    _, g, metrics = token(0.5, -2.0, lower)
    assert g == pytest.approx(0.8 * 2.0) and metrics["actor/clip_low_frac"] == 1.0
    _, g, metrics = token(0.5, -2.0, CISPO)
    assert g == pytest.approx(0.5 * 2.0) and metrics["actor/clip_low_frac"] == 0.0


def test_clip_fractions_per_side_are_token_shares():
    ratios = torch.tensor([[1.5, 0.5, 1.0, 0.7]], dtype=torch.float64)
    old = torch.full((1, 4), -1.0, dtype=torch.float64)
    adv = torch.tensor([[2.0, -2.0, 1.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    agg = Aggregator("token-mean", 4.0, 1)
    _, m = GPPO(make_mb(old, adv, mask), old + ratios.log(), None, agg)
    assert m["actor/clip_high_frac"] == pytest.approx(0.25)  # 1.5 with A>0
    assert m["actor/clip_low_frac"] == pytest.approx(0.25)  # 0.5 with A<0
    _, m = PPO(make_mb(old, adv, mask), old + ratios.log(), None, agg)
    assert m["actor/clip_high_frac"] == pytest.approx(0.25)
    assert m["actor/clip_low_frac"] == pytest.approx(0.25)
    _, m = CISPO(make_mb(old, adv, mask), old + ratios.log(), None, agg)
    assert m["actor/clip_high_frac"] == pytest.approx(0.25) and m["actor/clip_low_frac"] == 0.0


def test_cispo_without_clip_high_names_the_key():
    with pytest.raises(ConfigError, match=r"algorithm\.loss\.clip_high is required"):
        build(POLICY_LOSSES, {"name": "cispo"}, "algorithm.loss")


def test_both_losses_and_bundles_are_registered_for_any_bundle():
    assert {"gppo", "cispo"} <= set(POLICY_LOSSES.names())
    assert {"gppo", "cispo"} <= set(ALGORITHMS.names())
    loss = build(POLICY_LOSSES, {"name": "gppo", "clip_high": 0.3}, "algorithm.loss")
    assert isinstance(loss, GPPOLoss) and loss.clip_high == 0.3


@pytest.mark.parametrize("name", ["gppo", "cispo"])
@pytest.mark.slow
def test_a_short_run_of_each_bundle_finishes(name, tmp_path, model_cache):
    from harness.trainer import Trainer
    from tests.helpers import SMALL, make_config

    summary = Trainer(make_config(tmp_path, model_cache, *SMALL, f"algorithm={name}",
                                  "trainer.steps=2", "tracking.enabled=false")).fit()
    assert summary["final/steps"] == 2
