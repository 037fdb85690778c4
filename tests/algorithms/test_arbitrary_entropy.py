"""Arbitrary-entropy PO (spec §8.6): the temperature rule, positive selection and substitution, the
reduction to GRPO, the side batch's size, and the closed loop on a toy categorical policy."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers arbitrary_entropy)
from algorithms.arbitrary_entropy import choose_temperature, substitution_count
from harness.algorithm import build_algorithm
from harness.engines import RolloutEngine
from harness.rollout import RolloutContext
from harness.task import Task
from harness.typed_config import ConfigError
from harness.types import Example, SamplingParams, Score, Trajectory

CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm" / "arbitrary_entropy.yaml"
V = 20  # toy vocabulary: a response is one token


class CategoricalEngine(RolloutEngine):
    """One-token responses sampled from softmax(θ / T); log-probs at that temperature."""

    pad_token_id = 0

    def __init__(self, theta: torch.Tensor, seed: int) -> None:
        self.theta, self.gen = theta, torch.Generator().manual_seed(seed)
        self.temperatures: list[tuple[float, int]] = []

    def encode_prompt(self, example: Example) -> list[int]:
        return [1]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Trajectory]:
        self.temperatures.append((params.temperature, len(prompts)))
        with torch.no_grad():
            lp = torch.log_softmax(self.theta / params.temperature, -1)
        out = []
        for p in prompts:
            for t in torch.multinomial(lp.exp(), params.n, True, generator=self.gen).tolist():
                out.append(Trajectory(p, [t], logprobs=lp[t : t + 1].clone(), text=str(t)))
        return out


class CoinTask(Task):
    """Every answer is right with probability 1/2, whatever the token: GRPO's expected gradient
    is zero, so only the regulariser moves the entropy."""

    name = "coin"

    def __init__(self, seed: int) -> None:
        super().__init__(None)
        self.rng = random.Random(seed)

    def verify(self, example: Example, response: str) -> Score:
        ok = self.rng.random() < 0.5
        return Score(float(ok), ok, True)


def algorithm(**rollout):
    cfg = OmegaConf.load(CONF)
    cfg.rollout.update(rollout)
    return build_algorithm(cfg, max_new_tokens=1)


def step(algo, engine, task, prompts=16, n=8):
    examples = [Example(id=str(i), prompt="q") for i in range(prompts)]
    ctx = RolloutContext(engine=engine, task=task, draw_prompts=lambda k: examples[:k],
                         prompts_per_step=prompts, sampling=SamplingParams(n=n, max_new_tokens=1))
    batch = algo.rollout(ctx)
    with torch.no_grad():  # pi_old at the training temperature (1.0) for every row, as the trainer
        batch["old_logprobs"] = torch.log_softmax(engine.theta, -1)[batch["responses"]]
    algo.compute_advantages(batch)
    trained, metrics = algo.select_training_rows(batch)
    return batch, trained, {**ctx.metrics, **metrics}


@pytest.mark.parametrize(("proxy", "expected"), [(0.0, 1.2), (0.5, 1.2), (0.75, 1.2), (0.76, 0.8),
                                                 (3.0, 0.8)])
def test_temperature_is_high_iff_the_proxy_is_at_or_below_target(proxy, expected):
    assert choose_temperature(proxy, 0.75, 1.2, 0.8) == expected


def test_first_step_samples_the_side_batch_hot_on_a_quarter_of_the_prompts():
    algo = algorithm(target_entropy=0.75)
    engine = CategoricalEngine(torch.zeros(V), 0)
    step(algo, engine, CoinTask(0), prompts=18)
    assert engine.temperatures == [(1.0, 18), (1.2, 4)]  # floor(18 / 4) prompts, same n


def test_substituted_rows_are_positive_with_advantage_one_and_the_batch_size_is_kept():
    algo = algorithm(target_entropy=10.0)  # below target: s = min(60, #positives)
    engine = CategoricalEngine(torch.zeros(V), 1)
    batch, trained, m = step(algo, engine, CoinTask(1))
    main = int((~batch["side_batch"]).sum())
    positives = batch["side_batch"] & (batch["advantages"] > 0.05)
    s = int(m["aent/substituted"])
    assert len(trained) == main == 128 and s == min(60, int(positives.sum())) and s > 0
    sub = trained["substituted"]
    assert int(sub.sum()) == s and bool(trained["side_batch"][sub].all())
    assert torch.equal(trained["advantages"][sub], torch.ones(s))
    assert torch.equal(trained["rewards"][sub], torch.ones(s))
    # the rest are main rows s.. in order, advantages untouched
    main_rows = (~batch["side_batch"]).nonzero().flatten()[s:]
    assert torch.equal(trained["advantages"][~sub], batch["advantages"][main_rows])


def test_above_target_the_substitution_count_is_halved():
    assert substitution_count(100, False, 60) == 60 and substitution_count(100, True, 60) == 30
    assert substitution_count(7, True, 60) == 3 and substitution_count(0, False, 60) == 0
    algo = algorithm(target_entropy=0.1)
    algo.rollout.entropy_proxy = 3.0  # above target: T_low and half the rows
    engine = CategoricalEngine(torch.zeros(V), 2)
    batch, _, m = step(algo, engine, CoinTask(2))
    assert engine.temperatures[-1][0] == 0.8
    positives = int((batch["side_batch"] & (batch["advantages"] > 0.05)).sum())
    assert m["aent/substituted"] == min(60, positives) // 2 <= 30


def test_no_positive_side_sample_reduces_the_step_to_grpo():
    algo = algorithm()
    engine = CategoricalEngine(torch.zeros(V), 3)

    class Never(Task):
        name = "never"

        def verify(self, example: Example, response: str) -> Score:
            return Score(0.0, False, True)

    batch, trained, m = step(algo, engine, Never(None))
    assert m["aent/substituted"] == 0
    main = ~batch["side_batch"]
    assert torch.equal(trained["responses"], batch["responses"][main])
    assert torch.equal(trained["advantages"], batch["advantages"][main])
    assert not bool(trained["side_batch"].any())


def test_proxy_is_the_trained_tokens_nll_and_survives_a_checkpoint():
    algo = algorithm()
    engine = CategoricalEngine(torch.zeros(V), 4)
    _, trained, m = step(algo, engine, CoinTask(4))
    expected = float(-trained["old_logprobs"].mean())
    assert m["aent/next_entropy_proxy"] == pytest.approx(expected)
    assert expected == pytest.approx(torch.log(torch.tensor(float(V))).item(), rel=1e-5)
    restored = algorithm()
    restored.load_state_dict(algo.state_dict())
    assert restored.rollout.entropy_proxy == algo.rollout.entropy_proxy


def test_controller_reads_the_proxy_from_the_rows_being_trained():
    """The next temperature is chosen from −mean log π_old over the trained batch: the s
    substituted side positives and the main rows they did not replace — not the side rows left
    out, nor the replaced main rows."""
    from harness.batch import RolloutBatch

    algo = algorithm()
    side = torch.tensor([False] * 6 + [True] * 4)
    adv = torch.tensor([0.5, -0.5, 0.5, -0.5, 0.5, -0.5, 1.0, -1.0, 1.0, -1.0])
    # main rows: -1 per token, side rows: -3; two tokens on main rows, one on side rows
    old = torch.tensor([[-1.0, -1.0]] * 6 + [[-3.0, 0.0]] * 4)
    mask = torch.tensor([[1.0, 1.0]] * 6 + [[1.0, 0.0]] * 4)
    old[0], old[1] = torch.tensor([-7.0, -7.0]), torch.tensor([-7.0, -7.0])  # replaced rows
    batch = RolloutBatch({"side_batch": side, "advantages": adv, "old_logprobs": old,
                          "response_mask": mask}, [None] * 10)
    trained, m = algo.select_training_rows(batch)
    assert m["aent/substituted"] == 2.0 and bool(trained["substituted"][:2].all())
    # trained: two positives (1 token at -3 each) + main rows 2..5 (2 tokens at -1 each)
    expected = (2 * 3.0 + 8 * 1.0) / 10
    assert algo.rollout.entropy_proxy == pytest.approx(expected)
    assert m["aent/next_entropy_proxy"] == pytest.approx(expected)


def entropy_run(target: float, seed: int, steps: int = 120) -> tuple[float, float]:
    torch.manual_seed(seed)
    theta = torch.nn.Parameter(torch.randn(V) * 1.5)
    opt = torch.optim.SGD([theta], lr=1.0)
    algo, engine, task = algorithm(target_entropy=target), CategoricalEngine(theta, seed), \
        CoinTask(seed)

    def entropy() -> float:
        p = torch.softmax(theta.detach(), -1)
        return float(-(p * p.log()).sum())

    start, late = entropy(), []
    for i in range(steps):
        _, trained, _ = step(algo, engine, task)
        logp = torch.log_softmax(theta, -1)[trained["responses"]]
        loss, _ = algo.loss(trained, logp, None, algo.aggregator(trained))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= steps - 20:
            late.append(entropy())
    return start, sum(late) / len(late)


@pytest.mark.slow
def test_closed_loop_entropy_moves_towards_each_target():
    """Sign test on two targets around the start (≈ 2.2 nats): above it the entropy rises, below
    it falls, for every seed."""
    for seed in range(3):
        start, high = entropy_run(2.6, seed)
        start_low, low = entropy_run(1.2, seed)
        assert start == start_low
        assert high > start and low < start and high > low, (seed, start, high, low)


def test_the_bundle_needs_its_side_batch_strategy():
    cfg = OmegaConf.load(CONF)
    cfg.rollout = {"name": "group"}
    with pytest.raises(ConfigError, match="temperature_side_batch"):
        build_algorithm(cfg, max_new_tokens=1)
    with pytest.raises(ConfigError, match="side_fraction"):
        algorithm(side_fraction=0.0)
