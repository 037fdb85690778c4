r"""RLOO: REINFORCE with a leave-one-out baseline (spec §9.5).

For K samples of one prompt with outcome rewards r_1..r_K, each sample's baseline is the mean
reward of the *other* K-1 samples:

    Â_i = r_i - 1/(K-1) Σ_{j≠i} r_j  =  K/(K-1) · (r_i - mean(r))

broadcast to every token and plugged into the PPO clipped surrogate (spec §0.3).

Sources: Kool et al. 2019 (*Buy 4 REINFORCE samples, get a baseline for free!*); Ahmadian et al.
2024 (*Back to Basics*, arXiv 2402.14740); verl ``compute_rloo_outcome_advantage``.

Known discrepancies:
* Ahmadian et al. optimise the plain REINFORCE objective (sequence-level, one update per batch);
  the bundle follows verl's ``adv_estimator=rloo``: PPO clip, token-mean aggregation.
* A group of one has no leave-one-out baseline; it gets advantage 0 (verl instead leaves the raw
  reward, r_i, as its advantage).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algorithm import AdvantageEstimator, Algorithm
from harness.batch import RolloutBatch
from harness.groups import group_count, group_sum, num_groups
from harness.registry import register_advantage, register_algorithm


@register_advantage("rloo")
@dataclass
class RLOOAdvantage(AdvantageEstimator):
    """Â_i = r_i - mean_{j≠i} r_j, sequence-level [B]; a group of one gets 0."""

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        r, gi = batch["rewards"].float(), batch["group_index"]
        G = num_groups(gi)
        count = group_count(gi, G)[gi]
        others = (group_sum(r, gi, G)[gi] - r) / (count - 1.0).clamp(min=1.0)
        return torch.where(count > 1, r - others, torch.zeros_like(r))


@register_algorithm("rloo")
class RLOO(Algorithm):
    r"""RLOO: Â_i = r_i - 1/(K-1) Σ_{j≠i} r_j, with the PPO clipped surrogate."""
