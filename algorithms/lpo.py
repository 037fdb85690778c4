r"""LPO: Listwise Policy Optimization (Qu et al., arXiv 2605.06139; spec §1).

Group-based RLVR seen as target projection on the response simplex. For a prompt x with K
sampled responses y_1..y_K (behaviour policy π_b = π_old), outcome rewards R_k:

    s_{θ,k} = log π_θ(y_k|x) / π_b(y_k|x) = Σ_t m_{k,t} (log π_θ − log π_b)     (fp32)
    P_θ     = softmax(s_θ)                     listwise distribution over the group

Step 1, the target (Theorem 1), held fixed (detached):

    w* = argmax_w Σ_k w_k R_k − τ D_KL(w || P_t) = softmax(φ),   φ_k = R_k/τ + s_{t,k}

with s_{t,k} = log π_t(y_k)/π_b(y_k) the stale term (π_t the anchor policy; 0 on-policy). Softmax
is shift-invariant, so φ = A + s_t with the group-centred A_k = (R_k − μ_G)/τ (the ``lpo``
advantage estimator). τ: ``sigma_g`` σ_G + ε (GRPO), ``one`` 1 (Dr.GRPO), ``mu_g`` μ_G (MaxRL),
``rloo`` (K−1)/K (RLOO) or a positive number (spec §1.3).

Step 2, the projection (the loss per group; batch objective 1/B Σ_x L(x), B prompts):

    LPO_fwd:  L = D_KL(w* || P_θ),   ∂L/∂s_k = c_k = P_{θ,k} − w*_k            (|c_k| ≤ 1, Σc = 0)
    LPO_rev:  L = D_KL(P_θ || w*),   c_k = P_{θ,k} (d_k − d̄),  d_k = log P_{θ,k} − log w*_k,
                                     d̄ = Σ_j P_{θ,j} d_j = D_KL(P_θ || w*)         (Σc = 0)
    pointwise (negative control): L = −Σ_k w*_k log π_θ(y_k|x),  c_k = −w*_k    (Σc = −1)

and ∇L = Σ_k c_k ∇ s_{θ,k}. Proposition 1: on-policy (s = 0), c^rev_k = −A_k/K, the policy
gradient of Dr.GRPO-style seq-sum aggregation.

Exact two-pass surrogate (groups stay whole although they span micro-batches): the trainer calls
:meth:`LPO.prepare_minibatch` once per mini-batch; it computes s_θ for every sample with no grad
(pass 1) and c_k on whole groups. Pass 2 backpropagates, per micro-batch, Σ_k sg(c_k)·s_{θ,k},
whose gradient equals autograd of L on whole groups. Samples with c_k = 0 are left out by
``trainer.skip_zero_gradient`` only after the coefficients are computed.

Degenerate groups [inferred, spec §1.3]: a group with constant rewards (or K = 1, or τ ≤ ε as
MaxRL's μ_G ≤ ε) gets A := 0, so w* = P_t; ``skip_constant_groups`` (default) masks it
(c = 0), as GRPO's zero advantage does.

Knobs beyond the paper: ``score: mean`` divides s by |y_k| (GSPO-style ablation), ``s_clip``
clamps s (no clip in Algorithm 1), ``behaviour: rollout`` takes π_b from the sampler's
log-probs and π_t = π_old, so s_t = Σ_t (log π_old − log π_rollout).

Known discrepancies: the official code is not public; sum-of-token scores, B = prompts of the
mini-batch and no ratio clip follow the paper's equations and Algorithm 1. A group that a
mini-batch split (``trainer.mini_batch_size`` not a multiple of ``rollout.n``, or ``shuffle``)
is projected on the members present (the conditional of w* on that subset); the fraction is
logged as ``lpo/partial_group_frac``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.algorithm import AdvantageEstimator, Aggregator, Algorithm, PolicyLoss
from harness.batch import RolloutBatch
from harness.groups import (
    STD_KINDS,
    group_count,
    group_max,
    group_mean,
    group_min,
    group_std,
    group_sum,
    num_groups,
)
from harness.registry import register_advantage, register_algorithm, register_policy_loss
from harness.typed_config import ConfigError

TAU_NAMES = ("sigma_g", "one", "mu_g", "rloo")
PROJECTIONS = ("fwd", "rev")
SCORES = ("sum", "mean")
BEHAVIOURS = ("old", "rollout")


# -- listwise maths (pure functions over a flat [B] with group indices) ----------------------------
def _gsum(x: torch.Tensor, gi: torch.Tensor, G: int) -> torch.Tensor:
    """Per-group sum [G] in the dtype of ``x`` (fp64 stays fp64, unlike harness.groups)."""
    return torch.zeros(G, dtype=x.dtype, device=x.device).index_add(0, gi, x)


def group_log_softmax(x: torch.Tensor, gi: torch.Tensor, G: int) -> torch.Tensor:
    """log softmax of ``x`` [B] within each group (differentiable; at least fp32)."""
    x = x if x.dtype == torch.float64 else x.float()
    shift = torch.full((G,), float("-inf"), dtype=x.dtype, device=x.device).scatter_reduce(
        0, gi, x.detach(), reduce="amax")
    z = x - shift[gi]
    return z - torch.log(_gsum(torch.exp(z), gi, G))[gi]


def lpo_coefficients(
    log_p: torch.Tensor, log_w: torch.Tensor, gi: torch.Tensor, G: int, projection: str,
    pointwise: bool = False,
) -> torch.Tensor:
    """c_k = ∂L(group)/∂s_k [B] from log P_θ and log w* (both group log-softmaxes)."""
    P, w = log_p.exp(), log_w.exp()
    if pointwise:
        return -w
    if projection == "fwd":
        return P - w
    if projection == "rev":
        d = log_p - log_w
        return P * (d - _gsum(P * d, gi, G)[gi])
    raise ConfigError(f"algorithm.loss.projection={projection!r}; valid: {', '.join(PROJECTIONS)}")


def lpo_group_loss(
    s: torch.Tensor, phi: torch.Tensor, gi: torch.Tensor, G: int, projection: str,
    pointwise: bool = False,
) -> torch.Tensor:
    """The loss of each group [G] (differentiable in ``s``): D_KL(w*||P_θ), D_KL(P_θ||w*), or
    the pointwise −Σ w*_k s_k (= −Σ w*_k log π_θ(y_k) up to a constant in θ)."""
    log_p = group_log_softmax(s, gi, G)
    log_w = group_log_softmax(phi.detach().to(log_p.dtype), gi, G)
    if pointwise:
        return _gsum(-log_w.exp() * s.to(log_w.dtype), gi, G)
    if projection == "fwd":
        return _gsum(log_w.exp() * (log_w - log_p), gi, G)
    if projection == "rev":
        return _gsum(log_p.exp() * (log_p - log_w), gi, G)
    raise ConfigError(f"algorithm.loss.projection={projection!r}; valid: {', '.join(PROJECTIONS)}")


def sequence_scores(
    logp: torch.Tensor, base: torch.Tensor, mask: torch.Tensor, score: str = "sum"
) -> torch.Tensor:
    """s_k = Σ_t m (logp − base) in fp32 [B]; ``mean`` divides by the k-th response's length."""
    mask = mask.float()
    s = ((logp.float() - base.float()) * mask).sum(-1)
    return s / mask.sum(-1).clamp(min=1.0) if score == "mean" else s


