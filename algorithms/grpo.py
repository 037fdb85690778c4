r"""GRPO and Dr.GRPO: group-relative outcome advantages with the PPO clipped surrogate.

GRPO (Shao et al., DeepSeekMath, arXiv 2402.03300; spec §9.1). For a prompt q, G responses
o_1..o_G with outcome rewards r_1..r_G; every token of o_i gets

    Â_{i,t} = (r_i - mean(r)) / (std(r) + ε),          ε = 1e-6

and the policy maximises the clipped surrogate (spec §0.3)

    J(θ) = E[ 1/G Σ_i 1/|o_i| Σ_t min(ρ_{i,t} Â_{i,t}, clip(ρ_{i,t}, 1-ε_c, 1+ε_c) Â_{i,t})
              - β D_KL^{k3}(π_θ || π_ref) ],   ρ_{i,t} = π_θ(o_{i,t}|q,o_{i,<t}) / π_old(o_{i,t}|·)

Dr.GRPO (Liu et al., *Understanding R1-Zero-Like Training*, arXiv 2503.20783; spec §9.2) removes
both normalisations that bias GRPO towards long wrong answers and easy/hard questions:

    Â_{i,t} = r_i - mean(r),   loss = 1/(G L_max) Σ_i Σ_t ℓ_{i,t}   (seq-mean-token-sum-norm)

Sources: verl ``compute_grpo_outcome_advantage`` (std via unbiased ``torch.std``, ε = 1e-6, a group
of one sample uses mean 0 and std 1, so its advantage is r/(1+ε)); Dr.GRPO = verl's
``norm_adv_by_std_in_grpo=False`` with the same single-sample rule (mean 0, so Â = r); Oat
``masked_sum(..., constant_normalizer=generate_max_length)`` for the Dr.GRPO aggregation.

Known discrepancies:
* The paper aggregates seq-mean-token-mean with β = 0.04; ``conf/algorithm/grpo.yaml`` follows verl
  (token-mean) and ships β = 0 (set ``kl.coef`` to reproduce the paper).
* ``std_kind: population`` (√(μ(1-μ)) for binary rewards) is offered but is not verl's default.
* verl's single-sample rule gives a lone sample a non-zero advantage r/(1+ε) (not 0).
* Dr.GRPO's ``seq-mean-token-sum-norm`` divides by G·L_max (the paper, Oat's
  ``constant_normalizer`` over the batch mean); verl's mode of that name divides by L_max only
  (``loss_scale_factor``), so our gradients are 1/G of verl's (G = the mini-batch's sequences).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algorithm import AdvantageEstimator, Algorithm
from harness.batch import RolloutBatch
from harness.groups import STD_KINDS, group_count, group_mean, group_std, num_groups
from harness.registry import register_advantage, register_algorithm
from harness.typed_config import ConfigError


def _group_stats(batch: RolloutBatch, std_kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (mean, std) of its group, with verl's single-sample rule (mean 0, std 1)."""
    r, gi = batch["rewards"].float(), batch["group_index"]
    G = num_groups(gi)
    single = (group_count(gi, G) <= 1)[gi]
    mean = group_mean(r, gi, G)[gi]
    std = group_std(r, gi, std_kind, G)[gi]
    return torch.where(single, 0.0, mean), torch.where(single, 1.0, std)


@register_advantage("grpo")
@dataclass
class GRPOAdvantage(AdvantageEstimator):
    """Â_i = (r_i - μ_G) / (σ_G + eps), sequence-level [B]."""

    std_kind: str = "unbiased"
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.std_kind not in STD_KINDS:
            raise ConfigError(
                f"algorithm.advantage.std_kind={self.std_kind!r}; valid: {', '.join(STD_KINDS)}"
            )

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        mean, std = _group_stats(batch, self.std_kind)
        return (batch["rewards"].float() - mean) / (std + self.eps)


@register_advantage("dr_grpo")
@dataclass
class DrGRPOAdvantage(AdvantageEstimator):
    """Â_i = r_i - μ_G (no std normalisation), sequence-level [B]."""

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        mean, _ = _group_stats(batch, "unbiased")
        return batch["rewards"].float() - mean


@register_algorithm("grpo")
class GRPO(Algorithm):
    r"""GRPO: Â_i = (r_i - mean(r)) / (std(r) + ε) over the G samples of a prompt, PPO clip
    min(ρÂ, clip(ρ, 1-ε_l, 1+ε_h)Â) with dual clip, optional β·KL_k3 to the reference."""


@register_algorithm("dr_grpo")
class DrGRPO(Algorithm):
    r"""Dr.GRPO: Â_i = r_i - mean(r); loss Σ_i Σ_t ℓ_{i,t} / (G·L_max) with a constant L_max
    (seq-mean-token-sum-norm), no KL."""
