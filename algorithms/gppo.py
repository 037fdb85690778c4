r"""GPPO: Gradient-Preserving clipping Policy Optimization (Klear-Reasoner, arXiv 2508.07629).

PPO's clip zeroes the gradient of every token whose ratio left the trust region. GPPO keeps the
forward value of PPO but lets those tokens keep a bounded gradient: the clip bounds are
functions of :math:`r` with a stop-gradient,

.. math::

    \mathrm{lb} = \frac{1-\epsilon_l}{\mathrm{sg}(r)}\, r, \qquad
    \mathrm{ub} = \frac{1+\epsilon_h}{\mathrm{sg}(r)}\, r, \qquad
    \ell_{i,t} = -\min\big(r A,\ \mathrm{clip}(r, \mathrm{lb}, \mathrm{ub}) A\big)
    \quad(+\ \text{dual clip } \min(\ell, -cA) \text{ for } A<0),

so (spec §0.3 item 3) the value equals PPO's and the coefficient on :math:`\nabla\log\pi_\theta` is

* :math:`(1+\epsilon_h)A` when :math:`r>1+\epsilon_h,\ A>0` (PPO: 0),
* :math:`(1-\epsilon_l)A` when :math:`r<1-\epsilon_l,\ A<0` (PPO: 0),
* :math:`rA` otherwise (0 where the dual clip is active, as in PPO).

The bundle ``gppo`` is GRPO's advantage with this loss; the loss is registered as ``gppo`` for
any bundle (``algorithm.loss.name=gppo``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algorithm import Aggregator, Algorithm
from harness.batch import RolloutBatch
from harness.policy_loss import LOG_RATIO_CLAMP, PPOClipLoss, token_advantages
from harness.registry import register_algorithm, register_policy_loss


@register_policy_loss("gppo")
@dataclass
class GPPOLoss(PPOClipLoss):
    """PPO's value with gradient-preserving clip bounds (same knobs as ``ppo_clip``)."""

    def __call__(
        self,
        mb: RolloutBatch,
        logp: torch.Tensor,
        entropy: torch.Tensor | None,
        agg: Aggregator,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mb.require("old_logprobs", "advantages", "response_mask", stage="gppo loss")
        mask = mb["response_mask"]
        adv = token_advantages(mb["advantages"], logp).detach()
        log_ratio = (logp - mb["old_logprobs"]).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio)
        # r / sg(r) is 1 in value and carries d r: the bound's value is constant, its gradient
        # is the bound times d log pi.
        unit = ratio / ratio.detach()
        lower, upper = 1.0 - self.clip_low, 1.0 + self.clip_high
        bounded = torch.where(ratio < lower, lower * unit,
                              torch.where(ratio > upper, upper * unit, ratio))

        loss_unclipped = -adv * ratio
        loss_clipped = -adv * bounded
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
            "actor/clip_high_frac": agg.mean((clipped & (ratio > 1)).float(), mask),
            "actor/clip_low_frac": agg.mean((clipped & (ratio < 1)).float(), mask),
            "actor/ppo_kl": agg.mean(-log_ratio.detach(), mask),
        }
        return value, metrics


@register_algorithm("gppo")
class GPPO(Algorithm):
    r"""GPPO: GRPO advantages; PPO-valued loss whose clipped tokens keep the gradient
    (1+ε_h)Â (r>1+ε_h, Â>0) or (1-ε_l)Â (r<1-ε_l, Â<0) on ∇log π."""
