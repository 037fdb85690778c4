"""The default algorithm bundle (harness/algorithm.py) on hand-computed numbers: every loss
aggregation mode and its weights, the KL estimators and their clamps, DAPO's overlong penalty and
reward shaping, which rows can carry a gradient, the KL and entropy terms of the loss, and the
errors that name the bad config key."""

from __future__ import annotations

import math

import pytest
import torch

import algorithms  # noqa: F401  (registers the bundles and their parts)
from harness.algorithm import Aggregator, build_algorithm, kl_penalty, overlong_penalty
from harness.batch import RolloutBatch
from harness.typed_config import ConfigError
from harness.types import Trajectory
from tests.helpers import make_batch

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


# ---- Aggregator ----------------------------------------------------------------------------

def test_token_mean_divides_by_the_minibatch_tokens():
    assert Aggregator("token-mean", 10.0, 2)(PER_TOKEN, MASK).item() == pytest.approx(15 / 10)


def test_seq_mean_token_mean_averages_each_sequence_then_the_minibatch():
    agg = Aggregator("seq-mean-token-mean", 5.0, 4)
    assert agg(PER_TOKEN, MASK).item() == pytest.approx((2.0 + 4.5) / 4)


def test_seq_mean_token_mean_gives_an_empty_row_zero():
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    agg = Aggregator("seq-mean-token-mean", 3.0, 2)
    assert agg(PER_TOKEN, mask).item() == pytest.approx(2.0 / 2)


def test_seq_mean_token_sum_divides_the_sum_by_the_sequences():
    assert Aggregator("seq-mean-token-sum", 5.0, 3)(PER_TOKEN, MASK).item() == pytest.approx(5.0)


def test_seq_mean_token_sum_norm_divides_by_sequences_times_l_max():
    agg = Aggregator("seq-mean-token-sum-norm", 5.0, 2, L_max=10)
    assert agg(PER_TOKEN, MASK).item() == pytest.approx(15 / 20)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_minibatch_of_no_sequences_divides_by_one(mode):
    one = torch.tensor([[2.0]])
    assert Aggregator(mode, 1.0, 0)(one, torch.ones(1, 1)).item() == pytest.approx(2.0)


def test_token_weights_multiply_the_loss_but_never_the_diagnostics():
    agg = Aggregator("token-mean", 5.0, 2)
    w = torch.tensor([[2.0, 2.0, 2.0], [0.5, 0.5, 0.5]])
    weighted = agg.weighted(w)
    assert weighted.token_weights is w and agg.token_weights is None
    assert (weighted.mode, weighted.total_tokens, weighted.total_seqs) == ("token-mean", 5.0, 2)
    assert weighted(PER_TOKEN, MASK).item() == pytest.approx((12 + 4.5) / 5)
    assert weighted.mean(PER_TOKEN, MASK) == pytest.approx(15 / 5)


def test_diagnostics_average_over_metric_tokens_when_given():
    agg = Aggregator("token-mean", 5.0, 2, metric_tokens=3.0)
    assert agg.mean(PER_TOKEN, MASK) == pytest.approx(15 / 3)
    assert Aggregator("token-mean", 0.0, 0).mean(PER_TOKEN, MASK) == pytest.approx(15.0)


def test_for_batch_counts_the_response_tokens_and_rows():
    agg = Aggregator.for_batch("seq-mean-token-sum-norm", make_batch([1, 0], [0, 0]), L_max=7)
    assert (agg.mode, agg.total_tokens, agg.total_seqs, agg.L_max) == (
        "seq-mean-token-sum-norm", 6.0, 2, 7)


def test_an_unknown_mode_is_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"^algorithm\.agg='sum'; valid modes: token-mean, "
                                          r"seq-mean-token-mean, seq-mean-token-sum, "
                                          r"seq-mean-token-sum-norm$"):
        Aggregator("sum", 1.0, 1)


def test_seq_mean_token_sum_norm_needs_l_max():
    with pytest.raises(ConfigError, match=r"^algorithm\.agg_L_max must be set for "
                                          r"seq-mean-token-sum-norm$"):
        Aggregator("seq-mean-token-sum-norm", 1.0, 1)
    Aggregator("seq-mean-token-sum", 1.0, 1)  # the others do not


