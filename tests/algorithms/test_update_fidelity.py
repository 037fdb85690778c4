"""The trainer's update loop as each method needs it, on a bigram toy model: rows with a zero
advantage still train when a KL or entropy term touches them (every bundle); no loss computes a
cross-row statistic after ``trainer.skip_zero_gradient`` drops rows (AEPO's entropy z-score);
π_old (LPO's s_θ) is re-evaluated after the first optimizer step of a batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import algorithms  # noqa: F401  (registers every bundle)
from algorithms.lpo import lpo_group_loss, sequence_scores
from harness.algorithm import build_algorithm
from harness.batch import RolloutBatch
from harness.engines import RolloutEngine, TrainEngine
from harness.trainer import Trainer
from harness.types import Score, Trajectory

CONF = Path(__file__).resolve().parents[2] / "conf" / "algorithm"
BUNDLES = sorted(p.stem for p in CONF.glob("*.yaml"))
V = 7


class ToyEngine(TrainEngine, RolloutEngine):
    """A bigram policy log π(y_t | y_{t-1}) = log_softmax(W[y_{t-1}] / T) with the train-engine
    methods the trainer calls; ``optimizer_step`` is plain SGD and records each step's grad."""

    def __init__(self, seed: int = 0, lr: float = 0.5) -> None:
        g = torch.Generator().manual_seed(seed)
        self.W = (torch.randn(V, V, generator=g) * 0.7).requires_grad_(True)
        self.lr = lr
        self.grads: list[torch.Tensor] = []

    def forward(self, mb: RolloutBatch, temperature: float, with_entropy: bool = True,
                entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        P, T = mb.prompt_length, mb["responses"].shape[1]
        prev = mb["input_ids"][:, P - 1 : P + T - 1]
        logp_all = torch.log_softmax(self.W[prev] / temperature, -1)
        logp = logp_all.gather(-1, mb["responses"][..., None]).squeeze(-1)
        entropy = None
        if with_entropy:
            src = logp_all if entropy_grad else logp_all.detach()
            entropy = -(src.exp() * src).sum(-1)
        return logp, entropy

    @torch.no_grad()
    def logprobs(self, mb: RolloutBatch, temperature: float, micro: int = 0,
                 reference: bool = False) -> torch.Tensor:
        return self.forward(mb, temperature, with_entropy=False)[0]

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self) -> float:
        grad = self.W.grad.clone() if self.W.grad is not None else torch.zeros_like(self.W)
        self.grads.append(grad)
        with torch.no_grad():
            self.W -= self.lr * grad
        self.W.grad = None
        return float(grad.norm())


