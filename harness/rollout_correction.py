"""Rollout/trainer mismatch: how far the sampler's log-probs are from the trainer's, and
truncated importance sampling (TIS) to correct for it.

With vLLM rollout and a Megatron (or HF) trainer the two engines compute the same policy with
different kernels and precision, so the behaviour policy pi_rollout that produced a token is not
exactly the pi_old the PPO ratio divides by. The trainer recomputes log pi_old for every
on-policy row; :func:`mismatch_metrics` compares it with ``rollout_logprobs`` on the same
tokens, and :func:`is_weights` gives the correction (Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training"; verl ``algorithm.rollout_correction``,
TRL ``vllm_importance_sampling_*``)::

    token modes:     w_t = exp(log pi_old(y_t) - log pi_rollout(y_t))
    sequence modes:  w   = exp(sum_t m_t (log pi_old(y_t) - log pi_rollout(y_t)))   (all tokens)
    *_truncate:      w <- min(w, cap)              *_mask:  w <- w if w <= cap else 0

The weights are constants (no gradient) multiplying the per-token policy loss
(``batch["is_weights"]``, applied by :meth:`harness.algorithm.Aggregator.weighted`); KL and
entropy terms are not reweighted. Config: ``trainer.rollout_correction.{mode, cap}``, off
(``none``) by default so CPU runs, where rollout and training share one fp32 model, are
unchanged.
"""

from __future__ import annotations

import torch

from harness.batch import RolloutBatch

MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
LOG_WEIGHT_CLAMP = 20.0  # exp() of a broken log-prob must not overflow


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def mismatch_metrics(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """Per-token mismatch between the trainer's and the sampler's log-probs of the same tokens,
    over the tokens in ``mask`` (rows whose old log-probs were recomputed)."""
    diff = (old_logprobs - rollout_logprobs) * mask  # log pi_old - log pi_rollout
    tokens = float(mask.sum())
    if tokens == 0:
        return {}
    abs_diff = diff.abs()
    return {
        "rollout_corr/logprob_abs_diff_mean": float(abs_diff.sum()) / tokens,
        "rollout_corr/logprob_abs_diff_max": float(abs_diff.max()),
        "rollout_corr/prob_abs_diff_mean": _masked_mean(
            (old_logprobs.exp() - rollout_logprobs.exp()).abs(), mask),
        # KL(pi_rollout || pi_old) from the rollout's own samples: k1 and the unbiased,
        # non-negative k3
        "rollout_corr/kl_k1": float(-diff.sum()) / tokens,
        "rollout_corr/kl_k3": _masked_mean(diff.clamp(max=LOG_WEIGHT_CLAMP).exp() - 1 - diff,
                                           mask),
    }


def is_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
               mode: str, cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights [B, T] (detached) and their statistics for ``mode`` (see module)."""
    if mode not in MODES or mode == "none":
        raise ValueError(f"rollout_correction.mode={mode!r}; valid: {', '.join(MODES[1:])}")
    if cap <= 0:
        raise ValueError(f"rollout_correction.cap must be > 0, got {cap}")
    log_w = ((old_logprobs - rollout_logprobs) * mask).detach()
    if mode.startswith("sequence"):
        log_w = log_w.sum(-1, keepdim=True).expand_as(mask)
    w = log_w.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP).exp()
    over = w > cap
    w = w.clamp(max=cap) if mode.endswith("truncate") else torch.where(over, 0.0, w)
    w = w * mask
    metrics = {
        "rollout_corr/is_weight_mean": _masked_mean(w, mask),
        "rollout_corr/is_capped_frac": _masked_mean(over.float(), mask),
    }
    return w, metrics


def apply_rollout_correction(batch: RolloutBatch, own_rows: torch.Tensor, recomputed: bool,
                             mode: str, cap: float) -> dict[str, float]:
    """The trainer's step: mismatch metrics over the policy's own rows (``own_rows`` [B], when
    their old log-probs were recomputed; otherwise both sides are the sampler's and the metric
    is 0 by construction) and, when ``mode`` is on, ``batch["is_weights"]``. Rows that are not
    the policy's own samples (LOPE's perturbed prompts, another temperature) keep weight 1:
    their algorithm corrects them its own way."""
    if not recomputed and mode == "none":
        return {}
    own = own_rows[:, None]
    mask = batch["response_mask"] * own
    metrics = mismatch_metrics(batch["old_logprobs"], batch["rollout_logprobs"], mask)
    if mode != "none":
        weights, extra = is_weights(batch["old_logprobs"], batch["rollout_logprobs"], mask,
                                    mode, cap)
        batch["is_weights"] = torch.where(own, weights, torch.ones_like(weights))
        metrics.update(extra)
    return metrics
