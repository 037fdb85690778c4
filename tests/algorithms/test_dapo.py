"""DAPO: dynamic sampling (spec §9.7 item 5), ``RolloutBatch.select_groups`` and overlong shaping,
with a fake engine and task whose outcomes the test controls."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers dapo and dynamic_sampling)
from algorithms.dapo import DynamicSampling
from harness.algorithm import build_algorithm, overlong_penalty
from harness.batch import RolloutBatch
from harness.engines import RolloutEngine
from harness.registry import ROLLOUTS
from harness.rollout import RolloutContext
from harness.typed_config import ConfigError, build
from harness.types import Example, SamplingParams, Score, Trajectory
from tests.helpers import right_wrong_task

N = 4  # samples per prompt
CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm" / "dapo.yaml"


class FakeEngine(RolloutEngine):
    """Sample k of prompt ``ex`` answers ``ex.meta["outcomes"][k]`` = (text, response length)."""

    pad_token_id = 0

    def __init__(self) -> None:
        self.examples: dict[int, Example] = {}
        self.generate_calls = 0

    def encode_prompt(self, example: Example) -> list[int]:
        self.examples[int(example.id)] = example
        return [1, 1000 + int(example.id)]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Trajectory]:
        self.generate_calls += 1
        out = []
        for p in prompts:
            outcomes = self.examples[p[-1] - 1000].meta["outcomes"]
            for k in range(params.n):
                text, length = outcomes[k]
                reason = "length" if length >= params.max_new_tokens else "stop"
                out.append(Trajectory(p, [7] * length, text=text, finish_reason=reason))
        return out


def example(i: int, pattern: str, lengths: list[int] | None = None) -> Example:
    """``pattern`` like "RWWR": R = right, W = wrong, one letter per sample."""
    lengths = lengths or [3] * len(pattern)
    answers = ["right" if c == "R" else "wrong" for c in pattern]
    outcomes = list(zip(answers, lengths, strict=True))
    return Example(id=str(i), prompt=f"q{i}", meta={"outcomes": outcomes, "pattern": pattern})


def context(examples: list[Example], prompts_per_step: int, shape=None, max_new_tokens=10):
    pool = iter(examples)
    ctx = RolloutContext(
        engine=FakeEngine(),
        task=right_wrong_task(),
        draw_prompts=lambda k: [next(pool) for _ in range(k)],
        prompts_per_step=prompts_per_step,
        sampling=SamplingParams(n=N, max_new_tokens=max_new_tokens),
    )
    if shape is not None:
        ctx.shape_rewards = shape
    return ctx


def groups_of(batch: RolloutBatch, key: str = "correct") -> dict[int, list]:
    out: dict[int, list] = {}
    for g, v in zip(batch["group_index"].tolist(), batch[key].tolist(), strict=True):
        out.setdefault(g, []).append(v)
    return out


def patterns_of(batch: RolloutBatch) -> list[str]:
    seen: dict[int, str] = {}
    for t in batch.trajectories:
        seen.setdefault(t.group_id, t.example.meta["pattern"])
    return [seen[g] for g in sorted(seen)]


# -- dynamic sampling -----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_dynamic_sampling_never_emits_a_group_with_all_equal_accuracy(seed):
    rng = random.Random(seed)
    pool = [example(i, "".join(rng.choice("RWWW") for _ in range(N))) for i in range(400)]
    ctx = context(pool, prompts_per_step=6)
    batch = DynamicSampling(max_gen_batches=8)(ctx)
    groups = groups_of(batch)
    assert sorted(groups) == list(range(len(groups)))  # renumbered 0..G-1
    for g, vals in groups.items():
        assert len(vals) == N and 0 < sum(vals) < N, g
    assert batch.num_groups == 6 or ctx.metrics["rollout/gen_batches"] == 8


def test_dynamic_sampling_keeps_the_first_informative_groups_and_trims_to_the_target():
    rounds = ["RRRR", "RWWW", "WWWW", "WRWW"] + ["WWWW", "RRWW", "RRRR", "WWWR"] + ["RWRW"] * 4
    ctx = context([example(i, p) for i, p in enumerate(rounds)], prompts_per_step=4)
    batch = DynamicSampling(max_gen_batches=4)(ctx)
    # Round 1 keeps 2 groups, round 2 has 2 informative groups: exactly 4 groups, no round 3.
    assert patterns_of(batch) == ["RWWW", "WRWW", "RRWW", "WWWR"]
    assert len(batch) == 4 * N and batch.num_groups == 4
    assert ctx.engine.generate_calls == 2
    assert ctx.metrics["rollout/gen_batches"] == 2.0
    assert ctx.metrics["rollout/kept_group_frac"] == pytest.approx(4 / 8)
    assert [t.group_id for t in batch.trajectories] == batch["group_index"].tolist()


def test_dynamic_sampling_trims_extra_informative_groups_of_the_last_round():
    rounds = ["RRRR", "RWWW", "WWWW", "WWWW", "RWWW", "WRWW", "WWRW", "WWWR"]  # 2 rounds of 4
    ctx = context([example(i, p) for i, p in enumerate(rounds)], prompts_per_step=4)
    batch = DynamicSampling()(ctx)
    assert patterns_of(batch) == ["RWWW", "RWWW", "WRWW", "WWRW"]
    assert ctx.metrics["rollout/kept_group_frac"] == pytest.approx(5 / 8)


def test_dynamic_sampling_returns_what_it_kept_after_max_gen_batches():
    rounds = ["RRRR", "RWWW", "WWWW", "WWWW", "WWWW", "WWWW", "RRRR", "RRRR", "RRWW"]
    ctx = context([example(i, p) for i, p in enumerate(rounds)], prompts_per_step=3)
    batch = DynamicSampling(max_gen_batches=3)(ctx)
    assert patterns_of(batch) == ["RWWW", "RRWW"]
    assert ctx.metrics["rollout/gen_batches"] == 3.0
    assert ctx.metrics["rollout/kept_group_frac"] == pytest.approx(2 / 9)


def test_dynamic_sampling_with_no_informative_group_returns_an_empty_batch():
    ctx = context([example(i, "RRRR" if i % 2 else "WWWW") for i in range(20)], prompts_per_step=2)
    batch = DynamicSampling(max_gen_batches=4)(ctx)
    assert len(batch) == 0 and batch.num_groups == 0
    assert {"rewards", "correct", "response_mask", "group_index"} <= set(batch.tensors)
    assert ctx.metrics["rollout/gen_batches"] == 4.0
    assert ctx.metrics["rollout/kept_group_frac"] == 0.0


def test_dynamic_sampling_on_shaped_rewards_keeps_all_correct_groups_of_different_lengths():
    algo = build_algorithm(OmegaConf.load(CONF), max_new_tokens=10)
    pool = [example(0, "RRRR", [3, 3, 9, 10]), example(1, "RRRR", [3] * 4)] * 2
    for metric, kept in (("rewards", 1), ("correct", 0)):
        ctx = context(pool[:], prompts_per_step=2, shape=algo.shape_rewards)
        batch = DynamicSampling(max_gen_batches=1, metric=metric)(ctx)
        assert batch.num_groups == kept, metric


def test_dapo_filters_groups_on_accuracy_not_on_the_shaped_reward():
    """The paper's constraint is 0 < |{o_i correct}| < G: an all-correct group whose shaped
    rewards differ (overlong penalty) carries no accuracy signal and is dropped, by the bundle's
    yaml and by the strategy's default alike."""
    algo = build_algorithm(OmegaConf.load(CONF), max_new_tokens=10)
    for strategy in (algo.rollout, DynamicSampling()):
        pool = [example(0, "RRRR", [3, 3, 9, 10]), example(1, "RWWW", [3] * 4)]
        ctx = context(pool, prompts_per_step=1, shape=algo.shape_rewards)
        batch = strategy(ctx)
        assert patterns_of(batch) == ["RWWW"]
        assert ctx.metrics["rollout/gen_batches"] == 2.0  # the RRRR round was discarded


