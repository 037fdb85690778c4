"""ARPO (spec §6.7): the fork rule and its probability, the per-prompt budget, shared prefixes,
soft and hard attribution, and the reduction to i.i.d. sampling; with a scripted tool-using
engine whose segment entropies the test controls."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers arpo)
from algorithms.arpo import EntropyBranching, fork_probability, hard_attribution, should_fork
from harness.algorithm import build_algorithm
from harness.engines import RolloutEngine
from harness.rollout import RolloutContext
from harness.task import Task
from harness.tools import ToolEnv
from harness.typed_config import ConfigError
from harness.types import Example, SamplingParams, Score, Trajectory

CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm" / "arpo.yaml"
CHARS = "<>/searchanswerult 0123456789xy"


class ToolEngine(RolloutEngine):
    """Char-level ids. A trajectory searches ``hops`` times, then answers; segment k (k = number
    of tool results in its prefix) is sampled with per-token entropy ``entropy(k)``; the answer
    is "1" or "0" at random (seeded), so groups have reward variance."""

    pad_token_id = 0
    vocab_size = 100

    def __init__(self, hops: int, entropy, seed: int = 0) -> None:
        self.hops, self.entropy, self.rng = hops, entropy, random.Random(seed)

    def encode_prompt(self, example: Example) -> list[int]:
        return [1, 2]

    def encode_text(self, text: str) -> list[int]:
        return [10 + CHARS.index(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(CHARS[i - 10] for i in ids if i >= 10)

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 generator=None) -> list[Trajectory]:
        out = []
        for p in prompts:
            k = self.decode(p).count("</result>")
            text = ("<search>x</search>" if k < self.hops
                    else f"<answer>{self.rng.choice('01')}</answer>")
            ids = self.encode_text(text)
            stop = next((s for s in params.stop if text.endswith(s)), None)
            out.append(Trajectory(p, ids, logprobs=torch.full((len(ids),), -0.3),
                                  entropy=torch.full((len(ids),), float(self.entropy(k))),
                                  text=text, stop_string=stop))
        return out


class LookupTask(Task):
    name = "lookup"

    def tool_env(self) -> ToolEnv:
        return ToolEnv(tools={"search": lambda q: "y"}, max_calls=5, max_total_tokens=500)

    def verify(self, example: Example, response: str) -> Score:
        ok = response.endswith("<answer>1</answer>")
        return Score(float(ok), ok, True)


def rollout(M=8, prompts=3, hops=2, entropy=lambda k: 0.5 * k, seed=0, **knobs):
    examples = [Example(str(i), "q") for i in range(prompts)]
    ctx = RolloutContext(engine=ToolEngine(hops, entropy, seed), task=LookupTask(None),
                         draw_prompts=lambda n: examples[:n], prompts_per_step=prompts,
                         sampling=SamplingParams(n=M, max_new_tokens=40))
    random.seed(seed)
    return EntropyBranching(**{"initial_rollouts": 4, **knobs})(ctx), ctx


def test_with_beta_zero_the_fork_rate_is_tau_whatever_the_entropy():
    rng = random.Random(0)
    for delta in (-3.0, 0.0, 2.0):
        rate = sum(should_fork("arpo", rng.random(), delta, 0.0, 0.3, 0.5, 0, 0.0)
                   for _ in range(20000)) / 20000
        assert rate == pytest.approx(0.3, abs=0.015)


def test_fork_probability_is_monotone_and_saturates():
    beta, tau = 0.2, 0.5
    deltas = [x / 10 for x in range(-40, 41)]
    probs = [fork_probability(d, beta, tau) for d in deltas]
    assert probs == sorted(probs)
    assert fork_probability((1 - tau) / beta, beta, tau) == 1.0
    assert fork_probability(-tau / beta, beta, tau) == 0.0
    rng = random.Random(1)
    always = all(should_fork("arpo", rng.random(), (1 - tau) / beta, beta, tau, 0.5, 0, 0)
                 for _ in range(2000))
    never = not any(should_fork("arpo", rng.random(), -tau / beta - 1e-9, beta, tau, 0.5, 0, 0)
                    for _ in range(2000))
    assert always and never


def test_aepo_penalty_makes_forking_non_increasing_in_branches_and_zero_from_twenty():
    rng = random.Random(2)
    rates = []
    for branches in (0, 5, 10, 20, 30):
        rates.append(sum(should_fork("aepo", rng.random(), 1.0, 0.2, 0.5, 0.5, branches, 0.05)
                         for _ in range(5000)) / 5000)
    assert rates == sorted(rates, reverse=True) and rates[3] == rates[4] == 0.0


def test_every_prompt_gets_exactly_m_trajectories_and_forks_happen():
    batch, ctx = rollout(M=8, prompts=3)
    counts = torch.bincount(batch["group_index"]).tolist()
    assert counts == [8, 8, 8]
    assert ctx.metrics["branch/forks"] > 0
    assert ctx.metrics["branch/forks"] + ctx.metrics["branch/topups"] == 3 * (8 - 4)


def test_forks_share_the_exact_prefix_of_their_source_and_tool_tokens_are_masked():
    batch, _ = rollout(M=8, prompts=2)
    forked = 0
    for row, t in enumerate(batch.trajectories):
        group = (batch["group_index"] == batch["group_index"][row]).nonzero().flatten().tolist()
        if t.branch_parent is not None:
            forked += 1
            src = batch.trajectories[group[t.branch_parent]]
            assert t.branch_shared > 0
            assert t.response_ids[: t.branch_shared] == src.response_ids[: t.branch_shared]
            assert t.text[: len("<search>x</search><result>y</result>")] == \
                "<search>x</search><result>y</result>"
        mask = t.loss_mask
        for call in t.tool_calls:  # the result tokens are exactly the masked ones
            assert mask[call["start"] : call["end"]] == [0] * (call["end"] - call["start"])
        assert sum(mask) == len(t.response_ids) - sum(c["end"] - c["start"]
                                                      for c in t.tool_calls)
    assert forked > 0


def test_branch_probability_zero_gives_m_independent_samples_from_the_prompt():
    batch, ctx = rollout(M=6, prompts=2, branch_probability=0.0, entropy_weight=0.0)
    assert ctx.metrics["branch/forks"] == 0 and ctx.metrics["branch/topups"] == 2 * (6 - 4)
    assert all(t.branch_parent is None for t in batch.trajectories)
    assert torch.bincount(batch["group_index"]).tolist() == [6, 6]


def test_soft_attribution_is_grpo_and_prefix_weight_is_sum_of_sharers():
    batch, _ = rollout(M=8, prompts=2)
    algo = build_algorithm(OmegaConf.load(CONF), max_new_tokens=40)
    grpo = build_algorithm(OmegaConf.load(CONF.with_name("grpo.yaml")), max_new_tokens=40)
    algo.compute_advantages(batch)
    assert torch.equal(batch["advantages"], grpo.advantage(batch))
    # soft mode credits a shared token once per sharer (d copies, each with its own A): d * mean;
    # hard mode once, with the mean
    adv = batch["advantages"]
    hard, mask = hard_attribution(batch, adv)
    rows = (batch["group_index"] == 0).nonzero().flatten().tolist()
    trajs = [batch.trajectories[r] for r in rows]
    for root in [k for k, t in enumerate(trajs) if t.branch_parent is None]:
        sharers = [rows[k] for k in range(len(trajs)) if _root(trajs, k) == root]
        soft_weight = float(adv[sharers].sum())
        hard_weight = float((hard[sharers, 0] * mask[sharers, 0]).sum())
        assert soft_weight == pytest.approx(len(sharers) * hard_weight, abs=1e-5)


def test_hard_attribution_trains_each_shared_token_once_with_the_mean_advantage():
    batch, _ = rollout(M=8, prompts=2)
    seq = torch.linspace(-1, 1, len(batch))
    adv, mask = hard_attribution(batch, seq)
    for g in (0, 1):
        rows = (batch["group_index"] == g).nonzero().flatten().tolist()
        trajs = [batch.trajectories[r] for r in rows]
        for k, t in enumerate(trajs):
            if t.branch_parent is None:
                continue
            # walk to the root: every copy of position 0 is masked except the owner's
            owner = k
            while trajs[owner].branch_parent is not None:
                owner = trajs[owner].branch_parent
            assert mask[rows[k], 0] == 0 and mask[rows[owner], 0] == 1
        # position 0 is counted once per root, with the mean advantage of its sharers
        roots = [k for k, t in enumerate(trajs) if t.branch_parent is None]
        for root in roots:
            sharers = [k for k in range(len(trajs)) if _root(trajs, k) == root]
            assert adv[rows[root], 0].item() == pytest.approx(
                float(seq[[rows[k] for k in sharers]].mean()), abs=1e-6)
        assert int(mask[rows, 0].sum()) == len(roots)
    # unique tokens keep their own advantage
    assert (adv[mask.bool()] != 0).any()


def _root(trajs, k):
    while trajs[k].branch_parent is not None:
        k = trajs[k].branch_parent
    return k


def test_branching_needs_a_multi_turn_task():
    class Plain(Task):
        name = "plain"

    ctx = RolloutContext(engine=ToolEngine(1, lambda k: 0.0), task=Plain(None),
                         draw_prompts=lambda n: [], prompts_per_step=1,
                         sampling=SamplingParams(n=2))
    with pytest.raises(ConfigError, match="multi-turn"):
        EntropyBranching()(ctx)
    with pytest.raises(ConfigError, match="fork_rule"):
        EntropyBranching(fork_rule="sometimes")


# -- which segment gates a fork, where it forks, and which entropy it reads ------------------------
class TopkEngine(ToolEngine):
    """``generate`` reports the top-k entropy ``topk(k)`` when asked for a truncated entropy and
    ``full(k)`` otherwise (k = tool results in the prefix); ``forward`` gives the full-vocabulary
    entropy ``FULL`` per token, as a real engine's recomputation would."""

    FULL = 4.2
    can_forward = True

    def __init__(self, hops: int, topk, full=lambda k: 1.0, seed: int = 0) -> None:
        super().__init__(hops, topk, seed)
        self.full, self.topk_asked = full, []

    def generate(self, prompts, params, generator=None):
        self.topk_asked.append(params.entropy_topk)
        out = super().generate(prompts, params, generator)
        if params.entropy_topk == 0:
            for p, t in zip(prompts, out, strict=True):
                t.entropy = torch.full_like(t.entropy, float(self.full(
                    self.decode(p).count("</result>"))))
        return out

    def forward(self, mb, temperature, with_entropy=True, entropy_grad=False):
        shape = mb["responses"].shape
        return torch.zeros(shape), torch.full(shape, self.FULL)


