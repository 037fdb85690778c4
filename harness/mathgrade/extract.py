"""Final-answer extraction from a model's response (pure string scanning, linear time).

The answer is, in order of preference:

1. ``boxed`` - the content of the *last* ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces
   close, nested braces included (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); escaped braces
   ``\\{ \\}`` are literal and do not count. ``\\boxed 5`` (no braces) gives ``5``.
2. ``answer_line`` - the rest of the line after the last ``Answer:`` / ``answer is`` (case
   insensitive), without surrounding ``$`` and a final period.
3. ``last_number`` - the last number in the text (``-3``, ``1,000``, ``2.5``, ``3/4``).

Which methods are tried is configurable (``task.extraction``); each is counted separately in the
parse statistics, and ``none`` means nothing could be extracted (``Score.parsed=False``). Nothing
here evaluates model text; the grading itself happens in :mod:`harness.mathgrade.grading`.
"""

from __future__ import annotations

import re

METHODS = ("boxed", "answer_line", "last_number")
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_RE = re.compile(r"(?:final answer|answer)\s*(?:is\s*[:：]?|[:：])", re.IGNORECASE)
_MAX_BOX_TRIES = 4  # bounded retries keep a response full of unterminated boxes linear-time
_NUMBER_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?")


def _match_braces(text: str, open_at: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_at`` (escaped braces skipped), or None."""
    depth = 0
    i = open_at
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # an escaped character (\{ \} \\) never opens or closes a group
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}``; an unterminated last one
    falls back to the one before it."""
    starts = sorted({m.start() for cmd in _BOX_COMMANDS for m in re.finditer(re.escape(cmd), text)},
                    reverse=True)
    for start in starts[:_MAX_BOX_TRIES]:
        cmd = "\\boxed" if text.startswith("\\boxed", start) else "\\fbox"
        i = start + len(cmd)
        if i < len(text) and text[i] == "{":
            end = _match_braces(text, i)
            if end is not None:
                return text[i + 1 : end].strip()
            continue
        if i < len(text) and text[i] == " ":  # "\boxed 5": up to the next space, $ or newline
            m = re.match(r" +([^\s$]+)", text[i:])
            if m:
                return m.group(1).strip()
    return None


def answer_line(text: str) -> str | None:
    """The rest of the line after the last ``Answer:`` / ``the answer is``."""
    last = None
    for last in _ANSWER_RE.finditer(text):  # noqa: B007  (keep the last match)
        pass
    if last is None:
        return None
    line = text[last.end() :].split("\n", 1)[0].strip()
    line = line.strip("$ ").rstrip(".").strip("$ ").strip()
    return line or None


def last_number(text: str) -> str | None:
    found = None
    for found in _NUMBER_RE.finditer(text):  # noqa: B007  (keep the last match)
        pass
    return None if found is None else found.group(0).replace(",", "")


_EXTRACTORS = {"boxed": last_boxed, "answer_line": answer_line, "last_number": last_number}


def check_methods(methods: list[str] | tuple[str, ...]) -> None:
    """Raise a config error naming ``task.extraction`` unless it is a non-empty list of
    :data:`METHODS`."""
    if not methods or any(m not in METHODS for m in methods):
        raise ValueError(f"task.extraction={list(methods)} must be a non-empty list of: "
                         f"{', '.join(METHODS)}")


def extract_answer(text: str, methods: tuple[str, ...] | list[str] = METHODS,
                   ) -> tuple[str | None, str]:
    """``(answer, method)``; ``(None, "none")`` when no method finds one."""
    for method in methods:
        answer = _EXTRACTORS[method](text)
        if answer:
            return answer, method
    return None, "none"