# ---- KL and overlong -----------------------------------------------------------------------

def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    lr = logp - ref  # [0.5, -1.0]
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx(lr.tolist())
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx((0.5 * lr ** 2).tolist())
    k3 = [math.exp(-x) + x - 1 for x in lr.tolist()]
    assert kl_penalty(logp, ref, "k3").tolist() == pytest.approx(k3)


@pytest.mark.parametrize("log_ratio", [-30.0, 30.0])
def test_k3_is_clamped_at_ten(log_ratio):
    assert kl_penalty(torch.tensor([log_ratio]), torch.tensor([0.0]), "k3").item() == 10.0


def test_an_unknown_kl_estimator_is_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"^algorithm\.kl\.estimator='k4'; valid: k1, k2, k3$"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_overlong_penalty_is_zero_then_linear_down_to_minus_penalty():
    lengths = torch.tensor([0, 6, 7, 8, 10, 12])
    got = overlong_penalty(lengths, max_len=10, buffer_len=4, penalty=2.0).tolist()
    assert got == pytest.approx([0.0, 0.0, -0.5, -1.0, -2.0, -2.0])


def test_without_a_soft_zone_only_responses_reaching_l_max_are_punished():
    got = overlong_penalty(torch.tensor([9, 10, 11]), max_len=10, buffer_len=0, penalty=0.5)
    assert got.tolist() == [0.0, -0.5, -0.5]


# ---- the bundle ----------------------------------------------------------------------------

def bundle(max_new_tokens=10, **node):
    return build_algorithm({"name": "grpo", **node}, max_new_tokens)


def test_build_algorithm_needs_a_name_and_lists_the_choices():
    for node in (None, {}, {"agg": "token-mean"}):
        with pytest.raises(ConfigError, match=r"^algorithm\.name is required \(one of: .*grpo, "):
            build_algorithm(node, 8)


def test_build_algorithm_keeps_the_name_and_the_token_budget():
    alg = build_algorithm({"name": "dr_grpo", "agg": "seq-mean-token-sum-norm"}, 12)
    assert (alg.config.name, alg.max_new_tokens, alg.L_max) == ("dr_grpo", 12, 12)
    assert type(alg).__name__ == "DrGRPO"


def test_build_algorithm_names_the_bad_key():
    with pytest.raises(ConfigError, match=r"algorithm\.kl"):
        build_algorithm({"name": "grpo", "kl": {"coef": "lots"}}, 8)


def test_agg_l_max_overrides_the_token_budget():
    assert bundle(agg_L_max=32).L_max == 32
    assert bundle().L_max == 10


def test_bad_agg_and_kl_estimator_are_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"^algorithm\.agg='x'; valid modes: token-mean, "):
        bundle(agg="x")
    with pytest.raises(ConfigError, match=r"^algorithm\.kl\.estimator='k9'; valid: k1, k2, k3$"):
        bundle(kl={"estimator": "k9"})


@pytest.mark.parametrize("key,name", [("rollout", "group"), ("advantage", "grpo"),
                                      ("loss", "ppo_clip")])
def test_each_part_is_built_under_its_own_key(key, name):
    with pytest.raises(ConfigError, match=rf"algorithm\.{key}\.bogus"):
        bundle(**{key: {"name": name, "bogus": 1}})


def test_the_parts_are_built_from_their_nodes():
    alg = bundle(rollout={"name": "group"}, advantage={"name": "grpo", "std_kind": "population"},
                 loss={"name": "ppo_clip", "clip_high": 0.28})
    assert alg.rollout is not None
    assert alg.advantage.std_kind == "population"
    assert alg.policy_loss.clip_high == 0.28


def test_the_aggregator_uses_the_configured_mode_and_l_max():
    alg = bundle(agg="seq-mean-token-sum-norm", agg_L_max=16)
    agg = alg.aggregator(make_batch([1, 0], [0, 0]))
    assert (agg.mode, agg.L_max, agg.total_seqs, agg.total_tokens) == (
        "seq-mean-token-sum-norm", 16, 2, 6.0)


