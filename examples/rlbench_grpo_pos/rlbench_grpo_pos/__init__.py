"""GRPO+ ("positive-only GRPO"): an example algorithm that lives outside the rlbench tree.

Method: keep GRPO's group-normalised advantage but drop the push-down on below-average samples,

    Â⁺_i = max(Â_i, 0),   Â_i = (r_i - mean(r)) / (std(r) + ε),

so the update only raises the probability of responses that beat their group (a REINFORCE-style
"learn from successes" variant). Everything else -- rollout, PPO clip, aggregation -- is GRPO's,
reused by name from rlbench's registries.

A plugin imports rlbench's public API (:mod:`harness.api`) and nothing else from rlbench;
``tests/cli/test_plugin.py`` checks that this module does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.api import (
    ADVANTAGES,
    AdvantageEstimator,
    Algorithm,
    RolloutBatch,
    register_advantage,
    register_algorithm,
)


@register_advantage("grpo_pos")
@dataclass
class PositiveGRPOAdvantage(AdvantageEstimator):
    """Â⁺_i = max(Â_i, 0) with GRPO's Â_i (the registered ``grpo`` estimator, same knobs)."""

    std_kind: str = "unbiased"  # unbiased | population
    eps: float = 1e-6

    def __post_init__(self) -> None:
        # looked up when the algorithm is built, when every plugin has registered
        self._grpo = ADVANTAGES.get("grpo")(std_kind=self.std_kind, eps=self.eps)

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        return self._grpo(batch).clamp(min=0.0)


@register_algorithm("grpo_pos")
class GRPOPositive(Algorithm):
    """GRPO+: GRPO advantages clipped at 0 (learn only from above-average samples)."""
