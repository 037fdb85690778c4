r"""AEM: Adaptive Entropy Modulation (Zhao et al., arXiv 2605.00425; spec §5).

A modifier over any base advantage estimator (GRPO, DAPO's GRPO, MaxRL, ...). For response i of
a rollout group 𝒢 (single-turn: one response per trajectory, so the turn index t is dropped):

    H̄_i = 1/|S_i| Σ_{ℓ∈S_i} H_ℓ                       mean token entropy over the response mask
    H̃_i = (H̄_i - min_𝒢 H̄) / (max_𝒢 H̄ - min_𝒢 H̄)     (0 when max = min)
    α_i = exp(-λ H̃_i) / max(1/|𝒢| Σ_{j∈𝒢} exp(-λ H̃_j), ε)
    A^AEM_i = α_i · A^base_i                           broadcast to every token of the response

Theory (§5.2): with surprisal S = -log π(a|s) of the whole response and H_resp = E_a S, a
natural-gradient step on a sampled action changes entropy by ∝ A (S - H_resp); down-weighting
high-entropy responses (α decreasing in H̃) modulates that drift without ever flipping the sign
of an update (α > 0).

Config (``advantage: {name: aem, base: {name: grpo, ...}, lam: 1.0, eps: 1e-8}``): ``base`` is any
registered advantage estimator node, built through the ADVANTAGES registry with its own knobs.

Logged every step (the estimator's ``last_metrics``, returned by
``Algorithm.compute_advantages``): ``aem/alpha_min``,
``aem/alpha_max``, ``aem/alpha_mean`` over the batch.

Known discrepancies / choices:
* H_ℓ is the per-token entropy recorded at sampling time (batch key ``entropy``,
  ``rollout.entropy=true``), i.e. of the temperature-scaled behaviour distribution, not
  recomputed in the training forward pass as the paper does. On-policy at temperature 1 they
  coincide with π_old's; otherwise they differ by the temperature scaling.
* The spec's denominator is ``mean + ε``; here it is ``max(mean, ε)``: identical up to O(ε),
  but the weights then average to exactly 1 in a group, λ = 0 and a constant-entropy group give
  α = 1 exactly (the mean is ≥ e^{-λ} > 0, so ε only guards an overflowing λ).
* λ is not given in the sources (sweep {0.5, 1, 2}); the yaml ships 1.0.
* Multi-turn (a task with tools): a response is one model turn (i, t) of a trajectory, its tokens
  those of that segment (tool results are masked and excluded); H̄_{i,t} and α_{i,t} are per
  turn and A^AEM_{i,t} = α_{i,t} A^base_i is broadcast over turn t's tokens. ``group``:
  ``prompt_group_all_turns`` (default) normalises over every turn of every trajectory of the
  prompt, ``prompt_group_same_turn`` over the t-th turns only. Single-turn tasks have one
  response per trajectory, where both groups are the prompt's rollout group.
* A response with no loss tokens has H̄ = 0 (it still takes part in the group's min–max).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.algorithm import AdvantageEstimator, Algorithm
from harness.batch import RolloutBatch
from harness.groups import group_max, group_mean, group_min, num_groups
from harness.registry import ADVANTAGES, register_advantage, register_algorithm
from harness.typed_config import ConfigError, build

GROUPS = ("prompt_group_all_turns", "prompt_group_same_turn")


def mean_token_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """H̄_i: masked mean of the per-token entropy [B, T] over each response [B]."""
    mask = mask.float()
    return (entropy.float() * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def aem_weights(h_bar: torch.Tensor, group_index: torch.Tensor, lam: float,
                eps: float) -> torch.Tensor:
    """α_i = exp(-λ H̃_i) / max(mean_𝒢 exp(-λ H̃), ε) with H̃ min–max normalised per group."""
    G = num_groups(group_index)
    if G == 0:
        return torch.ones_like(h_bar)
    lo = group_min(h_bar, group_index, G)[group_index]
    hi = group_max(h_bar, group_index, G)[group_index]
    span = hi - lo
    flat = span <= 0
    h_tilde = torch.where(flat, 0.0, (h_bar - lo) / torch.where(flat, 1.0, span))
    w = torch.exp(-lam * h_tilde)
    return w / group_mean(w, group_index, G)[group_index].clamp(min=eps)


@register_advantage("aem")
class AEMAdvantage(AdvantageEstimator):
    """α_i · A^base_i with α from the group-min–max-normalised mean token entropy."""

    @dataclass
    class Config:
        base: dict[str, Any] = field(default_factory=dict)  # required: {name: <estimator>, ...}
        lam: float = 1.0  # λ, the temperature of exp(-λ H̃)
        eps: float = 1.0e-8  # floor of the self-normalising denominator
        group: str = "prompt_group_all_turns"

    def __init__(self, config: Config) -> None:
        p = "algorithm.advantage"
        if not math.isfinite(config.lam) or config.lam < 0:
            raise ConfigError(f"{p}.lam must be a finite number >= 0, got {config.lam!r}")
        if not math.isfinite(config.eps) or config.eps <= 0:
            raise ConfigError(f"{p}.eps must be a finite number > 0, got {config.eps!r}")
        if config.group not in GROUPS:
            raise ConfigError(f"{p}.group={config.group!r}; valid: {', '.join(GROUPS)}")
        if not isinstance(config.base, dict) or "name" not in config.base:
            raise ConfigError(
                f"{p}.base must name a base advantage estimator, e.g. {{name: grpo}} "
                f"(one of: {', '.join(n for n in ADVANTAGES.names() if n != 'aem')})"
            )
        if config.base["name"] == "aem":
            raise ConfigError(f"{p}.base.name must not be 'aem' itself")
        self.config = config
        self.base = build(ADVANTAGES, config.base, f"{p}.base")
        self.last_metrics: dict[str, float] = {}

    def weights(self, batch: RolloutBatch) -> torch.Tensor:
        batch.require("entropy", "response_mask", "group_index", stage="aem advantage "
                      "(per-token entropy is recorded at sampling time: rollout.entropy=true)")
        h_bar = mean_token_entropy(batch["entropy"], batch["response_mask"])
        return aem_weights(h_bar, batch["group_index"], self.config.lam, self.config.eps)

    def turn_weights(self, batch: RolloutBatch) -> torch.Tensor | None:
        """Multi-turn form: α per response (trajectory i, turn t) as a [B, T] token map, or None
        when every trajectory has a single model turn (then the response is the trajectory)."""
        if not any(len(t.turn_boundaries) > 1 for t in batch.trajectories):
            return None
        batch.require("entropy", "response_mask", "group_index", stage="aem advantage")
        mask, ent = batch["response_mask"], batch["entropy"].float()
        T = mask.shape[1]
        token_resp = torch.full(mask.shape, -1, dtype=torch.long)
        h_bar, groups, same_turn = [], [], self.config.group == "prompt_group_same_turn"
        keys: dict[tuple[int, int], int] = {}
        for row, t in enumerate(batch.trajectories):
            starts = list(t.turn_boundaries) or [0]
            ends = [*starts[1:], T]
            g = int(batch["group_index"][row])
            for k, (a, b) in enumerate(zip(starts, ends)):
                sel = mask[row, a:b] > 0
                if not bool(sel.any()):
                    continue
                token_resp[row, a:b][sel] = len(h_bar)
                h_bar.append(float(ent[row, a:b][sel].mean()))
                groups.append(keys.setdefault((g, k if same_turn else 0), len(keys)))
        if not h_bar:
            return torch.ones(mask.shape)
        alpha = aem_weights(torch.tensor(h_bar), torch.tensor(groups), self.config.lam,
                            self.config.eps)
        out = torch.ones(mask.shape)
        has = token_resp >= 0
        out[has] = alpha[token_resp[has]]
        return out

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        base = self.base(batch)
        per_turn = self.turn_weights(batch)
        if per_turn is not None:  # α_{i,t} broadcast over the tokens of turn t
            alpha = per_turn.to(base.device)
            adv = alpha * (base[:, None] if base.dim() == 1 else base)
        else:
            alpha = self.weights(batch).to(base.device)
            adv = alpha * base if base.dim() == 1 else alpha[:, None] * base
        self.last_metrics = dict(self.base.last_metrics)
        if alpha.dim() == 2:  # per-turn weights: only the model's tokens carry one
            alpha = alpha[batch["response_mask"].to(alpha.device) > 0]
        if alpha.numel():
            self.last_metrics.update({
                "aem/alpha_min": float(alpha.min()),
                "aem/alpha_max": float(alpha.max()),
                "aem/alpha_mean": float(alpha.mean()),
            })
        return adv


@register_algorithm("grpo_aem")
class GRPOAEM(Algorithm):
    r"""GRPO + AEM: Â_i = α_i (r_i - mean(r)) / (std(r) + ε), α_i = exp(-λ H̃_i) self-normalised
    in the group, H̃ the min–max-normalised mean token entropy; GRPO's loss settings."""
