"""Phase 1 of LANTERN: the target task's DFA and a text description of every automaton state.

    D^tgt = (Ω, ω_0, Σ, δ, F),   desc(ω) for each ω ∈ Ω

A :class:`DfaGenerator` turns a task description into a validated :class:`Dfa`. Two are
registered in :data:`DFA_GENERATORS`:

* ``template`` (the embedded default): a deterministic parser of the task grammar

      task   := step (", then " step)* [", avoiding " hazard]
      step   := a phrase of the map's vocabulary ("get coffee", "go to the office", ...)

  producing states ω_0..ω_n (ω_i: i subgoals done; ω_n accepting) plus a rejecting sink when a
  hazard is named. δ(ω_i, e_i) = ω_{i+1}, δ(ω_i, hazard) = sink, every other event loops.
* ``llm``: prompts a language model (any harness rollout backend, e.g. ``hf`` with a local model
  path, or any ``prompt -> text`` callable) with the vocabulary, the JSON format and a worked
  example, then parses and validates its answer, retrying with the validation error appended.

Validation (:func:`validate_dfa`, shared by both): a known initial state, a non-empty accepting
set, every event in the map's alphabet, *total* transitions (each state × event exactly once),
an accepting state reachable from ω_0, and a non-empty description for every state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from harness.registry import Registry

DFA_GENERATORS: Registry = Registry("DFA generator")


class DfaValidationError(ValueError):
    """A DFA (or DFA text) that breaks a rule; the message says which."""


@dataclass(frozen=True)
class Dfa:
    """States are 0..n-1; ``descriptions[i]`` is desc(ω_i); ``delta[(i, e)]`` is δ(ω_i, e)."""

    descriptions: tuple[str, ...]
    initial: int
    accepting: frozenset[int]
    alphabet: tuple[str, ...]
    delta: dict[tuple[int, str], int] = field(hash=False)

    @property
    def n_states(self) -> int:
        return len(self.descriptions)

    @cached_property
    def rejecting(self) -> frozenset[int]:
        """States from which no accepting state is reachable (sinks: the episode fails)."""
        return frozenset(range(self.n_states)) - _coreachable(self)

    def step(self, q: int, event: str) -> int:
        return self.delta.get((q, event), q)  # events outside Σ (other maps' cells) loop


def _reachable(dfa: Dfa, start: int) -> set[int]:
    seen, todo = {start}, [start]
    while todo:
        q = todo.pop()
        for e in dfa.alphabet:
            nxt = dfa.delta.get((q, e), q)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _coreachable(dfa: Dfa) -> frozenset[int]:
    return frozenset(q for q in range(dfa.n_states) if _reachable(dfa, q) & dfa.accepting)


def validate_dfa(dfa: Dfa, events: list[str] | None = None) -> Dfa:
    """Raise :class:`DfaValidationError` unless ``dfa`` is well formed (see the module doc)."""
    n = dfa.n_states
    if n == 0:
        raise DfaValidationError("the DFA has no states")
    if not 0 <= dfa.initial < n:
        raise DfaValidationError(f"initial state {dfa.initial} is not one of the {n} states")
    if not dfa.accepting:
        raise DfaValidationError("the DFA has no accepting state")
    if not all(0 <= q < n for q in dfa.accepting):
        raise DfaValidationError(f"accepting states {sorted(dfa.accepting)} out of range 0..{n-1}")
    if events is not None:
        unknown = sorted(set(dfa.alphabet) - set(events))
        if unknown:
            raise DfaValidationError(f"events {unknown} are not in the map's alphabet {events}")
    missing = [(q, e) for q in range(n) for e in dfa.alphabet if (q, e) not in dfa.delta]
    if missing:
        raise DfaValidationError(
            f"transitions are not total: missing {len(missing)} (state, event) pairs, "
            f"e.g. {missing[:3]}")
    bad = {k: v for k, v in dfa.delta.items() if not 0 <= v < n}
    if bad:
        raise DfaValidationError(f"transitions to unknown states: {bad}")
    if not _reachable(dfa, dfa.initial) & dfa.accepting:
        raise DfaValidationError("no accepting state is reachable from the initial state")
    empty = [q for q, d in enumerate(dfa.descriptions) if not str(d).strip()]
    if empty:
        raise DfaValidationError(f"states {empty} have no description")
    return dfa


# -- the template parser ----------------------------------------------------------------------


def state_description(remaining: list[str], hazard: str | None) -> str:
    """desc(ω) of a sequence task's state: the subgoal the agent must achieve next.

    Only the next subgoal (and the hazard) is described: it is what decides the action, and the
    later subgoals are the automaton's business. With the whole remaining plan in the text the
    sentence embedding matched "get wood, then get iron, then use the factory" to a source's "get
    iron, then use the factory" (more shared words) instead of "get wood, then use the workbench"
    (the same next move)."""
    if not remaining:
        return "The task is complete: every subgoal has been achieved."
    return f"The agent must {remaining[0]} next" + (f", while avoiding {hazard}." if hazard
                                                     else ".")


@DFA_GENERATORS.register("template")
class TemplateDfaGenerator:
    """Deterministic parser of ``step, then step, ... [, avoiding hazard]`` over a vocabulary."""

    def __init__(self, vocab: dict[str, str]) -> None:
        self.vocab = {k.lower(): v for k, v in vocab.items()}

    def generate(self, description: str) -> Dfa:
        text = " ".join(description.lower().strip().rstrip(".").split())
        hazard = None
        for sep in (", while avoiding ", ", avoiding ", " while avoiding ", " avoiding "):
            if sep in text:
                text, hazard = text.split(sep, 1)
                break
        steps = [p.strip() for p in re.split(r",\s*then\s+|\s+then\s+|,\s*", text) if p.strip()]
        if not steps:
            raise DfaValidationError(f"task description {description!r} names no subgoal")
        events = [self._event(p, description) for p in steps]
        hazard_event = self._event(hazard, description) if hazard else None
        n = len(steps)
        descriptions = [state_description(steps[i:], hazard) for i in range(n + 1)]
        alphabet = sorted(set(events) | ({hazard_event} if hazard_event else set()))
        sink = None
        if hazard_event:
            sink = n + 1
            descriptions.append(f"The task has failed: the agent touched {hazard}.")
        delta: dict[tuple[int, str], int] = {}
        for q in range(len(descriptions)):
            for e in alphabet:
                if q < n and e == events[q]:
                    delta[(q, e)] = q + 1
                elif q < n and e == hazard_event:
                    delta[(q, e)] = sink  # type: ignore[assignment]
                else:
                    delta[(q, e)] = q  # accept and sink absorb; other events loop
        return validate_dfa(Dfa(tuple(descriptions), 0, frozenset({n}), tuple(alphabet), delta))

    def _event(self, phrase: str, description: str) -> str:
        key = phrase.strip().lower()
        if key not in self.vocab:
            import difflib

            close = difflib.get_close_matches(key, list(self.vocab), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise DfaValidationError(
                f"unknown subgoal {phrase!r} in task description {description!r}.{hint} "
                f"Known phrases: {', '.join(sorted(self.vocab))}")
        return self.vocab[key]


# -- the LLM generator ------------------------------------------------------------------------

PROMPT = """You write deterministic finite automata (DFAs) for gridworld tasks.
Events (one per labelled cell): {events}
Meaning of the events: {meanings}
Answer with one JSON object only:
{{"states": [{{"id": "q0", "description": "..."}}, ...], "initial": "q0",
 "accepting": ["..."], "alphabet": [events used],
 "transitions": [["from", "event", "to"], ...]}}
