"""Truncated importance sampling and the rollout/trainer log-prob mismatch metrics
(harness/rollout_correction.py) on synthetic tensors, and how the weights enter the policy loss
(Aggregator.weighted): only the policy-loss tokens are scaled, diagnostics are not."""

from __future__ import annotations

import math

import pytest
import torch

from harness.algorithm import Aggregator
from harness.rollout_correction import apply_rollout_correction, is_weights, mismatch_metrics

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.3, -7.0]])
OLD = ROLLOUT + torch.tensor([[0.1, math.log(3.0), -0.2], [0.0, -0.5, 5.0]])  # log w


def test_mismatch_metrics_over_masked_tokens() -> None:
    m = mismatch_metrics(OLD, ROLLOUT, MASK)
    diffs = [0.1, math.log(3.0), -0.2, 0.0, -0.5]  # the padding token's 5.0 is not counted
    assert m["rollout_corr/logprob_abs_diff_max"] == pytest.approx(math.log(3.0))
    assert m["rollout_corr/logprob_abs_diff_mean"] == pytest.approx(
        sum(abs(d) for d in diffs) / 5)
    assert m["rollout_corr/kl_k1"] == pytest.approx(-sum(diffs) / 5)
    k3 = sum(math.exp(d) - 1 - d for d in diffs) / 5
    assert m["rollout_corr/kl_k3"] == pytest.approx(k3, rel=1e-5) and k3 > 0
    assert m["rollout_corr/prob_abs_diff_mean"] > 0


def test_identical_logprobs_have_no_mismatch_and_unit_weights() -> None:
    m = mismatch_metrics(ROLLOUT, ROLLOUT, MASK)
    assert m["rollout_corr/logprob_abs_diff_max"] == 0 and m["rollout_corr/kl_k3"] == 0
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        w, stats = is_weights(ROLLOUT, ROLLOUT, MASK, mode, cap=2.0)
        torch.testing.assert_close(w, MASK)
        assert stats["rollout_corr/is_capped_frac"] == 0


def test_token_truncate_caps_and_token_mask_zeroes() -> None:
    w, stats = is_weights(OLD, ROLLOUT, MASK, "token_truncate", cap=2.0)
    want = torch.tensor([[math.exp(0.1), 2.0, math.exp(-0.2)], [1.0, math.exp(-0.5), 0.0]])
    torch.testing.assert_close(w, want)
    assert stats["rollout_corr/is_capped_frac"] == pytest.approx(1 / 5)
    w, _ = is_weights(OLD, ROLLOUT, MASK, "token_mask", cap=2.0)
    assert w[0, 1] == 0 and w[0, 0] == pytest.approx(math.exp(0.1))


def test_sequence_modes_use_the_product_over_the_sequence() -> None:
    w, _ = is_weights(OLD, ROLLOUT, MASK, "sequence_truncate", cap=10.0)
    seq0 = math.exp(0.1 + math.log(3.0) - 0.2)
    torch.testing.assert_close(w[0], torch.full((3,), seq0))
    torch.testing.assert_close(w[1], torch.tensor([math.exp(-0.5), math.exp(-0.5), 0.0]))
    w, _ = is_weights(OLD, ROLLOUT, MASK, "sequence_mask", cap=2.0)
    assert torch.equal(w[0], torch.zeros(3))  # 2.7 > 2: the whole sequence is dropped


def test_weights_carry_no_gradient_and_bad_settings_fail() -> None:
    old = OLD.clone().requires_grad_(True)
    w, _ = is_weights(old, ROLLOUT, MASK, "token_truncate", cap=2.0)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="mode"):
        is_weights(OLD, ROLLOUT, MASK, "none", cap=2.0)
    with pytest.raises(ValueError, match="cap"):
        is_weights(OLD, ROLLOUT, MASK, "token_truncate", cap=0.0)


def test_weighted_aggregator_scales_the_loss_not_the_diagnostics() -> None:
    agg = Aggregator("token-mean", total_tokens=5.0, total_seqs=2)
    per_token = torch.ones(2, 3)
    w = torch.tensor([[2.0, 0.5, 1.0], [0.0, 1.0, 9.0]])
    assert float(agg(per_token, MASK)) == pytest.approx(1.0)
    weighted = agg.weighted(w)
    assert float(weighted(per_token, MASK)) == pytest.approx((2 + 0.5 + 1 + 0 + 1) / 5)
    assert weighted.mean(per_token, MASK) == agg.mean(per_token, MASK)
    assert agg.token_weights is None  # the original is unchanged


def test_policy_loss_gradient_is_scaled_per_token() -> None:
    from harness.algorithm import build_algorithm
    from harness.batch import RolloutBatch

    algo = build_algorithm({"name": "grpo", "loss": {"name": "ppo_clip", "dual_clip_c": None}},
                           max_new_tokens=3)
    mb = RolloutBatch({"response_mask": MASK, "old_logprobs": ROLLOUT.clone(),
                       "advantages": torch.tensor([1.0, -1.0])}, [None, None])
    logp = ROLLOUT.clone().requires_grad_(True)
    agg = Aggregator("token-mean", total_tokens=5.0, total_seqs=2)
    algo.loss(mb, logp, None, agg)[0].backward()
    plain = logp.grad.clone()
    mb["is_weights"] = torch.tensor([[2.0, 0.0, 1.0], [1.0, 0.5, 1.0]])
    logp.grad = None
    algo.loss(mb, logp, None, agg)[0].backward()
    torch.testing.assert_close(logp.grad, plain * mb["is_weights"])


def test_apply_keeps_weight_one_on_rows_that_are_not_the_policys_own() -> None:
    from harness.batch import RolloutBatch

    batch = RolloutBatch({"response_mask": MASK, "old_logprobs": OLD,
                          "rollout_logprobs": ROLLOUT}, [None, None])
    own = torch.tensor([True, False])
    m = apply_rollout_correction(batch, own, recomputed=True, mode="token_truncate", cap=2.0)
    assert torch.equal(batch["is_weights"][1], torch.ones(3))
    assert batch["is_weights"][0, 1] == 2.0
    assert m["rollout_corr/logprob_abs_diff_max"] == pytest.approx(math.log(3.0))
    off = RolloutBatch({"response_mask": MASK, "old_logprobs": OLD,
                        "rollout_logprobs": ROLLOUT}, [None, None])
    assert apply_rollout_correction(off, own, recomputed=False, mode="none", cap=2.0) == {}
    assert "is_weights" not in off
