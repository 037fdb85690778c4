"""Advantage estimators (spec §9.7 items 1-3, REINFORCE++) and the group helpers they share."""

from __future__ import annotations

import math

import pytest
import torch

import algorithms  # noqa: F401  (registers the estimators)
from harness.batch import RolloutBatch
from harness.groups import group_max, group_mean, group_min, group_std
from harness.registry import ADVANTAGES
from harness.typed_config import ConfigError, build
from tests.helpers import make_batch

ESTIMATORS = {
    "grpo": {"name": "grpo"},
    "grpo_population": {"name": "grpo", "std_kind": "population"},
    "dr_grpo": {"name": "dr_grpo"},
    "rloo": {"name": "rloo"},
    "maxrl": {"name": "maxrl"},
    "reinforce_pp": {"name": "reinforce_pp"},
    "reinforce_pp_baseline": {"name": "reinforce_pp", "baseline": "group_mean"},
}


def adv(name: str, batch: RolloutBatch, **knobs) -> torch.Tensor:
    return build(ADVANTAGES, {"name": name, **knobs}, "algorithm.advantage")(batch)


def per_group(values: torch.Tensor, groups: list[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for v, g in zip(values.tolist(), groups, strict=True):
        out.setdefault(g, []).append(v)
    return out


# Interleaved (non-contiguous) groups of different sizes with binary rewards.
REWARDS = [1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1]
GROUPS = [0, 1, 0, 2, 1, 0, 2, 1, 2, 0, 2, 1]


# -- group helpers --------------------------------------------------------------------------------
def test_group_helpers_match_a_per_group_loop_on_non_contiguous_groups():
    torch.manual_seed(0)
    gi = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0, 2])
    x = torch.randn(9)
    for g in range(3):
        xs = x[gi == g]
        assert group_mean(x, gi)[g] == pytest.approx(xs.mean().item(), abs=1e-6)
        assert group_std(x, gi, "unbiased")[g] == pytest.approx(xs.std().item(), abs=1e-6)
        assert group_std(x, gi, "population")[g] == pytest.approx(
            xs.std(unbiased=False).item(), abs=1e-6
        )
        assert group_max(x, gi)[g] == xs.max() and group_min(x, gi)[g] == xs.min()


# -- GRPO / Dr.GRPO -------------------------------------------------------------------------------
def test_grpo_matches_hand_computation_with_unbiased_std():
    a = adv("grpo", make_batch([1, 0, 0, 0], [0, 0, 0, 0]))
    std = math.sqrt(((0.75**2) + 3 * 0.25**2) / 3)  # Bessel
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-6)
    assert torch.allclose(a, expected, atol=1e-6)


def test_grpo_population_std_is_sqrt_mu_one_minus_mu_for_binary_rewards():
    a = adv("grpo", make_batch([1, 0, 0, 0], [0, 0, 0, 0]), std_kind="population")
    std = math.sqrt(0.25 * 0.75)
    assert torch.allclose(a, torch.tensor([0.75, -0.25, -0.25, -0.25]) / (std + 1e-6), atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "maxrl"])
def test_group_advantages_sum_to_zero_per_group(name):
    a = adv(name, make_batch(REWARDS, GROUPS))
    for g, vals in per_group(a, GROUPS).items():
        assert sum(vals) == pytest.approx(0.0, abs=1e-5), g
    assert a.abs().sum() > 0  # not trivially zero


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "maxrl"])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.3])
def test_constant_group_gives_zero_advantages(name, value):
    a = adv(name, make_batch([value] * 4 + [1, 0], [0, 0, 0, 0, 1, 1]))
    assert torch.equal(a[:4], torch.zeros(4))
    assert a[4] > 0 > a[5]


def test_dr_grpo_equals_grpo_times_group_std():
    batch = make_batch(REWARDS, GROUPS)
    grpo, dr = adv("grpo", batch), adv("dr_grpo", batch)
    std = group_std(batch["rewards"], batch["group_index"], "unbiased")[batch["group_index"]]
    assert torch.allclose(dr, grpo * (std + 1e-6), atol=1e-6)
    assert torch.equal(torch.sign(dr), torch.sign(grpo))


def test_single_sample_group_uses_mean_zero_std_one_like_verl():
    batch = make_batch([0.5, 1, 0], [0, 1, 1])
    assert adv("grpo", batch)[0] == pytest.approx(0.5 / (1 + 1e-6))
    assert adv("dr_grpo", batch)[0] == pytest.approx(0.5)


def test_grpo_rejects_unknown_std_kind():
    with pytest.raises(ConfigError, match="std_kind"):
        adv("grpo", make_batch([1, 0], [0, 0]), std_kind="biased")


# -- RLOO -----------------------------------------------------------------------------------------
def test_rloo_is_k_over_k_minus_one_times_dr_grpo():
    batch = make_batch(REWARDS, GROUPS)
    rloo, dr = adv("rloo", batch), adv("dr_grpo", batch)
    K = torch.bincount(batch["group_index"]).float()[batch["group_index"]]
    assert torch.allclose(rloo, K / (K - 1) * dr, atol=1e-6)


