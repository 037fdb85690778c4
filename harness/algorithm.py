"""Algorithms as bundles: rollout strategy + advantage estimator + policy loss.

An algorithm is registered with ``@register_algorithm(name)`` and configured by
``conf/algorithm/<name>.yaml``, the single place where all its knobs live::

    name: grpo
    rollout:   {name: group}                              # -> ROLLOUTS registry
    advantage: {name: grpo, std_kind: unbiased, ...}      # -> ADVANTAGES registry
    loss:      {name: ppo_clip, clip_low: 0.2, ...}       # -> POLICY_LOSSES registry
    agg: token-mean                                       # loss aggregation mode (spec §0.2)
    agg_L_max: null                                       # L_max of seq-mean-token-sum-norm
    kl: {coef: 0.0, estimator: k3}                        # KL to the reference model (§0.4)
    entropy_coef: 0.0
    overlong: {enabled: false, buffer_len: null, buffer_frac: 0.2, penalty: 1.0}  # DAPO §9.3

The shared maths every bundle uses lives here: loss aggregation (:class:`Aggregator`), the KL
estimators k1/k2/k3 and DAPO's overlong reward shaping. Subclasses override a hook only when the
method changes the data flow itself.

The loss of a bundle is  L = L_pg + β · agg(KL_est) − c_H · agg(H):  the KL term is a penalty
(it raises the loss), the entropy term a bonus (it lowers the loss, so its gradient raises H).

Known discrepancies:

* ``seq-mean-token-sum-norm`` divides by B·L_max (B the mini-batch's sequences), as the Dr.GRPO
  paper's loss and Oat's ``masked_sum(..., constant_normalizer=generate_max_length)`` averaged
  over the batch; verl's ``seq-mean-token-sum-norm`` divides the summed token losses by
  ``loss_scale_factor`` only (L_max when set; the padded width by default), with no 1/B, so our
  gradients are 1/B of verl's. With Adam the scale is nearly immaterial; with SGD, gradient
  clipping or a comparison of gradient norms, it is not.
* k3 follows verl's ``low_var_kl``: the log-ratio log π_ref − log π is clamped to [−20, 20]
  before ``exp`` and the estimate to [−10, 10]; without the first clamp, log π − log π_ref below
  about −88 overflows exp() in fp32 and the gradient is NaN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

import torch

from harness.batch import RolloutBatch
from harness.registry import ADVANTAGES, ALGORITHMS, POLICY_LOSSES, ROLLOUTS
from harness.typed_config import ConfigError, build, validate


class AdvantageEstimator(Protocol):
    """``A = estimator(batch)``: advantages [B] (one per sequence) or [B, T] (per token) from
    ``batch['rewards']``, ``batch['group_index']`` and ``batch['response_mask']``. Registered with
    ``@register_advantage(name)``; its dataclass fields are the knobs under
    ``algorithm.advantage``. An estimator that reports batch-level metrics assigns its own dict to
    ``last_metrics`` in each call (logged every step); the default is none."""

    last_metrics: Mapping[str, float] = MappingProxyType({})

    def __call__(self, batch: RolloutBatch) -> torch.Tensor: ...


class PolicyLoss(Protocol):
    """``loss, metrics = policy_loss(mb, logp, entropy, agg)``: the policy-gradient term of one
    micro-batch, aggregated by ``agg``. Registered with ``@register_policy_loss(name)``.

    Declared capabilities (class attributes; the trainer reads them, never probes):
    ``zero_advantage_zero_gradient`` -- a row whose advantage is 0 on every token contributes
    exactly 0 to the loss and its gradient, so the trainer may skip its forward/backward;
    ``micro_batch_coupled`` -- the loss computes a statistic across the rows of a micro-batch
    (AEPO's entropy z-score), so micro-batches must not be regrouped by length."""

    zero_advantage_zero_gradient: bool = False
    micro_batch_coupled: bool = False

    def __call__(self, mb: RolloutBatch, logp: torch.Tensor, entropy: torch.Tensor | None,
                 agg: Aggregator) -> tuple[torch.Tensor, dict[str, float]]: ...


AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclass
class KLConfig:
    coef: float = 0.0
    estimator: str = "k3"


@dataclass
class OverlongConfig:
    """DAPO soft overlong punishment with L_max = rollout.max_new_tokens and L_cache =
    buffer_len tokens (null: buffer_frac * L_max; the paper's 4096 / 20480 = 0.2)."""

    enabled: bool = False
    buffer_len: int | None = None
    buffer_frac: float = 0.2
    penalty: float = 1.0


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    rollout: dict[str, Any] = field(default_factory=lambda: {"name": "group"})
    advantage: dict[str, Any] = field(default_factory=lambda: {"name": "grpo"})
    loss: dict[str, Any] = field(default_factory=lambda: {"name": "ppo_clip"})
    agg: str = "token-mean"
    agg_L_max: int | None = None
    kl: KLConfig = field(default_factory=KLConfig)
    entropy_coef: float = 0.0
    overlong: OverlongConfig = field(default_factory=OverlongConfig)


@dataclass
class Aggregator:
    """Loss aggregation over a whole mini-batch, applied one micro-batch at a time.

    ``total_tokens``/``total_seqs`` are counted over the mini-batch, so the micro-batch losses
    sum exactly to the mini-batch loss (micro-batching never changes the gradient). Modes:

    * token-mean:              sum_{i,t} m l / sum_{i,t} m
    * seq-mean-token-mean:     1/B sum_i (sum_t m l / sum_t m)
    * seq-mean-token-sum:      1/B sum_i sum_t m l
    * seq-mean-token-sum-norm: 1/(B L_max) sum_i sum_t m l   (L_max fixed by config, never the
      padded width, so padding cannot change the loss -- Dr.GRPO)
    """

    mode: str
    total_tokens: float
    total_seqs: int
    L_max: int | None = None
    metric_tokens: float | None = None  # tokens diagnostics average over (None = total_tokens)
    # per-token constants multiplying the loss before aggregation (truncated importance
    # sampling, harness/rollout_correction.py); diagnostics (``mean``) are never weighted
    token_weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.mode not in AGG_MODES:
            raise ConfigError(f"algorithm.agg={self.mode!r}; valid modes: {', '.join(AGG_MODES)}")
        if self.mode == "seq-mean-token-sum-norm" and not self.L_max:
            raise ConfigError("algorithm.agg_L_max must be set for seq-mean-token-sum-norm")

    @classmethod
    def for_batch(cls, mode: str, batch: RolloutBatch, L_max: int | None = None) -> Aggregator:
        tokens = float(batch["response_mask"].sum().item())
        return cls(mode=mode, total_tokens=tokens, total_seqs=len(batch), L_max=L_max)

    def weighted(self, weights: torch.Tensor) -> Aggregator:
        """This aggregator with the loss of each token multiplied by ``weights`` [B, T]."""
        return dataclasses.replace(self, token_weights=weights)

    def __call__(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.token_weights is not None:
            per_token = per_token * self.token_weights.to(per_token.device)
        masked = per_token * mask
        seqs = max(self.total_seqs, 1)
        if self.mode == "token-mean":
            return masked.sum() / max(self.total_tokens, 1.0)
        if self.mode == "seq-mean-token-mean":
            return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / seqs
        if self.mode == "seq-mean-token-sum":
            return masked.sum() / seqs
        return masked.sum() / (seqs * self.L_max)

    def mean(self, per_token: torch.Tensor, mask: torch.Tensor) -> float:
        """Token-weighted share of a diagnostic (clip fraction, entropy) for this micro-batch;
        summing over micro-batches gives the token mean over the tokens that were trained."""
        tokens = self.total_tokens if self.metric_tokens is None else self.metric_tokens
        return float((per_token * mask).sum().item() / max(tokens, 1.0))


# verl's low_var_kl clamps the log-ratio before exp() (and the estimate after)
K3_LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimates of KL(π || π_ref) on tokens sampled from π (verl ``kl_penalty``), with
    log r = log π − log π_ref:  k1 = log r,  k2 = (log r)² / 2,  k3 = e^{−log r} + log r − 1 with
    −log r clamped to [−20, 20] before exp and the estimate to [−10, 10] (``low_var_kl``)."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        neg = (-log_ratio).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return (torch.exp(neg) - neg - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
    raise ConfigError(f"algorithm.kl.estimator={estimator!r}; valid: {', '.join(KL_ESTIMATORS)}")


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer_len: int, penalty: float
) -> torch.Tensor:
    """DAPO R_len(|y|): 0 up to L_max - L_cache, then linear down to -penalty at L_max."""
    lengths = lengths.float()
    if buffer_len <= 0:  # no soft zone: only responses that reach L_max are punished
        return torch.where(lengths >= max_len, -penalty, 0.0)
    frac = (max_len - buffer_len - lengths) / buffer_len
    return (frac * penalty).clamp(min=-penalty, max=0.0)


class Algorithm:
    """The default bundle. ``@register_algorithm`` subclasses document one method each."""

    # what the bundle needs from a task beyond what its parts declare (harness.compat)
    needs: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: AlgorithmConfig, max_new_tokens: int) -> None:
        self.config = config
        self.max_new_tokens = max_new_tokens
        if config.agg not in AGG_MODES:
            raise ConfigError(f"algorithm.agg={config.agg!r}; valid modes: {', '.join(AGG_MODES)}")
        if config.kl.estimator not in KL_ESTIMATORS:
            raise ConfigError(
                f"algorithm.kl.estimator={config.kl.estimator!r}; valid: {', '.join(KL_ESTIMATORS)}"
            )
        self.rollout = build(ROLLOUTS, config.rollout, "algorithm.rollout")
        self.advantage: AdvantageEstimator = build(ADVANTAGES, config.advantage,
                                                   "algorithm.advantage")
        self.policy_loss: PolicyLoss = build(POLICY_LOSSES, config.loss, "algorithm.loss")
        self.L_max = config.agg_L_max or max_new_tokens

    @property
    def needs_reference(self) -> bool:
        return self.config.kl.coef > 0

    # -- stages ---------------------------------------------------------------------------------
    def shape_rewards(self, batch: RolloutBatch) -> None:
        """Reward shaping after verification (in place on ``batch['rewards']``)."""
        ov = self.config.overlong
        if ov.enabled:
            batch.require("raw_rewards", "attention_mask", stage="overlong shaping")
            buffer = ov.buffer_len if ov.buffer_len is not None else round(
                ov.buffer_frac * self.max_new_tokens
            )
            batch["rewards"] = batch["raw_rewards"] + overlong_penalty(
                batch.generated_lengths(), self.max_new_tokens, buffer, ov.penalty
            )

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        """Write ``batch['advantages']``; return the estimator's metrics for the step log. An
        estimator reports batch-level metrics by setting ``last_metrics`` (a dict) in its call;
        they are returned here so they are logged on every step, even when every sample of a
        mini-batch is later skipped as zero-gradient."""
        batch.require("rewards", "group_index", "response_mask", stage="advantage")
        batch["advantages"] = self.advantage(batch)
        return dict(self.advantage.last_metrics)

    def select_training_rows(self, batch: RolloutBatch) -> tuple[RolloutBatch, dict[str, float]]:
        """Called once after :meth:`compute_advantages`: the rows the update trains on, and
        metrics. A method that chooses its training rows by advantage (arbitrary-entropy PO's
        substitution of positive side-batch samples) overrides it. Default: every row."""
        return batch, {}

    def state_dict(self) -> dict[str, Any]:
        """State carried from step to step (a controller's reading), saved in checkpoints so a
        resumed run continues identically. JSON-serialisable. Default: none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""

    def aggregator(self, minibatch: RolloutBatch) -> Aggregator:
        return Aggregator.for_batch(self.config.agg, minibatch, self.L_max)

    def prepare_minibatch(
        self, mb: RolloutBatch, logprob_fn: Callable[[RolloutBatch], torch.Tensor]
    ) -> dict[str, float]:
        """Called by the trainer once per mini-batch, before :meth:`gradient_rows` and the
        micro-batches; ``logprob_fn(mb)`` gives the current model's no-grad log-probs [B, T].
        A loss that couples samples (a listwise loss over a group) computes per-sample
        quantities here on the whole mini-batch and stores them in ``mb``. Returns mini-batch
        metrics (averaged over optimizer steps like the micro-batch ones). Default: nothing."""
        return {}

    def gradient_rows(self, batch: RolloutBatch) -> torch.Tensor:
        """Bool [B]: samples whose loss can have a non-zero gradient. A sample with zero
        advantage on every token contributes exactly nothing when the policy loss says so and
        no KL or entropy term touches it; the trainer then skips its forward/backward (most
        GRPO groups on an easy or hopeless prompt are constant). The aggregator still counts
        the skipped samples, so the update is unchanged. A loss that computes a statistic across
        rows must not see it change with the skip: it computes it in :meth:`prepare_minibatch`
        on the whole mini-batch (LPO's coefficients), or declares ``zero_advantage_zero_gradient``
        false so no row is dropped (AEPO's micro-batch entropy z-score)."""
        mask = batch["response_mask"]
        has_tokens = mask.sum(-1) > 0
        skippable = (
            self.policy_loss.zero_advantage_zero_gradient
            and self.config.kl.coef == 0
            and self.config.entropy_coef == 0
        )
        if not skippable:
            return has_tokens
        adv = batch["advantages"]
        nonzero = adv != 0 if adv.dim() == 1 else ((adv * mask) != 0).any(-1)
        return nonzero & has_tokens

    def loss(
        self,
        mb: RolloutBatch,
        logp: torch.Tensor,
        entropy: torch.Tensor | None,
        agg: Aggregator,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Policy loss + KL penalty - entropy bonus, aggregated by ``agg``. With rollout
        correction on, the trainer put truncated-IS weights in ``mb["is_weights"]``: they scale
        the policy-loss tokens only."""
        pg_agg = agg.weighted(mb["is_weights"]) if "is_weights" in mb else agg
        loss, metrics = self.policy_loss(mb, logp, entropy, pg_agg)
        mask = mb["response_mask"]
        if self.config.kl.coef > 0:
            mb.require("ref_logprobs", stage="kl penalty")
            kl = kl_penalty(logp, mb["ref_logprobs"], self.config.kl.estimator)
            loss = loss + self.config.kl.coef * agg(kl, mask)
            metrics["actor/kl"] = agg.mean(kl.detach(), mask)
        if self.config.entropy_coef and entropy is not None:
            loss = loss - self.config.entropy_coef * agg(entropy, mask)
        if entropy is not None:
            metrics["actor/entropy"] = agg.mean(entropy.detach(), mask)
        return loss, metrics


def build_algorithm(node: Any, max_new_tokens: int) -> Algorithm:
    """Validate ``cfg.algorithm`` and instantiate the registered bundle it names."""
    if node is None or "name" not in node:
        raise ConfigError(f"algorithm.name is required (one of: {', '.join(ALGORITHMS.names())})")
    cls = ALGORITHMS.get(node["name"])
    config = validate(AlgorithmConfig, {**dict(node)}, "algorithm")
    config.name = node["name"]
    return cls(config, max_new_tokens)
