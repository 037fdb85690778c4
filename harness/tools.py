"""The tool protocol of multi-turn (agentic) tasks.

A task that lets the model call tools returns a :class:`ToolEnv` from ``Task.tool_env()``. The
model writes ``<name>query</name>`` for a tool called ``name`` (``<search>…</search>``,
``<python>…</python>``); generation stops at the closing tag, the harness calls the tool and
appends ``<result>…</result>`` (tokenised by the rollout engine, masked out of the loss), and
generation resumes, up to ``max_calls`` calls and ``max_total_tokens`` response-side tokens. The
final answer is in ``<answer>…</answer>`` (or ``\\boxed{}``), as the task's verifier reads it.

A :class:`Tool` never raises into the trainer: a failure (bad query, timeout, sandbox error) is
returned to the model as text, marked as a :class:`ToolFailure` (a ``str``) so that the
trajectory's tool-call record counts it as failed (``ok: false``; ``tools/failed_calls``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class ToolFailure(str):
    """The text of a failed call (``error: empty search query``): shown to the model like any
    result, recorded with ``ok: false``."""


class Tool(Protocol):
    """``tool(query) -> result text``; must not raise (errors come back as a
    :class:`ToolFailure`)."""

    def __call__(self, query: str) -> str: ...


@dataclass
class ToolEnv:
    """The tools of a task and the budget of one trajectory."""

    tools: dict[str, Callable[[str], str]]
    max_calls: int = 4  # tool calls per trajectory; further calls get an error result
    max_total_tokens: int = 512  # response-side tokens per trajectory, tool results included
    max_result_chars: int = 400  # a longer tool result is cut (and the cut is said)
    result_open: str = "<result>"
    result_close: str = "</result>"
    answer_close: str = "</answer>"  # generation also stops here
    extra_stops: list[str] = field(default_factory=list)

    def stop_strings(self) -> list[str]:
        """Where generation pauses: each tool's closing tag, and the answer's."""
        return [f"</{name}>" for name in self.tools] + [self.answer_close, *self.extra_stops]

    def call(self, name: str, query: str) -> tuple[str, bool]:
        """(result text wrapped in the result tags, ok). Unknown tools and exceptions become
        error texts; the result is cut to ``max_result_chars``."""
        tool = self.tools.get(name)
        if tool is None:
            text, ok = f"error: unknown tool {name!r}; tools: {', '.join(self.tools)}", False
        else:
            try:
                result = tool(query)
                text, ok = str(result), not isinstance(result, ToolFailure)
            except Exception as exc:  # a tool bug must not kill the run; the model sees it
                text, ok = f"error: {type(exc).__name__}: {exc}", False
        if len(text) > self.max_result_chars:
            text = text[: self.max_result_chars] + " …(cut)"
        return f"{self.result_open}{text}{self.result_close}", ok
