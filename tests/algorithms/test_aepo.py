"""AEPO, agentic (spec §7.7), and AEM's multi-turn form (spec §5.6 on turns)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import algorithms  # noqa: F401
from algorithms.aem import AEMAdvantage
from algorithms.aepo import AEPOLoss, entropy_scaled_advantages
from algorithms.arpo import dynamic_root_count, should_fork
from harness.algorithm import Aggregator, build_algorithm
from harness.batch import RolloutBatch
from harness.policy_loss import PPOClipLoss
from harness.types import Score, Trajectory

CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm"
RATIOS = [0.5, 0.79, 0.9, 1.0, 1.1, 1.21, 1.5, 2.5, 5.0]  # not at a bound: ties split


def one_token(ratio: float, adv: float):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    mb = RolloutBatch({"old_logprobs": torch.zeros(1, 1), "advantages": torch.tensor([adv]),
                       "response_mask": torch.ones(1, 1)}, [None])
    return mb, logp, Aggregator("token-mean", 1.0, 1)


@pytest.mark.parametrize("adv", [-2.0, -0.5, 0.5, 2.0])
@pytest.mark.parametrize("ratio", RATIOS)
def test_aepo_clip_has_the_ppo_value_and_the_spec_gradient(ratio, adv):
    aepo = AEPOLoss(entropy_advantage=False)
    mb, logp, agg = one_token(ratio, adv)
    value, _ = aepo(mb, logp, None, agg)
    mb2, logp2, _ = one_token(ratio, adv)
    ppo_value, _ = PPOClipLoss()(mb2, logp2, None, agg)
    assert value.item() == pytest.approx(ppo_value.item(), rel=1e-6)
    (grad,) = torch.autograd.grad(value, logp)  # d loss / d log pi = -F * A
    if ratio > 1.2 and adv > 0:
        expected = -(1.2) * adv  # PPO would give 0 here
    elif ratio < 0.8 and adv < 0:
        expected = 0.0
    elif adv < 0 and ratio > 3.0:
        expected = 0.0  # dual clip (-cA bound) holds
    else:
        expected = -ratio * adv
    assert grad.item() == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_entropy_aware_advantage_with_a_zero_is_the_base_and_factor_averages_to_one():
    torch.manual_seed(0)
    adv = torch.randn(4, 6)
    ent = torch.rand(4, 6) * 3
    mask = (torch.rand(4, 6) > 0.3).float()
    assert torch.equal(entropy_scaled_advantages(adv, ent, mask, 0.0), adv)
    factor = entropy_scaled_advantages(torch.ones(4, 6), ent, mask, 0.2)
    assert float(factor[mask > 0].mean()) == pytest.approx(1.0, abs=1e-6)


def test_sign_flips_exactly_where_the_entropy_z_score_is_below_minus_five():
    ent = torch.tensor([[0.0] + [10.0] * 99])  # the first token has z ≈ -9.9
    adv = torch.ones(1, 100)
    out = entropy_scaled_advantages(adv, ent, torch.ones(1, 100), 0.2)
    h = ent[0]
    z = (h - h.mean()) / h.std()  # unbiased, as the code
    assert torch.equal(out[0] < 0, z < -5)
    assert int((out[0] < 0).sum()) == 1
    clamped = entropy_scaled_advantages(adv, ent, torch.ones(1, 100), 0.2, clamp_sign=True)
    assert (clamped >= 0).all()


def test_entropy_advantage_uses_the_forward_entropy_inside_the_loss():
    logp = torch.zeros(1, 2, requires_grad=True)
    mb = RolloutBatch({"old_logprobs": torch.zeros(1, 2), "advantages": torch.tensor([1.0]),
                       "response_mask": torch.ones(1, 2)}, [None])
    entropy = torch.tensor([[1.0, 3.0]])  # z = -1, +1
    value, _ = AEPOLoss()(mb, logp, entropy, Aggregator("token-mean", 2.0, 1))
    assert value.item() == pytest.approx(-((1 - 0.2) + (1 + 0.2)) / 2)
    with pytest.raises(ValueError, match="entropy"):
        AEPOLoss()(mb, logp, None, Aggregator("token-mean", 2.0, 1))


def test_premonitoring_root_count_is_bounded_centred_and_monotone():
    k = 16
    assert dynamic_root_count(1.0, 1.0, k) == k // 2 + 1
    counts = [dynamic_root_count(d, 0.0, k) for d in [x / 2 for x in range(-40, 41)]]
    assert counts == sorted(counts) and min(counts) >= 1 and max(counts) <= k
    assert dynamic_root_count(-100, 0, k) == 1 and dynamic_root_count(100, 0, k) == k


def test_without_penalty_aepo_forks_with_arpos_probability():
    rng = random.Random(3)
    for delta in (-1.0, 0.0, 1.5):
        a = sum(should_fork("arpo", rng.random(), delta, 0.2, 0.5, 0.5, 0, 0) for _ in range(20000))
        b = sum(should_fork("aepo", rng.random(), delta, 0.2, 0.5, 0.5, 7, 0.0)
                for _ in range(20000))
        assert a / 20000 == pytest.approx(b / 20000, abs=0.015)


def test_all_switches_off_aepo_is_arpo():
    cfg = OmegaConf.load(CONF / "aepo.yaml")
    cfg.loss.entropy_balanced_clipping = False
    cfg.loss.entropy_advantage = False
    aepo = build_algorithm(cfg, 8)
    arpo = build_algorithm(OmegaConf.load(CONF / "arpo.yaml"), 8)
    for ratio in RATIOS:
        for adv in (-1.0, 1.0):
            mb, logp, agg = one_token(ratio, adv)
            assert aepo.policy_loss(mb, logp, None, agg)[0].item() == pytest.approx(
                arpo.policy_loss(mb, logp, None, agg)[0].item())


def multiturn_batch() -> RolloutBatch:
    """Two groups of two trajectories with two model turns each (a tool result between)."""
    trajs = []
    for g in range(2):
        for k in range(2):
            ent = torch.tensor([0.2, 0.4, 0.0, 0.0, 1.0 + k, 2.0 + g])
            trajs.append(Trajectory([1], [5, 6, 7, 8, 9, 10], logprobs=torch.zeros(6),
                                    entropy=ent, loss_mask=[1, 1, 0, 0, 1, 1],
                                    turn_boundaries=[0, 4], group_id=g,
                                    score=Score(float(k), bool(k), True)))
    return RolloutBatch.from_trajectories(trajs, 0)


def aem(lam: float, group: str = "prompt_group_all_turns") -> AEMAdvantage:
    return AEMAdvantage(AEMAdvantage.Config(base={"name": "grpo"}, lam=lam, group=group))


def test_multiturn_aem_weights_each_turn_and_lambda_zero_is_the_base():
    batch = multiturn_batch()
    base = aem(0.0).base(batch)
    assert torch.allclose(aem(0.0)(batch), base[:, None].expand(-1, 6))
    adv = aem(1.0)(batch)
    # the two turns of a trajectory get different weights (different mean entropies)
    assert adv[0, 0] != adv[0, 4]
    # within a turn the weight is constant; it never flips the base's sign
    assert adv[0, 0] == adv[0, 1] and adv[0, 4] == adv[0, 5]
    mask = batch["response_mask"] > 0
    assert (torch.sign(adv[mask]) == torch.sign(base[:, None].expand(-1, 6)[mask])).all()


def test_multiturn_aem_self_normalises_over_the_groups_turns():
    batch = multiturn_batch()
    est = aem(1.5)
    w = est.turn_weights(batch)
    # group 0's four responses (2 trajectories x 2 turns) average to 1
    group0 = [float(w[r, s]) for r in (0, 1) for s in (0, 4)]
    assert sum(group0) / 4 == pytest.approx(1.0, abs=1e-6)
    same = aem(1.5, "prompt_group_same_turn").turn_weights(batch)
    assert (float(same[0, 0]) + float(same[1, 0])) / 2 == pytest.approx(1.0, abs=1e-6)
    assert max(group0) / min(group0) == pytest.approx(math.exp(1.5), rel=1e-5)


def test_multiturn_aem_turn_entropy_leaves_out_the_tool_result_tokens():
    """Turn 1 of each trajectory: model tokens at entropy 1.0 then a tool result at 9.0 (loss mask
    0); turn 2: model tokens at 2.0. Over the model's tokens turn 1 is the calmer turn and gets
    the larger weight; counting the tool tokens would make it the more entropic one."""
    trajs = []
    for k in range(2):
        ent = torch.tensor([1.0, 1.0, 9.0, 9.0, 2.0, 2.0])
        trajs.append(Trajectory([1], [5, 6, 7, 8, 9, 10], logprobs=torch.zeros(6), entropy=ent,
                                loss_mask=[1, 1, 0, 0, 1, 1], turn_boundaries=[0, 4], group_id=0,
                                score=Score(float(k), bool(k), True)))
    batch = RolloutBatch.from_trajectories(trajs, 0)
    w = aem(1.0).turn_weights(batch)
    assert float(w[0, 0]) > float(w[0, 4])
    assert float(w[0, 0]) / float(w[0, 4]) == pytest.approx(math.e, rel=1e-5)
