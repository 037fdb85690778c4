"""The LANTERN track's runner: one Hydra cell = one agent on one target task with one seed.

    rlbench train track=lantern agent=lantern task=office_cmo seed=0
    rlbench sweep track=lantern sweep=targets            (conf/lantern/sweep/targets.yaml)
    rlbench board --track lantern                        (leaderboards/lantern/)

The primary config is ``conf/lantern/config.yaml`` (groups ``agent/``, ``task/``, ``sweep/``),
typed by :class:`LanternConfig`. A cell:

1. builds the target's DFA with the configured generator (``dfa.generator``: ``template`` or
   ``llm``) and each source task's DFA the same way;
2. trains each source task by plain Q-learning (``source.*``; a fixed seed, so every target seed
   sees the same teachers; memoised in-process, so a sweep trains each source once);
3. trains the agent on the target for ``train.episodes`` episodes, evaluating the greedy policy
   every ``eval.every`` episodes (``eval.episodes`` rollouts, random tie-breaks);
4. logs to MLflow (experiment ``lantern`` by default): per evaluation ``eval/success``,
   ``train/success_rate``, ``train/env_steps``, ``lantern/tau_mean``; at the end
   ``final/success`` (mean of the last ``eval.final_window`` evaluations), ``final/auc`` (mean
   eval success over the whole run: the normalised area under the learning curve),
   ``final/episodes_to_threshold`` and ``final/steps_to_threshold`` (the first evaluation with
   success >= ``eval.threshold``; the budget when never reached, with ``final/reached`` = 0),
   and artifacts ``dfa.json`` and ``neighbourhood.json``.

A cell whose MLflow run FINISHED with the same config hash (``harness.cell_plan.config_hash``) is
skipped; tabular runs take seconds, so an unfinished one is simply run again.
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from harness.cell_plan import HASH_TAG, config_hash
from harness.config import CONF_DIR as _HARNESS_CONF
from harness.config import TrackingConfig, check_block_seed
from harness.typed_config import ConfigError, build
from lantern.agent import AGENTS, LanternAgent, QLearningAgent, Source, TransferContext
from lantern.dfa import DFA_GENERATORS, Dfa, DfaValidationError, dfa_to_json
from lantern.envs import ENVS, AutomatonGridEnv, GridMap

CONF_DIR = _HARNESS_CONF / "lantern"  # shipped with rlbench's configs (harness.config.conf_dir)
KIND = "lantern"


@dataclass
class SourceSpec:
    env: str = "office"
    description: str = ""


@dataclass
class TaskSpec:
    name: str = "office_cmo"
    env: str = "office"
    description: str = ""
    sources: list[SourceSpec] = field(default_factory=list)
    alignment: str = "aligned"  # aligned | paraphrased | misaligned (behaviour) | unrelated


@dataclass
class TrainSpec:
    episodes: int = 400
    max_steps: int = 150
    slip: float = 0.0


@dataclass
class EvalSpec:
    every: int = 10
    episodes: int = 3
    threshold: float = 0.8
    final_window: int = 5


@dataclass
class SourceTrainSpec:
    episodes: int = 1500
    epsilon: float = 0.2
    alpha: float = 0.5
    gamma: float = 0.95
    seed: int = 0
    random_starts: bool = True  # exploring starts: teachers whose values cover the whole map


@dataclass
class DfaSpec:
    generator: str = "template"  # template | llm
    model_path: str | None = None  # llm: a local model directory (never downloaded)
    backend: str = "hf"
    device: str = "cpu"
    retries: int = 2


@dataclass
class LanternConfig:
    track: str = "lantern"
    seed: int = 0
    # the seed a board pairs this run with (null: seed): an A/A control trains on seeds of its
    # own, paired with the baseline's runs of seed block_seed (conf/lantern/sweep/targets_aa.yaml)
    block_seed: int | None = None
    agent: Any = None
    task: TaskSpec = field(default_factory=TaskSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    source: SourceTrainSpec = field(default_factory=SourceTrainSpec)
    dfa: DfaSpec = field(default_factory=DfaSpec)
    tracking: TrackingConfig = field(default_factory=lambda: TrackingConfig(experiment="lantern"))


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="lantern_schema", node=LanternConfig)


def compose(overrides: list[str]) -> DictConfig:
    """The resolved track config for ``overrides`` (Hydra compose API, no run dir)."""
    from hydra import compose as _compose
    from hydra import initialize_config_dir

    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return _compose("config", overrides=overrides)


# -- building blocks ---------------------------------------------------------------------------


def make_generator(cfg: DictConfig, grid: GridMap) -> Any:
    name = cfg.dfa.generator
    cls = DFA_GENERATORS.get(name)  # unknown names list the valid ones
    if name == "llm":
        from lantern.dfa import backend_completion

        if not cfg.dfa.model_path:
            raise ConfigError("dfa.model_path must name a local model directory for "
                              "dfa.generator=llm")
        complete = backend_completion(cfg.dfa.model_path, cfg.dfa.backend, cfg.dfa.device)
        return cls(grid.vocab, complete, retries=cfg.dfa.retries)
    return cls(grid.vocab)


def build_dfa(cfg: DictConfig, env: str, description: str) -> tuple[GridMap, Dfa]:
    grid = ENVS.get(env)
    try:
        return grid, make_generator(cfg, grid).generate(description)
    except DfaValidationError as exc:
        raise ConfigError(f"task description {description!r} (map {env!r}): {exc}") from None


def run_episode(env: AutomatonGridEnv, agent: QLearningAgent, learn: bool,
                visits: np.ndarray | None = None) -> tuple[bool, int]:
    """One episode; returns (success, steps). ``learn=False``: greedy, no updates. ``visits``
    [S, Ω, A] counts the (s, ω, a) the agent acted in."""
    s, w = env.reset()
    terminal_states = env.dfa.accepting | env.dfa.rejecting
    while True:
        a = agent.act(s, w, greedy=not learn)
        if visits is not None:
            visits[s, w, a] += 1
        s2, w2, r, done, success = env.step(a)
        if learn:
            agent.update(s, w, a, r, s2, w2, w2 in terminal_states)
        s, w = s2, w2
        if done:
            return success, env.t


_SOURCES: dict[tuple, tuple[Source, float]] = {}


def train_source(cfg: DictConfig, spec: Any) -> tuple[Source, float]:
    """Plain Q-learning on a source task (memoised); returns it, with the visit counts of its
    training experience (LANTERN's automaton-level values Q_AD are averaged over them), and its
    greedy success."""
    sc, tc = cfg.source, cfg.train
    key = (spec.env, spec.description, sc.episodes, sc.epsilon, sc.alpha, sc.gamma, sc.seed,
           sc.random_starts, tc.max_steps, tc.slip, cfg.dfa.generator)
    if key in _SOURCES:
        return _SOURCES[key]
    grid, dfa = build_dfa(cfg, spec.env, spec.description)
    rng = np.random.default_rng(sc.seed)
    env = AutomatonGridEnv(grid, dfa, tc.max_steps, tc.slip, random.Random(sc.seed),
                           random_start=sc.random_starts)
    agent = QLearningAgent(QLearningAgent.Config(sc.alpha, sc.gamma, sc.epsilon))
    agent.prepare(TransferContext(grid.n_cells, dfa, [], None, rng), env.n_actions)  # type: ignore
    visits = np.zeros_like(agent.q)
    for _ in range(sc.episodes):
        run_episode(env, agent, learn=True, visits=visits)
    env.random_start = False  # its success is measured from S, as the target's
    success = float(np.mean([run_episode(env, agent, learn=False)[0] for _ in range(10)]))
    out = (Source(f"{spec.env}: {spec.description}", dfa, agent.q.copy(), visits), success)
    _SOURCES[key] = out
    return out


def agent_label(node: Any) -> str:
    return str(node.get("label") or node.get("name"))


def build_agent(node: Any) -> QLearningAgent:
    node = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "label"}
    try:
        return build(AGENTS, node, "agent")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# -- one cell ----------------------------------------------------------------------------------


def train_target(cfg: DictConfig, agent: QLearningAgent, env: AutomatonGridEnv,
                 log: Any = None) -> dict[str, float]:
    """Train on the target; ``log(metrics, episode)`` at each evaluation. Returns the summary."""
    ec, episodes = cfg.eval, cfg.train.episodes
    curve: list[tuple[int, float, int]] = []  # (episode, eval success, env steps so far)
    env_steps, window = 0, []
    for ep in range(1, episodes + 1):
        ok, steps = run_episode(env, agent, learn=True)
        env_steps += steps
        window.append(ok)
        if ep % ec.every == 0 or ep == episodes:
            succ = float(np.mean([run_episode(env, agent, learn=False)[0]
                                  for _ in range(ec.episodes)]))
            curve.append((ep, succ, env_steps))
            metrics = {"eval/success": succ, "train/success_rate": float(np.mean(window)),
                       "train/env_steps": float(env_steps)}
            if isinstance(agent, LanternAgent):
                metrics["lantern/tau_mean"] = agent.pop_tau_mean()
            window = []
            if log is not None:
                log(metrics, ep)
    hit = next(((e, st) for e, s, st in curve if s >= ec.threshold), None)
    last = [s for _, s, _ in curve[-ec.final_window:]]
    return {
        "final/success": float(np.mean(last)),
        "final/auc": float(np.mean([s for _, s, _ in curve])),
        "final/reached": 1.0 if hit else 0.0,
        "final/episodes_to_threshold": float(hit[0] if hit else episodes),
        "final/steps_to_threshold": float(hit[1] if hit else env_steps),
        "final/env_steps": float(env_steps),
    }


def _finished(tracker: Any, digest: str) -> str | None:
    runs = tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{HASH_TAG}` = '{digest}' and "
        f"tags.`rlbench.kind` = '{KIND}' and attributes.status = 'FINISHED'", max_results=1)
    return runs[0].info.run_id if runs else None


def run_cell(cfg: DictConfig) -> dict[str, float] | None:
    """Train one (agent, target task, seed) cell and log it; None when skipped."""
    from harness.tracking import Tracker, seed_tags

    if cfg.track != KIND:
        raise ConfigError(f"track={cfg.track!r}: this runner is the {KIND!r} track")
    if cfg.train.episodes < 1 or cfg.eval.every < 1 or cfg.eval.episodes < 1:
        raise ConfigError("train.episodes, eval.every and eval.episodes must be >= 1")
    check_block_seed(cfg)
    agent = build_agent(cfg.agent)
    label = agent_label(cfg.agent)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment, cfg.tracking.enabled)
    digest = config_hash(cfg)
    if tracker.enabled and (done := _finished(tracker, digest)):
        print(f"[lantern] skip {label} {cfg.task.name} s{cfg.seed}: run {done} FINISHED")
        return None
    t0 = time.time()
    grid, dfa = build_dfa(cfg, cfg.task.env, cfg.task.description)
    sources = [train_source(cfg, spec) for spec in cfg.task.sources]
    from lantern.embed import default_embedder

    rng = np.random.default_rng(cfg.seed)
    env = AutomatonGridEnv(grid, dfa, cfg.train.max_steps, cfg.train.slip,
                           random.Random(cfg.seed))
    ctx = TransferContext(grid.n_cells, dfa, [s for s, _ in sources], default_embedder(), rng)
    agent.prepare(ctx, env.n_actions)
    git = _git()
    tags = {"rlbench.kind": KIND, "rlbench.track": KIND, "rlbench.task": cfg.task.name,
            "rlbench.agent": label, **seed_tags(cfg), HASH_TAG: digest,
            "rlbench.alignment": cfg.task.alignment,
            "rlbench.git_commit": str(git["commit"]), "rlbench.git_dirty": str(git["dirty"]),
            **dict(cfg.tracking.tags)}
    tracker.start(cfg.tracking.run_name or f"{label}-{cfg.task.name}-s{cfg.seed}", tags)
    try:
        tracker.log_params(cfg)
        tracker.log_text(dfa_to_json(dfa), "dfa.json")
        tracker.log_json(_neighbourhood_report(agent, dfa, ctx), "neighbourhood.json")
        history: list[tuple[dict[str, float], int]] = []
        summary = train_target(cfg, agent, env, lambda m, ep: history.append((m, ep)))
        _log_history(tracker, history)  # one batch: SQLite writes dominate a tabular run
        summary.update({k: float(v) for k, v in agent.stats.items()})
        summary["final/source_success_mean"] = float(np.mean([s for _, s in sources])) \
            if sources else float("nan")
        summary["final/wall_s"] = time.time() - t0
        tracker.log_metrics({k: v for k, v in summary.items() if v == v}, cfg.train.episodes)
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end("FINISHED")
    print(f"[lantern] {label:<12} {cfg.task.name:<22} s{cfg.seed}: "
          f"episodes_to_threshold={summary['final/episodes_to_threshold']:.0f} "
          f"auc={summary['final/auc']:.3f} final={summary['final/success']:.2f}")
    return summary


_GIT: dict[str, Any] = {}


def _git() -> dict[str, Any]:
    """The repository's commit and whether tracked files differ from it (once per process: a
    sweep's cells run in one process from one tree)."""
    if not _GIT:
        from harness.manifest import git_state

        _GIT.update(git_state())
    return _GIT


def _log_history(tracker: Any, history: list[tuple[dict[str, float], int]]) -> None:
    if not tracker.enabled or not history:
        return
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, ep) for m, ep in history for k, v in m.items() if v == v]
    for start in range(0, len(items), 1000):
        tracker.client.log_batch(tracker.run_id, metrics=items[start : start + 1000])


