"""Edges of the algorithms' own maths and knobs (algorithms/grpo.py, dapo.py, rloo.py,
reinforce_pp.py, cispo.py, gppo.py): the errors that name a bad knob or a missing batch key,
dynamic sampling's bookkeeping on a one-prompt step, and the loss and estimator values the
shared tests do not pin down."""

from __future__ import annotations

import pytest
import torch

import algorithms  # noqa: F401  (registers the parts)
from algorithms.dapo import DynamicSampling, informative_groups
from algorithms.grpo import GRPOAdvantage
from harness.batch import RolloutBatch
from harness.rollout import RolloutContext, RolloutEngine
from harness.task import Task
from harness.typed_config import ConfigError
from harness.types import Example, SamplingParams, Score, Trajectory
from tests.helpers import make_batch

# ---- GRPO ----------------------------------------------------------------------------------

def test_grpo_names_the_valid_std_kinds():
    with pytest.raises(ConfigError, match=r"^algorithm\.advantage\.std_kind='sample'; valid: "
                                          r"unbiased, population$"):
        GRPOAdvantage(std_kind="sample")


# ---- DAPO ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["correct", "group_index"])
def test_dynamic_sampling_names_itself_and_the_missing_key(key):
    batch = make_batch([1, 0], [0, 0])
    del batch.tensors[key]
    with pytest.raises(KeyError, match=rf"stage 'dynamic sampling' needs batch keys \['{key}'\]"):
        informative_groups(batch, "correct")


def test_informative_groups_of_one_row_and_of_none():
    assert informative_groups(make_batch([1], [0]), "correct") == []
    assert informative_groups(make_batch([1, 0, 1, 1], [0, 0, 1, 1]), "correct") == [0]


def test_dynamic_sampling_names_the_valid_metrics():
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout\.metric='reward'; valid: "
                                          r"correct, rewards$"):
        DynamicSampling(metric="reward")


class OneGroupEngine(RolloutEngine):
    pad_token_id = 0

    def __init__(self, texts):
        self.texts = texts

    def encode_prompt(self, example):
        return [1, 2]

    def generate(self, prompts, params):
        return [Trajectory(p, [7, 7], text=self.texts[k]) for p in prompts for k in range(params.n)]


class RightTask(Task):
    name = "right"

    def verify(self, example, response):
        ok = response == "right"
        return Score(reward=float(ok), correct=ok, parsed=True)


def test_a_one_prompt_step_reports_the_share_of_its_one_group_kept():
    ctx = RolloutContext(engine=OneGroupEngine(["right", "wrong"]), task=RightTask(None),
                         draw_prompts=lambda k: [Example(id="0", prompt="q")] * k,
                         prompts_per_step=1, sampling=SamplingParams(n=2, max_new_tokens=4))
    batch = DynamicSampling(max_gen_batches=1)(ctx)
    assert batch.num_groups == 1
    assert ctx.metrics["rollout/kept_group_frac"] == 1.0
    assert ctx.metrics["rollout/gen_batches"] == 1.0


# ---- RLOO ----------------------------------------------------------------------------------

def test_rloo_in_a_group_of_two_is_the_difference_of_the_two_rewards():
    from algorithms.rloo import RLOOAdvantage

    adv = RLOOAdvantage()(make_batch([1.0, 0.25, 0.5], [0, 0, 1]))
    assert adv.tolist() == pytest.approx([0.75, -0.75, 0.0])


# ---- REINFORCE++ ---------------------------------------------------------------------------

def test_masked_whiten_uses_the_bessel_corrected_variance_of_the_masked_entries():
    from algorithms.reinforce_pp import masked_whiten

    values = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # mean 2, var ((1)^2 + (1)^2) / (2 - 1) = 2, eps 1e-8
    expected = [-1 / (2 + 1e-8) ** 0.5, 1 / (2 + 1e-8) ** 0.5, 0.0]
    assert masked_whiten(values, mask).tolist()[0] == pytest.approx(expected, rel=1e-6)


def test_masked_whiten_of_one_entry_is_zero():
    from algorithms.reinforce_pp import masked_whiten

    got = masked_whiten(torch.tensor([[4.0, 9.0]]), torch.tensor([[1.0, 0.0]]))
    assert got.tolist() == [[0.0, 0.0]]


def test_reinforce_pp_whitens_with_its_own_eps():
    from algorithms.reinforce_pp import ReinforcePPAdvantage

    batch = make_batch([1.0, 0.0], [0, 1], lengths=[1, 1])
    adv = ReinforcePPAdvantage(eps=0.5)(batch)
    # returns 1 and 0 on one token each: mean 0.5, var 0.5, / sqrt(0.5 + 0.5)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5])


