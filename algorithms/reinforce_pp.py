r"""REINFORCE++ and REINFORCE++-baseline (Hu et al., arXiv 2501.03262), with verl's semantics.

Outcome reward r_i for response i, response mask m_{i,t}. With γ = 1 and no KL term in the reward
the return of every response token is the outcome reward, optionally minus the group mean
(``baseline: group_mean``, "REINFORCE++-baseline"):

    s_i = r_i                         (baseline: none)
    s_i = r_i - mean_{j ∈ group(i)} r_j   (baseline: group_mean)

then the token returns are whitened over all response tokens of the batch (global, not per group):

    μ = Σ_{i,t} m s_i / Σ m,   σ² = Σ_{i,t} m (s_i - μ)² / (Σ m - 1),
    Â_{i,t} = m_{i,t} (s_i - μ) / √(σ² + eps)

giving advantages [B, T] with masked mean 0 and (unbiased) std ≈ 1, zeros on masked tokens. The
policy loss is the PPO clipped surrogate (spec §0.3).

Sources: verl ``compute_reinforce_plus_plus_outcome_advantage`` and
``compute_rf_baseline_outcome_advantage`` with ``verl_F.masked_whiten`` (unbiased masked variance
with Bessel's correction over tokens, ``rsqrt(var + 1e-8)``). ``eps`` = 1e-8 is verl's value.

Known discrepancies:
* The REINFORCE++ paper puts a k1 KL penalty into the token reward; here (as the verl outcome
  estimator with ``use_kl_in_reward=False``) any KL goes to the loss (``kl.coef``) instead.
* verl raises when the batch has ≤ 1 response token; here such a batch gets zero advantages.
* verl accumulates returns backwards and resets them at every masked token, so in multi-turn
  responses the tokens before a tool output get return 0; here every token with m = 1 gets r_i
  (identical for single-turn responses).
* As verl's baseline estimator, a group of one sample uses baseline 0 (s_i = r_i).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algorithm import AdvantageEstimator, Algorithm
from harness.batch import RolloutBatch
from harness.groups import group_count, group_mean, num_groups
from harness.registry import register_advantage, register_algorithm
from harness.typed_config import ConfigError

BASELINES = ("none", "group_mean")


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(values - μ) / √(σ² + eps) with μ, σ² (Bessel-corrected) over entries where mask = 1; zero
    where mask = 0. Fewer than two masked entries leave σ² = 0; none gives all zeros."""
    mask = mask.float()
    n = mask.sum()
    mean = (values * mask).sum() / n.clamp(min=1.0)
    var = ((values - mean).square() * mask).sum() / (n - 1.0).clamp(min=1.0)
    return (values - mean) * torch.rsqrt(var + eps) * mask


@register_advantage("reinforce_pp")
@dataclass
class ReinforcePPAdvantage(AdvantageEstimator):
    """Outcome reward (minus the group mean for ``group_mean``) broadcast to the response tokens
    and whitened over the batch; token-level [B, T]."""

    baseline: str = "none"
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ConfigError(
                f"algorithm.advantage.baseline={self.baseline!r}; valid: {', '.join(BASELINES)}"
            )

    def scores(self, batch: RolloutBatch) -> torch.Tensor:
        """Per-sequence score s_i [B] before broadcasting and whitening."""
        r = batch["rewards"].float()
        if self.baseline == "none":
            return r
        gi = batch["group_index"]
        G = num_groups(gi)
        mean = group_mean(r, gi, G)[gi]
        single = (group_count(gi, G) <= 1)[gi]
        return r - torch.where(single, 0.0, mean)

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        mask = batch["response_mask"].float()
        returns = self.scores(batch)[:, None] * mask
        return masked_whiten(returns, mask, self.eps)


@register_algorithm("reinforce_pp")
class ReinforcePP(Algorithm):
    r"""REINFORCE++: token return = outcome reward (γ = 1; minus the group mean for the
    -baseline variant), whitened over the batch's response tokens, PPO clipped surrogate."""
