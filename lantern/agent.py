"""Phases 3-5 of LANTERN (aggregation, gate, unified update) and the tabular baselines.

All agents learn a table Q(s, ω, a) over (cell, automaton state, action), act ε-greedily with
random tie-breaking, and differ in what they start from and how they update:

``qlearning``   Q₀ = q_init (0, or 1: optimistic);  ΔQ(s,ω,a) = α δ_t,
                δ_t = r + γ (1 − terminal) max_a' Q(s',ω',a') − Q(s,ω,a)
``single_best`` Q₀(s,ω,·) = Q_k*(s, ω_k*(ω), ·) of the one source k* whose states are closest
                in meaning to the target's (mean over ω of max cosine), ω_k*(ω) its most similar
                state; then Q-learning.
``uniform``     Q₀(s,ω,·) = (1/K) Σ_k Q_k(s, ω_k(ω), ·), each source's most similar state, equal
                weights; then Q-learning.
``lantern``     Q₀ = 0 and the unified update with the teachers of every source:

    Strategic   Q^agg_AD(ω)           = Σ_{k∈N_M(ω)} w_k Q_{k,AD}(ω_k)      (automaton level)
                Q_{k,AD}(ω_k)         = Σ_{s,a} N_k(s,ω_k,a) Q_k(s,ω_k,a) / Σ_{s,a} N_k(s,ω_k,a)
    Tactical    π^agg_teacher(a|s,ω)  = Σ_{k∈N_M(ω)} w_k π_k(a | s, ω_k),
                π_k = (1 − ε_T) greedy(Q_k) + ε_T / |A|   (a distribution; ties split)
    Volatility  V^exp(s,ω,a) ← (1 − η) V^exp + η |δ_t|   (EMA; V^exp₀ = v_exp_init: unvisited
                pairs count as unstable, so teachers speak first);  V^sem(ω) = 1 − max_k sim
    Trust       τ_exp = σ(−k_exp (V^exp − c_exp))  (falls as V^exp rises: more teacher)
                τ_sem = σ( k_sem (V^sem − c_sem))  (rises with V^sem: less teacher)
    Gate        product (default, as the notes write it):   τ = τ_exp · τ_sem
                and    (gate=and, the spec's §4.3 reading):  τ = 1 − (1 − τ_exp)(1 − τ_sem)
    Guidance    G_multi(a) = c_strat G_strat(a) + c_tact (π^agg_teacher(a|s,ω) − π_Q(a|s,ω)),
                π_Q = softmax(Q/β)  (the tactical term is −∂KL(π_teacher ‖ π_Q)/∂Q(a) up to 1/β)
    Update      ΔQ(s,ω,a) = α [τ δ_t + (1 − τ) G_multi(a)]       for the action taken
                ΔQ(s,ω,b) = α (1 − τ_b) G_multi(b)                for the others
                (guide_all_actions=true: the tactical guidance needs no sample, so it is applied
                to every action of the visited (s, ω); false: the taken action only.)

The strategic term (``strategic``):

* ``automaton`` (default, the method's Q_AD): the value each source's experience gives its
  automaton states, N_k(s, ω, a) the visit counts of the source's own experience (its replay
  buffer, ``Source.visits``; uniform over the table when none is recorded) — automaton
  distillation's "dynamic" transfer (Singireddy et al., arXiv 2310.19137), which LANTERN's notes
  name Q_AD. Nothing of it depends on a cell, so it needs no alignment of the maps. It is a target
  for the *experienced automaton transition* ω → ω' of the action taken:

      G_strat(a) = y_AD − Q(s,ω,a),   y_AD = Q^agg_AD(ω)                      if ω' = ω
                                      y_AD = r + γ (1 − terminal) Q^agg_AD(ω') if ω' ≠ ω

  (a subgoal edge earns the next automaton state's value, a hazard edge the terminal reward 0, a
  self-loop the state's own value); the other actions get no strategic term (their ω' is not
  observed).
* ``cell`` (ablation: the cell-level transplant this track used before): Q^agg(s,ω,a) =
  Σ_k w_k Q_k(s, ω_k, a), G_strat(a) = Q^agg(s,ω,a) − Q(s,ω,a) for every action. It reads each
  source's Q-table at the target's cell, which means something only because all maps here share
  one shape; it is not the method.
* ``off``: tactical guidance only.

The product gate gives the teacher weight 1 − τ_exp τ_sem, which is large when *either* trust is
low (an OR); the notes say the teacher should weigh heavily only when learning is unstable *and*
the semantics align, which is the ``and`` gate's teacher weight (1 − τ_exp)(1 − τ_sem). The
product is the default because it is the formula the source writes; the leaderboard runs both.

τ = 1 makes every LANTERN update exactly Q-learning's (``gate=off``); τ = 0 ignores δ_t.

Known discrepancies: only the abstract and a summary of the paper were available; the form of
G_multi, every constant, and Q_AD's estimator (visit-weighted mean of the source's Q over its
experience in ω) are ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.registry import Registry
from lantern.embed import Embedder, neighbourhood

AGENTS: Registry = Registry("lantern agent")
GATES = ("product", "and", "off", "fixed")
STRATEGIC = ("automaton", "cell", "off")


def sigmoid(x: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def trust_exp(v_exp: np.ndarray | float, slope: float, offset: float) -> np.ndarray | float:
    """τ_exp: decreasing in the experience volatility (slope > 0)."""
    return sigmoid(-slope * (np.asarray(v_exp) - offset))


def trust_sem(v_sem: np.ndarray | float, slope: float, offset: float) -> np.ndarray | float:
    """τ_sem: increasing in the semantic volatility (slope > 0)."""
    return sigmoid(slope * (np.asarray(v_sem) - offset))


def gate(t_exp: np.ndarray | float, t_sem: np.ndarray | float, kind: str = "product",
         fixed: float = 1.0) -> np.ndarray | float:
    """τ from the two trusts: ``product`` τ_exp·τ_sem, ``and`` 1 − (1 − τ_exp)(1 − τ_sem),
    ``off`` 1 (plain Q-learning), ``fixed`` the constant ``fixed``."""
    t_exp, t_sem = np.asarray(t_exp, dtype=np.float64), np.asarray(t_sem, dtype=np.float64)
    if kind == "product":
        return t_exp * t_sem
    if kind == "and":
        return 1.0 - (1.0 - t_exp) * (1.0 - t_sem)
    if kind == "off":
        return np.ones(np.broadcast(t_exp, t_sem).shape)
    if kind == "fixed":
        return np.full(np.broadcast(t_exp, t_sem).shape, float(fixed))
    raise ValueError(f"gate {kind!r}; valid: {', '.join(GATES)}")


def softmax(x: np.ndarray, temperature: float) -> np.ndarray:
    z = (x - x.max(axis=-1, keepdims=True)) / temperature
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def teacher_policy(q: np.ndarray, eps: float) -> np.ndarray:
    """π_k(a|s,ω) = (1 − ε) · uniform over argmax_a Q + ε / |A|, for a table [..., A]."""
    best = np.isclose(q, q.max(axis=-1, keepdims=True), rtol=0.0, atol=1e-12)
    greedy = best / best.sum(axis=-1, keepdims=True)
    return (1.0 - eps) * greedy + eps / q.shape[-1]


@dataclass
class Source:
    """A learned source task: its DFA (for the state descriptions), its Q-table [S, Ω_k, A] and
    the visit counts N(s, ω, a) of its own experience (None: not recorded)."""

    name: str
    dfa: object
    q: np.ndarray
    visits: np.ndarray | None = None


def automaton_values(source: Source) -> np.ndarray:
    """Q_{k,AD}(ω) [Ω_k]: the source's Q averaged over its experience in each automaton state,
    weighted by the visit counts (every (s, a) equally when none were recorded or ω was never
    visited)."""
    q = source.q
    n = source.visits if source.visits is not None else np.ones_like(q)
    out = np.empty(q.shape[1])
    for w in range(q.shape[1]):
        weights = n[:, w]
        total = weights.sum()
        out[w] = (q[:, w] * weights).sum() / total if total > 0 else q[:, w].mean()
    return out


@dataclass
class TransferContext:
    """Everything an agent may use before training on the target."""

    n_cells: int
    target_dfa: object
    sources: list[Source]
    embedder: Embedder
    rng: np.random.Generator


def _live(dfa: object) -> list[int]:
    """Non-terminal automaton states (the ones an agent acts in)."""
    return [q for q in range(dfa.n_states)  # type: ignore[attr-defined]
            if q not in dfa.accepting and q not in dfa.rejecting]  # type: ignore[attr-defined]


def semantic_matches(ctx: TransferContext) -> tuple[np.ndarray, list[list[int]], list[int]]:
    """sims[k, ω] = max cosine between target state ω and source k's live states, the argmax
    source state per (k, ω), and the target's live states."""
    live_t = _live(ctx.target_dfa)
    emb_t = ctx.embedder.embed([ctx.target_dfa.descriptions[q] for q in live_t])  # type: ignore
    sims = np.zeros((len(ctx.sources), len(live_t)))
    best: list[list[int]] = []
    for k, src in enumerate(ctx.sources):
        live_k = _live(src.dfa)
        emb_k = ctx.embedder.embed([src.dfa.descriptions[q] for q in live_k])  # type: ignore
        c = emb_t @ emb_k.T
        sims[k] = c.max(axis=1)
        best.append([live_k[j] for j in c.argmax(axis=1)])
    return sims, best, live_t