def _neighbourhood_report(agent: Any, dfa: Dfa, ctx: TransferContext) -> dict[str, Any]:
    out: dict[str, Any] = {"target_states": list(dfa.descriptions),
                           "sources": [s.name for s in ctx.sources]}
    if isinstance(agent, LanternAgent):
        out["neighbourhoods"] = {
            dfa.descriptions[w]: [{"source": ctx.sources[n.source].name,
                                   "state": ctx.sources[n.source].dfa.descriptions[n.state],
                                   "cosine": round(n.sim, 4), "weight": round(n.weight, 4)}
                                  for n in nbrs]
            for w, nbrs in agent.neighbours.items()}
    return out


# -- Hydra entry points ------------------------------------------------------------------------


def _job(cfg: DictConfig) -> Any:
    from harness.registry import RegistryError

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the embedder's torch: one thread per job
    try:
        return run_cell(cfg)
    except (ConfigError, RegistryError) as exc:
        print(f"rlbench: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def run_hydra(overrides: list[str], multirun: bool) -> None:
    """``rlbench train|sweep track=lantern ...``: Hydra app over ``conf/lantern``."""
    import hydra

    register_schema()
    if not multirun:  # bad keys exit 2 naming the key, before Hydra's run dir is made
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        try:
            compose(overrides)
        except (HydraException, OmegaConfBaseException) as exc:
            print(f"rlbench: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    argv = ["rlbench", *(["--multirun"] if multirun else []), *overrides]
    saved, sys.argv = sys.argv, argv
    try:
        hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(_job)()
    finally:
        sys.argv = saved


def build_board(uri: str, experiment: str | None, out: str | None,
                log_to_mlflow: bool = True, allow_dirty: bool = False) -> list[Path]:
    from lantern.transfer_board import build_board as _build

    return _build(uri, experiment or "lantern", out or "leaderboards/lantern",
                  log_to_mlflow=log_to_mlflow, allow_dirty=allow_dirty)


class _Track:
    """What ``harness.registry.TRACKS`` holds for ``lantern``."""

    run_hydra = staticmethod(run_hydra)
    build_board = staticmethod(build_board)


TRACK = _Track()
