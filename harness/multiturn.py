"""Multi-turn (tool-using) generation, token-in/token-out.

A trajectory alternates model segments and tool results. Each round, every unfinished trajectory
generates its next segment from its own token prefix (prompt + everything so far) until a stop
string of the task's :class:`~harness.tools.ToolEnv` (a tool's closing tag or ``</answer>``), EOS,
or its token budget. A segment that ends with ``</tool>`` has its query run (all of a round's
calls at once in a thread pool, so a slow tool delays only its own trajectory's next segment);
the result text is tokenised by the engine and appended with loss mask 0 and log-prob 0.

The ids trained on are exactly the ids the engine generated plus the tool-result ids: the
response is never decoded and re-encoded (``tests/engine/test_multiturn.py`` checks this). Each
trajectory records its turn boundaries (response offsets where a model segment starts) and its
tool calls (name, query, ok, latency).

:class:`TurnState` is the unit a branching strategy (ARPO, AEPO) copies to fork a trajectory.
"""

from __future__ import annotations

import dataclasses
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.tools import ToolEnv
from harness.types import Example, SamplingParams, Trajectory

_POOL = ThreadPoolExecutor(4, thread_name_prefix="rlbench-tools")


@dataclass
class TurnState:
    """One trajectory in progress."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)  # response offsets of model segments
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None  # set when the trajectory is done
    # lineage, for branching strategies: the state it was forked from and the shared length
    parent: int | None = None
    shared_len: int = 0
    segment_entropies: list[float] = field(default_factory=list)  # per model segment
    last_tool_end: int = 0  # response length right after the latest tool result

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def fork(self, at: int) -> TurnState:
        """A copy sharing the first ``at`` response tokens (its continuation is re-sampled)."""
        calls = [c for c in self.tool_calls if c["end"] <= at]
        return TurnState(
            prompt_ids=list(self.prompt_ids), response_ids=self.response_ids[:at],
            logprobs=self.logprobs[:at], entropy=self.entropy[:at],
            loss_mask=self.loss_mask[:at], turn_starts=[s for s in self.turn_starts if s < at],
            tool_calls=[dict(c) for c in calls], shared_len=at, last_tool_end=at,
            segment_entropies=self.segment_entropies[: len([s for s in self.turn_starts
                                                            if s < at])])

    def to_trajectory(self, decode: Any) -> Trajectory:
        return Trajectory(
            prompt_ids=self.prompt_ids, response_ids=list(self.response_ids),
            logprobs=torch.tensor(self.logprobs, dtype=torch.float32),
            entropy=torch.tensor(self.entropy, dtype=torch.float32),
            loss_mask=list(self.loss_mask), finish_reason=self.finish_reason or "length",
            text=decode(self.response_ids), turn_boundaries=list(self.turn_starts),
            tool_calls=[dict(c) for c in self.tool_calls])


def _tool_request(text: str, stop: str | None, env: ToolEnv) -> tuple[str, str] | None:
    """(tool name, query) when the segment ends with a tool's closing tag."""
    if stop is None or not stop.startswith("</") or stop == env.answer_close:
        return None
    name = stop[2:-1]
    if name not in env.tools:
        return None
    match = re.search(rf"<{re.escape(name)}>(.*)</{re.escape(name)}>\s*$", text, re.S)
    return name, (match.group(1) if match else "")


