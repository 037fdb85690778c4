r"""ARPO: Agentic Reinforced Policy Optimization (Dong et al., arXiv 2507.19849; official code
dongguanting/ARPO at e257337d / a95cd089, ``vllm_rollout_with_tools.py``; spec §6).

Multi-turn tool use makes the model uncertain right after a tool result arrives. ARPO spends part
of each prompt's rollout budget branching there instead of on fresh samples.

Rollout (``entropy_branching``, §6.2). Budget M = ``rollout.n`` trajectories per prompt,
N = ``initial_rollouts`` started from the prompt. Each round every active trajectory generates its
next segment (up to a tool's closing tag or the answer). The entropy of a segment is the top-10
truncated entropy summed over its first ≤ 20 tokens (the code's vLLM ``logprobs=10``),

    H = Σ_{ℓ ≤ 20} −Σ_{v ∈ top10(ℓ)} p_v log p_v ,      ΔH = (H_t − H_initial) / ln |V| ,

with H_initial the trajectory's first segment (a fork's first post-fork segment). Which segment
gates a fork after tool result k (``branch_on``):

* ``call`` (default; the official code): the segment that *made* call k. When it ends in a tool
  call and the result is appended, each candidate copy may fork right after that result (the
  copy re-samples everything that follows it). The first segment is its own baseline, so the
  first call forks at the base rate (ΔH = 0).
* ``result`` (the paper's text, "after each tool call, generate k tokens" and compare): the
  segment generated *after* result k; if it forks, the copy restarts at that same result and
  re-samples the segment. The first call never forks on its own segment's entropy.

``call`` is the default because the paper's results come from the code, and the rest of the
rule (the uniform draw u, ln |V|, the top-10 sum over 20 tokens) already follows the code.
Each of the Z = ``beam_size`` − 1 candidate copies forks with

    u ~ U(0, 1),   fork iff clip(u − βΔH, 0, 1) ≤ τ      (probability clip(τ + βΔH, 0, 1)),

(``fork_rule: arpo``; the paper's deterministic α + βΔH > τ is ``fork_rule: deterministic``),
while the prompt has fewer than M trajectories. A prompt with no active trajectory and fewer than
M gets one new trajectory from the prompt per round (top-up), so every prompt returns exactly M.

AEPO's rollout (spec §7.2) is the same strategy with ``fork_rule: aepo``: fork iff
clip((u + βΔH)·max(0, 1 − λ_pen·l), 0, 1) ≥ τ, with l the prompt's branches so far (top-ups
counted, as in the code read), λ_pen = ``consecutive_penalty``.

Entropy measures. The branching entropy is the engine's top-k truncated one (``entropy_topk``);
it is kept per token as the batch key ``entropy_topk`` (logged as ``rollout/entropy_topk``).
The batch's ``entropy`` — and so ``rollout/entropy``, comparable with every other algorithm's —
is the full-vocabulary entropy of the sampling distribution, recomputed after the rollout by a
no-grad forward of the rollout engine (an engine without ``forward``, vLLM, leaves it to the
trainer, which recomputes it with the train engine).

Advantage (§6.3). Soft attribution (default) is plain GRPO over the M trajectories: every
trajectory holds its own copy of a shared prefix, so the prefix receives Σ_{sharers} Â_i.
Hard attribution (``attribution: hard``): a token shared by d trajectories is trained once, with
the mean advantage (1/d) Σ Â_i of its sharers, and masked on the other copies.

Loss (§6.4): the PPO clip (0.2/0.2, dual 3), token-mean, no KL, tool tokens masked.

Known discrepancies: the code keys H_initial by slot index and never clears it between batches
(stale baselines can carry over); here each trajectory's baseline is its own first segment. A
trajectory whose tool-call budget is spent gets an error message as its result and goes on (the
code appends EOS and ends it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from harness.algorithm import AdvantageEstimator, Algorithm
from harness.batch import RolloutBatch
from harness.compat import TOOLS
from harness.multiturn import TurnState, step_round, tool_metrics
from harness.registry import ADVANTAGES, register_advantage, register_algorithm, register_rollout
from harness.rollout import RolloutContext, full_vocab_entropy, score_groups
from harness.typed_config import ConfigError, build

FORK_RULES = ("arpo", "aepo", "deterministic")
BRANCH_ON = ("call", "result")
ATTRIBUTIONS = ("soft", "hard")


def fork_probability(delta_h: float, beta: float, tau: float) -> float:
    """ARPO's code: P(clip(u − βΔH, 0, 1) ≤ τ) for u ~ U(0, 1) = clip(τ + βΔH, 0, 1)."""
    return min(1.0, max(0.0, tau + beta * delta_h))