class QLearningAgent:
    """Tabular ε-greedy Q-learning over (cell, automaton state) from Q₀ = 0."""

    @dataclass
    class Config:
        alpha: float = 0.5
        gamma: float = 0.95
        epsilon: float = 0.1
        q_init: float = 0.0  # Q₀ of every entry no source fills (> 0: optimistic exploration)

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.q: np.ndarray = np.zeros(0)
        self.rng = np.random.default_rng(0)
        self.stats: dict[str, float] = {}

    def prepare(self, ctx: TransferContext, n_actions: int) -> None:
        self.rng = ctx.rng
        self.q = np.full((ctx.n_cells, ctx.target_dfa.n_states, n_actions),  # type: ignore
                         float(self.cfg.q_init))
        q0 = self.initial_q(ctx)
        if isinstance(q0, np.ndarray):  # transferred rows replace Q₀; the rest keep q_init
            filled = np.any(q0 != 0, axis=(0, 2))
            self.q[:, filled] = q0[:, filled]

    def initial_q(self, ctx: TransferContext) -> np.ndarray | float:
        return 0.0

    def act(self, s: int, w: int, greedy: bool = False) -> int:
        row = self.q[s, w]
        if not greedy and self.rng.random() < self.cfg.epsilon:
            return int(self.rng.integers(len(row)))
        best = np.flatnonzero(row == row.max())  # random tie-break: Q₀ = 0 is all ties
        return int(best[0] if len(best) == 1 else self.rng.choice(best))

    def td_error(self, s: int, w: int, a: int, r: float, s2: int, w2: int,
                 terminal: bool) -> float:
        target = r if terminal else r + self.cfg.gamma * float(self.q[s2, w2].max())
        return target - float(self.q[s, w, a])

    def update(self, s: int, w: int, a: int, r: float, s2: int, w2: int,
               terminal: bool) -> float:
        delta = self.td_error(s, w, a, r, s2, w2, terminal)
        self.q[s, w, a] += self.cfg.alpha * delta
        return delta


