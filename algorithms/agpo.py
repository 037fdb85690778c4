r"""AGPO: Asymmetric Group Policy Optimization (Xu et al., JD.com, arXiv 2605.05826; spec §2).

Binary outcome c_i = 1[o_i correct] for the G responses of a prompt, with group mean μ and
standard deviation σ of c (population σ by default, ``std_kind``). Two readings of the sources:

Form A (default, ``form: A``): negative-dominant, wrong samples get the constant reward ℛ,
correct samples a variance-scaled positive advantage

    Â_i = 1[c_i=1] · (c_i - μ) / sqrt(σ² + δ²)  +  1[c_i=0] · ℛ,        ℛ = -1

Form B (``form: B``, the survey's formula with "r_i < 0" read as "incorrect"):

    Â_i = (c_i - μ) / sqrt(σ² + δ²)  +  1[c_i=0] · ℛ

δ > 0 is required (no value is given in the sources; sweep {0.1, 0.3, 0.5, 1.0}). In Form A an
all-correct group gets Â ≡ 0 (μ = 1, σ = 0; δ avoids 0/0), an all-wrong group Â ≡ ℛ, and a
correct sample's Â ≤ 1/δ. The sequence-level advantage is broadcast to the tokens and plugged into
the PPO clipped surrogate with the harness GRPO settings (token-mean, clip 0.2, no KL).

Logged every step (the estimator's ``last_metrics``, returned by
``Algorithm.compute_advantages``): ``agpo/all_correct_group_frac``,
``agpo/all_wrong_group_frac``, ``agpo/adv_pos_mean``, ``agpo/adv_neg_mean``.

Known discrepancies / choices:
* Only the abstract and secondary summaries were reachable; the Form A/B composition is unresolved.
* The indicator and the statistics use the verifier's verdict (``correct``), i.e. the binary
  reward the method is defined for; reward shaping (format score, overlong penalty) is ignored.
* σ kind is not given in the sources; population is the default (the "σ → 0 when all correct"
  argument assumes it), ``std_kind: unbiased`` is offered.
* A group of one sample: μ = c, σ = 0, so a lone correct sample gets 0 and a lone wrong one ℛ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from harness.algorithm import AdvantageEstimator, Algorithm
from harness.batch import RolloutBatch
from harness.compat import BINARY_CORRECT
from harness.groups import STD_KINDS, group_max, group_mean, group_min, group_std, num_groups
from harness.registry import register_advantage, register_algorithm
from harness.typed_config import ConfigError

FORMS = ("A", "B")


def advantage_sign_metrics(adv: torch.Tensor, prefix: str) -> dict[str, float]:
    """Mean of the positive and of the negative sequence advantages (omitted when none)."""
    out: dict[str, float] = {}
    pos, neg = adv[adv > 0], adv[adv < 0]
    if pos.numel():
        out[f"{prefix}/adv_pos_mean"] = float(pos.mean())
    if neg.numel():
        out[f"{prefix}/adv_neg_mean"] = float(neg.mean())
    return out


@register_advantage("agpo")
@dataclass
class AGPOAdvantage(AdvantageEstimator):
    """Form A: correct (c-μ)/sqrt(σ²+δ²), wrong ℛ; Form B: (c-μ)/sqrt(σ²+δ²) + 1[wrong]·ℛ.
    Sequence-level [B]. ``delta`` is required (no default)."""

    needs: ClassVar[frozenset[str]] = frozenset({BINARY_CORRECT})  # harness.compat

    delta: float = "???"  # type: ignore[assignment]  # OmegaConf MISSING: required in the yaml
    form: str = "A"
    std_kind: str = "population"
    wrong_reward: float = -1.0  # ℛ

    def __post_init__(self) -> None:
        self.last_metrics: dict[str, float] = {}  # not a knob: the latest batch's metrics
        p = "algorithm.advantage"
        delta = self.delta
        if isinstance(delta, bool) or not isinstance(delta, (int, float)):
            raise ConfigError(f"{p}.delta must be a number > 0, got {delta!r}")
        if not math.isfinite(delta) or delta <= 0:
            raise ConfigError(f"{p}.delta must be a finite number > 0, got {delta!r}")
        self.delta = float(delta)
        if self.form not in FORMS:
            raise ConfigError(f"{p}.form={self.form!r}; valid: {', '.join(FORMS)}")
        if self.std_kind not in STD_KINDS:
            raise ConfigError(f"{p}.std_kind={self.std_kind!r}; valid: {', '.join(STD_KINDS)}")
        if not math.isfinite(self.wrong_reward):
            raise ConfigError(f"{p}.wrong_reward must be finite, got {self.wrong_reward!r}")

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        batch.require("correct", "group_index", stage="agpo advantage")
        c, gi = batch["correct"].float(), batch["group_index"]
        G = num_groups(gi)
        mu = group_mean(c, gi, G)
        sigma = group_std(c, gi, self.std_kind, G)
        scaled = (c - mu[gi]) / torch.sqrt(sigma[gi].square() + self.delta**2)
        correct = c > 0.5
        if self.form == "A":
            adv = torch.where(correct, scaled, torch.full_like(c, self.wrong_reward))
        else:
            adv = scaled + torch.where(correct, 0.0, self.wrong_reward)
        self.last_metrics = self.metrics(adv, c, gi, G)
        return adv

    @staticmethod
    def metrics(adv: torch.Tensor, c: torch.Tensor, gi: torch.Tensor, G: int) -> dict[str, float]:
        if G == 0:
            return {}
        present = group_max(c, gi, G) > float("-inf")
        lo, hi = group_min(c, gi, G)[present], group_max(c, gi, G)[present]
        return {
            "agpo/all_correct_group_frac": float((lo > 0.5).float().mean()),
            "agpo/all_wrong_group_frac": float((hi < 0.5).float().mean()),
            **advantage_sign_metrics(adv, "agpo"),
        }


@register_algorithm("agpo")
class AGPO(Algorithm):
    r"""AGPO: wrong samples get ℛ = -1, correct ones (1-μ)/sqrt(σ²+δ²) (Form A; Form B adds the
    GRPO-with-δ term to every sample), PPO clipped surrogate with the GRPO settings."""