def dynamic_root_count(h_root: float, h_tool: float, k: int, beta: float = 0.5) -> int:
    """AEPO's entropy pre-monitoring: m = clip(⌊k σ(β (H_root − H_tool))⌋ + 1, 1, k) root
    samples, the other k − m the branch budget."""
    sigma = 1.0 / (1.0 + math.exp(-beta * (h_root - h_tool)))
    return max(1, min(k, math.floor(k * sigma) + 1))


def should_fork(rule: str, u: float, delta_h: float, beta: float, tau: float, alpha: float,
                branches: int, penalty: float) -> bool:
    """One fork decision. ``u`` is the uniform draw (unused by the deterministic rule)."""
    if rule == "arpo":
        return min(1.0, max(0.0, u - beta * delta_h)) <= tau
    if rule == "aepo":
        p = (u + beta * delta_h) * max(0.0, 1.0 - penalty * branches)
        return min(1.0, max(0.0, p)) >= tau
    return alpha + beta * delta_h > tau  # the paper's rule with a constant alpha


@dataclass
class _Slot:
    state: TurnState
    prompt: int
    initial: float | None = None  # H_initial of this trajectory


@register_rollout("entropy_branching")
@dataclass
class EntropyBranching:
    """M = rollout.n trajectories per prompt: N from the prompt, the rest forked after tool
    calls where the segment entropy rose, topped up from the prompt when a prompt runs dry."""

    needs: ClassVar[frozenset[str]] = frozenset({TOOLS})  # harness.compat

    initial_rollouts: int = 8
    beam_size: int = 2
    entropy_weight: float = 0.2
    branch_probability: float = 0.5
    fork_rule: str = "arpo"
    branch_on: str = "call"  # call: the segment that made the call (code) | result: the next one
    alpha: float = 0.5  # only for fork_rule=deterministic
    consecutive_penalty: float = 0.05  # only for fork_rule=aepo
    entropy_topk: int = 10
    entropy_tokens: int = 20
    dynamic_rollouts: bool = False  # AEPO's entropy pre-monitoring of the root count
    premonitor_beta: float = 0.5  # beta_pm of the pre-monitoring sigmoid

    def __post_init__(self) -> None:
        if self.fork_rule not in FORK_RULES:
            raise ConfigError(f"algorithm.rollout.fork_rule={self.fork_rule!r}; valid: "
                              f"{', '.join(FORK_RULES)}")
        if self.branch_on not in BRANCH_ON:
            raise ConfigError(f"algorithm.rollout.branch_on={self.branch_on!r}; valid: "
                              f"{', '.join(BRANCH_ON)}")
        if self.initial_rollouts < 1 or self.beam_size < 1:
            raise ConfigError("algorithm.rollout.initial_rollouts and beam_size must be >= 1, "
                              f"got {self.initial_rollouts}/{self.beam_size}")

    def __call__(self, ctx: RolloutContext) -> RolloutBatch:
        env = ctx.task.tool_env()
        if env is None:
            raise ConfigError(f"algorithm.rollout.name=entropy_branching needs a multi-turn task "
                              f"(one with tools); task {ctx.task.name!r} has none")
        examples = ctx.draw_prompts(ctx.prompts_per_step)
        M, N = ctx.sampling.n, min(self.initial_rollouts, ctx.sampling.n)
        params = _with(ctx.sampling, entropy_topk=self.entropy_topk)
        ln_v = math.log(max(ctx.engine.vocab_size, 2))  # 0: the engine does not know V
        rng = random.Random(random.getrandbits(64))  # the checkpointed global RNG seeds it
        roots = ([self._premonitor(ctx, ex, params, env, ln_v, M) for ex in examples]
                 if self.dynamic_rollouts else [N] * len(examples))
        slots = [_Slot(TurnState(ctx.engine.encode_prompt(ex)), p)
                 for p, ex in enumerate(examples) for _ in range(roots[p])]
        created, branches = list(roots), [0] * len(examples)
        ctx.metrics["branch/root_samples"] = sum(roots) / max(len(roots), 1)
        deltas: list[float] = []
        forks = topups = 0
        while True:
            stepped = {id(s) for s in step_round(ctx.engine, [s.state for s in slots], params,
                                                 env)}
            if not stepped and all(c >= M for c in created):
                break
            new: list[_Slot] = []
            for i, slot in enumerate(slots):
                if id(slot.state) not in stepped:
                    continue
                at = self._fork_point(slot)
                if at is None:
                    continue
                delta = (self._segment_entropy(slot.state) - slot.initial) / ln_v
                deltas.append(delta)
                for _ in range(self.beam_size - 1):
                    p = slot.prompt
                    if created[p] >= M or not should_fork(
                            self.fork_rule, rng.random(), delta, self.entropy_weight,
                            self.branch_probability, self.alpha, branches[p],
                            self.consecutive_penalty):
                        continue
                    copy = slot.state.fork(at)
                    copy.parent = i
                    new.append(_Slot(copy, p))
                    created[p] += 1
                    branches[p] += 1
                    forks += 1
            for p, ex in enumerate(examples):  # top-up: one fresh trajectory per idle prompt
                idle = not any(s.prompt == p and not s.state.done for s in slots + new)
                if idle and created[p] < M:
                    new.append(_Slot(TurnState(ctx.engine.encode_prompt(ex)), p))
                    created[p] += 1
                    branches[p] += self.fork_rule == "aepo"  # the code counts top-ups too
                    topups += 1
            slots += new
        return self._assemble(ctx, examples, slots, M, N, forks, topups, deltas)

    def _segment_entropy(self, state: TurnState) -> float:
        """H of the segment just generated: the top-k entropy summed over its first tokens."""
        start = state.turn_starts[-1]
        return sum(state.entropy[start : start + self.entropy_tokens])

    def _fork_point(self, slot: _Slot) -> int | None:
        """Where a fork gated by the segment just generated copies up to (None: no decision).
        The first segment of a trajectory sets its baseline H_initial."""
        state = slot.state
        first = slot.initial is None
        if first:
            slot.initial = self._segment_entropy(state)
        if self.branch_on == "call":  # it made a call whose result is in, and it goes on
            made_call = (not state.done and bool(state.tool_calls)
                         and state.tool_calls[-1]["end"] == len(state.response_ids))
            return len(state.response_ids) if made_call else None
        return None if first else state.turn_starts[-1]  # re-sample from the previous result

    def _premonitor(self, ctx: RolloutContext, example: Any, params: Any, env: Any,
                    ln_v: float, k: int) -> int:
        """One tool-using pre-rollout of the prompt: H_root from its first segment, H_tool the
        mean of its later ones (= H_root when it made no tool call), both / ln|V|."""
        state = TurnState(ctx.engine.encode_prompt(example))
        while step_round(ctx.engine, [state], params, env):
            pass
        ctx.metrics["rollout/tokens"] = ctx.metrics.get("rollout/tokens", 0.0) + sum(
            state.loss_mask)
        seg = [sum(state.entropy[a : a + self.entropy_tokens]) / ln_v for a in state.turn_starts]
        h_root = seg[0] if seg else 0.0
        h_tool = sum(seg[1:]) / len(seg[1:]) if len(seg) > 1 else h_root
        return dynamic_root_count(h_root, h_tool, k, self.premonitor_beta)

    def _assemble(self, ctx: RolloutContext, examples: list[Any], slots: list[_Slot], M: int,
                  N: int, forks: int, topups: int, deltas: list[float]) -> RolloutBatch:
        """Prompt-major order; each trajectory's lineage (``branch_parent`` as an index within
        its group, ``branch_shared`` tokens) is kept for hard attribution."""
        trajs, owners, groups = [], [], []
        for p, ex in enumerate(examples):
            mine = [i for i, s in enumerate(slots) if s.prompt == p]
            local = {i: k for k, i in enumerate(mine)}
            for i in mine:
                t = slots[i].state.to_trajectory(ctx.engine.decode)
                t.temperature = ctx.sampling.temperature
                parent = slots[i].state.parent
                t.branch_parent = local.get(parent) if parent is not None else None
                t.branch_shared = slots[i].state.shared_len
                trajs.append(t)
                owners.append(ex)
                groups.append(p)
        for key, value in tool_metrics(trajs).items():
            ctx.metrics[key] = value
        ctx.metrics["branch/forks"] = float(forks)
        ctx.metrics["branch/topups"] = float(topups)
        budget = max(M * len(examples) - int(ctx.metrics["branch/root_samples"]
                                             * len(examples)), 1)
        ctx.metrics["branch/budget_used"] = forks / budget
        ctx.metrics["branch/delta_entropy_mean"] = sum(deltas) / len(deltas) if deltas else 0.0
        batch = score_groups(ctx, trajs, owners, groups)
        # the engine's per-token entropy was the top-k one the branching needs: it gets its own
        # key, and ``entropy`` becomes the full-vocabulary one every other algorithm logs
        if "entropy" in batch:
            batch["entropy_topk"] = batch.tensors.pop("entropy")
        full = full_vocab_entropy(ctx.engine, batch, ctx.sampling.temperature, M)
        if full is not None:
            batch["entropy"] = full
        return batch