def test_dapo_bundle_rollout_gives_shaped_rewards_and_no_zero_advantage_group():
    algo = build_algorithm(OmegaConf.load(CONF), max_new_tokens=10)
    assert isinstance(algo.rollout, DynamicSampling)
    patterns = ["RRRR", "RWRW", "WWWW", "WRRR"] * 3
    pool = [example(i, p, [2, 9, 10, 4]) for i, p in enumerate(patterns)]
    ctx = context(pool, prompts_per_step=2, shape=algo.shape_rewards)
    batch = algo.rollout(ctx)
    assert batch.num_groups == 2
    # L_max = 10, L_cache = 2: lengths 2, 9, 10, 4 -> penalties 0, -0.5, -1, 0.
    penalty = torch.tensor([0.0, -0.5, -1.0, 0.0]).repeat(2)
    assert torch.allclose(batch["rewards"], batch["raw_rewards"] + penalty)
    algo.compute_advantages(batch)
    for g, vals in groups_of(batch, "advantages").items():
        assert any(abs(v) > 0 for v in vals), g


def test_dynamic_sampling_rejects_bad_knobs():
    with pytest.raises(ConfigError, match=r"algorithm\.rollout\.metric"):
        build(ROLLOUTS, {"name": "dynamic_sampling", "metric": "accuracy"}, "algorithm.rollout")
    with pytest.raises(ConfigError, match="max_gen_batches"):
        build(ROLLOUTS, {"name": "dynamic_sampling", "max_gen_batches": 0}, "algorithm.rollout")


