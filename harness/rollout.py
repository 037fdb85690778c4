"""Rollout strategies: how an algorithm turns prompts into a scored ``RolloutBatch``.

A strategy is a dataclass registered with ``@register_rollout(name)``; its fields are the knobs
under ``algorithm.rollout`` and calling it with a :class:`RolloutContext` returns the batch. The
default, ``group``, draws ``data.prompts_per_step`` prompts and samples ``rollout.n`` i.i.d.
responses for each (the GRPO group). :func:`sample_groups` is the shared generate -> verify ->
shape pipeline that other strategies (dynamic sampling, resampling, branching) build on.
:class:`PromptSampler` is where prompts come from; :func:`rollout_metrics` summarises a batch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.batch import RolloutBatch
from harness.engines import RolloutEngine
from harness.multiturn import generate_multiturn, tool_metrics
from harness.registry import register_rollout
from harness.task import Task
from harness.types import Example, SamplingParams, Score, Trajectory


@dataclass
class RolloutContext:
    engine: RolloutEngine
    task: Task
    draw_prompts: Callable[[int], list[Example]]
    prompts_per_step: int
    sampling: SamplingParams
    shape_rewards: Callable[[RolloutBatch], None] = lambda batch: None
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    # sums of the verifiers' per-sample ``Score.info["stats"]`` over every scored trajectory
    stat_sums: dict[str, float] = field(default_factory=dict)
    scored: int = 0

    def add_time(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds


def sample_groups(ctx: RolloutContext, examples: list[Example],
                  sampling: SamplingParams | None = None) -> RolloutBatch:
    """Generate ``sampling.n`` responses per example (default: the run's sampling parameters),
    verify them, shape rewards. Each trajectory records the temperature it was sampled at."""
    sampling = sampling or ctx.sampling
    t0 = time.perf_counter()
    env = ctx.task.tool_env()
    if env is not None:  # multi-turn task: segments, tool calls, masked tool results
        trajs = generate_multiturn(ctx.engine, examples, sampling, env)
        for key, value in tool_metrics(trajs).items():
            ctx.metrics[key] = ctx.metrics.get(key, 0.0) + value
    else:
        prompt_ids = [ctx.engine.encode_prompt(ex) for ex in examples]
        trajs = ctx.engine.generate(prompt_ids, sampling)
    for traj in trajs:
        traj.temperature = sampling.temperature
    ctx.add_time("gen", time.perf_counter() - t0)
    n = sampling.n
    return score_groups(ctx, trajs, [examples[i // n] for i in range(len(trajs))],
                        [i // n for i in range(len(trajs))])


def score_groups(ctx: RolloutContext, trajs: list[Trajectory], owners: list[Example],
                 group_ids: list[int]) -> RolloutBatch:
    """Verify generated trajectories against their examples, batch them, shape rewards."""
    # every generated token counts toward the budget, including groups a strategy discards;
    # tool-result tokens were not generated
    generated = float(sum(len(t.response_ids) if t.loss_mask is None else sum(t.loss_mask)
                          for t in trajs))
    ctx.metrics["rollout/tokens"] = ctx.metrics.get("rollout/tokens", 0.0) + generated
    t0 = time.perf_counter()
    scores = ctx.task.verify_batch(owners, [t.text for t in trajs])
    for traj, score, owner, g in zip(trajs, scores, owners, group_ids, strict=True):
        traj.example, traj.score, traj.group_id = owner, score, g
    _log_verifier_stats(ctx, scores)
    batch = RolloutBatch.from_trajectories(trajs, ctx.engine.pad_token_id)
    ctx.shape_rewards(batch)
    ctx.add_time("reward", time.perf_counter() - t0)
    return batch


def _log_verifier_stats(ctx: RolloutContext, scores: list[Score]) -> None:
    """``rollout/<stat>``: the mean of each verifier stat (answer-extraction method, grading
    timeouts, EM/F1, tool calls, ...) over every trajectory scored this step, discarded groups
    included, as ``eval/<set>/<stat>`` is over an eval set."""
    ctx.scored += len(scores)
    for score in scores:
        for key, value in score.info.get("stats", {}).items():
            ctx.stat_sums[key] = ctx.stat_sums.get(key, 0.0) + float(value)
    for key, total in ctx.stat_sums.items():
        ctx.metrics[f"rollout/{key}"] = total / max(ctx.scored, 1)


@register_rollout("group")
@dataclass
class GroupRollout:
    """G = ``rollout.n`` i.i.d. samples for each of ``data.prompts_per_step`` prompts."""

    def __call__(self, ctx: RolloutContext) -> RolloutBatch:
        return sample_groups(ctx, ctx.draw_prompts(ctx.prompts_per_step))


class PromptSampler:
    """Shuffled passes over the training pool; the order of pass ``e`` depends only on
    (seed, e), so (epoch, position) is the whole state a checkpoint needs."""

    def __init__(self, examples: list[Example], seed: int) -> None:
        if not examples:
            raise ValueError("the task's training pool is empty")
        self.examples, self.seed = examples, seed
        self.epoch, self.position = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def draw(self, k: int) -> list[Example]:
        out = []
        for _ in range(k):
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            out.append(self.examples[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffled(self.epoch)


@torch.no_grad()
def full_vocab_entropy(engine: RolloutEngine, batch: RolloutBatch, temperature: float,
                       chunk: int) -> torch.Tensor | None:
    """The full-vocabulary entropy [B, T] of the sampling distribution at ``temperature`` on every
    response token, from a no-grad forward of ``engine`` in chunks of ``chunk`` rows; None when the
    engine cannot score (``can_forward`` False, vLLM: the trainer recomputes it with the train
    engine). A strategy
    that sampled with a truncated entropy (``SamplingParams.entropy_topk``) uses it to keep
    ``rollout/entropy`` the same quantity for every algorithm."""
    if not engine.can_forward or len(batch) == 0:
        return None
    scorer: Any = engine  # a rollout engine that can forward is a train engine too
    parts = [scorer.forward(mb, temperature, with_entropy=True)[1].float().cpu()
             for mb in batch.split(max(chunk, 1))]
    return torch.cat(parts) * batch["response_mask"]


def on_policy_rows(batch: RolloutBatch, train_temperature: float) -> torch.Tensor:
    """Bool [B]: rows sampled from pi_theta itself on their training prompt at the training
    temperature (not LOPE's perturbed-prompt rows, not arbitrary-entropy's side batch)."""
    t = batch["sampling_temperature"]
    return ~batch["is_offpolicy"] & ((t == train_temperature) | t.isnan())


def rollout_metrics(batch: RolloutBatch, train_temperature: float = 1.0) -> dict[str, float]:
    if len(batch) == 0:
        return {"rollout/samples": 0.0}
    rewards, mask = batch["rewards"], batch["response_mask"]
    lengths = batch.response_lengths()
    groups = batch["group_index"]
    g = batch.num_groups
    lo = torch.full((g,), float("inf")).scatter_reduce(0, groups, rewards, "amin")
    hi = torch.full((g,), float("-inf")).scatter_reduce(0, groups, rewards, "amax")
    out = {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "rollout/acc": float(batch["correct"].float().mean()),
        "rollout/zero_var_group_frac": float((hi - lo == 0).float().mean()),
        "rollout/parse_fail_rate": float((~batch["parsed"]).float().mean()),
        "rollout/response_len_mean": float(lengths.mean()),
        "rollout/response_len_max": float(lengths.max()),
        "rollout/truncation_rate": float(batch["truncated"].float().mean()),
        "rollout/samples": float(len(batch)),
    }
    # the policy's own entropy: rows sampled from another prompt or temperature measure a
    # different distribution. ``entropy`` is always the full-vocabulary entropy; a strategy's
    # top-k truncated one (ARPO/AEPO branching) is ``entropy_topk``, another quantity
    m = mask * on_policy_rows(batch, train_temperature)[:, None]
    for key, name in (("entropy", "rollout/entropy"), ("entropy_topk", "rollout/entropy_topk")):
        if key in batch:
            out[name] = float((batch[key] * m).sum() / m.sum().clamp(min=1))
    if "old_logprobs" in batch:
        own = on_policy_rows(batch, train_temperature)[:, None]
        diff = (batch["old_logprobs"] - batch["rollout_logprobs"]).abs() * mask * own
        out["rollout/logprob_diff_max"] = float(diff.max())
    return out
