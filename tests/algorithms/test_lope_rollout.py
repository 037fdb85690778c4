"""LOPE (spec §3.8): resampling of all-wrong groups from Lorem-perturbed prompts, regrouping,
advantage shaping over the G + G' pool, policy shaping f(ρ) = ρ/(ρ+γ) on replaced rows; with a
fake engine whose outcomes depend on whether the prompt was perturbed."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers lope)
from algorithms.lope import LOREM_WORDS, LopeAdvantage, LopePolicyShapingLoss, LopeResample, perturb
from harness.algorithm import Aggregator, build_algorithm
from harness.batch import RolloutBatch
from harness.engines import RolloutEngine
from harness.registry import ROLLOUTS
from harness.rollout import RolloutContext
from harness.trainer import Trainer
from harness.typed_config import ConfigError, build
from harness.types import Example, SamplingParams, Trajectory
from tests.helpers import right_wrong_task

G = 8
CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm" / "lope.yaml"
NAIVE_LP, PERTURBED_LP = -0.5, -2.0  # behaviour log-prob per token, naive vs perturbed prompt


class FakeEngine(RolloutEngine):
    """Prompt text ``"<id>"`` (naive) or ``"<lorem words> <id>"`` (perturbed). The naive prompt's
    k-th sample is correct iff k < ``naive_correct[id]``; over the perturbed prompts of one
    example, the j-th sample overall is correct iff j < ``perturbed_correct[id]``."""

    pad_token_id = 0

    def __init__(self, naive_correct: dict[int, int], perturbed_correct: dict[int, int]) -> None:
        self.naive, self.perturbed = naive_correct, perturbed_correct
        self.seen_perturbed: dict[int, int] = {}
        self.prompts: list[str] = []

    def encode_prompt(self, example: Example) -> list[int]:
        return [ord(c) for c in example.prompt]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Trajectory]:
        out = []
        for p in prompts:
            text = "".join(map(chr, p))
            self.prompts.append(text)
            words = text.split(" ")
            ex_id = int(words[-1])
            perturbed = len(words) > 1
            for k in range(params.n):
                if perturbed:
                    j = self.seen_perturbed.get(ex_id, 0)
                    self.seen_perturbed[ex_id] = j + 1
                    ok = j < self.perturbed.get(ex_id, 0)
                else:
                    ok = k < self.naive[ex_id]
                response = [5, 6, 7] if ok else [8, 9]
                lp = torch.full((len(response),), PERTURBED_LP if perturbed else NAIVE_LP)
                out.append(Trajectory(p, response, logprobs=lp, entropy=torch.ones(len(response)),
                                      text="right" if ok else "wrong"))
        return out


def run(naive: dict[int, int], perturbed: dict[int, int], seed: int = 0, **knobs):
    engine = FakeEngine(naive, perturbed)
    examples = [Example(id=str(i), prompt=str(i)) for i in sorted(naive)]
    ctx = RolloutContext(engine=engine, task=right_wrong_task(),
                         draw_prompts=lambda k: examples[:k], prompts_per_step=len(examples),
                         sampling=SamplingParams(n=G))
    strategy = LopeResample(**{"word_min": 1, "word_max": 3, "separator": " ", **knobs})
    random.seed(seed)
    return strategy(ctx), ctx, engine


def rows_of(batch: RolloutBatch, g: int) -> list[int]:
    return (batch["group_index"] == g).nonzero().flatten().tolist()


def test_resampling_fires_only_for_all_wrong_groups():
    batch, ctx, engine = run({0: 3, 1: 0, 2: 1}, {1: 5})
    perturbed_prompts = [p for p in engine.prompts if " " in p]
    assert len(perturbed_prompts) == 6  # num_perturbation prefixes for group 1 only
    assert all(p.endswith(" 1") for p in perturbed_prompts)
    assert ctx.metrics["lope/all_wrong_groups"] == 1.0
    assert not batch["is_offpolicy"][rows_of(batch, 0) + rows_of(batch, 2)].any()
    assert batch["is_offpolicy"][rows_of(batch, 1)].sum() == 5


@pytest.mark.parametrize(("c", "replaced"), [(0, 0), (1, 1), (5, 5), (7, 7), (8, 7), (24, 7)])
def test_group_stays_size_g_with_at_most_g_minus_1_replacements(c, replaced):
    batch, ctx, _ = run({0: 0}, {0: c})
    assert len(batch) == G and rows_of(batch, 0) == list(range(G))
    assert int(batch["is_offpolicy"].sum()) == replaced
    assert int(batch["correct"].sum()) == replaced  # every replacement is a correct response
    assert int((~batch["correct"]).sum()) >= 1  # one original wrong response always stays
    assert ctx.metrics["lope/rescued_groups"] == float(c > 0)
    assert ctx.metrics["lope/replaced_rows"] == replaced


def test_replaced_rows_keep_behaviour_logprobs_of_the_perturbed_prompt_and_train_on_the_naive():
    batch, _, _ = run({0: 0}, {0: 3})
    off = batch["is_offpolicy"].nonzero().flatten().tolist()
    assert len(off) == 3
    for i in off:
        t = batch.trajectories[i]
        assert t.prompt_ids == [ord("0")]  # trained on the naive prompt
        assert t.generation_prompt_ids != t.prompt_ids
        assert "".join(map(chr, t.generation_prompt_ids)).split(" ")[0] in LOREM_WORDS
        assert t.response_ids == [5, 6, 7]  # the perturbed sample's tokens, untouched
        assert torch.equal(batch["rollout_logprobs"][i, :3], torch.full((3,), PERTURBED_LP))
    naive_tokens = batch["input_ids"][:, batch.prompt_length - 1]
    assert (naive_tokens == ord("0")).all()  # every row's prompt is the naive one
    # the trainer's pi_old keeps the behaviour log-probs of the replaced rows in both modes
    for mode in ("rollout", "recompute"):
        fake = SimpleNamespace(
            separate_engines=False,
            cfg=OmegaConf.create({"rollout": {"temperature": 1.0},
                                  "trainer": {"old_logprobs": mode}}),
            engine=SimpleNamespace(logprobs=lambda b, t, m: torch.full(
                b["responses"].shape, -9.0)))
        old = Trainer.old_logprobs(fake, batch, 0)
        assert torch.equal(old[off, :3], torch.full((3, 3), PERTURBED_LP))
        on = [i for i in range(G) if i not in off]
        expect = NAIVE_LP if mode == "rollout" else -9.0
        assert torch.equal(old[on, :2], torch.full((len(on), 2), expect))


def test_advantage_shaping_uses_all_32_rewards():
    batch, _, _ = run({0: 0, 1: 4}, {0: 1})
    adv = LopeAdvantage(shaping=True)(batch)
    pool = torch.tensor([1.0] + [0.0] * 31)
    std = pool.std().item()  # unbiased, as torch.std
    g0 = rows_of(batch, 0)
    correct = [i for i in g0 if batch["correct"][i]]
    wrong = [i for i in g0 if not batch["correct"][i]]
    assert len(correct) == 1 and len(wrong) == 7
    assert adv[correct[0]].item() == pytest.approx((1 - 1 / 32) / (std + 1e-6), rel=1e-5)
    assert adv[wrong].tolist() == pytest.approx([-(1 / 32) / (std + 1e-6)] * 7, rel=1e-5)
    assert adv[correct[0]].item() == pytest.approx(5.5, abs=0.1)  # the spec's worked example
    # the untouched group gets plain GRPO; without shaping the regrouped group does too
    grpo = LopeAdvantage(shaping=False)(batch)
    g1 = rows_of(batch, 1)
    assert torch.allclose(adv[g1], grpo[g1])
    r = batch["rewards"][g0]
    assert torch.allclose(grpo[g0], (r - r.mean()) / (r.std() + 1e-6))


def loss_inputs(log_ratio: float, adv: float, off: bool):
    logp = torch.tensor([[log_ratio]], requires_grad=True)
    mb = RolloutBatch({"old_logprobs": torch.zeros(1, 1), "advantages": torch.tensor([adv]),
                       "response_mask": torch.ones(1, 1), "is_offpolicy": torch.tensor([off])},
                      [None])
    return mb, logp, Aggregator("token-mean", 1.0, 1)


@pytest.mark.parametrize("rho", [0.05, 0.1, 0.5, 1.0, 5.0])
def test_policy_shaping_on_replaced_rows_is_rho_over_rho_plus_gamma_unclipped(rho):
    loss_fn = LopePolicyShapingLoss(gamma=0.1)
    mb, logp, agg = loss_inputs(math.log(rho), 2.0, off=True)
    value, _ = loss_fn(mb, logp, None, agg)
    f = rho / (rho + 0.1)
    assert 0 < f < 1 and value.item() == pytest.approx(-2.0 * f, rel=1e-5)
    (grad,) = torch.autograd.grad(value, logp)
    # d(-A f)/dlog rho = -A * gamma rho / (rho + gamma)^2: non-zero even at rho = 5 (no clip)
    assert grad.item() == pytest.approx(-2.0 * 0.1 * rho / (rho + 0.1) ** 2, rel=1e-4)
    assert grad.item() != 0.0


def test_policy_shaping_gradient_weight_peaks_at_a_quarter_where_rho_equals_gamma():
    log_rho = torch.linspace(-8, 4, 2001, requires_grad=True)
    rho = log_rho.exp()
    (w,) = torch.autograd.grad((rho / (rho + 0.1)).sum(), log_rho)
    assert w.max().item() == pytest.approx(0.25, abs=1e-4)
    assert rho[w.argmax()].item() == pytest.approx(0.1, rel=0.02)


def test_real_rows_keep_the_ppo_clip_and_no_shaping_off_is_plain_ppo():
    loss_fn = LopePolicyShapingLoss(gamma=0.1, clip_high=0.3)
    mb, logp, agg = loss_inputs(math.log(2.0), 1.0, off=False)
    value, _ = loss_fn(mb, logp, None, agg)
    assert value.item() == pytest.approx(-1.3)  # clip(2, 0.8, 1.3) * A
    (grad,) = torch.autograd.grad(value, logp)
    assert grad.item() == 0.0
    plain = LopePolicyShapingLoss(policy_shaping=False)
    mb, logp, agg = loss_inputs(math.log(2.0), 1.0, off=True)
    assert plain(mb, logp, None, agg)[0].item() == pytest.approx(-1.3)


def test_mixed_micro_batch_adds_both_terms_with_the_mini_batch_normaliser():
    logp = torch.tensor([[0.0, 0.0], [math.log(0.3), math.log(0.3)]], requires_grad=True)
    mb = RolloutBatch({"old_logprobs": torch.zeros(2, 2), "advantages": torch.tensor([1.0, 2.0]),
                       "response_mask": torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                       "is_offpolicy": torch.tensor([False, True]),
                       "lope_offpolicy_tokens": torch.tensor([1.0, 1.0])}, [None, None])
    value, metrics = LopePolicyShapingLoss()(mb, logp, None, Aggregator("token-mean", 3.0, 2))
    f = 0.3 / 0.4
    assert value.item() == pytest.approx((-1.0 * 2 - 2.0 * f) / 3, rel=1e-5)
    assert metrics["lope/f_rho_mean"] == pytest.approx(f, rel=1e-5)
    assert metrics["lope/rho_mean"] == pytest.approx(0.3, rel=1e-5)


def test_without_all_wrong_groups_lope_reduces_to_grpo():
    batch, ctx, engine = run({0: 3, 1: 8, 2: 1}, {})
    assert not any(" " in p for p in engine.prompts)
    assert ctx.metrics["lope/replaced_rows"] == 0.0
    lope = build_algorithm(OmegaConf.load(CONF), max_new_tokens=4)
    grpo = build_algorithm(OmegaConf.load(CONF.with_name("grpo.yaml")), max_new_tokens=4)
    a = lope.advantage(batch)
    assert torch.equal(a, grpo.advantage(batch))
    batch["advantages"], batch["old_logprobs"] = a, batch["rollout_logprobs"]
    logp = batch["rollout_logprobs"] + 0.1 * torch.randn_like(batch["rollout_logprobs"])
    agg = lope.aggregator(batch)
    grpo.policy_loss.clip_high = lope.policy_loss.clip_high
    assert lope.loss(batch, logp, None, agg)[0].item() == pytest.approx(
        grpo.loss(batch, logp, None, agg)[0].item())


def test_resample_off_is_plain_group_sampling():
    batch, ctx, engine = run({0: 0, 1: 2}, {0: 5}, resample=False)
    assert not batch["is_offpolicy"].any() and not any(" " in p for p in engine.prompts)
    assert ctx.metrics["lope/all_wrong_groups"] == 1.0


def test_prefixes_are_seeded_by_the_global_rng_so_resumes_repeat_them():
    _, _, e1 = run({0: 0}, {0: 2}, seed=3)
    _, _, e2 = run({0: 0}, {0: 2}, seed=3)
    _, _, e3 = run({0: 0}, {0: 2}, seed=4)
    assert e1.prompts == e2.prompts and e1.prompts != e3.prompts


def test_chat_prompts_get_the_prefix_as_a_system_message():
    ex = Example(id="0", prompt=[{"role": "user", "content": "q"}])
    out = perturb(ex, "lorem ipsum", "\n", "tail")
    assert out.prompt[0] == {"role": "system", "content": "lorem ipsum\ntail"}
    assert out.prompt[1:] == ex.prompt and ex.prompt == [{"role": "user", "content": "q"}]
    assert perturb(Example(id="1", prompt="p"), "a b", " ", "").prompt == "a b p"


def test_bad_knobs_name_the_key():
    with pytest.raises(ConfigError, match="word_min"):
        build(ROLLOUTS, {"name": "lope_resample", "word_min": 5, "word_max": 2}, "r")
    with pytest.raises(ConfigError, match="gamma"):
        LopePolicyShapingLoss(gamma=0.0)
