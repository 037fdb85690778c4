"""LANTERN track: the spec's §4.5 properties, DFA generation and validation, the environments."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from lantern.agent import (
    LanternAgent,
    QLearningAgent,
    Source,
    TransferContext,
    automaton_values,
    gate,
    teacher_policy,
    trust_exp,
    trust_sem,
)
from lantern.dfa import (
    DfaValidationError,
    LlmDfaGenerator,
    TemplateDfaGenerator,
    dfa_to_json,
    parse_dfa_json,
)
from lantern.embed import neighbour_weights, neighbourhood
from lantern.envs import ENVS, AutomatonGridEnv

OFFICE = ENVS.get("office")
TASK = "get coffee, then get mail, then go to the office, avoiding decorations"


class FakeEmbedder:
    """Deterministic unit vectors per text (no model): enough for the agent's arithmetic."""

    def embed(self, texts: list[str]) -> np.ndarray:
        out = []
        for t in texts:
            # a stable digest: str hash() is salted per process (PYTHONHASHSEED), which made
            # the vectors, and the tests reading them, change from run to run
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "big")
            v = np.random.default_rng(seed).normal(size=64)
            out.append(v / np.linalg.norm(v))
        return np.stack(out)


def _ctx(seed: int = 0, sources: list[Source] | None = None, task: str = TASK
         ) -> TransferContext:
    dfa = TemplateDfaGenerator(OFFICE.vocab).generate(task)
    return TransferContext(OFFICE.n_cells, dfa, sources or [], FakeEmbedder(),
                           np.random.default_rng(seed))


def _random_source(name: str, description: str, seed: int) -> Source:
    dfa = TemplateDfaGenerator(OFFICE.vocab).generate(description)
    q = np.random.default_rng(seed).uniform(0, 1, size=(OFFICE.n_cells, dfa.n_states, 4))
    return Source(name, dfa, q)


def _train(agent: QLearningAgent, ctx: TransferContext, episodes: int) -> np.ndarray:
    env = AutomatonGridEnv(OFFICE, ctx.target_dfa, max_steps=60, rng=random.Random(0))
    agent.prepare(ctx, env.n_actions)
    terminal = ctx.target_dfa.accepting | ctx.target_dfa.rejecting
    for _ in range(episodes):
        s, w = env.reset()
        done = False
        while not done:
            a = agent.act(s, w)
            s2, w2, r, done, _ = env.step(a)
            agent.update(s, w, a, r, s2, w2, w2 in terminal)
            s, w = s2, w2
    return agent.q


# -- §4.5 properties ---------------------------------------------------------------------------


@pytest.mark.parametrize("gate_kind", ["off", "fixed"])
def test_tau_one_is_plain_q_learning(gate_kind):
    """τ = 1 (gate off, or fixed at 1) reproduces Q-learning's table exactly, teachers present."""
    sources = [_random_source("s", "get coffee, then go to the office, avoiding decorations", 1)]
    task = "get coffee, avoiding decorations"  # short: rewards arrive within a few episodes
    plain = _train(QLearningAgent(QLearningAgent.Config()), _ctx(0, sources, task), 40)
    lantern = _train(LanternAgent(LanternAgent.Config(gate=gate_kind, tau_fixed=1.0)),
                     _ctx(0, sources, task), 40)
    assert np.abs(plain).sum() > 0  # it learned something to compare
    np.testing.assert_allclose(lantern, plain, rtol=0, atol=1e-12)


def test_tau_one_update_equals_alpha_delta_and_tau_zero_ignores_td():
    sources = [_random_source("s", "get coffee, then go to the office, avoiding decorations", 2)]
    for tau in (1.0, 0.0):
        agent = LanternAgent(LanternAgent.Config(gate="fixed", tau_fixed=tau))
        agent.prepare(_ctx(0, sources), 4)
        agent.q[:] = np.random.default_rng(3).uniform(size=agent.q.shape)
        before = agent.q.copy()
        g = agent.guidance(10, 0, 2, 1.0, 0, False)
        delta = agent.update(10, 0, 2, 1.0, 11, 0, terminal=False)
        change = agent.q[10, 0] - before[10, 0]
        if tau == 1.0:
            assert change[2] == pytest.approx(agent.cfg.alpha * delta)
            assert np.all(change[[0, 1, 3]] == 0)
        else:  # τ = 0: the update is the guidance, the same whatever the TD error
            np.testing.assert_allclose(change, agent.cfg.alpha * g)
            agent.q[:] = before
            agent.q[12, 0] = agent.q[11, 0] + 3.0  # another next cell: another δ_t
            agent.update(10, 0, 2, 1.0, 12, 0, terminal=False)
            np.testing.assert_allclose(agent.q[10, 0] - before[10, 0], agent.cfg.alpha * g)


