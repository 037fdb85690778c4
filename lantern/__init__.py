"""LANTERN: LLM-augmented neurosymbolic transfer with experience-gated reasoning networks — the
classic-RL transfer track of rlbench (method and sources: docs/lantern.md).

Q-learning transfer for tasks whose reward is given by an automaton (a DFA over subgoal events):

    Phase 1  D^tgt = (Ω, ω_0, Σ, δ, F) and desc(ω) from the task text       lantern.dfa
    Phase 2  φ(ω) = E(desc(ω)), cosine sim, top-M neighbours, weights w_k    lantern.embed
    Phase 3  Q^agg_AD(ω) = Σ w_k Q_k,AD(ω_k),  π^agg_teacher = Σ w_k π_k     lantern.agent
    Phase 4  τ = τ_exp(V^exp) · τ_sem(V^sem)   (or the AND gate)             lantern.agent
    Phase 5  ΔQ = α [τ δ_t + (1 − τ) G_multi]                                lantern.agent

Environments (``ENVS``), DFA generators (``DFA_GENERATORS``) and agents (``AGENTS``) are
``harness.registry.Registry`` instances; the runner (``lantern.track``) is reached through
``rlbench train|sweep track=lantern`` and the leaderboard through ``rlbench board --track lantern``.
Importing this package is light: the sentence-embedding model loads on first use.
"""

from lantern.agent import AGENTS
from lantern.dfa import DFA_GENERATORS
from lantern.envs import ENVS

__all__ = ["AGENTS", "DFA_GENERATORS", "ENVS"]