def toy_batch(rewards: list[float], K: int, seed: int = 1, engine: ToyEngine | None = None
              ) -> RolloutBatch:
    """Groups of K responses of 2..5 tokens; old log-probs are the engine's (on-policy)."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i, r in enumerate(rewards):
        n = int(torch.randint(2, 6, (1,), generator=g))
        resp = torch.randint(0, V, (n,), generator=g).tolist()
        trajs.append(Trajectory([1, int(torch.randint(0, V, (1,), generator=g))], resp,
                                logprobs=torch.zeros(n), group_id=i // K, temperature=1.0,
                                score=Score(float(r), r > 0.5, True)))
    batch = RolloutBatch.from_trajectories(trajs, 0)
    engine = engine or ToyEngine()
    batch["old_logprobs"] = engine.logprobs(batch, 1.0) * batch["response_mask"]
    batch["rollout_logprobs"] = batch["old_logprobs"].clone()
    batch["ref_logprobs"] = (batch["old_logprobs"]
                             - 0.3 * torch.rand(batch["old_logprobs"].shape, generator=g))
    return batch


def shell_trainer(algo, engine: ToyEngine, **trainer) -> Trainer:
    """A Trainer with just what :meth:`Trainer.update` reads."""
    tr = Trainer.__new__(Trainer)
    tr.cfg = OmegaConf.create({
        "trainer": {"epochs": 1, "shuffle": False, "mini_batch_size": 0, "micro_batch_size": 0,
                    "skip_zero_gradient": True, "length_bucketing": False,
                    "optim": {"grad_clip": 1.0}, **trainer},
        "rollout": {"temperature": 1.0}})
    tr.algorithm, tr.engine = algo, engine
    return tr


def bundle(name: str, **overrides):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return build_algorithm(cfg, max_new_tokens=8)


# -- zero-advantage rows and the KL / entropy terms ----------------------------------------------
@pytest.mark.parametrize("name", BUNDLES)
@pytest.mark.parametrize("term", ["kl.coef", "entropy_coef"])
def test_zero_advantage_rows_still_train_when_a_kl_or_entropy_term_is_on(name, term):
    """A row with A = 0 has a gradient through the KL or entropy term, so ``gradient_rows`` must
    keep it (LPO included: there it is c_k = 0 that would drop it)."""
    batch = toy_batch([1.0, 1.0, 0.0, 1.0], K=2)
    algo = bundle(name, **{term: 0.05})
    batch["advantages"] = torch.zeros(len(batch))
    algo.prepare_minibatch(batch, lambda mb: mb["old_logprobs"])
    assert bool(algo.gradient_rows(batch).all()), name
    plain = bundle(name, **{"kl.coef": 0.0, "entropy_coef": 0.0})
    plain.prepare_minibatch(batch, lambda mb: mb["old_logprobs"])
    if name not in ("aepo",):  # without the terms a zero row carries nothing: it is dropped
        assert not bool(plain.gradient_rows(batch).any()), name


def test_skipping_with_a_kl_term_keeps_the_update_of_the_zero_advantage_rows():
    batch = toy_batch([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], K=2)
    grads = {}
    for skip in (True, False):
        algo = bundle("grpo", **{"kl.coef": 0.1})
        algo.compute_advantages(batch)
        engine = ToyEngine()
        shell_trainer(algo, engine, skip_zero_gradient=skip).update(batch)
        grads[skip] = engine.grads[0]
    assert (batch["advantages"] == 0).sum() == 4 and grads[False].abs().max() > 0
    assert torch.allclose(grads[True], grads[False], atol=1e-7)


# -- AEPO: the entropy z-score sees every row of the micro-batch --------------------------------
def test_aepo_update_does_not_depend_on_skipping_zero_advantage_rows():
    """The entropy z-score is over all valid tokens of the micro-batch (the source's): a
    zero-advantage row's tokens count, so skipping it must not change the other rows' update."""
    batch = toy_batch([1.0, 1.0, 1.0, 1.0, 0.0, 1.0], K=3)  # group 0 constant: A = 0
    grads = {}
    for skip in (True, False):
        algo = bundle("aepo")
        algo.compute_advantages(batch)
        engine = ToyEngine()
        shell_trainer(algo, engine, skip_zero_gradient=skip, micro_batch_size=4).update(batch)
        grads[skip] = engine.grads[0]
    assert (batch["advantages"] == 0).sum() == 3 and grads[False].abs().max() > 0
    assert torch.allclose(grads[True], grads[False], atol=1e-7)


def test_aepo_entropy_z_score_uses_the_unbiased_std_over_the_micro_batch():
    from algorithms.aepo import entropy_scaled_advantages

    ent = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = entropy_scaled_advantages(torch.ones(2, 3), ent, mask, 0.2)
    # H over the valid tokens: 1, 2, 3 -> mean 2, unbiased std 1
    assert out[0, 0] == pytest.approx(0.8) and out[1, 0] == pytest.approx(1.2)
    assert out[0, 1] == pytest.approx(1.0)


# -- π_old after the first optimizer step --------------------------------------------------------
@pytest.mark.parametrize("layout", [{"mini_batch_size": 4}, {"epochs": 2}])
def test_lpo_re_evaluates_pi_theta_after_the_first_optimizer_step(layout):
    """LPO's s_θ = Σ (log π_θ − log π_old) is 0 only before the first step of a batch; the next
    mini-batch (or epoch) must see the updated policy, else every step is the on-policy
    (fixed-advantage) gradient."""
    engine = ToyEngine()
    batch = toy_batch([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0], K=4, engine=engine)
    algo = bundle("lpo_rev")
    algo.compute_advantages(batch)
    tr = shell_trainer(algo, engine, **layout)
    rows = (torch.arange(4, 8) if "mini_batch_size" in layout else torch.arange(8))
    W1 = None

    def remember(step=engine.optimizer_step):  # the weights after the first step
        nonlocal W1
        out = step()
        if W1 is None:
            W1 = engine.W.detach().clone()
        return out

    engine.optimizer_step = remember
    tr.update(batch, old_is_current=True)
    assert len(engine.grads) == 2
    # the second step's gradient: autograd of the group losses at the weights after step one
    mb = batch.select(rows)
    W = W1.clone().requires_grad_(True)
    probe = ToyEngine()
    probe.W = W
    logp, _ = probe.forward(mb, 1.0)
    s = sequence_scores(logp, mb["old_logprobs"], mb["response_mask"])
    _, gi = torch.unique(mb["group_index"], return_inverse=True)
    G = int(gi.max()) + 1
    L = lpo_group_loss(s, mb["advantages"], gi, G, "rev")
    (L.sum() / G).backward()  # seq-mean-token-sum: Σ_g n_g L_g / B with n_g = B / G
    expected = W.grad
    assert torch.allclose(engine.grads[1], expected, atol=1e-6, rtol=1e-4)
    assert engine.grads[1].abs().max() > 0
