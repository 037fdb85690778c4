r"""DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization (Yu et al., arXiv 2503.14476;
spec §9.3).

For a prompt q with G responses o_i and rewards R_i, GRPO's advantage
Â_{i,t} = (R_i - mean(R)) / std(R) and the objective

    J(θ) = E[ 1/Σ_i|o_i| · Σ_i Σ_t min(r_{i,t} Â_{i,t}, clip(r_{i,t}, 1-ε_low, 1+ε_high) Â_{i,t}) ]
    s.t.  0 < |{o_i : is_equivalent(a, o_i)}| < G

with its four changes to GRPO:

1. Clip-Higher: ε_low = 0.2, ε_high = 0.28 (``loss: ppo_clip``).
2. Dynamic sampling (the constraint above): groups whose accuracy is 0 or 1 carry no gradient
   (all advantages 0) and are dropped; prompts are over-sampled until the batch is full
   (:class:`DynamicSampling`, registered as rollout ``dynamic_sampling``).
3. Token-level policy-gradient loss 1/Σ_i|o_i| (``agg: token-mean``).
4. Overlong reward shaping (``overlong``, :func:`harness.algorithm.overlong_penalty`):
   R_len(y) = 0 for |y| ≤ L_max - L_cache, ((L_max - L_cache) - |y|)/L_cache up to L_max, -1 beyond.

No KL term. Sources: the paper; verl's ``recipe/dapo`` (``filter_groups`` with
``max_num_gen_batches``, ``clip_ratio_c = 10.0`` dual clip, ``loss_agg_mode = token-mean``).

Known discrepancies:
* verl keeps every informative group of the last round and trims the concatenated batch to the
  target size; here the kept groups are trimmed in generation order to exactly
  ``prompts_per_step`` groups, which is the same set.
* When ``max_gen_batches`` rounds do not fill the batch, verl raises (or, with
  ``max_num_gen_batches <= 0``, loops forever); here the groups kept so far are returned (possibly
  none: the trainer skips the update on an empty batch).
* The paper's L_max = 20480, L_cache = 4096; here L_max = ``rollout.max_new_tokens`` and
  L_cache = ``overlong.buffer_frac`` · L_max (0.2 = 4096/20480) unless ``buffer_len`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.algorithm import Algorithm
from harness.batch import RolloutBatch
from harness.groups import group_max, group_min
from harness.registry import register_algorithm, register_rollout
from harness.rollout import RolloutContext, sample_groups
from harness.typed_config import ConfigError

METRICS = ("correct", "rewards")


def informative_groups(batch: RolloutBatch, metric: str) -> list[int]:
    """Ids of the groups whose ``metric`` values are not all equal, in increasing order."""
    batch.require(metric, "group_index", stage="dynamic sampling")
    if len(batch) == 0:
        return []
    values, gi = batch[metric].float(), batch["group_index"]
    G = batch.num_groups
    spread = group_max(values, gi, G) > group_min(values, gi, G)
    return spread.nonzero().flatten().tolist()


@register_rollout("dynamic_sampling")
@dataclass
class DynamicSampling:
    """Over-sample ``data.prompts_per_step`` prompts per round, keep only groups whose ``metric``
    (``correct`` = accuracy, or the shaped ``rewards``) varies, for at most ``max_gen_batches``
    rounds; return exactly ``prompts_per_step`` groups, or fewer if the rounds ran out."""

    max_gen_batches: int = 4
    metric: str = "correct"

    def __post_init__(self) -> None:
        if self.max_gen_batches < 1:
            raise ConfigError(
                f"algorithm.rollout.max_gen_batches must be >= 1, got {self.max_gen_batches}"
            )
        if self.metric not in METRICS:
            raise ConfigError(
                f"algorithm.rollout.metric={self.metric!r}; valid: {', '.join(METRICS)}"
            )

    def __call__(self, ctx: RolloutContext) -> RolloutBatch:
        target = ctx.prompts_per_step
        kept: list[RolloutBatch] = []
        n_kept = n_generated = n_informative = rounds = 0
        while True:
            last = sample_groups(ctx, ctx.draw_prompts(target))
            rounds += 1
            good = informative_groups(last, self.metric)
            n_generated += last.num_groups
            n_informative += len(good)
            take = good[: target - n_kept]
            if take:
                kept.append(last.select_groups(take))
                n_kept += len(take)
            if n_kept >= target or rounds >= self.max_gen_batches:
                break

        ctx.metrics["rollout/gen_batches"] = float(rounds)
        # Share of generated groups that passed the filter (before trimming to the target).
        ctx.metrics["rollout/kept_group_frac"] = n_informative / max(n_generated, 1)
        if not kept:
            return last.select_groups([])  # 0 rows, but every key of a scored batch
        if len(kept) == 1:
            return kept[0]
        # concat re-pads to the kept samples' lengths and offsets the group ids (0..G-1 each).
        return RolloutBatch.concat(kept, ctx.engine.pad_token_id)


@register_algorithm("dapo")
class DAPO(Algorithm):
    r"""DAPO: GRPO advantages; loss 1/Σ|o_i| Σ_{i,t} min(rÂ, clip(r, 1-ε_low, 1+ε_high)Â) with
    ε_low = 0.2, ε_high = 0.28; dynamic sampling keeps only groups with 0 < #correct < G;
    overlong shaping R_len; no KL."""
