r"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585).

Instead of clipping the token update (which drops the gradient of every token outside the trust
region, often the rare "fork" tokens that matter for reasoning), CISPO clips only the
importance-sampling weight and keeps it out of the graph (spec §0.3 item 5):

.. math::

    \hat r_{i,t} = \mathrm{clip}\big(r_{i,t},\ 1-\epsilon_l^{IS},\ 1+\epsilon_h^{IS}\big),
    \qquad
    \ell_{i,t} = -\,\mathrm{sg}(\hat r_{i,t})\, A_{i,t}\, \log\pi_\theta(o_{i,t}\mid q, o_{i,<t}),

aggregated token-mean, so every token, including :math:`r>1+\epsilon_h^{IS}` where PPO gives
zero, gets the gradient :math:`-\mathrm{sg}(\hat r)A\nabla\log\pi_\theta`. MiniMax effectively
disables the lower bound (``clip_low: null`` here means :math:`\hat r \ge 0` only) and tunes only
the upper one; its exact value was not published, so ``clip_high`` has no default and must be
set in the yaml.

The bundle ``cispo`` is GRPO's advantage with this loss; the loss is registered as ``cispo`` for
any bundle (``algorithm.loss.name=cispo``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algorithm import Aggregator, Algorithm, PolicyLoss
from harness.batch import RolloutBatch
from harness.policy_loss import LOG_RATIO_CLAMP, token_advantages
from harness.registry import register_algorithm, register_policy_loss
from harness.typed_config import ConfigError


@register_policy_loss("cispo")
@dataclass
class CISPOLoss(PolicyLoss):
    """-sg(clip(r, 1-ε_l, 1+ε_h)) · A · log π_θ per token."""

    # A = 0 gives loss 0 and gradient 0, so zero-advantage samples may skip the backward.
    zero_advantage_zero_gradient = True

    clip_high: float | None = None  # ε_h^IS: required (MiniMax's value is not published)
    clip_low: float | None = None  # ε_l^IS; null = no lower bound (r̂ >= 0), as MiniMax

    def __post_init__(self) -> None:
        if self.clip_high is None:
            raise ConfigError(
                "algorithm.loss.clip_high is required for cispo (ε_h^IS; MiniMax-M1 did not "
                "publish its value), e.g. algorithm.loss.clip_high=0.28"
            )
        if self.clip_high < 0:
            raise ConfigError(f"algorithm.loss.clip_high must be >= 0, got {self.clip_high}")
        if self.clip_low is not None and not 0 <= self.clip_low <= 1:
            raise ConfigError(f"algorithm.loss.clip_low must be in [0, 1] or null, "
                              f"got {self.clip_low}")

    def __call__(
        self,
        mb: RolloutBatch,
        logp: torch.Tensor,
        entropy: torch.Tensor | None,
        agg: Aggregator,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb.require("old_logprobs", "advantages", "response_mask", stage="cispo loss")
        mask = mb["response_mask"]
        adv = token_advantages(mb["advantages"], logp).detach()
        log_ratio = (logp - mb["old_logprobs"]).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio).detach()
        lower = 0.0 if self.clip_low is None else 1.0 - self.clip_low
        weight = ratio.clamp(lower, 1.0 + self.clip_high)
        loss = -weight * adv * logp

        value = agg(loss, mask)
        high = ratio > 1.0 + self.clip_high
        low = ratio < lower
        metrics = {
            "actor/pg_loss": float(value.detach().item()),
            "actor/pg_clipfrac": agg.mean((high | low).float(), mask),
            "actor/clip_high_frac": agg.mean(high.float(), mask),
            "actor/clip_low_frac": agg.mean(low.float(), mask),
            "actor/ppo_kl": agg.mean(-log_ratio.detach(), mask),
        }
        return value, metrics


@register_algorithm("cispo")
class CISPO(Algorithm):
    r"""CISPO: GRPO advantages; loss -sg(clip(r, 1-ε_l, 1+ε_h)) Â log π_θ, token-mean: every
    token keeps its gradient, only the IS weight is clipped."""
