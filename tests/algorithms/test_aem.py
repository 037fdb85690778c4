"""AEM (spec §5): every Testable property of §5.6, over GRPO and DAPO, metrics, a 2-step run."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers the estimators)
from algorithms.aem import GRPOAEM, AEMAdvantage, aem_weights, mean_token_entropy
from harness.algorithm import AdvantageEstimator, build_algorithm
from harness.batch import RolloutBatch
from harness.registry import ADVANTAGES, ALGORITHMS
from harness.trainer import Trainer
from harness.typed_config import ConfigError, build
from harness.types import Score, Trajectory
from tests.helpers import make_config

YAML = "conf/algorithm/grpo_aem.yaml"


def make_batch(rewards, groups, entropies, lengths=None, correct=None) -> RolloutBatch:
    """``entropies[i]`` is a list of per-token entropies (its length = the response length),
    or a float repeated over ``lengths[i]`` (default 3) tokens."""
    rows = []
    for i, e in enumerate(entropies):
        n = lengths[i] if lengths is not None else 3
        rows.append([float(e)] * n if isinstance(e, (int, float)) else [float(x) for x in e])
    correct = correct if correct is not None else [r > 0 for r in rewards]
    trajs = [
        Trajectory(prompt_ids=[5, 6], response_ids=list(range(7, 7 + len(h))), group_id=g,
                   entropy=torch.tensor(h), finish_reason="stop",
                   score=Score(reward=float(r), correct=bool(c), parsed=True))
        for r, g, h, c in zip(rewards, groups, rows, correct, strict=True)
    ]
    return RolloutBatch.from_trajectories(trajs, pad_id=0)


def aem(**knobs) -> AEMAdvantage:
    knobs.setdefault("base", {"name": "grpo"})
    return build(ADVANTAGES, {"name": "aem", **knobs}, "algorithm.advantage")


def base(batch, **knobs) -> torch.Tensor:
    return build(ADVANTAGES, {"name": "grpo", **knobs}, "algorithm.advantage")(batch)


def random_batch(seed: int, G: int = 4, n: int = 6) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (G * n,), generator=g).tolist()
    groups = [i // n for i in range(G * n)]
    lengths = torch.randint(1, 7, (G * n,), generator=g).tolist()
    ents = [(torch.rand(L, generator=g) * 3).tolist() for L in lengths]
    return make_batch(rewards, groups, ents)


# -- §5.6 properties ------------------------------------------------------------------------------
@pytest.mark.parametrize("lam", [0.5, 1.0, 2.0, 7.0])
@pytest.mark.parametrize("seed", range(3))
def test_weights_self_normalise_in_every_group(lam, seed):  # property 1
    b = random_batch(seed)
    alpha = aem(lam=lam).weights(b)
    gi = b["group_index"]
    for g in range(4):
        assert alpha[gi == g].mean().item() == pytest.approx(1.0, abs=1e-6)
    assert (alpha > 0).all()


def test_weights_with_the_spec_plus_eps_differ_only_by_order_eps():  # property 1 (1 - O(ε))
    b = random_batch(0)
    eps = 1e-3
    alpha = aem(lam=1.0, eps=eps).weights(b)
    h = mean_token_entropy(b["entropy"], b["response_mask"])
    gi = b["group_index"]
    for g in range(4):
        hg = h[gi == g]
        w = torch.exp(-(hg - hg.min()) / (hg.max() - hg.min()))
        spec = w / (w.mean() + eps)
        # ratio (mean + eps) / mean = 1 + eps / mean, and mean >= e^-lam
        assert torch.allclose(alpha[gi == g], spec, rtol=eps * math.e, atol=0)
        assert not torch.equal(alpha[gi == g], spec)


@pytest.mark.parametrize("lam", [0.5, 1.0, 2.0])
def test_alpha_strictly_decreasing_and_ratio_is_e_to_lambda(lam):  # property 2
    ents = [0.3, 2.0, 1.1, 0.9, 1.7]
    b = make_batch([1, 0, 1, 0, 1], [0] * 5, ents)
    alpha = aem(lam=lam).weights(b)
    order = sorted(range(5), key=lambda i: ents[i])
    by_h = alpha[order]
    assert all(x > y for x, y in itertools.pairwise(by_h.tolist()))
    assert (alpha.max() / alpha.min()).item() == pytest.approx(math.exp(lam), rel=1e-6)
    # by hand: H~ = (H - 0.3) / 1.7, alpha = exp(-lam H~) / mean
    h_t = torch.tensor([(e - 0.3) / 1.7 for e in ents])
    w = torch.exp(-lam * h_t)
    assert torch.allclose(alpha, w / w.mean(), atol=1e-6)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("base_node", [
    {"name": "grpo"}, {"name": "grpo", "std_kind": "population", "eps": 1e-3},
    {"name": "dr_grpo"}, {"name": "rloo"}, {"name": "maxrl"},
])
def test_lambda_zero_is_exactly_the_base(seed, base_node):  # property 3
    b = random_batch(seed)
    expected = build(ADVANTAGES, base_node, "algorithm.advantage")(b)
    got = aem(lam=0.0, base=base_node)(b)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("lam", [0.0, 0.5, 2.0, 20.0])
@pytest.mark.parametrize("seed", range(4))
def test_sign_is_never_flipped(lam, seed):  # property 4
    b = random_batch(seed)
    a_base = base(b)
    a = aem(lam=lam)(b)
    assert torch.equal(torch.sign(a), torch.sign(a_base))
    assert torch.allclose(a, aem(lam=lam).weights(b) * a_base)  # and it is alpha * base


@pytest.mark.parametrize("seed", range(20))
def test_entropy_drift_sign_on_a_softmax_bandit(seed):  # property 5
    """A natural-gradient step on a sampled action a with advantage A changes the entropy of a
    softmax policy by (to first order) η A (S(a) - H), S = -log π(a). The natural gradient of
    log π(a) for a softmax over logits is e_a / π(a) (F = diag π - π πᵀ; F e_a = π_a ∇log π(a)).
    AEM's α > 0 scales A, so it changes the drift's size but never its sign."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(6, generator=g, dtype=torch.float64)
    a = int(torch.randint(0, 6, (1,), generator=g))
    A = float(torch.randn(1, generator=g, dtype=torch.float64))
    alpha = float(torch.rand(1, generator=g, dtype=torch.float64)) * 3 + 0.1

    def entropy(t):
        p = torch.softmax(t, 0)
        return float(-(p * p.log()).sum())

    pi = torch.softmax(theta, 0)
    S, H = float(-pi[a].log()), entropy(theta)
    eta = 1e-6
    step = torch.zeros(6, dtype=torch.float64)
    step[a] = 1.0 / pi[a]
    # Fisher check: F e_a / pi_a equals the score e_a - pi
    F = torch.diag(pi) - torch.outer(pi, pi)
    score = -pi.clone()
    score[a] += 1.0
    assert torch.allclose(F @ step, score)
    for adv in (A, alpha * A):
        drift = entropy(theta + eta * adv * step) - H
        assert drift == pytest.approx(eta * adv * (S - H), rel=1e-3, abs=1e-14)
        if abs(S - H) > 1e-6:
            assert math.copysign(1, drift) == math.copysign(1, adv * (S - H))


