r"""MaxRL: Maximum Likelihood RL (Tajwar et al., arXiv 2602.02710; spec §9.4).

MaxRL maximises E_x log p_θ(x) (p = pass rate) instead of E_x p_θ(x); its gradient is
Σ_k (1/k) ∇pass@k. With N samples of one prompt, outcome rewards r_i and μ = mean(r):

    Â_i = (r_i - μ) / μ      if μ > eps,      Â_i = 0 otherwise (all-fail: no update)

For binary rewards with K successes out of N: correct samples get N/K - 1, wrong ones exactly -1;
the estimator equals (up to the factor N) 1/K Σ_{i: r_i=1} ∇log π - 1/N Σ_i ∇log π. The advantage is
broadcast to the tokens and plugged into the PPO clipped surrogate (spec §0.3).

Sources: the paper; TRL ``examples/scripts/maxrl.py`` (GRPO with ``scale_rewards="mean"``).
The official code (a verl fork) was not located.

Known discrepancies:
* The division is by μ exactly (no ε in the denominator), so a wrong sample gets exactly -1 as in
  the paper; ``eps`` only decides when μ counts as zero. Implementations that add ε to μ give
  slightly different values.
* With shaped rewards (overlong penalty) μ can be ≤ 0 while some samples succeed; such groups get
  0, as the all-fail case.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algorithm import AdvantageEstimator, Algorithm
from harness.batch import RolloutBatch
from harness.groups import group_mean, num_groups
from harness.registry import register_advantage, register_algorithm


@register_advantage("maxrl")
@dataclass
class MaxRLAdvantage(AdvantageEstimator):
    """Â_i = (r_i - μ_G) / μ_G, 0 when μ_G ≤ eps; sequence-level [B]."""

    eps: float = 1e-6

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        r, gi = batch["rewards"].float(), batch["group_index"]
        mu = group_mean(r, gi, num_groups(gi))[gi]
        ok = mu > self.eps
        # Divide by 1 where the group is masked out so no inf/nan is ever formed.
        return torch.where(ok, (r - mu) / torch.where(ok, mu, 1.0), torch.zeros_like(r))


@register_algorithm("maxrl")
class MaxRL(Algorithm):
    r"""MaxRL: Â_i = (r_i - μ)/μ (0 for an all-fail group), PPO clipped surrogate; the gradient
    is that of E_x log pass-rate(x) = Σ_k (1/k) ∇pass@k."""