@pytest.mark.parametrize("weighting", ["softmax", "linear"])
def test_neighbourhood_weights_are_non_negative_and_sum_to_one(weighting):
    rng = np.random.default_rng(0)
    for _ in range(50):
        sims = rng.uniform(-1, 1, size=rng.integers(1, 6))
        w = neighbour_weights(sims, weighting, temperature=0.05)
        assert np.all(w >= 0) and w.sum() == pytest.approx(1.0)
    target = rng.normal(size=(3, 8))
    sources = [rng.normal(size=(2, 8)), rng.normal(size=(4, 8))]
    nbrs, v_sem = neighbourhood(target, sources, top_m=3, weighting=weighting)
    for row in nbrs:
        assert len(row) == 3 and sum(n.weight for n in row) == pytest.approx(1.0)
        assert all(n.weight >= 0 for n in row)
    assert np.all((v_sem >= 0) & (v_sem <= 2))


def test_identical_single_source_has_zero_semantic_volatility():
    emb = np.random.default_rng(1).normal(size=(4, 8))
    nbrs, v_sem = neighbourhood(emb, [emb.copy()], top_m=1)
    np.testing.assert_allclose(v_sem, 0.0, atol=1e-12)
    assert [n[0].state for n in nbrs] == [0, 1, 2, 3]


def test_semantic_volatility_in_0_1_for_non_negative_embeddings():
    rng = np.random.default_rng(2)
    _, v_sem = neighbourhood(rng.uniform(size=(5, 6)), [rng.uniform(size=(3, 6))], top_m=2)
    assert np.all((v_sem >= 0) & (v_sem <= 1))


def test_aggregated_teacher_policy_is_a_distribution():
    sources = [_random_source("a", "get coffee, then go to the office, avoiding decorations", 4),
               _random_source("b", "get mail, then go to the office, avoiding decorations", 5)]
    agent = LanternAgent(LanternAgent.Config(top_m=3, weighting="linear"))
    agent.prepare(_ctx(0, sources), 4)
    pi = agent.pi_teacher
    assert np.all(pi >= 0)
    np.testing.assert_allclose(pi.sum(axis=-1), 1.0, atol=1e-12)
    q = np.random.default_rng(0).normal(size=(7, 4))
    q[0] = 1.0  # all ties
    np.testing.assert_allclose(teacher_policy(q, 0.1).sum(-1), 1.0)


@pytest.mark.parametrize("kind", ["product", "and"])
def test_gate_monotone_in_each_volatility(kind):
    """Rising V^exp lowers τ (more teacher); rising V^sem raises τ (less teacher)."""
    v = np.linspace(0, 1, 41)
    for fixed in (0.0, 0.2, 0.5, 1.0):
        tau_exp_sweep = gate(trust_exp(v, 50, 0.05), trust_sem(fixed, 10, 0.3), kind)
        tau_sem_sweep = gate(trust_exp(fixed, 50, 0.05), trust_sem(v, 10, 0.3), kind)
        assert np.all(np.diff(tau_exp_sweep) <= 0) and tau_exp_sweep[0] > tau_exp_sweep[-1]
        assert np.all(np.diff(tau_sem_sweep) >= 0) and tau_sem_sweep[-1] > tau_sem_sweep[0]
    assert np.all((tau_exp_sweep >= 0) & (tau_exp_sweep <= 1))


def test_product_gate_is_an_or_and_the_and_gate_needs_both():
    """Spec §4.3: teacher weight 1 − τ is large when either trust is low under the product, only
    when both are low under the AND gate."""
    low, high = 0.05, 0.95
    assert 1 - gate(low, high, "product") > 0.9 and 1 - gate(high, low, "product") > 0.9
    assert 1 - gate(low, high, "and") < 0.1 and 1 - gate(high, low, "and") < 0.1
    assert 1 - gate(low, low, "and") > 0.9


def test_bad_gate_and_weighting_name_the_key_and_valid_values():
    with pytest.raises(ValueError, match=r"agent.gate='or'.*product, and, off, fixed"):
        LanternAgent(LanternAgent.Config(gate="or"))
    with pytest.raises(ValueError, match=r"agent.weighting='cosine'.*softmax, linear"):
        LanternAgent(LanternAgent.Config(weighting="cosine"))


# -- the agent's wiring: volatilities, the gate, the strategic term ------------------------------

SOURCE_TASK = "get coffee, then go to the office, avoiding decorations"