@pytest.mark.parametrize("scale,shift", [(2.0, 0.0), (0.1, 5.0), (7.5, -0.3)])
def test_invariant_to_positive_affine_entropy_transforms(scale, shift):  # property 6
    b = random_batch(1)
    ref = aem(lam=1.5)(b)
    b2 = random_batch(1)
    b2["entropy"] = (b2["entropy"] * scale + shift) * b2["response_mask"]
    assert torch.allclose(aem(lam=1.5)(b2), ref, atol=1e-5)
    # a different transform per group is also invisible (min-max is per group)
    b3 = random_batch(1)
    per_group = torch.tensor([1.0, 3.0, 0.5, 9.0])[b3["group_index"]][:, None]
    b3["entropy"] = b3["entropy"] * per_group + per_group
    assert torch.allclose(aem(lam=1.5)(b3), ref, atol=1e-5)


# -- edge cases and details -----------------------------------------------------------------------
def test_constant_entropy_group_gives_alpha_one():
    b = make_batch([1, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1], [0.7, 0.7, 0.7, 0.1, 2.0, 1.0])
    alpha = aem(lam=3.0).weights(b)
    assert torch.equal(alpha[:3], torch.ones(3))
    assert not torch.allclose(alpha[3:], torch.ones(3))
    a = aem(lam=3.0)(b)
    assert torch.equal(a[:3], base(b)[:3])


