r"""Arbitrary-entropy policy optimisation (Wang et al., *Entropy Is Controllable in Reinforcement
Fine-tuning*, arXiv 2510.08141; official code 597358816/AEPO at b353a054 on EasyR1; spec §8).
Registered as ``arbitrary_entropy``: ``aepo`` is the agentic method of spec §7.

The objective adds a REINFORCE regulariser on positive samples drawn at a temperature chosen to
push the entropy towards a target:

    ∇J = ∇J_GRPO + α E_{q, o ~ π_θ^T(·|q)} [ ∇log π_θ(o|q) R(q, o) ],
    T = T_high = 1.2 if H(π_θold) ≤ H_target, else T_low = 0.8.

What the code does each step (§8.3), and this module with it:

1. main batch: n rollouts per prompt at the rollout temperature, GRPO advantages;
2. H: the entropy proxy of the previous update, −mean log π of the sampled tokens (an NLL
   estimator, not the exact entropy; 0 before the first update), so T = 1.2 on the first step;
3. side batch (``temperature_side_batch`` strategy): the first ⌊P/4⌋ prompts, the same n, at T;
   GRPO advantages within the side groups;
4. positives: side samples with advantage > 0.05 (correct answers in mixed groups), advantage
   set to 1;
5. s = min(60, #positives), halved (floor) when H > H_target;
6. substitution: the s positives replace the first s rows of the main batch, so the batch size
   stays constant; every row's π_old is evaluated at the training temperature (T = 1), so the
   side rows train like on-policy rows with no correction for the temperature mismatch;
7. the standard PPO update (clip 0.2/0.2, dual 3, token-mean, no KL, no entropy loss).

α is not a knob: it is implicit in s (≈ the regulariser rows' share of the batch's tokens).

Deviation: the proxy here is −mean log π_θold over the trained batch's response tokens at the
training temperature, evaluated with the weights that enter the update (EasyR1 averages the
actor's ``entropy_loss`` over the update's micro-batches; with one on-policy mini-batch per step,
as in the testbed, the two coincide).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from harness.algorithm import Algorithm
from harness.batch import RolloutBatch
from harness.registry import register_algorithm, register_rollout
from harness.rollout import RolloutContext, sample_groups
from harness.typed_config import ConfigError


def choose_temperature(proxy: float, target: float, t_high: float, t_low: float) -> float:
    """T_high when the entropy proxy is at or below the target (raise entropy), else T_low."""
    return t_high if proxy <= target else t_low


def substitution_count(n_positive: int, above_target: bool, max_rows: int) -> int:
    """s = min(max_rows, #positives), halved (floor) above the target."""
    s = min(max_rows, n_positive)
    return s // 2 if above_target else s


@register_rollout("temperature_side_batch")
@dataclass
class TemperatureSideBatch:
    """The main GRPO batch plus a side batch on the first ``side_fraction`` of its prompts at the
    temperature the entropy controller chose (rows marked by ``side_batch``)."""

    target_entropy: float = 0.75
    t_high: float = 1.2
    t_low: float = 0.8
    side_fraction: float = 0.25
    positive_threshold: float = 0.05  # side samples with advantage above it are kept
    max_substitute: int = 60  # reinforce_sample_num: most rows substituted per step

    def __post_init__(self) -> None:
        if not 0.0 < self.side_fraction <= 1.0:
            raise ConfigError(
                f"algorithm.rollout.side_fraction must be in (0, 1], got {self.side_fraction}")
        if self.t_high <= 0 or self.t_low <= 0:
            raise ConfigError("algorithm.rollout.t_high/t_low must be > 0, got "
                              f"{self.t_high}/{self.t_low}")
        self.entropy_proxy = 0.0  # the previous update's reading; 0 before the first one
        self.temperature = self.t_high

    def __call__(self, ctx: RolloutContext) -> RolloutBatch:
        prompts = ctx.draw_prompts(ctx.prompts_per_step)
        main = sample_groups(ctx, prompts)
        self.temperature = choose_temperature(self.entropy_proxy, self.target_entropy,
                                              self.t_high, self.t_low)
        side_prompts = prompts[: int(len(prompts) * self.side_fraction)]
        ctx.metrics["aent/temperature"] = self.temperature
        ctx.metrics["aent/entropy_proxy"] = self.entropy_proxy
        ctx.metrics["aent/target_entropy"] = self.target_entropy
        ctx.metrics["aent/side_prompts"] = float(len(side_prompts))
        if not side_prompts:
            main["side_batch"] = torch.zeros(len(main), dtype=torch.bool)
            ctx.metrics["aent/extra_tokens"] = 0.0
            return main
        before = ctx.metrics.get("rollout/tokens", 0.0)
        side = sample_groups(ctx, side_prompts,
                             dataclasses.replace(ctx.sampling, temperature=self.temperature))
        ctx.metrics["aent/extra_tokens"] = ctx.metrics.get("rollout/tokens", 0.0) - before
        out = RolloutBatch.concat([main, side], ctx.engine.pad_token_id)
        out["side_batch"] = torch.arange(len(out)) >= len(main)
        return out


@register_algorithm("arbitrary_entropy")
class ArbitraryEntropy(Algorithm):
    r"""Arbitrary-entropy PO: T = 1.2 if H_proxy ≤ H_target else 0.8; a side batch on P/4 prompts
    at T; its positives (Â > 0.05) get Â = 1 and replace the first s = min(60, #pos) (halved
    above target) rows of the GRPO batch; PPO update."""

    def __init__(self, config: Any, max_new_tokens: int) -> None:
        super().__init__(config, max_new_tokens)
        if not isinstance(self.rollout, TemperatureSideBatch):
            raise ConfigError("algorithm.rollout.name must be temperature_side_batch for "
                              f"arbitrary_entropy, got {config.rollout.get('name')!r}")

    def select_training_rows(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        side = batch["side_batch"]
        main_rows = (~side).nonzero().flatten()
        ctl = self.rollout
        positives = (side & (batch["advantages"] > ctl.positive_threshold)).nonzero().flatten()
        s = substitution_count(len(positives), ctl.entropy_proxy > ctl.target_entropy,
                               ctl.max_substitute)
        rows = torch.cat([positives[:s], main_rows[s:]])
        out = batch.select(rows)
        adv = out["advantages"].clone()
        adv[:s] = 1.0
        out["advantages"] = adv
        out["substituted"] = torch.arange(len(out)) < s
        # the proxy the next step's temperature is chosen by: -mean log pi_old of the trained
        # tokens at the training temperature
        mask = out["response_mask"]
        self.rollout.entropy_proxy = float(-(out["old_logprobs"] * mask).sum()
                                           / mask.sum().clamp(min=1))
        return out, {"aent/positives": float(len(positives)), "aent/substituted": float(s),
                     "aent/next_entropy_proxy": self.rollout.entropy_proxy}

    def state_dict(self) -> dict[str, Any]:
        return {"entropy_proxy": self.rollout.entropy_proxy}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rollout.entropy_proxy = float(state.get("entropy_proxy", 0.0))