def test_the_agent_gates_each_volatility_in_its_direction():
    """More experience volatility at (s, ω, a) lowers that action's τ (more teacher); a target
    state with more semantic volatility gets a higher τ (less teacher)."""
    same = _random_source("same", TASK, 1)  # identical descriptions: V^sem = 0
    agent = LanternAgent(LanternAgent.Config(exp_slope=10.0, sem_slope=10.0, sem_offset=0.5))
    agent.prepare(_ctx(0, [same]), 4)
    agent.v_exp[10, 0] = [0.0, 0.1, 0.4, 1.0]
    tau = agent.tau(10, 0)
    assert np.all(np.diff(tau) < 0)
    far = _random_source("far", "go to room a, then go to room b", 2)
    other = LanternAgent(LanternAgent.Config(exp_slope=10.0, sem_slope=10.0, sem_offset=0.5))
    other.prepare(_ctx(0, [far]), 4)
    assert other.v_sem[0] > agent.v_sem[0] + 0.3
    other.v_exp[10, 0] = agent.v_exp[10, 0]
    assert np.all(other.tau(10, 0) > tau)


def test_experience_volatility_is_an_ema_of_the_absolute_td_error():
    agent = LanternAgent(LanternAgent.Config(v_exp_init=0.2, ema_rate=0.5))
    agent.prepare(_ctx(0, [_random_source("s", SOURCE_TASK, 3)]), 4)
    agent.q[11, 0] = 0.0
    agent.q[10, 0, 1] = 0.8  # r = 0, Q(s') = 0: δ = −0.8 < 0
    delta = agent.update(10, 0, 1, 0.0, 11, 0, terminal=False)
    assert delta == pytest.approx(-0.8)
    assert agent.v_exp[10, 0, 1] == pytest.approx(0.2 + 0.5 * (0.8 - 0.2))


def test_automaton_values_are_the_visit_weighted_mean_of_the_source_q():
    src = _random_source("s", SOURCE_TASK, 4)
    visits = np.zeros_like(src.q)
    visits[5, 0, 1], visits[7, 0, 3] = 3, 1
    weighted = Source("s", src.dfa, src.q, visits)
    v = automaton_values(weighted)
    assert v[0] == pytest.approx((3 * src.q[5, 0, 1] + src.q[7, 0, 3]) / 4)
    assert v[1] == pytest.approx(src.q[:, 1].mean())  # never visited: the plain mean


def test_strategic_term_is_automaton_level_and_ignores_the_cell_layout():
    """Q^agg_AD(ω) = Σ w_k Q_k,AD(ω_k) is a function of the automaton state only: reshuffling a
    source's cells (another map with the same experience) leaves it unchanged, while the
    cell-level transplant (the ``cell`` ablation) changes."""
    src = _random_source("s", SOURCE_TASK, 5)
    src.visits = np.random.default_rng(6).integers(0, 5, size=src.q.shape).astype(float)
    perm = np.random.default_rng(7).permutation(src.q.shape[0])
    moved = Source("moved", src.dfa, src.q[perm], src.visits[perm])
    agents = {}
    for name, source in (("orig", src), ("moved", moved)):
        for strategic in ("automaton", "cell"):
            a = LanternAgent(LanternAgent.Config(strategic=strategic))
            a.prepare(_ctx(0, [source]), 4)
            agents[name, strategic] = a
    assert LanternAgent.Config().strategic == "automaton"
    np.testing.assert_allclose(agents["orig", "automaton"].v_agg,
                               agents["moved", "automaton"].v_agg)
    assert not np.allclose(agents["orig", "cell"].q_agg, agents["moved", "cell"].q_agg)
    # the target's "get coffee" state reads the source's "get coffee" state (identical text)
    a = agents["orig", "automaton"]
    assert a.v_agg[0] == pytest.approx(automaton_values(src)[0], rel=1e-6)


def test_strategic_target_follows_the_automaton_transition_of_the_action_taken():
    agent = LanternAgent(LanternAgent.Config(strategic_coef=1.0, tactical_coef=0.0))
    agent.prepare(_ctx(0, [_random_source("s", SOURCE_TASK, 8)]), 4)
    agent.v_agg[:] = [0.2, 0.5, 0.7, 0.9, 0.4]  # terminal entries must not be read
    agent.q[10, 0] = [0.1, 0.3, 0.0, 0.0]
    gamma = agent.cfg.gamma
    loop = agent.guidance(10, 0, 1, 0.0, 0, False)  # self-loop: ω's own value
    np.testing.assert_allclose(loop, [0, 0.2 - 0.3, 0, 0])
    edge = agent.guidance(10, 0, 1, 0.0, 1, False)  # subgoal edge: γ Q_AD(ω')
    np.testing.assert_allclose(edge, [0, gamma * 0.5 - 0.3, 0, 0])
    hazard = agent.guidance(10, 0, 0, 0.0, 4, True)  # terminal: the reward only
    np.testing.assert_allclose(hazard, [-0.1, 0, 0, 0])
    cell = LanternAgent(LanternAgent.Config(strategic="cell", tactical_coef=0.0))
    cell.prepare(_ctx(0, [_random_source("s", SOURCE_TASK, 8)]), 4)
    np.testing.assert_allclose(cell.guidance(10, 0, 1, 0.0, 0, False),
                               cell.q_agg[10, 0] - cell.q[10, 0])