def test_mean_entropy_uses_only_the_response_mask():
    # same mean per response, different lengths and padding: equal weights
    b = make_batch([1, 0], [0, 0], [[1.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    h = mean_token_entropy(b["entropy"], b["response_mask"])
    assert h.tolist() == pytest.approx([2.0, 2.0])
    b["response_mask"][1, 3:] = 0.0  # masked tokens do not count ...
    b["entropy"][1, 3:] = 100.0  # ... whatever entropy they carry
    assert mean_token_entropy(b["entropy"], b["response_mask"]).tolist() == pytest.approx([2, 2])


def test_lower_entropy_correct_response_gets_the_larger_update():
    b = make_batch([1, 1, 0, 0], [0] * 4, [0.2, 1.0, 0.2, 1.0])
    a = aem(lam=1.0)(b)
    assert a[0] > a[1] > 0 > a[3] > a[2]  # low entropy -> alpha > 1, for both signs


def test_token_level_base_is_broadcast():
    b = random_batch(2)
    alpha = aem(lam=1.0).weights(b)

    class TokenBase(AdvantageEstimator):
        def __call__(self, batch):
            return torch.arange(batch["response_mask"].numel(), dtype=torch.float32).view(
                batch["response_mask"].shape) - 10.0

    est = aem(lam=1.0)
    est.base = TokenBase()
    got = est(b)
    assert got.shape == b["response_mask"].shape
    assert torch.allclose(got, alpha[:, None] * TokenBase()(b))


def test_missing_entropy_names_the_key():
    b = random_batch(0)
    del b.tensors["entropy"]
    with pytest.raises(KeyError, match="entropy"):
        aem()(b)


# -- over DAPO's setup ----------------------------------------------------------------------------
def test_over_dapo_setup_with_overlong_shaping_and_filtered_groups():
    node = OmegaConf.to_container(OmegaConf.load("conf/algorithm/dapo.yaml"))
    dapo_adv = dict(node["advantage"])
    node["advantage"] = {"name": "aem", "base": dapo_adv, "lam": 2.0}
    alg = build_algorithm(node, max_new_tokens=10)
    plain = build_algorithm(OmegaConf.to_container(OmegaConf.load("conf/algorithm/dapo.yaml")),
                            max_new_tokens=10)
    assert alg.config.overlong.enabled and alg.config.loss["clip_high"] == 0.28
    rewards = [1, 0, 1, 0, 1, 1, 0, 0]
    lengths = [3, 10, 9, 2, 4, 10, 5, 8]  # several in the overlong buffer (L_cache = 2)
    ents = [0.5, 1.5, 0.9, 2.2, 0.1, 0.4, 3.0, 1.0]
    b1 = make_batch(rewards, [0] * 4 + [1] * 4, ents, lengths=lengths)
    b1["raw_rewards"] = b1["rewards"].clone()
    b2 = make_batch(rewards, [0] * 4 + [1] * 4, ents, lengths=lengths)
    b2["raw_rewards"] = b2["rewards"].clone()
    for a, b in ((alg, b1), (plain, b2)):
        a.shape_rewards(b)
        a.compute_advantages(b)
    assert not torch.equal(b1["rewards"], b1["raw_rewards"])  # overlong shaping happened
    alpha = alg.advantage.weights(b1)
    assert torch.allclose(b1["advantages"], alpha * b2["advantages"])
    assert torch.equal(torch.sign(b1["advantages"]), torch.sign(b2["advantages"]))
    assert not torch.allclose(b1["advantages"], b2["advantages"])


# -- config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("node,key", [
    ({"lam": -1.0}, "lam"), ({"lam": float("nan")}, "lam"), ({"eps": 0.0}, "eps"),
    ({"group": "turn"}, "group"), ({"base": {"name": "grpo", "std": 1}}, r"base\.std"),
    ({"base": {"std_kind": "unbiased"}}, "base"), ({"base": {}}, "base"),
    ({"base": {"name": "aem"}}, r"base\.name"),
    ({"base": {"name": "gpro"}}, None), ({"lamda": 1.0}, "lamda"),
])
def test_bad_config_names_the_key(node, key):
    if key is None:  # an unknown base estimator lists the valid names
        with pytest.raises(KeyError, match="grpo"):
            aem(**node)
        return
    with pytest.raises(ConfigError, match=rf"algorithm\.advantage\.{key}"):
        aem(**node)


def test_yaml_defaults_and_registration():
    node = OmegaConf.load(YAML)
    alg = build_algorithm(OmegaConf.to_container(node), max_new_tokens=12)
    assert isinstance(alg, GRPOAEM) and ALGORITHMS.get("grpo_aem") is GRPOAEM
    assert isinstance(alg.advantage, AEMAdvantage)
    grpo = OmegaConf.load("conf/algorithm/grpo.yaml")
    assert node.advantage.base == grpo.advantage  # the base is exactly GRPO's estimator
    for key in ("rollout", "loss", "agg", "kl", "entropy_coef", "overlong"):
        assert node[key] == grpo[key], key


# -- metrics --------------------------------------------------------------------------------------
def test_alpha_metrics():
    b = make_batch([1, 0, 1, 0], [0] * 4, [0.0, 1.0, 0.5, 0.25])
    est = aem(lam=2.0)
    est(b)
    alpha = est.weights(b)
    m = est.last_metrics
    assert m["aem/alpha_min"] == pytest.approx(alpha.min().item())
    assert m["aem/alpha_max"] == pytest.approx(alpha.max().item())
    assert m["aem/alpha_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m["aem/alpha_max"] / m["aem/alpha_min"] == pytest.approx(math.exp(2.0), rel=1e-6)


def test_aem_weights_of_empty_batch():
    assert aem_weights(torch.zeros(0), torch.zeros(0, dtype=torch.long), 1.0, 1e-8).numel() == 0


@pytest.mark.slow
def test_two_step_run_logs_the_aem_metrics(tmp_path, model_cache):
    cfg = make_config(
        tmp_path, model_cache, "algorithm=grpo_aem", "algorithm.advantage.lam=2.0",
        # default trainer.skip_zero_gradient=true: the metrics come from compute_advantages, so
        # they are logged even when every sample of a step has zero advantage and is skipped
        "trainer.steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=2",
        "data.prompts_per_step=4", "rollout.n=4",
        "task.tiny.eval.heldout.limit=8", "task.tiny.eval.heldout.n=2",
        "task.tiny.eval.heldout.k=[1,2]",
    )
    summary = Trainer(cfg).fit()
    assert summary["final/steps"] == 2
    client = MlflowClient(cfg.tracking.uri)
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.name"] == "grpo_aem"
    m = run.data.metrics
    assert 0 < m["aem/alpha_min"] <= 1.0 + 1e-6 <= m["aem/alpha_max"] + 2e-6
    assert m["aem/alpha_mean"] == pytest.approx(1.0, abs=1e-4)
    # within a group alpha in [e^-lam / mean, 1 / mean] and mean in [e^-lam, 1]
    assert math.exp(-2.0) * (1 - 1e-4) <= m["aem/alpha_min"]
    assert m["aem/alpha_max"] <= math.exp(2.0) * (1 + 1e-4)
