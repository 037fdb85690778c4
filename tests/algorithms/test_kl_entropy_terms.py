"""The KL-to-reference and entropy terms of every bundle's loss (harness/algorithm.py, spec §0.4):
each estimator estimates KL(π ‖ π_ref) (not the reverse) at its stated scale, k3 survives extreme
log-ratios, the KL term is a penalty and the entropy term a bonus."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import algorithms  # noqa: F401
from harness.algorithm import Aggregator, build_algorithm, kl_penalty
from harness.batch import RolloutBatch

CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm" / "grpo.yaml"
PI = torch.tensor([0.60, 0.30, 0.05, 0.05])
REF = torch.tensor([0.05, 0.15, 0.40, 0.40])  # π_ref / π ≤ 8: k3's ±10 clamp stays inactive


def expectation_under_pi(estimator: str) -> float:
    """E_{x ~ π}[k(x)]: the estimator averaged over tokens sampled from the policy."""
    k = kl_penalty(PI.log(), REF.log(), estimator)
    return float((PI * k).sum())


def test_k1_and_k3_are_unbiased_for_kl_of_the_policy_to_the_reference():
    forward = float((PI * (PI / REF).log()).sum())  # KL(π ‖ π_ref), the penalty's direction
    reverse = float((REF * (REF / PI).log()).sum())
    assert abs(forward - reverse) > 0.05  # the two directions differ here
    assert expectation_under_pi("k1") == pytest.approx(forward, rel=1e-5)
    assert expectation_under_pi("k3") == pytest.approx(forward, rel=1e-5)


def test_each_estimator_has_its_stated_value_at_a_point():
    logp, ref = torch.tensor([-0.5]), torch.tensor([-1.25])  # log r = 0.75
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.75)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * 0.75**2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-0.75) + 0.75 - 1)
    # k2 and k3 are non-negative whatever the sign of log r; k1 is not
    assert kl_penalty(ref, logp, "k1").item() == pytest.approx(-0.75)
    for est in ("k2", "k3"):
        assert kl_penalty(ref, logp, est).item() > 0


@pytest.mark.parametrize("gap", [-200.0, -90.0, 90.0, 200.0])
def test_k3_is_finite_with_a_finite_gradient_at_extreme_log_ratios(gap):
    logp = torch.tensor([gap], requires_grad=True)
    k3 = kl_penalty(logp, torch.tensor([0.0]), "k3")
    k3.sum().backward()
    assert torch.isfinite(k3).all() and torch.isfinite(logp.grad).all()
    assert -10.0 <= k3.item() <= 10.0


def bundle(kl_coef: float = 0.0, entropy_coef: float = 0.0, estimator: str = "k3"):
    cfg = OmegaConf.load(CONF)
    cfg.kl.coef, cfg.entropy_coef, cfg.kl.estimator = kl_coef, entropy_coef, estimator
    return build_algorithm(cfg, max_new_tokens=4)


def one_batch(logp_value: float, ref_value: float):
    mb = RolloutBatch({"old_logprobs": torch.full((2, 3), logp_value),
                       "advantages": torch.tensor([0.5, -0.5]),
                       "response_mask": torch.ones(2, 3),
                       "ref_logprobs": torch.full((2, 3), ref_value)}, [None, None])
    logp = torch.full((2, 3), logp_value, requires_grad=True)
    return mb, logp, Aggregator("token-mean", 6.0, 2)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_term_is_a_penalty_that_pulls_the_policy_towards_the_reference(estimator):
    mb, logp, agg = one_batch(-0.2, -1.0)  # π above π_ref on the sampled tokens
    base, _ = bundle().loss(mb, logp, None, agg)
    value, metrics = bundle(0.1, estimator=estimator).loss(mb, logp, None, agg)
    kl = float(kl_penalty(logp.detach(), mb["ref_logprobs"], estimator).mean())
    assert kl > 0 and value.item() == pytest.approx(base.item() + 0.1 * kl, rel=1e-6)
    assert metrics["actor/kl"] == pytest.approx(kl, rel=1e-6)
    (grad,) = torch.autograd.grad(value, logp)
    (pg_grad,) = torch.autograd.grad(base, logp)
    # the KL part of the gradient is positive: descending it lowers log π towards log π_ref
    assert ((grad - pg_grad) > 0).all()


def test_entropy_term_is_a_bonus():
    mb, logp, agg = one_batch(-0.5, -0.5)
    entropy = torch.full((2, 3), 1.3, requires_grad=True)
    base, _ = bundle().loss(mb, logp, entropy, agg)
    value, _ = bundle(entropy_coef=0.01).loss(mb, logp, entropy, agg)
    assert value.item() == pytest.approx(base.item() - 0.01 * 1.3, rel=1e-6)
    (grad,) = torch.autograd.grad(value, entropy)
    assert (grad < 0).all()  # descending the loss raises the entropy