def step_round(engine: Any, states: list[TurnState], params: SamplingParams, env: ToolEnv,
               generator: torch.Generator | None = None) -> list[TurnState]:
    """Advance every unfinished state by one model segment (and its tool call). Returns the states
    that generated in this round, in order."""
    active = [s for s in states if not s.done]
    if not active:
        return []
    budget = [env.max_total_tokens - len(s.response_ids) for s in active]
    seg_params = dataclasses.replace(
        params, n=1, stop=tuple(env.stop_strings()), entropy=True,
        max_new_tokens=max(1, min(params.max_new_tokens, max(budget))))
    kwargs = {"generator": generator} if generator is not None else {}
    outs = engine.generate([s.prompt_ids + s.response_ids for s in active], seg_params, **kwargs)
    requests = []
    for s, out, room in zip(active, outs, budget, strict=True):
        ids = out.response_ids[: max(room, 0)]
        cut = len(ids) < len(out.response_ids)
        s.turn_starts.append(len(s.response_ids))
        s.response_ids += ids
        s.logprobs += out.logprobs[: len(ids)].tolist()
        ent = out.entropy[: len(ids)] if out.entropy is not None else torch.zeros(len(ids))
        s.entropy += ent.tolist()
        s.segment_entropies.append(float(ent[:20].sum()))  # ARPO: first <= 20 tokens, summed
        s.loss_mask += [1] * len(ids)
        if cut or len(s.response_ids) >= env.max_total_tokens:
            s.finish_reason = "length"
            continue
        request = _tool_request(out.text, out.stop_string, env)
        if request is None:  # EOS, </answer>, or the segment's own length limit
            s.finish_reason = "length" if out.finish_reason == "length" else "stop"
            continue
        requests.append((s, *request))
    futures = [(s, name, query, _POOL.submit(_timed_call, env, s, name, query))
               for s, name, query in requests]
    for s, name, query, fut in futures:
        result, ok, seconds = fut.result()
        ids = engine.encode_text(result)[: env.max_total_tokens - len(s.response_ids)]
        start = len(s.response_ids)
        s.response_ids += ids
        s.logprobs += [0.0] * len(ids)
        s.entropy += [0.0] * len(ids)
        s.loss_mask += [0] * len(ids)
        s.last_tool_end = len(s.response_ids)
        s.tool_calls.append({"name": name, "query": query, "ok": ok, "latency_s": seconds,
                             "start": start, "end": len(s.response_ids)})
        if len(s.response_ids) >= env.max_total_tokens:
            s.finish_reason = "length"
    return active


def _timed_call(env: ToolEnv, state: TurnState, name: str, query: str) -> tuple[str, bool, float]:
    t0 = time.perf_counter()
    if len(state.tool_calls) >= env.max_calls:
        text = f"{env.result_open}error: tool-call budget of {env.max_calls} used up" \
               f"{env.result_close}"
        return text, False, time.perf_counter() - t0
    text, ok = env.call(name, query)
    return text, ok, time.perf_counter() - t0


def generate_multiturn(engine: Any, examples: list[Example], params: SamplingParams,
                       env: ToolEnv, generator: torch.Generator | None = None
                       ) -> list[Trajectory]:
    """``params.n`` multi-turn trajectories per example, prompt-major, like ``engine.generate``."""
    if any(ex.images for ex in examples):
        # each round re-prefills prompt + response as plain ids, which would drop the pixels
        raise NotImplementedError("multi-turn (tool) rollouts do not carry images yet: "
                                  f"example {next(ex.id for ex in examples if ex.images)!r}")
    states = [TurnState(prompt_ids=engine.encode_prompt(ex))
              for ex in examples for _ in range(params.n)]
    while step_round(engine, states, params, env, generator):
        pass
    trajs = [s.to_trajectory(engine.decode) for s in states]
    for i, t in enumerate(trajs):
        t.group_id = i // params.n
    return trajs


def tool_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Per-step tool statistics: calls per trajectory (all and by tool), failed calls, share of
    response tokens masked out (tool results), turns per trajectory."""
    n = max(len(trajs), 1)
    names = sorted({c["name"] for t in trajs for c in t.tool_calls})
    out = {"tools/calls_per_traj": sum(len(t.tool_calls) for t in trajs) / n,
           "tools/failed_calls": float(sum(not c["ok"] for t in trajs for c in t.tool_calls)),
           "tools/turns_per_traj": sum(len(t.turn_boundaries) for t in trajs) / n}
    for name in names:
        out[f"tools/{name}_per_traj"] = sum(
            c["name"] == name for t in trajs for c in t.tool_calls) / n
    tokens = sum(len(t.response_ids) for t in trajs)
    masked = sum(len(t.response_ids) - sum(t.loss_mask or []) for t in trajs)
    out["tools/masked_token_frac"] = masked / max(tokens, 1)
    return out
