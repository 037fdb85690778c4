r"""AEPO (agentic): Agentic Entropy-Balanced Policy Optimization (Dong et al., arXiv 2510.14545;
official code RUC-NLPIR/ARPO, folder AEPO/, read through copies; spec §7). Registered as
``aepo``; the entropy-control method of arXiv 2510.08141 is ``arbitrary_entropy``.

AEPO keeps ARPO's branching rollout and balances entropy in four places, each switchable:

1. **Dynamic rollout** (``entropy_branching`` with ``dynamic_rollouts: true``; the rule is
   ``dynamic_root_count`` in ``algorithms/arpo.py``; off in the released scripts): one
   tool-using pre-rollout per prompt measures H_root (its first segment) and H_tool (the mean
   of its later segments), both as ARPO's segment entropy / ln|V|, and sets the number of root
   samples

       m = clip(⌊k σ(β_pm (H_root − H_tool))⌋ + 1, 1, k),   β_pm = 0.5,  k = rollout.n ,

   the remaining k − m being the branch budget.
2. **Consecutive-branch penalty** (``fork_rule: aepo``): fork iff
   clip((u + βΔH)·max(0, 1 − λ_pen·l), 0, 1) ≥ τ, l = the prompt's branches so far.
3. **Entropy-aware advantage** (``loss.entropy_advantage``): per token
   Ã_t = Ã^Acc (1 + a Ã^ΔH_t), Ã^ΔH_t = (H_t − mean H)/std H over *all* valid response tokens
   of the micro-batch, std the unbiased one (std 0, or a single token → 1), H_t the current
   policy's entropy (detached), a = 0.2. Without a clamp the sign flips when Ã^ΔH_t < −1/a (the
   code has none; ``clamp_sign`` adds one). The z-score couples the rows of a micro-batch: a row
   with Ã^Acc = 0 has no gradient of its own but its tokens enter mean H and std H, so the loss
   declares zero-advantage rows not skippable (``zero_advantage_zero_gradient`` is false while
   the entropy advantage is on) and ``trainer.skip_zero_gradient`` keeps them; the micro-batches
   are then the source's, and the advantage of a row never depends on the skip.
4. **Entropy-balanced clipping** (``loss.entropy_balanced_clipping``):

       ℓ = −min(r Ã, clip(r, 1 − ε_l, (1 + ε_h)/sg(r) · r) Ã),

   the PPO value everywhere, but a token above the upper bound with Ã > 0 keeps the gradient
   (1 + ε_h) Ã ∇log π instead of 0 (high-entropy exploratory tokens are not silenced); the lower
   side is PPO's. Dual clip 3, token-mean, no KL.

With dynamic rollouts, the penalty, the advantage and the clipping all off, AEPO is ARPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algorithm import Aggregator, Algorithm
from harness.batch import RolloutBatch
from harness.policy_loss import PPOClipLoss
from harness.registry import register_algorithm, register_policy_loss


def entropy_scaled_advantages(adv: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor,
                              coef: float, clamp_sign: bool = False) -> torch.Tensor:
    """Ã^Acc (1 + a z), z = the entropy's z-score over the tokens where ``mask`` is 1."""
    valid = mask > 0
    h = entropy.detach()
    if bool(valid.any()):
        mean = h[valid].mean()
        std = h[valid].std() if int(valid.sum()) > 1 else torch.tensor(0.0)  # unbiased, as the code
        std = torch.where(std > 0, std, torch.ones_like(std))
    else:
        mean, std = torch.tensor(0.0), torch.tensor(1.0)
    factor = 1.0 + coef * (h - mean) / std
    if clamp_sign:
        factor = factor.clamp(min=0.0)
    return adv * factor


@register_policy_loss("aepo_clip")
@dataclass
class AEPOLoss(PPOClipLoss):
    """PPO clip with entropy-balanced upper clipping and the entropy-aware advantage."""

    @property
    def zero_advantage_zero_gradient(self) -> bool:  # type: ignore[override]
        # with the entropy-aware advantage, a zero-advantage row still shapes the micro-batch's
        # entropy z-score, so dropping it would change the other rows' advantages
        return not self.entropy_advantage

    @property
    def micro_batch_coupled(self) -> bool:
        """The entropy z-score is over a micro-batch's rows: regrouping rows would change it."""
        return self.entropy_advantage

    entropy_balanced_clipping: bool = True
    entropy_advantage: bool = True
    entropy_advantage_coef: float = 0.2
    clamp_sign: bool = False

    def clipped_ratio(self, ratio: torch.Tensor) -> torch.Tensor:
        if not self.entropy_balanced_clipping:
            return super().clipped_ratio(ratio)
        upper = 1.0 + self.clip_high
        # value 1 + eps_h, gradient (1 + eps_h) d log pi: (1 + eps_h) / sg(r) * r
        held = upper * ratio / ratio.detach()
        return torch.where(ratio > upper, held, ratio.clamp(min=1.0 - self.clip_low))

    def __call__(self, mb: RolloutBatch, logp: torch.Tensor, entropy: torch.Tensor | None,
                 agg: Aggregator) -> tuple[torch.Tensor, dict[str, float]]:
        if not self.entropy_advantage:
            return super().__call__(mb, logp, entropy, agg)
        if entropy is None:
            raise ValueError("aepo_clip with entropy_advantage needs the forward's per-token "
                             "entropy; the engine returned none")
        adv = mb["advantages"]
        adv = adv[:, None].expand_as(logp) if adv.dim() == 1 else adv
        mask = mb["response_mask"]
        scaled = entropy_scaled_advantages(adv, entropy, mask, self.entropy_advantage_coef,
                                           self.clamp_sign)
        value, metrics = super().__call__(
            RolloutBatch({**mb.tensors, "advantages": scaled}, mb.trajectories), logp, entropy,
            agg)
        flipped = (torch.sign(scaled) != torch.sign(adv)) & (adv != 0)
        metrics["aepo/sign_flip_frac"] = agg.mean(flipped.float(), mask)
        return value, metrics


@register_algorithm("aepo")
class AEPO(Algorithm):
    r"""AEPO: ARPO's branching with a consecutive-branch penalty (and optional entropy
    pre-monitoring of the root count); Ã_t = Ã(1 + a·z(H_t)); upper clip keeps (1+ε_h)Ã."""