AGENTS.register("qlearning", QLearningAgent)


@AGENTS.register("single_best")
class SingleBestSourceAgent(QLearningAgent):
    """Q-learning started from the Q-table of the one semantically closest source task."""

    def initial_q(self, ctx: TransferContext) -> np.ndarray | float:
        if not ctx.sources:
            return 0.0
        sims, best, live = semantic_matches(ctx)
        k = int(np.argmax(sims.mean(axis=1)))
        self.stats = {"transfer/source_index": float(k),
                      "transfer/source_sim": float(sims[k].mean())}
        q0 = np.zeros((ctx.n_cells, ctx.target_dfa.n_states, ctx.sources[k].q.shape[2]))  # type: ignore
        for j, w in enumerate(live):
            q0[:, w] = ctx.sources[k].q[:, best[k][j]]
        return q0


@AGENTS.register("uniform")
class UniformAveragingAgent(QLearningAgent):
    """Q-learning started from the equal-weight average of every source's closest state."""

    def initial_q(self, ctx: TransferContext) -> np.ndarray | float:
        if not ctx.sources:
            return 0.0
        _, best, live = semantic_matches(ctx)
        q0 = np.zeros((ctx.n_cells, ctx.target_dfa.n_states, ctx.sources[0].q.shape[2]))  # type: ignore
        for j, w in enumerate(live):
            q0[:, w] = np.mean([src.q[:, best[k][j]] for k, src in enumerate(ctx.sources)], axis=0)
        return q0


