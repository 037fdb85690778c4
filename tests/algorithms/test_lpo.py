"""LPO (spec §1.9): coefficient bounds and zero-sum, Proposition 1, the K = 2 closed form, the
exact two-pass surrogate across micro-batches (toy model; the real trainer in
test_lpo_trainer.py), τ mapping and
limits, Corollary 2, degenerate groups, shift invariance and configs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers every bundle)
from algorithms.lpo import (
    LPOTargetAdvantage,
    group_log_softmax,
    lpo_coefficients,
    lpo_group_loss,
    sequence_scores,
)
from harness.algorithm import Aggregator, AlgorithmConfig, build_algorithm
from harness.batch import RolloutBatch
from harness.registry import ADVANTAGES, ALGORITHMS, POLICY_LOSSES
from harness.typed_config import ConfigError, build, schema_of
from harness.types import Trajectory

CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm"
V = 7  # toy vocabulary


def load(name: str):
    return OmegaConf.load(CONF / f"{name}.yaml")


def algo(name: str = "lpo_fwd", **loss):
    node = load(name)
    for k, v in loss.items():
        if k in ("tau", "std_kind"):
            node.advantage[k] = v
        else:
            node.loss[k] = v
    return build_algorithm(node, max_new_tokens=16)


def groups_of(K: int, G: int) -> torch.Tensor:
    return torch.arange(G).repeat_interleave(K)


def random_simplex_inputs(K=5, G=6, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    gi = groups_of(K, G)
    s = torch.randn(K * G, generator=g, dtype=torch.float64) * scale
    phi = torch.randn(K * G, generator=g, dtype=torch.float64) * scale
    return s, phi, gi, G  # fp64, as prepare runs the listwise maths


def coeffs(s, phi, gi, G, projection, pointwise=False):
    return lpo_coefficients(group_log_softmax(s, gi, G), group_log_softmax(phi, gi, G), gi, G,
                            projection, pointwise)


def per_group(x, gi, G):
    return torch.zeros(G, dtype=x.dtype).index_add_(0, gi, x).float()


# -- toy autoregressive model: a bigram table, log pi(y_t | y_{t-1}) = log_softmax(W[y_{t-1}]) ----
class Toy:
    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.W = (torch.randn(V, V, generator=g) * 0.5).requires_grad_(True)

    def logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        prev = torch.cat([batch["prompt_tok"][:, None], batch["responses"][:, :-1]], 1)
        logits = torch.log_softmax(self.W[prev], -1)
        return logits.gather(-1, batch["responses"][..., None]).squeeze(-1)


def toy_batch(rewards, K, lengths=None, seed=1, model=None, stale=0.3):
    """Groups of K with rewards, random tokens/lengths; old log-probs = the model's minus noise
    (so s_θ ≠ 0, an off-policy inner epoch)."""
    g = torch.Generator().manual_seed(seed)
    B = len(rewards)
    lengths = lengths or torch.randint(1, 6, (B,), generator=g).tolist()
    T = max(lengths)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    tensors = {
        "responses": torch.randint(0, V, (B, T), generator=g),
        "prompt_tok": torch.randint(0, V, (B,), generator=g),
        "response_mask": mask,
        "rewards": torch.as_tensor(rewards, dtype=torch.float32),
        "group_index": groups_of(K, B // K),
    }
    batch = RolloutBatch(tensors, [Trajectory([], []) for _ in range(B)])
    model = model or Toy()
    with torch.no_grad():
        lp = model.logprobs(batch)
    batch["old_logprobs"] = (lp + stale * torch.randn(B, T, generator=g)) * mask
    batch["rollout_logprobs"] = (lp + stale * torch.randn(B, T, generator=g)) * mask
    return batch, model


def grad_two_pass(alg, batch, model, micro, skip=True):
    """The trainer's update path for one mini-batch: prepare (no grad, whole mini-batch),
    aggregator, gradient_rows drop, micro-batch surrogate backward."""
    model.W.grad = None
    mb = batch.select(torch.arange(len(batch)))
    metrics = alg.prepare_minibatch(mb, lambda b: model.logprobs(b).detach())
    agg = alg.aggregator(mb)
    if skip:
        rows = alg.gradient_rows(mb)
        mb = mb.select(rows.nonzero().squeeze(-1))
    for m in mb.split(micro):
        loss, _ = alg.loss(m, model.logprobs(m), None, agg)
        loss.backward()
    grad = model.W.grad if model.W.grad is not None else torch.zeros_like(model.W)
    return grad.clone(), metrics


def grad_direct(alg, batch, model):
    """Autograd of 1/G Σ_x L(x) on whole groups (constant groups masked)."""
    model.W.grad = None
    loss_cfg = alg.policy_loss
    mask = batch["response_mask"]
    base = batch["rollout_logprobs"] if loss_cfg.behaviour == "rollout" else batch["old_logprobs"]
    s = sequence_scores(model.logprobs(batch), base, mask, loss_cfg.score)
    if loss_cfg.s_clip is not None:
        s = s.clamp(-loss_cfg.s_clip, loss_cfg.s_clip)
    s_t = (sequence_scores(batch["old_logprobs"], base, mask, loss_cfg.score)
           if loss_cfg.behaviour == "rollout" else 0.0)
    gi = batch["group_index"]
    G = int(gi.max()) + 1
    phi = batch["advantages"] + s_t
    L = lpo_group_loss(s, phi, gi, G, loss_cfg.projection, loss_cfg.pointwise)
    active = per_group(batch["advantages"].abs(), gi, G) > 0
    (L * active).sum().div(G).backward()
    return model.W.grad.clone()


# -- 1, 2: bounds and zero-sum --------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_forward_coefficients_are_bounded_and_zero_sum(seed):
    s, phi, gi, G = random_simplex_inputs(seed=seed, scale=4.0)
    c = coeffs(s, phi, gi, G, "fwd")
    assert torch.allclose(per_group(c, gi, G), torch.zeros(G), atol=1e-6)
    assert c.abs().max() <= 1.0
    assert (per_group(c.abs(), gi, G) <= 2.0 + 1e-6).all()


@pytest.mark.parametrize("seed", range(5))
def test_reverse_coefficients_are_zero_sum(seed):
    s, phi, gi, G = random_simplex_inputs(seed=seed, scale=4.0)
    c = coeffs(s, phi, gi, G, "rev")
    assert torch.allclose(per_group(c, gi, G), torch.zeros(G), atol=1e-6)
    assert c.abs().max() > 1e-3  # not trivially zero


def test_pointwise_coefficients_sum_to_minus_one():
    s, phi, gi, G = random_simplex_inputs(seed=3)
    c = coeffs(s, phi, gi, G, "fwd", pointwise=True)
    assert torch.allclose(per_group(c, gi, G), -torch.ones(G), atol=1e-6)


@pytest.mark.parametrize("projection", ["fwd", "rev"])
@pytest.mark.parametrize("pointwise", [False, True])
def test_coefficients_are_the_gradient_of_the_group_loss(projection, pointwise):
    s, phi, gi, G = random_simplex_inputs(seed=7)
    s = s.double().requires_grad_(True)
    lpo_group_loss(s, phi.double(), gi, G, projection, pointwise).sum().backward()
    c = coeffs(s.detach(), phi.double(), gi, G, projection, pointwise)
    assert torch.allclose(s.grad.float(), c.float(), atol=1e-6)


# -- 3, 4: Proposition 1 and first-order agreement ------------------------------------------------
def test_proposition_1_reverse_coefficients_on_policy():
    K, G = 4, 5
    gi = groups_of(K, G)
    A = torch.randn(K * G)
    A = A - per_group(A, gi, G)[gi] / K  # zero-mean per group
    c = coeffs(torch.zeros(K * G), A, gi, G, "rev")
    assert torch.allclose(c, -A / K, atol=1e-6)


def test_proposition_1_autograd_reverse_kl_equals_policy_gradient_on_a_tiny_model():
    K, G = 4, 3
    rewards = [1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 1]
    batch, model = toy_batch(rewards, K, stale=0.0)  # on-policy: old = current
    alg = algo("lpo_rev", tau="sigma_g")
    alg.compute_advantages(batch)
    A, gi = batch["advantages"], batch["group_index"]
    # -∇ D_KL(P_θ || softmax(A)) by autograd on whole groups
    s = sequence_scores(model.logprobs(batch), batch["old_logprobs"], batch["response_mask"])
    lpo_group_loss(s, A, gi, G, "rev").sum().backward()
    g_kl = -model.W.grad.clone()
    model.W.grad = None
    # policy gradient 1/K Σ_k A_k ∇ log π(y_k) (seq-sum aggregation), per prompt, summed
    seq_logp = (model.logprobs(batch) * batch["response_mask"]).sum(-1)
    (A * seq_logp).sum().div(K).backward()
    g_pg = model.W.grad.clone()
    assert g_pg.abs().max() > 1e-3
    assert torch.allclose(g_kl, g_pg, atol=1e-5)


def test_forward_agrees_with_policy_gradient_to_first_order():
    K, G = 4, 50
    gi = groups_of(K, G)
    for eps in (1e-1, 1e-2):
        A = torch.randn(K * G, dtype=torch.float64) * eps
        c = coeffs(torch.zeros(K * G, dtype=torch.float64), A, gi, G, "fwd")
        assert torch.allclose(c, 1.0 / K - torch.softmax(A.view(G, K), -1).flatten())
        err = (c - (-(A - per_group(A, gi, G)[gi] / K) / K)).abs().max()
        assert err <= 2 * eps**2  # O(|A|^2)


# -- 5: self-correction ---------------------------------------------------------------------------
@pytest.mark.parametrize("projection", ["fwd", "rev"])
def test_coefficients_vanish_when_p_theta_equals_the_target(projection):
    _, phi, gi, G = random_simplex_inputs(seed=2)
    shift = torch.randn(G, dtype=torch.float64)[gi]  # P_θ = w* up to a per-group shift
    c = coeffs(phi + shift, phi, gi, G, projection)
    assert c.abs().max() < 1e-6


# -- 6: two-pass surrogate = direct autograd ------------------------------------------------------
@pytest.mark.parametrize("name", ["lpo_fwd", "lpo_rev"])
@pytest.mark.parametrize("options", [{}, {"score": "mean"}, {"behaviour": "rollout"},
                                     {"s_clip": 0.5}, {"pointwise": True}])
@pytest.mark.parametrize("micro", [3, 5, 0])
def test_two_pass_surrogate_matches_direct_autograd_across_micro_batches(name, options, micro):
    K = 4  # micro=3 or 5 splits every group of 4 across micro-batches
    rewards = [1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0.5, 0, 0, 0, 0, 0, 0, 1, 1, 0]
    batch, model = toy_batch(rewards, K, seed=4)
    alg = algo(name, **options)
    alg.compute_advantages(batch)
    g2, metrics = grad_two_pass(alg, batch, model, micro)
    g1 = grad_direct(alg, batch, model)
    assert g1.abs().max() > 1e-4
    assert torch.allclose(g2, g1, atol=1e-6, rtol=1e-4)
    assert metrics["lpo/active_group_frac"] == pytest.approx(3 / 5)  # two constant groups


def test_skipping_zero_coefficient_rows_does_not_change_the_gradient():
    rewards = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0]
    batch, model = toy_batch(rewards, 4, seed=5)
    alg = algo("lpo_fwd")
    alg.compute_advantages(batch)
    mb = batch.select(torch.arange(len(batch)))
    alg.prepare_minibatch(mb, lambda b: model.logprobs(b).detach())
    rows = alg.gradient_rows(mb)
    assert rows.tolist() == [False] * 4 + [True] * 4 + [False] * 4
    g_skip, _ = grad_two_pass(alg, batch, model, 3, skip=True)
    g_all, _ = grad_two_pass(alg, batch, model, 3, skip=False)
    assert torch.allclose(g_skip, g_all, atol=1e-7)
    alg_kl = algo("lpo_fwd")
    alg_kl.config.kl.coef = 0.1
    assert alg_kl.gradient_rows(mb).all()


def test_loss_without_prepare_names_the_missing_step():
    batch, model = toy_batch([1, 0, 0, 1], 4)
    alg = algo("lpo_fwd")
    alg.compute_advantages(batch)
    with pytest.raises(KeyError, match="prepare_minibatch"):
        alg.loss(batch, model.logprobs(batch), None, alg.aggregator(batch))


# -- 7: K = 2 closed form -------------------------------------------------------------------------
@pytest.mark.parametrize("tau", ["0.3", "1", "2.5"])
def test_k2_closed_form_matches_forward_loss(tau):
    t = float(tau)
    g = torch.Generator().manual_seed(0)
    G = 6
    gi = groups_of(2, G)
    rewards = torch.tensor([1.0, 0.0] * G)
    batch = RolloutBatch({"rewards": rewards, "group_index": gi},
                         [Trajectory([], []) for _ in range(2 * G)])
    A = LPOTargetAdvantage(tau=tau)(batch)
    s = torch.randn(2 * G, generator=g, dtype=torch.float64) * 2
    L = lpo_group_loss(s, A.double(), gi, G, "fwd")
    sw, sl = s[0::2], s[1::2]
    sig = torch.sigmoid
    closed = -sig(torch.tensor(1 / t)) * torch.log(sig(sw - sl)) \
        - sig(torch.tensor(-1 / t)) * torch.log(sig(sl - sw))
    p = sig(torch.tensor(1 / t, dtype=torch.float64))
    entropy_w = -(p * p.log() + (1 - p) * (1 - p).log())  # L_fwd = cross-entropy − H(w*)
    assert torch.allclose(L + entropy_w, closed.double(), atol=1e-6)


# -- 8, 9: τ mapping and limits -------------------------------------------------------------------
def reward_batch(rewards, K):
    r = torch.as_tensor(rewards, dtype=torch.float32)
    return RolloutBatch({"rewards": r, "group_index": groups_of(K, len(r) // K),
                         "response_mask": torch.ones(len(r), 2)},
                        [Trajectory([], []) for _ in r])


@pytest.mark.parametrize("tau, baseline", [("sigma_g", {"name": "grpo"}),
                                           ("one", {"name": "dr_grpo"}),
                                           ("mu_g", {"name": "maxrl"}),
                                           ("rloo", {"name": "rloo"})])
def test_tau_choice_reproduces_the_baseline_advantage_softmax(tau, baseline):
    K = 5
    g = torch.Generator().manual_seed(1)
    rewards = (torch.rand(4 * K, generator=g) > 0.5).float() * torch.rand(4 * K, generator=g)
    rewards[:K] = torch.tensor([1.0, 0, 0, 1, 0])
    batch = reward_batch(rewards, K)
    A = build(ADVANTAGES, {"name": "lpo", "tau": tau}, "a")(batch)
    base = build(ADVANTAGES, baseline, "b")(batch)
    w = torch.softmax(A.view(-1, K), -1)
    assert torch.allclose(w, torch.softmax(base.view(-1, K), -1), atol=1e-5)
    assert not torch.allclose(w, torch.full_like(w, 1 / K))


def test_tau_numbers_and_names_are_parsed_and_bad_ones_fail():
    batch = reward_batch([1.0, 0.0, 0.0, 0.0], 4)
    a2 = build(ADVANTAGES, {"name": "lpo", "tau": 2}, "a")(batch)
    a1 = build(ADVANTAGES, {"name": "lpo", "tau": "one"}, "a")(batch)
    assert torch.allclose(a2 * 2, a1)
    for bad in ("sigma", "0", "-1", "inf"):
        with pytest.raises(ConfigError, match="tau"):
            build(ADVANTAGES, {"name": "lpo", "tau": bad}, "algorithm.advantage")


def test_tau_limits_one_hot_and_anchor():
    batch = reward_batch([0.2, 1.0, 1.0, 0.0], 4)
    A = build(ADVANTAGES, {"name": "lpo", "tau": "1e-6"}, "a")(batch)
    w = torch.softmax(A, -1)
    assert torch.allclose(w, torch.tensor([0.0, 0.5, 0.5, 0.0]), atol=1e-6)  # ties shared
    A = build(ADVANTAGES, {"name": "lpo", "tau": "1e9"}, "a")(batch)
    s_t = torch.tensor([0.3, -1.0, 0.2, 0.5])
    assert torch.allclose(torch.softmax(A + s_t, -1), torch.softmax(s_t, -1), atol=1e-6)


# -- 10: Corollary 2 ------------------------------------------------------------------------------
def test_corollary_2_mode_coverage_bound():
    g = torch.Generator().manual_seed(0)
    K, G = 6, 200
    gi = groups_of(K, G)
    phi = torch.randn(K * G, generator=g, dtype=torch.float64)
    s = torch.randn(K * G, generator=g, dtype=torch.float64) * 3
    log_w, log_p = group_log_softmax(phi, gi, G), group_log_softmax(s, gi, G)
    w, P = log_w.exp(), log_p.exp()
    D = per_group(w * (log_w - log_p), gi, G)
    alpha = w  # take α = w*_k itself for each k
    assert (alpha * torch.exp(-D[gi] / alpha - 1) < P).all()


# -- 11, 12 and degenerate groups -----------------------------------------------------------------
def test_constant_group_target_is_the_anchor_and_skipped():
    rewards = [1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0]
    batch, model = toy_batch(rewards, 4, seed=2)
    for tau in ("sigma_g", "mu_g", "one", "rloo"):
        alg = algo("lpo_fwd", tau=tau, behaviour="rollout")
        alg.compute_advantages(batch)
        assert (batch["advantages"][:8] == 0).all()  # w* = softmax(s_t) = P_t
        mb = batch.select(torch.arange(12))
        alg.prepare_minibatch(mb, lambda b: model.logprobs(b).detach())
        assert (mb["lpo_weight"][:8] == 0).all() and (mb["lpo_weight"][8:] != 0).all()
    keep = algo("lpo_fwd", skip_constant_groups=False)
    keep.compute_advantages(batch)
    mb = batch.select(torch.arange(12))
    keep.prepare_minibatch(mb, lambda b: model.logprobs(b).detach())
    assert (mb["lpo_c"][:8] != 0).all()  # off-policy: pulled back toward P_t


@pytest.mark.parametrize("name", ["lpo_fwd", "lpo_rev"])
def test_degenerate_groups_give_finite_values(name):
    # all-wrong (μ = 0 for mu_g), single-sample groups, an empty response, huge scores
    for tau in ("mu_g", "sigma_g", "rloo", "1e-6"):
        rewards = [0, 0, 0, 0, 1, 0, 0, 0]
        batch, model = toy_batch(rewards, 4, lengths=[3, 1, 0, 2, 5, 5, 0, 4], seed=3,
                                 stale=40.0)
        alg = algo(name, tau=tau)
        alg.compute_advantages(batch)
        g, metrics = grad_two_pass(alg, batch, model, 3)
        assert torch.isfinite(g).all() and all(math.isfinite(v) for v in metrics.values())
        single = reward_batch([1.0, 0.0, 1.0], 1)
        assert (build(ADVANTAGES, {"name": "lpo", "tau": tau}, "a")(single) == 0).all()


@pytest.mark.parametrize("tau", ["sigma_g", "one", "rloo", "0.7"])
def test_loss_is_invariant_to_a_reward_shift(tau):
    rewards = torch.tensor([1.0, 0, 0, 1, 0.5, 0, 1, 1])
    batch, model = toy_batch(rewards.tolist(), 4, seed=6)
    alg = algo("lpo_rev", tau=tau)
    out = []
    for shift in (0.0, 3.0):
        batch["rewards"] = rewards + shift
        alg.compute_advantages(batch)
        g, metrics = grad_two_pass(alg, batch, model, 0)
        out.append((g, metrics["actor/pg_loss"]))
    assert torch.allclose(out[0][0], out[1][0], atol=1e-6)
    assert out[0][1] == pytest.approx(out[1][1], rel=1e-5, abs=1e-7)


def test_metrics_match_their_definitions():
    rewards = [1, 0, 0, 1, 0, 1, 1, 1]
    batch, model = toy_batch(rewards, 4, seed=8)
    alg = algo("lpo_fwd", tau="one")
    alg.compute_advantages(batch)
    mb = batch.select(torch.arange(8))
    m = alg.prepare_minibatch(mb, lambda b: model.logprobs(b).detach())
    gi, G = mb["group_index"], 2
    s = sequence_scores(model.logprobs(mb).detach(), mb["old_logprobs"], mb["response_mask"])
    log_p, log_w = group_log_softmax(s, gi, G), group_log_softmax(mb["advantages"], gi, G)
    c = log_p.exp() - log_w.exp()
    assert m["lpo/c_abs_max"] == pytest.approx(float(c.abs().max()), abs=1e-6)
    assert m["lpo/c_abs_mean"] == pytest.approx(float(c.abs().mean()), abs=1e-6)
    assert m["lpo/c_sum"] == pytest.approx(0.0, abs=1e-6)
    kl = (log_w.exp() * (log_w - log_p)).sum() / G
    assert m["lpo/kl_target"] == pytest.approx(float(kl), rel=1e-5)
    assert m["lpo/p_entropy"] == pytest.approx(float(-(log_p.exp() * log_p).sum() / G), rel=1e-5)
    assert m["actor/pg_loss"] == pytest.approx(float(kl), rel=1e-5)  # fwd: the loss is the KL
    assert m["lpo/partial_group_frac"] == 0.0
    half = batch.select(torch.arange(6))  # a mini-batch that cuts group 1
    assert alg.prepare_minibatch(half, lambda b: model.logprobs(b).detach())[
        "lpo/partial_group_frac"] == 0.5


# -- configs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lpo_fwd", "lpo_rev"])
def test_config_builds_lists_every_knob_with_a_comment(name):
    node = OmegaConf.to_container(load(name))
    alg = build_algorithm(load(name), 12)
    assert type(alg) is ALGORITHMS.get(name) and alg.policy_loss.projection == name[-3:]
    assert set(node) == {f for f in AlgorithmConfig.__dataclass_fields__}
    for key, registry in (("advantage", ADVANTAGES), ("loss", POLICY_LOSSES)):
        schema = schema_of(registry.get(node[key]["name"]))
        assert set(node[key]) - {"name"} == set(schema.__dataclass_fields__)
    for line in (CONF / f"{name}.yaml").read_text().splitlines():
        code = line.split("#", 1)[0].strip()
        if code and not code.endswith(":"):
            assert "#" in line, line
    assert alg.config.agg == "seq-mean-token-sum" and alg.advantage.tau == "sigma_g"


@pytest.mark.parametrize("path, value, match", [
    ("loss.projection", "rev", "projection"), ("loss.score", "median", "score"),
    ("loss.behaviour", "ref", "behaviour"), ("loss.s_clip", -1.0, "s_clip"),
    ("agg", "seq-mean-token-mean", "agg"), ("loss.name", "ppo_clip", "lpo"),
])
def test_bad_lpo_config_fails_naming_the_key(path, value, match):
    node = load("lpo_fwd")
    if path == "loss.name":
        node.loss = {"name": "ppo_clip"}
    else:
        OmegaConf.update(node, path, value)
    with pytest.raises(ConfigError, match=match):
        build_algorithm(node, 12)


def test_aggregation_is_the_paper_batch_objective():
    """seq-mean-token-sum with weight n_g c_k gives 1/(#prompts) Σ_x Σ_k c_k s_k."""
    batch, model = toy_batch([1, 0, 0, 1, 0, 1, 0, 0], 4, seed=9)
    alg = algo("lpo_fwd")
    alg.compute_advantages(batch)
    alg.prepare_minibatch(batch, lambda b: model.logprobs(b).detach())
    agg = Aggregator.for_batch("seq-mean-token-sum", batch)
    value, _ = alg.loss(batch, model.logprobs(batch), None, agg)
    s = sequence_scores(model.logprobs(batch), batch["old_logprobs"], batch["response_mask"])
    expected = float((batch["lpo_c"] * s.detach()).sum() / 2)
    assert float(value.detach()) == pytest.approx(expected, rel=1e-5)