# segment k's per-token entropy: the second segment rises (ΔH ≈ +3.9), the later ones fall
RISE_THEN_FALL = {0: 1.0, 1: 2.0, 2: 0.5, 3: 0.5}.get


def branching(engine, M=8, prompts=1, **knobs):
    examples = [Example(str(i), "q") for i in range(prompts)]
    ctx = RolloutContext(engine=engine, task=LookupTask(None),
                         draw_prompts=lambda n: examples[:n], prompts_per_step=prompts,
                         sampling=SamplingParams(n=M, max_new_tokens=40))
    random.seed(0)
    # τ = 0, β = 1: a fork happens iff u ≤ ΔH, so always after a rise, never otherwise
    knobs = {"initial_rollouts": 2, "branch_probability": 0.0, "entropy_weight": 1.0, **knobs}
    return EntropyBranching(**knobs)(ctx), ctx


def fork_points(batch):
    """(tool results in the shared prefix) of every forked trajectory."""
    points = set()
    for t in batch.trajectories:
        if t.branch_parent is not None:
            ends = [c["end"] for c in t.tool_calls]
            assert t.branch_shared in ends  # a fork is placed right after a tool result
            points.add(ends.index(t.branch_shared) + 1)
    return points


def test_default_rule_gates_the_fork_after_result_k_on_the_segment_that_made_call_k():
    assert EntropyBranching().branch_on == "call"
    batch, ctx = branching(TopkEngine(3, RISE_THEN_FALL))
    # the rising segment made call 2: its copies restart after result 2
    assert ctx.metrics["branch/forks"] > 0 and fork_points(batch) == {2}