def test_overlong_shaping_adds_the_penalty_to_the_raw_reward():
    alg = bundle(max_new_tokens=10,
                 overlong={"enabled": True, "buffer_len": 4, "penalty": 1.0})
    batch = make_batch([1, 1, 0], [0, 0, 0], lengths=[6, 8, 10])
    batch["raw_rewards"] = torch.tensor([1.0, 1.0, 0.0])
    alg.shape_rewards(batch)
    assert batch["rewards"].tolist() == pytest.approx([1.0, 0.5, -1.0])


def test_the_overlong_buffer_defaults_to_a_fraction_of_the_budget():
    alg = bundle(max_new_tokens=10, overlong={"enabled": True, "buffer_frac": 0.4})
    batch = make_batch([1, 1], [0, 0], lengths=[6, 8])
    alg.shape_rewards(batch)
    assert batch["rewards"].tolist() == pytest.approx([1.0, 0.5])  # buffer round(0.4 * 10) = 4


def test_shaping_is_off_by_default():
    batch = make_batch([1, 0], [0, 0], lengths=[10, 10])
    bundle(max_new_tokens=10).shape_rewards(batch)
    assert batch["rewards"].tolist() == [1.0, 0.0]


def test_overlong_shaping_names_itself_when_raw_rewards_are_missing():
    alg = bundle(overlong={"enabled": True})
    batch = make_batch([1], [0])
    del batch.tensors["raw_rewards"]
    with pytest.raises(KeyError,
                       match=r"stage 'overlong shaping' needs batch keys \['raw_rewards'\]"):
        alg.shape_rewards(batch)


def test_compute_advantages_writes_them_and_returns_the_estimators_metrics():
    alg = bundle()
    batch = make_batch([1, 0, 1, 1], [0, 0, 1, 1])
    assert alg.compute_advantages(batch) == {}
    assert batch["advantages"].shape == (4,)
    assert batch["advantages"][2:].tolist() == [0.0, 0.0]

    alg.advantage.last_metrics = {"adv/x": 1.0}
    metrics = alg.compute_advantages(batch)
    assert metrics == {"adv/x": 1.0} and metrics is not alg.advantage.last_metrics


@pytest.mark.parametrize("key", ["rewards", "group_index", "response_mask"])
def test_compute_advantages_names_itself_and_the_missing_key(key):
    batch = make_batch([1, 0], [0, 0])
    del batch.tensors[key]
    with pytest.raises(KeyError, match=rf"stage 'advantage' needs batch keys \['{key}'\]"):
        bundle().compute_advantages(batch)


def test_default_hooks_do_nothing():
    alg = bundle()
    batch = make_batch([1, 0], [0, 0])
    assert alg.select_training_rows(batch) == (batch, {})
    assert alg.state_dict() == {}
    assert alg.load_state_dict({}) is None
    assert alg.prepare_minibatch(batch, lambda mb: None) == {}
    assert not alg.needs_reference and bundle(kl={"coef": 0.1}).needs_reference


def _rows_batch(adv):
    batch = make_batch([1, 0, 1], [0, 0, 0], lengths=[2, 2, 2])
    batch["response_mask"] = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    batch["advantages"] = adv
    return batch


def test_zero_advantage_rows_and_empty_rows_carry_no_gradient():
    alg = bundle()
    assert alg.gradient_rows(_rows_batch(torch.tensor([0.5, 0.0, 0.5]))).tolist() == [
        True, False, False]


