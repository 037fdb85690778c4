"""GRPO+ ("positive-only GRPO"): an example algorithm that lives outside the rlbench tree.

Method: keep GRPO's group-normalised advantage but drop the push-down on below-average samples,

    Â⁺_i = max(Â_i, 0),   Â_i = (r_i - mean(r)) / (std(r) + ε),

so the update only raises the probability of responses that beat their group (a REINFORCE-style
"learn from successes" variant). Everything else -- rollout, PPO clip, aggregation -- is GRPO's,
reused by name from rlbench's registries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms.grpo import GRPOAdvantage
from harness.algorithm import Algorithm
from harness.batch import RolloutBatch
from harness.registry import register_advantage, register_algorithm


@register_advantage("grpo_pos")
@dataclass
class PositiveGRPOAdvantage(GRPOAdvantage):
    """Â⁺_i = max(Â_i, 0) with GRPO's Â_i."""

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        return super().__call__(batch).clamp(min=0.0)


@register_algorithm("grpo_pos")
class GRPOPositive(Algorithm):
    """GRPO+: GRPO advantages clipped at 0 (learn only from above-average samples)."""