def test_reinforce_pp_group_mean_baseline_leaves_a_lone_sample_its_reward():
    from algorithms.reinforce_pp import ReinforcePPAdvantage

    est = ReinforcePPAdvantage(baseline="group_mean")
    scores = est.scores(make_batch([0.75, 1.0, 0.0], [0, 1, 1]))
    assert scores.tolist() == pytest.approx([0.75, 0.5, -0.5])


def test_reinforce_pp_names_the_valid_baselines():
    from algorithms.reinforce_pp import ReinforcePPAdvantage

    with pytest.raises(ConfigError, match=r"^algorithm\.advantage\.baseline='mean'; valid: "
                                          r"none, group_mean$"):
        ReinforcePPAdvantage(baseline="mean")


# ---- CISPO ---------------------------------------------------------------------------------

def _loss_batch(log_ratios, adv):
    old = torch.zeros(1, len(log_ratios), dtype=torch.float64)
    logp = torch.tensor([log_ratios], dtype=torch.float64)
    tensors = {"old_logprobs": old, "advantages": torch.tensor([adv], dtype=torch.float64),
               "response_mask": torch.ones_like(old)}
    return RolloutBatch(tensors, [Trajectory([], [])]), logp


def _cispo(log_ratios, adv=1.0, **knobs):
    from algorithms.cispo import CISPOLoss
    from harness.algorithm import Aggregator

    mb, logp = _loss_batch(log_ratios, adv)
    return CISPOLoss(**{"clip_high": 0.28, **knobs})(
        mb, logp, None, Aggregator("token-mean", float(len(log_ratios)), 1))


@pytest.mark.parametrize("key", ["old_logprobs", "advantages", "response_mask"])
def test_cispo_names_itself_and_the_missing_key(key):
    from algorithms.cispo import CISPOLoss
    from harness.algorithm import Aggregator

    mb, logp = _loss_batch([0.0], 1.0)
    del mb.tensors[key]
    with pytest.raises(KeyError, match=rf"stage 'cispo loss' needs batch keys \['{key}'\]"):
        CISPOLoss(clip_high=0.28)(mb, logp, None, Aggregator("token-mean", 1.0, 1))


def test_cispo_reports_its_metrics_by_name():
    import math

    # one token above 1 + eps_h (ratio 2), one below 1 - eps_l (ratio 0.25), one inside
    value, metrics = _cispo([math.log(2.0), math.log(0.25), 0.0], clip_low=0.5)
    assert set(metrics) == {"actor/pg_loss", "actor/pg_clipfrac", "actor/clip_high_frac",
                            "actor/clip_low_frac", "actor/ppo_kl"}
    assert metrics["actor/pg_loss"] == pytest.approx(value.item())
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert metrics["actor/clip_high_frac"] == pytest.approx(1 / 3)
    assert metrics["actor/clip_low_frac"] == pytest.approx(1 / 3)
    assert metrics["actor/ppo_kl"] == pytest.approx(-(math.log(2.0) + math.log(0.25)) / 3)


@pytest.mark.parametrize("log_ratio", [-30.0, 30.0])
def test_cispo_clamps_the_log_ratio_on_both_sides(log_ratio):
    import math

    _, metrics = _cispo([log_ratio])
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.copysign(20.0, log_ratio))


def test_a_ratio_exactly_on_a_cispo_bound_is_not_clipped():
    import math

    _, high = _cispo([math.log(2.0)], clip_high=1.0)
    assert high["actor/clip_high_frac"] == 0.0 and high["actor/pg_clipfrac"] == 0.0
    _, low = _cispo([math.log(0.5)], clip_low=0.5)
    assert low["actor/clip_low_frac"] == 0.0 and low["actor/pg_clipfrac"] == 0.0


def test_cispo_accepts_zero_and_one_as_bounds():
    from algorithms.cispo import CISPOLoss

    CISPOLoss(clip_high=0.0)
    CISPOLoss(clip_high=0.28, clip_low=0.0)
    CISPOLoss(clip_high=0.28, clip_low=1.0)


def test_cispo_refuses_bad_bounds_naming_the_knob():
    from algorithms.cispo import CISPOLoss

    with pytest.raises(ConfigError, match=r"^algorithm\.loss\.clip_high is required for cispo "
                                          r"\(ε_h\^IS; MiniMax-M1 did not publish its value\), "
                                          r"e\.g\. algorithm\.loss\.clip_high=0\.28$"):
        CISPOLoss()
    with pytest.raises(ConfigError, match=r"^algorithm\.loss\.clip_high must be >= 0, got -0\.1$"):
        CISPOLoss(clip_high=-0.1)
    for bad in (1.5, -0.5):
        with pytest.raises(ConfigError, match=rf"^algorithm\.loss\.clip_low must be in \[0, 1\] "
                                              rf"or null, got {bad}$"):
            CISPOLoss(clip_high=0.28, clip_low=bad)