def test_paper_rule_gates_the_fork_after_result_k_on_the_segment_after_it():
    batch, ctx = branching(TopkEngine(3, RISE_THEN_FALL), branch_on="result")
    # the rising segment follows result 1: its copies restart after result 1
    assert ctx.metrics["branch/forks"] > 0 and fork_points(batch) == {1}


def test_first_call_forks_at_the_base_rate_under_the_code_rule():
    """One call, then an answer segment whose entropy falls. The code's rule gates the fork after
    the result on the calling segment (its own baseline: ΔH = 0, so rate τ); the paper's rule on
    the falling answer segment (never)."""
    falls = {0: 1.0, 1: 0.0}.get
    batch, ctx = branching(TopkEngine(1, falls), branch_probability=0.5)
    assert ctx.metrics["branch/forks"] > 0 and fork_points(batch) == {1}
    _, paper = branching(TopkEngine(1, falls), branch_probability=0.5, branch_on="result")
    assert paper.metrics["branch/forks"] == 0


def test_branching_reads_the_top_k_entropy_and_logs_the_full_one_as_rollout_entropy():
    from harness.rollout import rollout_metrics

    engine = TopkEngine(3, RISE_THEN_FALL, full=lambda k: 1.0)  # flat full entropy: no rise
    batch, ctx = branching(engine, entropy_topk=10)
    assert set(engine.topk_asked) == {10}
    assert ctx.metrics["branch/forks"] > 0  # the top-k rise was seen
    mask = batch["response_mask"] > 0
    assert torch.all(batch["entropy"][mask] == TopkEngine.FULL)
    assert set(batch["entropy_topk"][mask].unique().tolist()) <= {0.5, 1.0, 2.0}
    m = rollout_metrics(batch, 1.0)
    assert m["rollout/entropy"] == pytest.approx(TopkEngine.FULL)
    assert m["rollout/entropy_topk"] == pytest.approx(
        float(batch["entropy_topk"][mask].mean()))