def test_paraphrased_task_sources_share_no_state_description_with_the_target():
    from lantern.track import build_dfa, compose

    cfg = compose(["task=office_cmo_paraphrased", "tracking.enabled=false"])
    _, target = build_dfa(cfg, cfg.task.env, cfg.task.description)
    live = [target.descriptions[q] for q in range(target.n_states)
            if q not in target.accepting and q not in target.rejecting]
    for spec in cfg.task.sources:
        _, dfa = build_dfa(cfg, spec.env, spec.description)
        assert not set(live) & set(dfa.descriptions)
    assert cfg.task.alignment == "paraphrased" and cfg.task.env == "office"


# -- DFA generation ------------------------------------------------------------------------------


def test_template_parser_builds_a_total_dfa_with_descriptions():
    dfa = TemplateDfaGenerator(OFFICE.vocab).generate(TASK)
    assert dfa.n_states == 5  # 3 subgoals + accept + the decoration sink
    assert dfa.alphabet == ("*", "c", "m", "o")
    assert all((q, e) in dfa.delta for q in range(5) for e in dfa.alphabet)
    assert dfa.accepting == {3} and dfa.rejecting == {4}
    q = dfa.initial
    for e in ("m", "c", "c", "o", "m", "o"):  # mail first is ignored; coffee, mail, office
        q = dfa.step(q, e)
    assert q == 3
    assert dfa.step(1, "*") == 4
    assert "get coffee" in dfa.descriptions[0] and "get mail" in dfa.descriptions[1]


def test_template_parser_rejects_unknown_subgoals_listing_known_phrases():
    with pytest.raises(DfaValidationError, match=r"unknown subgoal 'get cofee'.*get coffee"):
        TemplateDfaGenerator(OFFICE.vocab).generate("get cofee, then go to the office")


def test_llm_generator_parses_a_stub_answer_and_retries_after_an_invalid_one():
    good = dfa_to_json(TemplateDfaGenerator(OFFICE.vocab).generate(TASK))
    answers = iter(["Sure! {not json", "Here it is: " + good + " Hope that helps."])
    prompts: list[str] = []

    def stub(prompt: str) -> str:
        prompts.append(prompt)
        return next(answers)

    dfa = LlmDfaGenerator(OFFICE.vocab, stub, retries=1).generate(TASK)
    assert dfa.n_states == 5 and dfa.accepting == {3}
    assert TASK in prompts[0] and "is invalid" in prompts[1]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda o: o["transitions"].pop(), "not total"),
    (lambda o: o.update(accepting=[]), "no accepting state"),
    (lambda o: o.update(transitions=[[t[0], t[1], t[0]] for t in o["transitions"]]),
     "no accepting state is reachable"),
    (lambda o: o["states"][1].update(description=" "), "no description"),
    (lambda o: o.update(initial="q9"), "unknown state 'q9'"),
    (lambda o: o["alphabet"].append("z"), "not in the map's alphabet"),
])
def test_dfa_validation_errors(mutate, message):
    import json

    obj = json.loads(dfa_to_json(TemplateDfaGenerator(OFFICE.vocab).generate(TASK)))
    mutate(obj)
    with pytest.raises(DfaValidationError, match=message):
        parse_dfa_json(json.dumps(obj), OFFICE.events)


def test_llm_generator_gives_up_with_every_error():
    gen = LlmDfaGenerator(OFFICE.vocab, lambda p: "no automaton here", retries=2)
    with pytest.raises(DfaValidationError, match=r"no valid DFA in 3 tries"):
        gen.generate(TASK)


# -- environments ---------------------------------------------------------------------------------


def test_env_rewards_only_the_accepting_transition_and_sinks_on_hazards():
    dfa = TemplateDfaGenerator(OFFICE.vocab).generate("get coffee, avoiding decorations")
    env = AutomatonGridEnv(OFFICE, dfa, max_steps=50)
    env.reset()
    # start (5,5) -> coffee at (5,1): four steps left
    results = [env.step(2) for _ in range(4)]
    assert [r[2] for r in results] == [0, 0, 0, 1.0] and results[-1][3] and results[-1][4]
    env.reset()
    env.s = OFFICE.width * 8 + 3  # next to the decoration at (8,2)
    _, q, r, done, success = env.step(2)
    assert done and not success and r == 0 and q in dfa.rejecting


def test_all_maps_share_one_shape_and_unknown_maps_list_the_valid_ones():
    shapes = {(ENVS.get(n).height, ENVS.get(n).width) for n in ENVS.names()}
    assert len(shapes) == 1
    with pytest.raises(KeyError, match=r"unknown lantern environment 'ofice'.*office"):
        ENVS.get("ofice")