@AGENTS.register("lantern")
class LanternAgent(QLearningAgent):
    """LANTERN: semantic multi-source teachers mixed into the TD update by the dual gate."""

    @dataclass
    class Config(QLearningAgent.Config):
        top_m: int = 2  # M: source states in each target state's neighbourhood
        weighting: str = "softmax"  # softmax | linear (spec §4.2: both readings)
        weight_temperature: float = 0.01  # T of softmax(sim / T)
        gate: str = "product"  # product (notes) | and (spec §4.3) | off (τ = 1) | fixed
        strategic: str = "automaton"  # automaton (Q_AD, the method) | cell (ablation) | off
        tau_fixed: float = 1.0  # τ when gate=fixed
        ema_rate: float = 0.1  # η of V^exp
        v_exp_init: float = 1.0  # V^exp before any visit: unstable, so teachers lead at first
        exp_slope: float = 50.0  # k_exp
        exp_offset: float = 0.05  # c_exp
        sem_slope: float = 25.0  # k_sem
        sem_offset: float = 0.2  # c_sem (MiniLM: same-subgoal states ~1.0, unrelated ~0.55)
        strategic_coef: float = 1.0  # c_strat
        tactical_coef: float = 0.1  # c_tact
        student_temperature: float = 0.02  # β of π_Q = softmax(Q / β)
        teacher_epsilon: float = 0.1  # ε_T of each source's teacher policy
        guide_all_actions: bool = True

    cfg: Config

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        for key, valid in (("weighting", ("softmax", "linear")), ("gate", GATES),
                           ("strategic", STRATEGIC)):
            if getattr(cfg, key) not in valid:
                raise ValueError(f"agent.{key}={getattr(cfg, key)!r} is not one of: "
                                 f"{', '.join(valid)}")
        self._tau_sum, self._tau_n = 0.0, 0

    def prepare(self, ctx: TransferContext, n_actions: int) -> None:
        super().prepare(ctx, n_actions)
        cfg, dfa = self.cfg, ctx.target_dfa
        shape = self.q.shape
        self.q_agg = np.zeros(shape)  # cell-level transplant (strategic=cell)
        self.v_agg = np.zeros(shape[1])  # Q^agg_AD(ω) (strategic=automaton)
        self.pi_teacher = np.full(shape, 1.0 / n_actions)
        self.v_sem = np.ones(shape[1])
        self.v_exp = np.full(shape, float(cfg.v_exp_init))
        self.neighbours: dict[int, list] = {}
        live_t = _live(dfa)
        if ctx.sources and live_t:
            emb_t = ctx.embedder.embed([dfa.descriptions[q] for q in live_t])  # type: ignore
            live_src = [_live(src.dfa) for src in ctx.sources]
            emb_src = [ctx.embedder.embed([src.dfa.descriptions[q] for q in lv])  # type: ignore
                       for src, lv in zip(ctx.sources, live_src)]
            nbrs, v_sem = neighbourhood(emb_t, emb_src, cfg.top_m, cfg.weighting,
                                        cfg.weight_temperature, live_src)
            policies = [teacher_policy(src.q, cfg.teacher_epsilon) for src in ctx.sources]
            q_ad = [automaton_values(src) for src in ctx.sources]
            for j, w in enumerate(live_t):
                self.neighbours[w] = nbrs[j]
                self.v_sem[w] = v_sem[j]
                self.v_agg[w] = sum(n.weight * q_ad[n.source][n.state] for n in nbrs[j])
                self.q_agg[:, w] = sum(n.weight * ctx.sources[n.source].q[:, n.state]
                                       for n in nbrs[j])
                self.pi_teacher[:, w] = sum(n.weight * policies[n.source][:, n.state]
                                            for n in nbrs[j])
        self.t_sem = trust_sem(self.v_sem, cfg.sem_slope, cfg.sem_offset)
        self.stats = {"sem/v_sem_mean": float(np.mean([self.v_sem[w] for w in live_t]))
                      if live_t else 1.0,
                      "sem/max_sim_mean": float(np.mean([1.0 - self.v_sem[w] for w in live_t]))
                      if live_t else 0.0}

    def tau(self, s: int, w: int) -> np.ndarray:
        """τ for every action at (s, ω), from the current volatilities."""
        cfg = self.cfg
        t_exp = trust_exp(self.v_exp[s, w], cfg.exp_slope, cfg.exp_offset)
        return gate(t_exp, self.t_sem[w], cfg.gate, cfg.tau_fixed)

    def strategic_target(self, w: int, r: float, w2: int, terminal: bool) -> float:
        """y_AD of the automaton transition ω → ω' (``strategic=automaton``)."""
        if w2 == w:
            return float(self.v_agg[w])
        return r if terminal else r + self.cfg.gamma * float(self.v_agg[w2])

    def guidance(self, s: int, w: int, a: int, r: float, w2: int, terminal: bool) -> np.ndarray:
        """G_multi for every action at (s, ω), the action ``a`` having led to ω' = ``w2``."""
        cfg, q = self.cfg, self.q[s, w]
        pi_q = softmax(q, cfg.student_temperature)
        strat = np.zeros_like(q)
        if cfg.strategic == "automaton":
            strat[a] = self.strategic_target(w, r, w2, terminal) - q[a]
        elif cfg.strategic == "cell":
            strat = self.q_agg[s, w] - q
        return cfg.strategic_coef * strat + cfg.tactical_coef * (self.pi_teacher[s, w] - pi_q)

    def update(self, s: int, w: int, a: int, r: float, s2: int, w2: int,
               terminal: bool) -> float:
        cfg = self.cfg
        delta = self.td_error(s, w, a, r, s2, w2, terminal)
        self.v_exp[s, w, a] += cfg.ema_rate * (abs(delta) - self.v_exp[s, w, a])
        tau = self.tau(s, w)
        if cfg.gate == "off":  # exactly Q-learning's arithmetic, not just τ ≈ 1
            self.q[s, w, a] += cfg.alpha * delta
            return delta
        g = self.guidance(s, w, a, r, w2, terminal)
        step = (1.0 - tau) * g
        if not cfg.guide_all_actions:
            step = np.where(np.arange(len(step)) == a, step, 0.0)
        step[a] += tau[a] * delta
        self.q[s, w] += cfg.alpha * step
        self._tau_sum += float(tau[a])
        self._tau_n += 1
        return delta

    def pop_tau_mean(self) -> float:
        """Mean τ of the taken actions since the last call (nan when none)."""
        out = self._tau_sum / self._tau_n if self._tau_n else math.nan
        self._tau_sum, self._tau_n = 0.0, 0
        return out