def parse_tau(tau: str | float) -> str | float:
    """A τ name, or a positive float (Hydra hands numbers to the ``str`` field as text)."""
    if isinstance(tau, str) and tau in TAU_NAMES:
        return tau
    try:
        value = float(tau)
    except (TypeError, ValueError):
        raise ConfigError(
            f"algorithm.advantage.tau={tau!r}; valid: {', '.join(TAU_NAMES)} or a number > 0"
        ) from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"algorithm.advantage.tau must be > 0 and finite, got {tau!r}")
    return value


# -- the target: A = (R − μ_G)/τ ----------------------------------------------------------------
@register_advantage("lpo")
@dataclass
class LPOTargetAdvantage(AdvantageEstimator):
    """A_k = (R_k − μ_G)/τ [B]: the target logits, w* = softmax(A + s_t). Degenerate groups
    (constant R, K = 1, τ ≤ 0, or μ_G ≤ eps for ``mu_g``) get A = 0."""

    tau: str = "sigma_g"
    std_kind: str = "unbiased"
    eps: float = 1e-6

    def __post_init__(self) -> None:
        self.tau_value = parse_tau(self.tau)
        if self.std_kind not in STD_KINDS:
            raise ConfigError(
                f"algorithm.advantage.std_kind={self.std_kind!r}; valid: {', '.join(STD_KINDS)}"
            )

    def temperature(self, r: torch.Tensor, gi: torch.Tensor, G: int) -> torch.Tensor:
        """τ of each group [G]."""
        if self.tau_value == "sigma_g":
            return group_std(r, gi, self.std_kind, G) + self.eps
        if self.tau_value == "mu_g":
            return group_mean(r, gi, G)
        if self.tau_value == "rloo":
            n = group_count(gi, G)
            return (n - 1.0) / n.clamp(min=1.0)
        if self.tau_value == "one":
            return torch.ones(G)
        return torch.full((G,), float(self.tau_value))

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        r, gi = batch["rewards"].float(), batch["group_index"]
        G = num_groups(gi)
        tau = self.temperature(r, gi, G)
        constant = group_max(r, gi, G) == group_min(r, gi, G)
        floor = self.eps if self.tau_value == "mu_g" else 0.0  # MaxRL: μ_G ≤ eps is all-fail
        ok = (~constant & (tau > floor) & torch.isfinite(tau))[gi]
        centred = r - group_mean(r, gi, G)[gi]
        return torch.where(ok, centred / torch.where(ok, tau[gi], 1.0), torch.zeros_like(r))