def _with(params: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(params, **changes)


def hard_attribution(batch: RolloutBatch, seq_adv: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(token advantages [B, T], response mask [B, T]): every response token is owned by the
    trajectory it was first generated in (follow ``branch_parent`` while the position lies in the
    shared prefix); the owner's copy carries the mean advantage of all trajectories that contain
    it, the other copies are masked out."""
    mask = batch["response_mask"].clone()
    T = mask.shape[1]
    adv = seq_adv[:, None].expand(-1, T).clone()
    gi = batch["group_index"].tolist()
    rows_of: dict[int, list[int]] = {}
    for row, g in enumerate(gi):
        rows_of.setdefault(g, []).append(row)
    for rows in rows_of.values():
        trajs = [batch.trajectories[r] for r in rows]
        if all(t.branch_parent is None for t in trajs):
            continue
        sharers: dict[tuple[int, int], list[int]] = {}
        for k, t in enumerate(trajs):
            for pos in range(len(t.response_ids)):
                owner = k
                while True:
                    parent = trajs[owner].branch_parent
                    if parent is None or pos >= trajs[owner].branch_shared:
                        break
                    owner = parent
                sharers.setdefault((owner, pos), []).append(k)
        for (owner, pos), ks in sharers.items():
            if len(ks) == 1:
                continue
            mean = float(seq_adv[[rows[k] for k in ks]].mean())
            adv[rows[owner], pos] = mean
            for k in ks:
                if k != owner:
                    mask[rows[k], pos] = 0.0
    return adv, mask


@register_advantage("arpo")
@dataclass
class ArpoAdvantage(AdvantageEstimator):
    """GRPO over the M trajectories of a prompt; ``attribution`` says how shared prefixes are
    credited (soft: every copy with its own Â; hard: once, with the sharers' mean)."""

    attribution: str = "soft"
    std_kind: str = "unbiased"
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.attribution not in ATTRIBUTIONS:
            raise ConfigError(f"algorithm.advantage.attribution={self.attribution!r}; valid: "
                              f"{', '.join(ATTRIBUTIONS)}")
        self.grpo = build(ADVANTAGES, {"name": "grpo", "std_kind": self.std_kind,
                                       "eps": self.eps}, "algorithm.advantage")

    def __call__(self, batch: RolloutBatch) -> torch.Tensor:
        return self.grpo(batch)


@register_algorithm("arpo")
class ARPO(Algorithm):
    r"""ARPO: entropy-based branching after tool calls (fork w.p. clip(τ + βΔH, 0, 1), budget
    M with N roots, top-ups); GRPO advantages (soft attribution) or shared tokens once with
    the sharers' mean advantage (hard); PPO clip, token-mean, tool tokens masked."""

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        metrics = super().compute_advantages(batch)
        if isinstance(self.advantage, ArpoAdvantage) and self.advantage.attribution == "hard":
            adv, mask = hard_attribution(batch, batch["advantages"])
            metrics["branch/deduplicated_tokens"] = float(
                (batch["response_mask"] - mask).sum())
            batch["advantages"], batch["response_mask"] = adv, mask
        return metrics