def test_without_an_engine_forward_the_batch_carries_no_truncated_entropy_as_entropy():
    batch, _ = rollout(M=4, prompts=1)  # ToolEngine has no forward (like vLLM)
    assert "entropy" not in batch and "entropy_topk" in batch


def test_aepo_penalty_counts_the_branches_and_stops_forking():
    rising = lambda k: 1.0 + k  # noqa: E731  every later segment rises: ΔH ≥ 3.9
    knobs = {"fork_rule": "aepo", "initial_rollouts": 4, "branch_probability": 0.5}
    _, free = branching(TopkEngine(4, rising), **knobs, consecutive_penalty=0.0)
    assert free.metrics["branch/forks"] == 8 - 4  # (u + βΔH)·1 ≥ τ always
    # λ = 0.5: the factor is 1 with no branch yet, 0.5 after one, 0 from two on
    _, penalised = branching(TopkEngine(4, rising), **knobs, consecutive_penalty=0.5)
    assert penalised.metrics["branch/forks"] == 2


@pytest.mark.parametrize(("root", "tool", "expected"), [(3.0, 0.5, 16), (0.5, 3.0, 1)])
def test_aepo_premonitoring_gives_more_roots_when_the_root_is_the_more_uncertain(root, tool,
                                                                               expected):
    profile = lambda k: root if k == 0 else tool  # noqa: E731
    _, ctx = branching(TopkEngine(2, profile), M=16, dynamic_rollouts=True)
    assert ctx.metrics["branch/root_samples"] == expected
