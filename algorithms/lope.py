r"""LOPE: Lorem Perturbation for Exploration (Huang et al., *Nonsense Helps: Prompt Space
Perturbation Broadens Reasoning Exploration*, arXiv 2605.05566; official code shrango/LoPE at
b4b58fe9, built on EasyR1; spec §3).

GRPO wastes every prompt whose G rollouts are all wrong: the group has zero variance, so zero
advantage. LOPE resamples exactly those prompts from *perturbed* prompts δ⊕p, where δ is a random
Lorem Ipsum word sequence, and trains on what it finds with the naive prompt p.

Rollout (``lope_resample``, §3.2). For each all-wrong group, ``num_perturbation`` distinct prefixes
δ_1..δ_6, ``rollout_n_per_perturbation`` samples each: G' = 6 × 4 = 24 responses o'. With c of
them correct, min(c, G−1) original wrong responses are replaced by correct o' (chosen at random
when c ≥ G), so at least one original wrong response always stays; c = 0 leaves the group as is.
A replaced row keeps its response tokens and its behaviour log-probs log π_θold(o'|δ⊕p), and is
trained on the naive prompt p (``is_offpolicy``; the perturbed prompt is kept in
``generation_prompt_ids``).

Advantage shaping (``lope`` estimator, ``shaping: true``, §3.3). For a resampled prompt the group
statistics are taken over all G + G' = 32 rewards (the 8 original zeros and the 24 perturbed ones)
and applied to every member of the regrouped group:

    Â_i = (r_i − mean(r_all)) / (std_unbiased(r_all) + ε),   |r_all| = 32;

every other prompt gets plain GRPO within its group.

Policy shaping (``lope_ppo`` loss, ``policy_shaping: true``, §3.4). For replaced rows

    ρ_{i,t} = π_θ(o'_{i,t} | p, o'_{i,<t}) / π_θold(o'_{i,t} | δ⊕p, o'_{i,<t}),
    f(ρ) = ρ / (ρ + γ),  γ = 0.1,      ℓ_{i,t} = −Â_i f(ρ_{i,t})      (no clipping),

log ρ clamped to [−20, 20]; real rows keep the PPO clip (EasyR1: ε_l = 0.2, ε_h = 0.3, dual 3).
df/dlog ρ = γρ/(ρ+γ)², largest (1/4) at ρ = γ: tokens the naive-prompt policy finds unlikely are
up-weighted relative to the raw ratio.

Ablations are configs: ``algorithm.rollout.resample=false`` is GRPO (with LOPE's clip);
``resample`` alone is the paper's "resample"; ``+ loss.policy_shaping``; ``+ advantage.shaping``
(the full method, ``conf/algorithm/lope.yaml``).

Known discrepancies: the README calls the prefix length "100–300 tokens", the code words; its
quick-start command leaves both shaping flags off (§3.5). For the tiny character-level testbed the
prefix is a few random Lorem words (``word_min``/``word_max``), which is what fits the warm-started
model's prompt distribution (conf/sweep/lope_testbed.yaml).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from harness.algorithm import AdvantageEstimator, Aggregator, Algorithm
from harness.batch import RolloutBatch
from harness.compat import BINARY_CORRECT
from harness.groups import group_max, num_groups
from harness.policy_loss import LOG_RATIO_CLAMP, PPOClipLoss, token_advantages
from harness.registry import (
    ADVANTAGES,
    register_advantage,
    register_algorithm,
    register_policy_loss,
    register_rollout,
)
from harness.rollout import RolloutContext, sample_groups
from harness.typed_config import ConfigError, build
from harness.types import Example

# The classic Lorem Ipsum vocabulary (from Cicero's *De finibus* as mangled by typesetters): the
# perturbation is generated locally from these words, never downloaded.
_LOREM_TEXT = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris "
    "nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse "
    "cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui "
    "officia deserunt mollit anim id est laborum curabitur pretium tincidunt lacus nunc pulvinar "
    "sapien egestas integer vitae justo eget magna fermentum iaculis eu posuere morbi tristique "
    "senectus netus malesuada fames ac turpis"
)
LOREM_WORDS = tuple(_LOREM_TEXT.split())
BOXED_TAIL = "Please reason step by step, and put your final answer within \\boxed{}."


def lorem_prefix(rng: random.Random, word_min: int, word_max: int) -> str:
    """A random Lorem Ipsum word sequence of uniform length in [word_min, word_max]."""
    return " ".join(rng.choice(LOREM_WORDS) for _ in range(rng.randint(word_min, word_max)))


def perturb(example: Example, prefix: str, separator: str, tail: str) -> Example:
    """δ⊕p: a text prompt gets ``prefix + tail + separator + prompt``; a chat prompt gets the
    prefix (and tail) as a system message before its messages, as the paper places it."""
    if isinstance(example.prompt, str):
        head = prefix + (("\n" + tail) if tail else "")
        return dataclasses.replace(example, prompt=head + separator + example.prompt)
    system = {"role": "system", "content": prefix + (("\n" + tail) if tail else "")}
    return dataclasses.replace(example, prompt=[system, *example.prompt])


@register_rollout("lope_resample")
@dataclass
class LopeResample:
    """GRPO groups; all-wrong groups are resampled from Lorem-perturbed prompts and regrouped."""

    needs: ClassVar[frozenset[str]] = frozenset({BINARY_CORRECT})  # harness.compat

    resample: bool = True
    num_perturbation: int = 6
    rollout_n_per_perturbation: int = 4
    word_min: int = 100
    word_max: int = 300
    separator: str = "\n"  # between the prefix (+ tail) and a text prompt
    tail: str = ""  # e.g. BOXED_TAIL for math prompts; "" adds nothing
    resample_temperature: float | None = None  # null: the run's rollout temperature

    def __post_init__(self) -> None:
        if self.num_perturbation < 1 or self.rollout_n_per_perturbation < 1:
            raise ConfigError("algorithm.rollout.num_perturbation and rollout_n_per_perturbation "
                              f"must be >= 1, got {self.num_perturbation}/"
                              f"{self.rollout_n_per_perturbation}")
        if not 1 <= self.word_min <= self.word_max:
            raise ConfigError(f"algorithm.rollout.word_min/word_max must satisfy 1 <= min <= max,"
                              f" got {self.word_min}/{self.word_max}")

    def __call__(self, ctx: RolloutContext) -> RolloutBatch:
        batch = sample_groups(ctx, ctx.draw_prompts(ctx.prompts_per_step))
        G = ctx.sampling.n
        wrong = _all_wrong_groups(batch)
        ctx.metrics["lope/all_wrong_groups"] = float(len(wrong))
        if not self.resample or not wrong:
            for key in ("rescued_groups", "replaced_rows", "extra_tokens"):
                ctx.metrics[f"lope/{key}"] = 0.0
            return _with_pool(batch, {})
        tokens_before = ctx.metrics.get("rollout/tokens", 0.0)
        # one random stream for the prefixes and the choice of correct responses: Python's global
        # RNG, which checkpoints save, so a resumed run draws the same prefixes
        rng = random.Random(random.getrandbits(64))
        originals = [batch.trajectories[_rows_of(batch, g)[0]].example for g in wrong]
        perturbed = [perturb(ex, lorem_prefix(rng, self.word_min, self.word_max), self.separator,
                             self.tail)
                     for ex in originals for _ in range(self.num_perturbation)]
        params = dataclasses.replace(ctx.sampling, n=self.rollout_n_per_perturbation)
        if self.resample_temperature is not None:
            params.temperature = self.resample_temperature
        extra = sample_groups(ctx, perturbed, params)
        per_prompt = self.num_perturbation * self.rollout_n_per_perturbation
        trajs = list(batch.trajectories)
        rewards, raw = batch["rewards"].clone(), batch["raw_rewards"].clone()
        pools: dict[int, torch.Tensor] = {}
        rescued = replaced = 0
        for j, g in enumerate(wrong):
            rows = _rows_of(batch, g)
            lo, hi = j * per_prompt, (j + 1) * per_prompt
            pools[g] = torch.cat([batch["rewards"][rows], extra["rewards"][lo:hi]])
            correct = [lo + i for i in range(per_prompt) if bool(extra["correct"][lo + i])]
            if not correct:
                continue
            rescued += 1
            chosen = correct if len(correct) < G else rng.sample(correct, G - 1)
            for row, src in zip(rows, chosen):  # len(rows) = G > len(chosen): one wrong stays
                t = extra.trajectories[src]
                trajs[row] = dataclasses.replace(
                    t, prompt_ids=list(batch.trajectories[row].prompt_ids),
                    generation_prompt_ids=list(t.prompt_ids), is_offpolicy=True,
                    group_id=g, example=batch.trajectories[row].example)
                rewards[row], raw[row] = extra["rewards"][src], extra["raw_rewards"][src]
                replaced += 1
        out = RolloutBatch.from_trajectories(trajs, ctx.engine.pad_token_id)
        out["rewards"], out["raw_rewards"] = rewards, raw
        ctx.metrics["lope/rescued_groups"] = float(rescued)
        ctx.metrics["lope/rescued_frac"] = rescued / len(wrong)
        ctx.metrics["lope/replaced_rows"] = float(replaced)
        ctx.metrics["lope/perturbed_acc"] = float(extra["correct"].float().mean())
        ctx.metrics["lope/extra_tokens"] = ctx.metrics.get("rollout/tokens", 0.0) - tokens_before
        return _with_pool(out, pools)


def _rows_of(batch: RolloutBatch, group: int) -> list[int]:
    return (batch["group_index"] == group).nonzero().flatten().tolist()


def _all_wrong_groups(batch: RolloutBatch) -> list[int]:
    """Groups none of whose samples is correct (the verifier's verdict, not the shaped reward)."""
    if len(batch) == 0:
        return []
    gi = batch["group_index"]
    any_correct = group_max(batch["correct"].float(), gi, num_groups(gi)) > 0
    return (~any_correct).nonzero().flatten().tolist()


def _with_pool(batch: RolloutBatch, pools: dict[int, torch.Tensor]) -> RolloutBatch:
    """Per row, the reward pool its group's advantage statistics are taken over when it is wider
    than the group (count, sum, sum of squares; count 0 = the group itself)."""
    n, s, sq = (torch.zeros(len(batch)) for _ in range(3))
    for g, pool in pools.items():
        rows = batch["group_index"] == g
        n[rows], s[rows], sq[rows] = float(len(pool)), pool.sum(), pool.square().sum()
    batch["reward_pool_n"], batch["reward_pool_sum"], batch["reward_pool_sumsq"] = n, s, sq
    return batch


@register_advantage("lope")
@dataclass
class LopeAdvantage(AdvantageEstimator):
    """GRPO; with ``shaping``, a resampled group's mean and std come from its G + G' pool."""

    shaping: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        # the registered GRPO estimator itself (unbiased std, verl's single-sample rule)
        self.grpo = build(ADVANTAGES, {"name": "grpo", "std_kind": "unbiased", "eps": self.eps},
                          "algorithm.advantage")
        self.last_metrics: dict[str, float] = {}

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        adv = self.grpo(batch)
        pooled = batch["reward_pool_n"] > 1 if "reward_pool_n" in batch else None
        self.last_metrics = {"lope/pooled_groups": 0.0}
        if not self.shaping or pooled is None or not bool(pooled.any()):
            return adv
        n = batch["reward_pool_n"]
        mean = batch["reward_pool_sum"] / n.clamp(min=1)
        var = (batch["reward_pool_sumsq"] - n * mean.square()) / (n - 1).clamp(min=1)
        shaped = (batch["rewards"].float() - mean) / (var.clamp(min=0).sqrt() + self.eps)
        self.last_metrics["lope/pooled_groups"] = float(
            len(set(batch["group_index"][pooled].tolist())))
        return torch.where(pooled, shaped, adv)


@register_policy_loss("lope_ppo")
@dataclass
class LopePolicyShapingLoss(PPOClipLoss):
    """PPO clip on real rows; ``policy_shaping``: −Â·ρ/(ρ+γ), unclipped, on off-policy rows."""

    clip_high: float = 0.3
    policy_shaping: bool = True
    gamma: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gamma <= 0:
            raise ConfigError(f"algorithm.loss.gamma must be > 0, got {self.gamma}")

    def __call__(self, mb: RolloutBatch, logp: torch.Tensor, entropy: torch.Tensor | None,
                 agg: Aggregator) -> tuple[torch.Tensor, dict[str, float]]:
        off = mb["is_offpolicy"]
        if not self.policy_shaping or not bool(off.any()):
            return super().__call__(mb, logp, entropy, agg)
        mask = mb["response_mask"]
        off_mask = mask * off[:, None]
        # real rows: the PPO clip over their tokens, with the mini-batch's normalisers
        real = RolloutBatch({**mb.tensors, "response_mask": mask * (~off)[:, None]},
                            mb.trajectories)
        value, metrics = super().__call__(real, logp, entropy, agg)
        adv = token_advantages(mb["advantages"], logp).detach()
        log_ratio = (logp - mb["old_logprobs"]).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio)
        shaped = ratio / (ratio + self.gamma)
        value = value + agg(-adv * shaped, off_mask)
        metrics["actor/pg_loss"] = float(value.detach().item())
        if "lope_offpolicy_tokens" in mb:  # exact means over the mini-batch's replaced tokens
            tokens = float(mb["lope_offpolicy_tokens"][0].clamp(min=1))
            metrics["lope/f_rho_mean"] = float((shaped.detach() * off_mask).sum()) / tokens
            metrics["lope/rho_mean"] = float((ratio.detach() * off_mask).sum()) / tokens
        return value, metrics


@register_algorithm("lope")
class LOPE(Algorithm):
    r"""LOPE: all-wrong groups resampled from Lorem-perturbed prompts δ⊕p (6 × 4), up to G−1
    correct responses swapped in and trained on p; Â over the 32-reward pool; replaced rows
    trained with −Â·ρ/(ρ+γ), γ = 0.1, unclipped."""

    def prepare_minibatch(self, mb: RolloutBatch, logprob_fn: Any) -> dict[str, float]:
        # the replaced-token count of the whole mini-batch, so that per-micro-batch sums of
        # f(ρ) add up to its mean over the mini-batch
        off_tokens = (mb["response_mask"] * mb["is_offpolicy"][:, None]).sum()
        mb["lope_offpolicy_tokens"] = off_tokens.expand(len(mb)).clone()
        return {}