Every state needs a one-sentence description of what the agent must do next. Give a transition
for every state and every event of the alphabet (self-loops included).

Example task: {example_task}
Answer: {example_answer}

Task: {task}
Answer:"""


def dfa_to_json(dfa: Dfa) -> str:
    """The JSON form the LLM is asked for (also the few-shot example)."""
    return json.dumps({
        "states": [{"id": f"q{i}", "description": d} for i, d in enumerate(dfa.descriptions)],
        "initial": f"q{dfa.initial}",
        "accepting": [f"q{i}" for i in sorted(dfa.accepting)],
        "alphabet": list(dfa.alphabet),
        "transitions": [[f"q{q}", e, f"q{t}"] for (q, e), t in sorted(dfa.delta.items())],
    })


def parse_dfa_json(text: str, events: list[str] | None = None) -> Dfa:
    """Parse the first JSON object in ``text`` into a validated :class:`Dfa`."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise DfaValidationError("the answer contains no JSON object")
    try:
        obj = json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise DfaValidationError(f"the answer is not valid JSON: {exc}") from None
    for key in ("states", "initial", "accepting", "alphabet", "transitions"):
        if key not in obj:
            raise DfaValidationError(f"the DFA JSON lacks the key {key!r}")
    try:
        ids = [str(s["id"]) for s in obj["states"]]
        descs = tuple(str(s.get("description", "")) for s in obj["states"])
    except (TypeError, KeyError):
        raise DfaValidationError("each state must be an object with 'id' and 'description'") \
            from None
    if len(set(ids)) != len(ids):
        raise DfaValidationError(f"duplicate state ids: {ids}")
    index = {sid: i for i, sid in enumerate(ids)}

    def idx(sid: Any, where: str) -> int:
        if str(sid) not in index:
            raise DfaValidationError(f"{where} names unknown state {sid!r} (states: {ids})")
        return index[str(sid)]

    delta: dict[tuple[int, str], int] = {}
    for tr in obj["transitions"]:
        if not isinstance(tr, list | tuple) or len(tr) != 3:
            raise DfaValidationError(f"a transition must be [from, event, to], got {tr!r}")
        key = (idx(tr[0], "a transition"), str(tr[1]))
        to = idx(tr[2], "a transition")
        if key in delta and delta[key] != to:
            raise DfaValidationError(f"nondeterministic: two transitions from {tr[0]!r} on "
                                     f"{tr[1]!r}")
        delta[key] = to
    alphabet = tuple(sorted(str(e) for e in obj["alphabet"]))
    stray = sorted({e for _, e in delta} - set(alphabet))
    if stray:
        raise DfaValidationError(f"transitions on events {stray} outside the alphabet")
    dfa = Dfa(descs, idx(obj["initial"], "initial"),
              frozenset(idx(a, "accepting") for a in obj["accepting"]), alphabet, delta)
    return validate_dfa(dfa, events)


