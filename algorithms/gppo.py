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

from harness.algorithm import Algorithm
from harness.policy_loss import PPOClipLoss
from harness.registry import register_algorithm, register_policy_loss


@register_policy_loss("gppo")
@dataclass
class GPPOLoss(PPOClipLoss):
    """PPO's value with gradient-preserving clip bounds (same knobs as ``ppo_clip``)."""

    def clipped_ratio(self, ratio: torch.Tensor) -> torch.Tensor:
        # r / sg(r) is 1 in value and carries d r: a bound keeps its value and gains the
        # gradient bound * d log pi; everything else (value, dual clip, metrics) is PPO's.
        unit = ratio / ratio.detach()
        lower, upper = 1.0 - self.clip_low, 1.0 + self.clip_high
        return torch.where(ratio < lower, lower * unit,
                           torch.where(ratio > upper, upper * unit, ratio))


@register_algorithm("gppo")
class GPPO(Algorithm):
    r"""GPPO: GRPO advantages; PPO-valued loss whose clipped tokens keep the gradient
    (1+ε_h)Â (r>1+ε_h, Â>0) or (1-ε_l)Â (r<1-ε_l, Â<0) on ∇log π."""