def test_token_advantages_count_only_on_unmasked_tokens():
    alg = bundle()
    adv = torch.tensor([[0.0, 0.3], [0.0, 0.0], [1.0, 1.0]])
    assert alg.gradient_rows(_rows_batch(adv)).tolist() == [True, False, False]
    batch = _rows_batch(torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    batch["response_mask"] = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    batch["advantages"] = torch.tensor([[0.0, 9.0], [0.0, 0.0], [0.0, 0.0]])
    assert alg.gradient_rows(batch).tolist() == [False, False, False]


@pytest.mark.parametrize("node", [{"kl": {"coef": 0.1}}, {"entropy_coef": 0.01},
                                  {"loss": {"name": "lpo"}}])
def test_every_row_with_tokens_carries_a_gradient_when_something_else_touches_it(node):
    try:
        alg = bundle(**node)
    except ConfigError:
        pytest.skip("no such loss")
    if alg.policy_loss.zero_advantage_zero_gradient and "loss" in node:
        pytest.skip("this loss declares zero-advantage rows skippable")
    assert alg.gradient_rows(_rows_batch(torch.tensor([0.5, 0.0, 0.5]))).tolist() == [
        True, True, False]


# ---- the loss ------------------------------------------------------------------------------

def loss_batch(**extra):
    old = torch.tensor([[-1.0, -1.0]])
    tensors = {"old_logprobs": old, "advantages": torch.tensor([1.0]),
               "response_mask": torch.ones(1, 2), **extra}
    return RolloutBatch(tensors, [Trajectory([], [])])


def test_the_loss_is_the_policy_loss_when_nothing_else_is_on():
    alg = bundle()
    logp = torch.tensor([[-1.0, -1.0]])
    value, metrics = alg.loss(loss_batch(), logp, None, Aggregator("token-mean", 2.0, 1))
    assert value.item() == pytest.approx(-1.0)
    assert "actor/kl" not in metrics and "actor/entropy" not in metrics


def test_is_weights_scale_the_policy_loss_tokens():
    alg = bundle()
    mb = loss_batch(is_weights=torch.tensor([[0.5, 0.0]]))
    value, _ = alg.loss(mb, torch.tensor([[-1.0, -1.0]]), None, Aggregator("token-mean", 2.0, 1))
    assert value.item() == pytest.approx(-0.25)


def test_the_kl_term_adds_coef_times_the_aggregated_estimate():
    alg = bundle(kl={"coef": 0.5, "estimator": "k1"})
    mb = loss_batch(ref_logprobs=torch.tensor([[-2.0, -1.0]]))
    value, metrics = alg.loss(mb, torch.tensor([[-1.0, -1.0]]), None,
                              Aggregator("token-mean", 2.0, 1))
    assert value.item() == pytest.approx(-1.0 + 0.5 * 0.5)
    assert metrics["actor/kl"] == pytest.approx(0.5)


def test_the_kl_term_names_itself_without_reference_log_probs():
    alg = bundle(kl={"coef": 0.5})
    agg = Aggregator("token-mean", 2.0, 1)
    with pytest.raises(KeyError, match=r"stage 'kl penalty' needs batch keys \['ref_logprobs'\]"):
        alg.loss(loss_batch(), torch.tensor([[-1.0, -1.0]]), None, agg)


def test_the_entropy_bonus_subtracts_coef_times_the_entropy_and_is_always_logged():
    ent = torch.tensor([[2.0, 4.0]])
    logp = torch.tensor([[-1.0, -1.0]])
    agg = Aggregator("token-mean", 2.0, 1)
    value, metrics = bundle(entropy_coef=0.1).loss(loss_batch(), logp, ent, agg)
    assert value.item() == pytest.approx(-1.0 - 0.1 * 3.0)
    assert metrics["actor/entropy"] == pytest.approx(3.0)
    value, metrics = bundle().loss(loss_batch(), logp, ent, agg)
    assert value.item() == pytest.approx(-1.0)
    assert metrics["actor/entropy"] == pytest.approx(3.0)


def test_the_policy_loss_sees_the_entropy():
    seen = {}
    alg = bundle()
    real = alg.policy_loss

    def spy(mb, logp, entropy, agg):
        seen["entropy"] = entropy
        return real(mb, logp, entropy, agg)

    alg.policy_loss = spy
    ent = torch.tensor([[2.0, 4.0]])
    alg.loss(loss_batch(), torch.tensor([[-1.0, -1.0]]), ent, Aggregator("token-mean", 2.0, 1))
    assert seen["entropy"] is ent


def test_a_row_with_a_single_token_can_carry_a_gradient():
    alg = bundle()
    batch = _rows_batch(torch.tensor([0.5, 0.5, 0.5]))
    batch["response_mask"] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    assert alg.gradient_rows(batch).tolist() == [True, True, False]


def test_overlong_shaping_names_itself_when_the_attention_mask_is_missing():
    alg = bundle(overlong={"enabled": True})
    batch = make_batch([1], [0])
    del batch.tensors["attention_mask"]
    with pytest.raises(KeyError,
                       match=r"stage 'overlong shaping' needs batch keys \['attention_mask'\]"):
        alg.shape_rewards(batch)