# -- select_groups --------------------------------------------------------------------------------
def scored(rewards, groups, lengths) -> RolloutBatch:
    trajs = [
        Trajectory([1] * (1 + g), [7] * n, group_id=g, score=Score(float(r), r > 0, True))
        for r, g, n in zip(rewards, groups, lengths, strict=True)
    ]
    return RolloutBatch.from_trajectories(trajs, pad_id=0)


def test_select_groups_keeps_whole_groups_in_the_given_order_and_renumbers_them():
    batch = scored([1, 0, 1, 0, 1, 1], [2, 0, 1, 2, 0, 1], [1, 2, 3, 4, 5, 6])
    batch["rewards"] = batch["rewards"] - 0.25  # shaped rewards must survive the selection
    out = batch.select_groups([2, 0])
    assert out["group_index"].tolist() == [0, 0, 1, 1]
    assert out["response_mask"].sum(-1).tolist() == [1, 4, 2, 5]
    assert out["rewards"].tolist() == [0.75, -0.25, -0.25, 0.75]
    assert [t.group_id for t in out.trajectories] == [0, 0, 1, 1]
    assert [t.group_id for t in batch.trajectories] == [2, 0, 1, 2, 0, 1]  # originals untouched
    assert batch["group_index"].tolist() == [2, 0, 1, 2, 0, 1]


def test_select_groups_with_an_empty_selection_keeps_every_key():
    batch = scored([1, 0], [0, 0], [2, 3])
    out = batch.select_groups([])
    assert len(out) == 0 and out.num_groups == 0
    assert set(out.tensors) == set(batch.tensors)


def test_select_groups_rejects_unknown_or_repeated_groups():
    batch = scored([1, 0], [0, 1], [2, 3])
    with pytest.raises(ValueError):
        batch.select_groups([2])
    with pytest.raises(ValueError):
        batch.select_groups([1, 1])


def test_from_trajectories_accepts_an_empty_list():
    batch = RolloutBatch.from_trajectories([], pad_id=0)
    assert len(batch) == 0 and batch.num_groups == 0
    assert batch["response_mask"].shape == (0, 1)


# -- overlong shaping -----------------------------------------------------------------------------
def test_overlong_penalty_is_continuous_at_the_buffer_start_and_minus_one_at_l_max():
    L_max, L_cache = 20, 4
    start = L_max - L_cache

    def pen(x: float) -> float:
        return overlong_penalty(torch.tensor([x]), L_max, L_cache, 1.0).item()

    assert pen(0) == 0.0 and pen(start - 1) == 0.0 and pen(start) == 0.0
    assert pen(start + 1e-3) == pytest.approx(-1e-3 / L_cache, abs=1e-6)  # no jump
    assert pen(start + L_cache / 2) == pytest.approx(-0.5)
    assert pen(L_max) == pytest.approx(-1.0)
    assert pen(L_max + 5) == pytest.approx(-1.0)
    lengths = torch.arange(0, L_max + 1, dtype=torch.float32)
    steps = overlong_penalty(lengths, L_max, L_cache, 1.0).diff()
    assert steps.max() <= 0 and steps.min() >= -1 / L_cache - 1e-6  # monotone, bounded slope


def test_overlong_penalty_scales_with_the_penalty_knob():
    assert overlong_penalty(torch.tensor([20.0]), 20, 4, 0.5).item() == pytest.approx(-0.5)
