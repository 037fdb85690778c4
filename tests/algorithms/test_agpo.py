"""AGPO (spec §2): every Testable property of §2.6, δ validation, metrics, a 2-step run."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers the estimators)
from algorithms.agpo import AGPO
from harness.algorithm import build_algorithm
from harness.batch import RolloutBatch
from harness.registry import ADVANTAGES, ALGORITHMS
from harness.trainer import Trainer
from harness.typed_config import ConfigError, build
from harness.types import Score, Trajectory
from tests.helpers import make_config

YAML = "conf/algorithm/agpo.yaml"


def make_batch(correct, groups, rewards=None) -> RolloutBatch:
    rewards = rewards if rewards is not None else [float(c) for c in correct]
    trajs = [
        Trajectory(prompt_ids=[5, 6], response_ids=[7, 8, 9], group_id=g,
                   score=Score(reward=float(r), correct=bool(c), parsed=True))
        for c, g, r in zip(correct, groups, rewards, strict=True)
    ]
    return RolloutBatch.from_trajectories(trajs, pad_id=0)


def agpo(batch: RolloutBatch, **knobs) -> torch.Tensor:
    knobs.setdefault("delta", 0.1)
    return build(ADVANTAGES, {"name": "agpo", **knobs}, "algorithm.advantage")(batch)


def group(k: int, G: int) -> list[int]:
    """k correct then G-k wrong."""
    return [1] * k + [0] * (G - k)


def pop_sigma(mu: float) -> float:
    return math.sqrt(mu * (1 - mu))


# -- §2.6 properties ------------------------------------------------------------------------------
@pytest.mark.parametrize("delta", [1e-4, 0.1, 0.5, 3.0])
@pytest.mark.parametrize("std_kind", ["population", "unbiased"])
def test_all_correct_group_gives_zero(delta, std_kind):  # property 1
    a = agpo(make_batch(group(5, 5), [0] * 5), delta=delta, std_kind=std_kind)
    assert torch.equal(a, torch.zeros(5))


@pytest.mark.parametrize("delta", [1e-4, 0.1, 1.0])
def test_all_wrong_group_is_exactly_minus_one(delta):  # property 2
    a = agpo(make_batch(group(0, 6), [0] * 6), delta=delta)
    assert torch.equal(a, torch.full((6,), -1.0))


def test_wrong_samples_get_exactly_r_in_mixed_groups_whatever_mu():  # property 3
    correct = group(1, 4) + group(2, 4) + group(3, 4) + group(7, 8)
    groups = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 8
    a = agpo(make_batch(correct, groups), delta=0.3)
    wrong = torch.tensor(correct) == 0
    assert torch.equal(a[wrong], torch.full((int(wrong.sum()),), -1.0))
    assert (a[~wrong] > 0).all()
    a2 = agpo(make_batch(correct, groups), delta=0.3, wrong_reward=-2.5)
    assert torch.equal(a2[wrong], torch.full((int(wrong.sum()),), -2.5))
    assert torch.equal(a2[~wrong], a[~wrong])  # R does not touch the positive side


def test_mixed_group_matches_the_formula_by_hand():
    # G=4, 1 correct: mu = 1/4, population sigma^2 = 3/16; delta = 0.5
    a = agpo(make_batch(group(1, 4), [0] * 4), delta=0.5)
    expected = 0.75 / math.sqrt(3 / 16 + 0.25)
    assert a[0].item() == pytest.approx(expected, rel=1e-6)
    # unbiased sigma^2 = 3/16 * 4/3 = 1/4
    a = agpo(make_batch(group(1, 4), [0] * 4), delta=0.5, std_kind="unbiased")
    assert a[0].item() == pytest.approx(0.75 / math.sqrt(0.25 + 0.25), rel=1e-6)


@pytest.mark.parametrize("delta", [0.05, 0.3, 1.0])
def test_correct_advantage_decreases_in_mu_and_is_capped(delta):  # property 4
    G = 10
    correct, groups = [], []
    for k in range(1, G):
        correct += group(k, G)
        groups += [k - 1] * G
    a = agpo(make_batch(correct, groups), delta=delta)
    pos = [a[(k - 1) * G].item() for k in range(1, G)]  # the first sample of each group is correct
    assert all(x > y for x, y in itertools.pairwise(pos))
    assert max(pos) <= 1 / delta
    # sqrt(sigma^2 + delta^2) >= delta, so a correct sample's advantage is <= (1 - mu) / delta
    for k, p in zip(range(1, G), pos, strict=True):
        assert p <= (1 - k / G) / delta + 1e-6


@pytest.mark.parametrize("k,G", [(1, 4), (1, 8), (3, 8), (5, 8), (7, 8)])
def test_delta_to_zero_gives_sqrt_of_odds(k, G):  # property 5
    mu = k / G
    a = agpo(make_batch(group(k, G), [0] * G), delta=1e-7)
    assert a[0].item() == pytest.approx(math.sqrt((1 - mu) / mu), rel=1e-5)


@pytest.mark.parametrize("delta", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("k", range(1, 10))
def test_group_sum_closed_form(delta, k):  # property 6
    G = 10
    mu = k / G
    a = agpo(make_batch(group(k, G), [0] * G), delta=delta)
    closed = G * (1 - mu) * (mu / math.sqrt(mu * (1 - mu) + delta**2) - 1)
    assert a.sum().item() == pytest.approx(closed, rel=1e-5, abs=1e-5)
    threshold = 0.25 * (1 + math.sqrt(1 + 8 * delta**2))
    if abs(mu - threshold) > 1e-6:
        assert (a.sum().item() < 0) == (mu < threshold)


def test_sum_threshold_tends_to_one_half():  # property 6, δ -> 0
    G = 100
    below = agpo(make_batch(group(49, G), [0] * G), delta=1e-4).sum().item()
    above = agpo(make_batch(group(51, G), [0] * G), delta=1e-4).sum().item()
    assert below < 0 < above


def test_form_b_by_hand():  # property 7
    # G=5, 2 correct: mu = 0.4, population sigma^2 = 0.24, delta = 0.2
    d = math.sqrt(0.24 + 0.04)
    a = agpo(make_batch(group(2, 5), [0] * 5), delta=0.2, form="B")
    assert a[:2].tolist() == pytest.approx([0.6 / d] * 2, rel=1e-6)
    assert a[2:].tolist() == pytest.approx([-0.4 / d - 1] * 3, rel=1e-6)
    form_a = agpo(make_batch(group(2, 5), [0] * 5), delta=0.2, form="A")
    assert torch.allclose(a[:2], form_a[:2])  # correct samples agree between the forms
    assert not torch.allclose(a[2:], form_a[2:])


def test_form_b_is_grpo_with_delta_plus_constant_shift():  # property 7
    correct = group(1, 4) + group(3, 4) + group(4, 4) + group(0, 4)
    groups = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    b = make_batch(correct, groups)
    grpo_delta = agpo(b, delta=0.3, form="B", wrong_reward=0.0)
    form_b = agpo(b, delta=0.3, form="B")
    wrong = torch.tensor(correct) == 0
    assert torch.allclose(form_b - grpo_delta, torch.where(wrong, -1.0, 0.0))
    # with R = 0, Form B is group-centred: every group sums to zero (unlike Form A)
    for g in range(4):
        assert grpo_delta[torch.tensor(groups) == g].sum().abs().item() < 1e-5


def test_indicator_is_the_verdict_not_the_shaped_reward():
    # a format score or overlong penalty must not change AGPO (defined on the binary outcome)
    plain = agpo(make_batch(group(2, 4), [0] * 4))
    shaped = agpo(make_batch(group(2, 4), [0] * 4, rewards=[0.8, 1.0, 0.1, -0.3]))
    assert torch.equal(plain, shaped)


def test_lone_sample_groups():
    a = agpo(make_batch([1, 0], [0, 1]))
    assert a.tolist() == [0.0, -1.0]


# -- config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, 0.0, -0.1, float("nan"), float("inf"), "abc"])
def test_invalid_delta_raises_naming_the_key(bad):
    with pytest.raises(ConfigError, match=r"algorithm\.advantage\.delta"):
        build(ADVANTAGES, {"name": "agpo", "delta": bad}, "algorithm.advantage")


def test_missing_delta_raises_naming_the_key():
    with pytest.raises(ConfigError, match=r"algorithm\.advantage\.delta"):
        build(ADVANTAGES, {"name": "agpo"}, "algorithm.advantage")
    node = OmegaConf.to_container(OmegaConf.load(YAML))
    del node["advantage"]["delta"]
    with pytest.raises(ConfigError, match=r"algorithm\.advantage\.delta"):
        build_algorithm(node, max_new_tokens=12)


@pytest.mark.parametrize("knob,value", [("form", "C"), ("form", "a"), ("std_kind", "sample")])
def test_invalid_form_and_std_kind(knob, value):
    with pytest.raises(ConfigError, match=rf"algorithm\.advantage\.{knob}"):
        build(ADVANTAGES, {"name": "agpo", "delta": 0.1, knob: value}, "algorithm.advantage")


def test_yaml_defaults_and_registration():
    node = OmegaConf.load(YAML)
    assert node.advantage.delta > 0 and node.advantage.form == "A"
    assert node.advantage.std_kind == "population" and node.advantage.wrong_reward == -1.0
    alg = build_algorithm(OmegaConf.to_container(node), max_new_tokens=12)
    assert isinstance(alg, AGPO) and ALGORITHMS.get("agpo") is AGPO
    assert alg.advantage.delta == node.advantage.delta
    grpo = OmegaConf.load("conf/algorithm/grpo.yaml")
    for key in ("rollout", "loss", "agg", "kl", "entropy_coef", "overlong"):
        assert node[key] == grpo[key], key  # only the advantage differs from GRPO


# -- metrics --------------------------------------------------------------------------------------
def test_metrics_fractions_and_means():
    correct = group(4, 4) + group(0, 4) + group(0, 4) + group(1, 4)
    groups = [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    est = build(ADVANTAGES, {"name": "agpo", "delta": 0.5}, "algorithm.advantage")
    a = est(make_batch(correct, groups))
    m = est.last_metrics
    assert m["agpo/all_correct_group_frac"] == pytest.approx(0.25)
    assert m["agpo/all_wrong_group_frac"] == pytest.approx(0.5)
    assert m["agpo/adv_pos_mean"] == pytest.approx(a[12].item())  # the only positive sample
    assert m["agpo/adv_neg_mean"] == pytest.approx(-1.0)
    est(make_batch(group(4, 4), [0] * 4))  # all zero: no positive nor negative mean
    assert "agpo/adv_pos_mean" not in est.last_metrics
    assert "agpo/adv_neg_mean" not in est.last_metrics


@pytest.mark.slow
def test_two_step_run_logs_the_agpo_metrics(tmp_path, model_cache):
    cfg = make_config(
        tmp_path, model_cache, "algorithm=agpo", "algorithm.advantage.delta=0.3",
        "trainer.steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=2",
        "data.prompts_per_step=4", "rollout.n=4",
        "task.tiny.eval.heldout.limit=8", "task.tiny.eval.heldout.n=2",
        "task.tiny.eval.heldout.k=[1,2]",
    )
    summary = Trainer(cfg).fit()
    assert summary["final/steps"] == 2
    client = MlflowClient(cfg.tracking.uri)
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.name"] == "agpo"
    metrics = run.data.metrics
    for key in ("agpo/all_correct_group_frac", "agpo/all_wrong_group_frac"):
        assert 0.0 <= metrics[key] <= 1.0 + 1e-6, key
    if "agpo/adv_neg_mean" in metrics:
        assert metrics["agpo/adv_neg_mean"] < 0
