"""Shared policy losses. ``ppo_clip`` is the PPO/GRPO clipped surrogate with dual clip (spec §0.3).

With log-ratio :math:`\\log r_{i,t} = \\log\\pi_\\theta - \\log\\pi_\\text{old}` and advantage
:math:`A_{i,t}` (a per-sequence advantage is broadcast over the tokens):

.. math::

    \\ell_{i,t} = -\\min\\big(r A,\\ \\mathrm{clip}(r, 1-\\epsilon_l, 1+\\epsilon_h) A\\big),
    \\qquad \\ell_{i,t} \\leftarrow \\min(\\ell_{i,t}, -cA)\\ \\text{ if } A<0
    \\ \\text{(dual clip, Ye et al. 2020)}

aggregated by the bundle's :class:`~harness.algorithm.Aggregator`. This is verl's
``compute_policy_loss`` (``vanilla``): the log-ratio is clamped to [-20, 20] before ``exp`` as
there, the metrics follow verl's definitions (``pg_clipfrac``: the clipped term is strictly the
larger, i.e. the clip is active; ``pg_clipfrac_lower``: the dual clip is active). DAPO's
clip-higher is this loss with ``clip_high > clip_low``.

Every metric is ``agg.mean`` (token share over the tokens of the mini-batch that enter the
update) and ``actor/pg_loss`` is the
aggregated loss itself, so summing a metric over the micro-batches of one mini-batch gives its
mini-batch value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algorithm import Aggregator, PolicyLoss
from harness.batch import RolloutBatch
from harness.registry import register_policy_loss
from harness.typed_config import ConfigError

# verl clamps the log-ratio so a stale or broken log-prob cannot overflow exp().
LOG_RATIO_CLAMP = 20.0


def token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Advantages as [B, T]: a sequence-level [B] advantage is broadcast over the tokens."""
    if advantages.dim() == 1:
        return advantages[:, None].expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(f"advantages of shape {tuple(advantages.shape)}, logp {tuple(like.shape)}")
    return advantages


@register_policy_loss("ppo_clip")
@dataclass
class PPOClipLoss(PolicyLoss):
    """PPO clipped surrogate with asymmetric bounds and an optional dual clip (null = off)."""

    # A token with A = 0 has loss 0 and gradient 0 whatever the ratio, so the trainer may leave
    # zero-advantage samples out of the forward/backward without changing the update.
    zero_advantage_zero_gradient = True

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = 3.0

    def __post_init__(self) -> None:
        if self.clip_low < 0 or self.clip_high < 0:
            raise ConfigError(
                "algorithm.loss.clip_low/clip_high must be >= 0, "
                f"got {self.clip_low}/{self.clip_high}"
            )
        if self.clip_low >= 1:
            raise ConfigError(f"algorithm.loss.clip_low must be < 1, got {self.clip_low}")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
            # The dual bound -cA must lie above the ordinary clip's value for A<0 (verl asserts it).
            raise ConfigError(
                f"algorithm.loss.dual_clip_c must be > 1 (or null), got {self.dual_clip_c}"
            )

    def clipped_ratio(self, ratio: torch.Tensor) -> torch.Tensor:
        """clip(r, 1-eps_l, 1+eps_h); a variant may change the bounds' gradient (GPPO)."""
        return ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)

    def __call__(
        self,
        mb: RolloutBatch,
        logp: torch.Tensor,
        entropy: torch.Tensor | None,
        agg: Aggregator,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb.require("old_logprobs", "advantages", "response_mask", stage="ppo_clip loss")
        mask = mb["response_mask"]
        adv = token_advantages(mb["advantages"], logp).detach()
        log_ratio = (logp - mb["old_logprobs"]).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio)

        loss_unclipped = -adv * ratio
        loss_clipped = -adv * self.clipped_ratio(ratio)
        loss = torch.maximum(loss_unclipped, loss_clipped)
        clipped = loss_clipped > loss_unclipped
        dual = torch.zeros_like(clipped)
        if self.dual_clip_c is not None:
            bound = -adv * self.dual_clip_c
            negative = adv < 0
            dual = negative & (loss > bound)
            loss = torch.where(negative, torch.minimum(loss, bound), loss)

        value = agg(loss, mask)
        metrics = {
            "actor/pg_loss": float(value.detach().item()),
            "actor/pg_clipfrac": agg.mean(clipped.float(), mask),
            "actor/pg_clipfrac_lower": agg.mean(dual.float(), mask),
            # the clip per side: the upper bound binds only for A>0, the lower only for A<0
            "actor/clip_high_frac": agg.mean((clipped & (ratio > 1)).float(), mask),
            "actor/clip_low_frac": agg.mean((clipped & (ratio < 1)).float(), mask),
            "actor/ppo_kl": agg.mean(-log_ratio.detach(), mask),
        }
        return value, metrics