def test_rloo_is_leave_one_out_by_hand_and_zero_for_a_group_of_one():
    a = adv("rloo", make_batch([1, 0, 0.5, 7], [0, 0, 0, 1]))
    assert torch.allclose(a, torch.tensor([1 - 0.25, 0 - 0.75, 0.5 - 0.5, 0.0]))


# -- MaxRL ----------------------------------------------------------------------------------------
def test_maxrl_wrong_is_minus_one_correct_is_inverse_mean_minus_one():
    rewards, groups = [1, 0, 0, 0, 1, 1, 0, 1], [0, 0, 0, 0, 1, 1, 1, 1]
    a = adv("maxrl", make_batch(rewards, groups))
    mu = {0: 0.25, 1: 0.75}
    for ai, r, g in zip(a.tolist(), rewards, groups, strict=True):
        if r:
            assert ai == pytest.approx(1 / mu[g] - 1, rel=1e-6)
        else:
            assert ai == -1.0  # exactly: no epsilon in the denominator


def test_maxrl_all_fail_group_gives_zero():
    a = adv("maxrl", make_batch([0, 0, 0, 1, 0], [0, 0, 0, 1, 1]))
    assert torch.equal(a[:3], torch.zeros(3))
    assert a[3] == 1.0 and a[4] == -1.0


# -- REINFORCE++ ----------------------------------------------------------------------------------
def test_reinforce_pp_token_advantages_are_whitened_over_masked_tokens():
    batch = make_batch([1, 0, 0.5, 1, 0, 0], [0, 0, 1, 1, 2, 2], lengths=[2, 5, 1, 4, 3, 6])
    mask = batch["response_mask"]
    a = adv("reinforce_pp", batch)
    assert a.shape == mask.shape
    vals = a[mask.bool()]
    assert vals.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert vals.std().item() == pytest.approx(1.0, abs=1e-6)  # Bessel over tokens, as verl
    assert torch.equal(a[~mask.bool()], torch.zeros_like(a[~mask.bool()]))
    # Every token of a sequence carries its outcome (gamma = 1): one value per row.
    for i in range(len(batch)):
        row = a[i][mask[i].bool()]
        assert torch.allclose(row, row[0].expand_as(row))


def test_reinforce_pp_whitening_weights_sequences_by_token_count():
    # Two sequences: reward 1 with 3 tokens, reward 0 with 1 token -> token mean 0.75.
    a = adv("reinforce_pp", make_batch([1, 0], [0, 1], lengths=[3, 1]))
    std = math.sqrt((3 * 0.25**2 + 0.75**2) / 3)
    assert a[0, 0].item() == pytest.approx(0.25 / std, rel=1e-5)
    assert a[1, 0].item() == pytest.approx(-0.75 / std, rel=1e-5)


def test_reinforce_pp_group_mean_baseline_zeroes_constant_groups_before_whitening():
    est = build(ADVANTAGES, {"name": "reinforce_pp", "baseline": "group_mean"}, "x")
    batch = make_batch([1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 2, 2])
    s = est.scores(batch)
    assert torch.equal(s[:4], torch.zeros(4))
    assert torch.allclose(s[4:], torch.tensor([0.5, -0.5]))


def test_reinforce_pp_group_mean_all_constant_batch_gives_all_zeros():
    batch = make_batch([1, 1, 0, 0, 0.5, 0.5], [0, 0, 1, 1, 2, 2], lengths=[1, 2, 3, 4, 5, 6])
    assert torch.equal(adv("reinforce_pp", batch, baseline="group_mean"), torch.zeros(6, 6))
    assert adv("reinforce_pp", batch).abs().sum() > 0  # without the baseline it is not zero


def test_reinforce_pp_rejects_unknown_baseline():
    with pytest.raises(ConfigError, match="baseline"):
        adv("reinforce_pp", make_batch([1, 0], [0, 0]), baseline="leave_one_out")


# -- robustness -----------------------------------------------------------------------------------
EDGE_CASES = {
    "group_of_one": ([1.0], [0], [3]),
    "groups_of_one": ([1.0, 0.0, 0.5], [0, 1, 2], [3, 2, 1]),
    "all_equal": ([1.0] * 4, [0, 0, 1, 1], [3, 3, 3, 3]),
    "all_zero": ([0.0] * 4, [0, 0, 1, 1], [3, 3, 3, 3]),
    "empty_responses": ([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], [0, 0, 0, 0]),
    "one_token": ([1.0, 0.0], [0, 0], [1, 0]),
    "negative_rewards": ([-1.0, -0.5, 0.0, -0.2], [0, 0, 1, 1], [2, 2, 2, 2]),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_every_estimator_gives_finite_advantages_on_edge_cases(estimator, case):
    rewards, groups, lengths = EDGE_CASES[case]
    batch = make_batch(rewards, groups, lengths)
    a = build(ADVANTAGES, ESTIMATORS[estimator], "algorithm.advantage")(batch)
    assert a.shape in {(len(batch),), tuple(batch["response_mask"].shape)}
    assert torch.isfinite(a).all()


def test_empty_batch_gives_empty_advantages():
    batch = RolloutBatch.from_trajectories([], pad_id=0)
    batch.tensors["rewards"] = torch.zeros(0)
    for knobs in ESTIMATORS.values():
        a = build(ADVANTAGES, knobs, "algorithm.advantage")(batch)
        assert a.shape[0] == 0