# -- the projection loss (pass 2) and the coefficients (pass 1) ----------------------------------
@register_policy_loss("lpo")
@dataclass
class LPOLoss(PolicyLoss):
    """Σ_k sg(c_k) s_{θ,k} per micro-batch, with c_k from :meth:`prepare` on whole groups."""

    projection: str = "fwd"
    pointwise: bool = False
    score: str = "sum"
    s_clip: float | None = None
    behaviour: str = "old"
    skip_constant_groups: bool = True

    def __post_init__(self) -> None:
        for key, value, valid in (("projection", self.projection, PROJECTIONS),
                                  ("score", self.score, SCORES),
                                  ("behaviour", self.behaviour, BEHAVIOURS)):
            if value not in valid:
                raise ConfigError(f"algorithm.loss.{key}={value!r}; valid: {', '.join(valid)}")
        if self.s_clip is not None and not self.s_clip > 0:
            raise ConfigError(f"algorithm.loss.s_clip must be > 0 (or null), got {self.s_clip}")

    def base_logprobs(self, mb: RolloutBatch) -> torch.Tensor:
        """log π_b per token: π_old, or the sampler's log-probs with ``behaviour: rollout``."""
        return mb["rollout_logprobs"] if self.behaviour == "rollout" else mb["old_logprobs"]

    def prepare(self, mb: RolloutBatch, logp: torch.Tensor) -> dict[str, float]:
        """Pass 1: from the no-grad log π_θ [B, T] of the whole mini-batch, write
        ``mb['lpo_c']`` (c_k) and ``mb['lpo_weight']`` (the per-token weight of log π_θ in pass
        2, c_k times the group size, the clip indicator and 1/|y_k| for ``score: mean``)."""
        mb.require("old_logprobs", "advantages", "response_mask", "group_index", stage="lpo")
        if self.behaviour == "rollout":
            mb.require("rollout_logprobs", stage="lpo (behaviour: rollout)")
        A = mb["advantages"].float()
        if A.dim() != 1:
            raise ValueError("LPO needs a sequence-level advantage [B] (the target logits)")
        mask = mb["response_mask"].float()
        base = self.base_logprobs(mb)
        with torch.no_grad():
            _, gi = torch.unique(mb["group_index"], return_inverse=True)
            G = int(gi.max()) + 1
            s_raw = sequence_scores(logp.detach().to(base.device), base, mask, self.score)
            s = s_raw if self.s_clip is None else s_raw.clamp(-self.s_clip, self.s_clip)
            inside = torch.ones_like(s) if self.s_clip is None else (s_raw.abs() <= self.s_clip)
            s_t = (sequence_scores(mb["old_logprobs"], base, mask, self.score)
                   if self.behaviour == "rollout" else torch.zeros_like(s))
            # s is fp32 (spec); the [B]-sized listwise maths runs in fp64, which costs nothing
            # and keeps Σc = 0 to rounding of fp64
            s, phi = s.double(), (A + s_t).double()
            log_p, log_w = group_log_softmax(s, gi, G), group_log_softmax(phi, gi, G)
            c = lpo_coefficients(log_p, log_w, gi, G, self.projection, self.pointwise).float()
            n = group_count(gi, G)
            degenerate = group_max(A.abs(), gi, G) == 0
            active = ~degenerate if self.skip_constant_groups else torch.ones_like(degenerate)
            c = c * active[gi]
            length = mask.sum(-1).clamp(min=1.0) if self.score == "mean" else torch.ones_like(s)
            mb["lpo_c"] = c
            mb["lpo_weight"] = (n[gi] * c * inside.float() / length).float()
            loss_g = lpo_group_loss(s, phi, gi, G, self.projection, self.pointwise)
            return self._metrics(c, s_raw, log_p, log_w, loss_g, n, active, gi, G, mb)

    @staticmethod
    def _metrics(c, s_raw, log_p, log_w, loss_g, n, active, gi, G, mb) -> dict[str, float]:
        P, w = log_p.exp(), log_w.exp()
        rows, na = active[gi], max(int(active.sum()), 1)
        kl = _gsum(w * (log_w - log_p), gi, G)
        ent = _gsum(-P * log_p, gi, G)
        out = {
            "lpo/c_abs_max": float(c[rows].abs().max()) if rows.any() else 0.0,
            "lpo/c_abs_mean": float(c[rows].abs().mean()) if rows.any() else 0.0,
            "lpo/c_sum": float(group_sum(c, gi, G)[active].sum() / na),
            "lpo/kl_target": float(kl[active].sum() / na),
            "lpo/p_entropy": float(ent[active].sum() / na),
            "lpo/s_abs_max": float(s_raw.abs().max()),
            "lpo/active_group_frac": float(active.float().mean()),
            # the objective as seq-mean-token-sum weighs it: Σ_g n_g L_g / B
            "actor/pg_loss": float((n * loss_g)[active].sum() / len(gi)),
        }
        if "lpo_group_size" in mb:
            full = group_max(mb["lpo_group_size"].float(), gi, G)
            out["lpo/partial_group_frac"] = float((n < full).float().mean())
        return out

    def __call__(
        self, mb: RolloutBatch, logp: torch.Tensor, entropy: torch.Tensor | None, agg: Aggregator
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Pass 2: per-token loss weight_k (log π_θ − log π_b), aggregated by ``agg``."""
        mb.require("lpo_weight", "response_mask",
                   stage="lpo loss (Algorithm.prepare_minibatch writes lpo_weight)")
        mask = mb["response_mask"]
        weight = mb["lpo_weight"].to(logp.device).float()[:, None]
        delta = logp.float() - self.base_logprobs(mb).to(logp.device).float()
        return agg(weight * delta, mask), {}


# -- the bundles -----------------------------------------------------------------------------------
class LPO(Algorithm):
    """Shared LPO bundle; subclasses fix the projection direction."""

    PROJECTION = "fwd"

    def __init__(self, config, max_new_tokens: int) -> None:
        super().__init__(config, max_new_tokens)
        if not isinstance(self.policy_loss, LPOLoss):
            raise ConfigError(f"algorithm.loss.name must be lpo for {config.name}")
        if self.policy_loss.projection != self.PROJECTION:
            raise ConfigError(
                f"algorithm.loss.projection={self.policy_loss.projection!r} contradicts "
                f"algorithm {config.name} (projection {self.PROJECTION!r})"
            )
        if config.agg == "seq-mean-token-mean":
            # a per-sequence 1/|y| would rescale each c_k and break the exact surrogate
            raise ConfigError("algorithm.agg=seq-mean-token-mean is not valid for LPO; use "
                              "seq-mean-token-sum (or loss.score=mean for length-normalised s)")

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        metrics = super().compute_advantages(batch)
        gi = batch["group_index"]
        batch["lpo_group_size"] = group_count(gi, num_groups(gi))[gi]
        return metrics

    def prepare_minibatch(
        self, mb: RolloutBatch, logprob_fn: Callable[[RolloutBatch], torch.Tensor]
    ) -> dict[str, float]:
        if len(mb) == 0:
            return {}
        return self.policy_loss.prepare(mb, logprob_fn(mb))

    def gradient_rows(self, batch: RolloutBatch) -> torch.Tensor:
        """Rows with tokens whose weight is non-zero (all rows with tokens if a KL or entropy
        term touches them). Needs :meth:`prepare_minibatch` first (coefficients on whole
        groups, before any row is dropped)."""
        has_tokens = batch["response_mask"].sum(-1) > 0
        if self.config.kl.coef != 0 or self.config.entropy_coef != 0:
            return has_tokens
        batch.require("lpo_weight", stage="lpo gradient_rows (after prepare_minibatch)")
        return has_tokens & (batch["lpo_weight"] != 0)


@register_algorithm("lpo_fwd")
class LPOForward(LPO):
    r"""LPO_fwd: project w* = softmax(R/τ + s_t) onto P_θ = softmax(s_θ) by D_KL(w*||P_θ);
    c_k = P_{θ,k} − w*_k (bounded by 1, zero-sum)."""

    PROJECTION = "fwd"


@register_algorithm("lpo_rev")
class LPOReverse(LPO):
    r"""LPO_rev: D_KL(P_θ||w*); c_k = P_{θ,k}(d_k − d̄), d = log P_θ − log w*; on-policy it is
    the policy gradient with A = (R − μ)/τ (Proposition 1)."""

    PROJECTION = "rev"