@DFA_GENERATORS.register("llm")
class LlmDfaGenerator:
    """Prompt a model for the DFA, parse and validate it; on an invalid answer, retry with the
    error appended (``retries`` times), then raise :class:`DfaValidationError`.

    ``complete`` is any ``prompt -> text`` function: :func:`backend_completion` wraps a harness
    rollout backend (``hf`` over a local model path); tests pass a stub."""

    EXAMPLE_TASK = "get coffee, then go to the office, avoiding decorations"

    def __init__(self, vocab: dict[str, str], complete: Callable[[str], str],
                 retries: int = 2) -> None:
        self.vocab, self.complete, self.retries = vocab, complete, retries
        self.template = TemplateDfaGenerator(vocab)

    def prompt(self, description: str) -> str:
        events = sorted(set(self.vocab.values()))
        meanings = "; ".join(f"{e} = {', '.join(p for p, v in self.vocab.items() if v == e)}"
                             for e in events)
        try:  # the worked example comes from the template parser (same format, valid)
            example_task = self.EXAMPLE_TASK
            example = dfa_to_json(self.template.generate(example_task))
        except DfaValidationError:  # a vocabulary without those phrases: its first phrase
            example_task = next(iter(self.vocab))
            example = dfa_to_json(self.template.generate(example_task))
        return PROMPT.format(events=", ".join(events), meanings=meanings,
                             example_task=example_task, example_answer=example, task=description)

    def generate(self, description: str) -> Dfa:
        prompt, errors = self.prompt(description), []
        for _ in range(self.retries + 1):
            answer = self.complete(prompt)
            try:
                return parse_dfa_json(answer, sorted(set(self.vocab.values())))
            except DfaValidationError as exc:
                errors.append(str(exc))
                prompt = f"{prompt} {answer}\nThat DFA is invalid: {exc}. Corrected answer:"
        raise DfaValidationError(f"the LLM gave no valid DFA in {self.retries + 1} tries: "
                                 + " | ".join(errors))


def backend_completion(model_path: str, backend: str = "hf", device: str = "cpu",
                       max_new_tokens: int = 1024, temperature: float = 0.0,
                       seed: int = 0) -> Callable[[str], str]:
    """A ``prompt -> text`` function over a harness rollout backend (``BACKENDS`` registry) and
    a *local* model directory (nothing is downloaded: HF offline mode is forced). Temperature 0
    is approximated by a tiny temperature (the engines sample)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from omegaconf import OmegaConf

    import harness.backends  # noqa: F401  (registers the engines)
    from harness.config import BackendConfig
    from harness.registry import BACKENDS
    from harness.types import Example, SamplingParams

    cfg = OmegaConf.structured(BackendConfig(device=device))
    engine = BACKENDS.get(backend)(model_path, cfg, seed)
    params = SamplingParams(n=1, temperature=max(temperature, 1e-4),
                            max_new_tokens=max_new_tokens)

    def complete(prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        ex = Example(id="lantern-dfa", prompt=messages if engine.tokenizer.chat_template
                     else prompt)
        return engine.generate([engine.encode_prompt(ex)], params)[0].text

    return complete
