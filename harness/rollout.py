"""Rollout strategies: how an algorithm turns prompts into a scored ``RolloutBatch``.

A strategy is a dataclass registered with ``@register_rollout(name)``; its fields are the knobs
under ``algorithm.rollout`` and calling it with a :class:`RolloutContext` returns the batch. The
default, ``group``, draws ``data.prompts_per_step`` prompts and samples ``rollout.n`` i.i.d.
responses for each (the GRPO group). :func:`sample_groups` is the shared generate -> verify ->
shape pipeline that other strategies (dynamic sampling, resampling, branching) build on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from harness.batch import RolloutBatch
from harness.multiturn import generate_multiturn, tool_metrics
from harness.registry import register_rollout
from harness.task import Task
from harness.types import Example, SamplingParams, Trajectory


class RolloutEngine(Protocol):
    pad_token_id: int

    def encode_prompt(self, example: Example) -> list[int]: ...

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Trajectory]:
        """``params.n`` samples for each prompt, prompt-major order, ``text`` decoded."""
        ...


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
    batch = RolloutBatch.from_trajectories(trajs, ctx.engine.pad_token_id)
    ctx.shape_rewards(batch)
    ctx.add_time("reward", time.perf_counter() - t0)
    return batch


@register_rollout("group")
@dataclass
class GroupRollout:
    """G = ``rollout.n`` i.i.d. samples for each of ``data.prompts_per_step`` prompts."""

    def __call__(self, ctx: RolloutContext) -> RolloutBatch:
        return sample_groups(ctx, ctx.draw_prompts(ctx.prompts_per_step))
