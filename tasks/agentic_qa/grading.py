"""Answer extraction and grading of agentic QA: SQuAD-normalised EM and F1, the Tool-Star
hierarchical reward, and the format check it depends on.

All functions are pure, bounded and never execute model text:

* :func:`extract_answer` - the last ``<answer>...</answer>``, else the last ``\\boxed{...}``
  (brace-matched), else None (a parse failure, not a wrong answer).
* :func:`normalize_answer`, :func:`exact_match`, :func:`f1_score` - the SQuAD v1.1 official
  evaluation: lower case, punctuation removed, articles (a, an, the) removed, whitespace
  collapsed; F1 over the multiset of normalised tokens; both are maxed over the gold aliases.
* :func:`format_ok`, :func:`toolstar_reward` - the Tool-Star hierarchical reward of
  ``specs/algorithms.md`` §6.3: format correct and Acc > 0 -> ``max(Acc + r_M, Acc)`` with
  ``r_M = 0.1`` when both ``<search>`` and ``<python>`` were called; format correct and
  Acc = 0 -> 0; otherwise -1. The spec does not define "format correct"; here it means (our
  reading, documented in docs/tasks/agentic_qa.md): an answer was extracted, every tool call is
  closed and followed by exactly one ``<result>...</result>``, no tags are nested or left open,
  and nothing but whitespace follows the final ``</answer>``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

MAX_RESPONSE_CHARS = 200_000  # a longer response is not graded (parse failure)
ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_TAG = re.compile(r"<(/?)([a-z_]+)>")


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower, drop punctuation, drop articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def _f1_one(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:  # SQuAD v2's rule: both empty -> 1, one empty -> 0
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Iterable[str]) -> float:
    """Token-level F1 against the best-matching gold answer (0.0 when there is none)."""
    return max((_f1_one(prediction, g) for g in golds), default=0.0)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` with balanced braces, or None."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        depth, i = 0, start + len("\\boxed")
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
        start = text.rfind("\\boxed{", 0, start)  # unbalanced: try an earlier one
    return None


def last_answer_tag(text: str) -> str | None:
    """The content of the last complete ``<answer>...</answer>``, or None."""
    end = text.rfind("</answer>")
    while end >= 0:
        start = text.rfind("<answer>", 0, end)
        if start >= 0:
            return text[start + len("<answer>") : end]
        end = text.rfind("</answer>", 0, end)
    return None


def extract_answer(response: str) -> tuple[str | None, str]:
    """(answer, method): method is ``answer_tag``, ``boxed`` or ``none``. A ``\\boxed{}`` inside
    the answer tag is unwrapped (Tool-Star writes ``<answer>\\boxed{X}</answer>``)."""
    if len(response) > MAX_RESPONSE_CHARS:
        return None, "none"
    tagged = last_answer_tag(response)
    if tagged is not None:
        inner = last_boxed(tagged)
        return (inner if inner is not None else tagged).strip(), "answer_tag"
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed.strip(), "boxed"
    return None, "none"


def tool_calls(response: str, tools: Sequence[str]) -> Counter[str]:
    """How many complete ``<name>...</name>`` calls of each tool the response holds."""
    counts: Counter[str] = Counter()
    for name in tools:
        counts[name] = len(re.findall(rf"<{re.escape(name)}>.*?</{re.escape(name)}>",
                                      response[:MAX_RESPONSE_CHARS], re.DOTALL))
    return counts


def format_ok(response: str, tools: Sequence[str]) -> bool:
    """The structural check of the hierarchical reward (see the module docstring)."""
    if len(response) > MAX_RESPONSE_CHARS or extract_answer(response)[0] is None:
        return False
    known = {*tools, "result", "answer"}
    open_tag: str | None = None
    expect_result = False  # a tool call was just closed: the next tag must open its result
    answered = False
    for m in _TAG.finditer(response):
        closing, name = m.group(1) == "/", m.group(2)
        if name not in known:
            continue  # other markup (<think>, html in results) is not ours to judge
        if answered:
            return False  # a tag after the final answer
        if open_tag is not None:
            if open_tag == "result" and not (closing and name == "result"):
                continue  # tool output may contain anything, including our tag names
            if not (closing and name == open_tag):
                return False  # nested or mismatched
            open_tag = None
            if name in tools:
                expect_result = True
            elif name == "answer":
                answered = True
            continue
        if closing:
            return False  # a closing tag without its opening
        if expect_result != (name == "result"):
            return False  # a result without a call, or a call without its result
        expect_result = False
        open_tag = name
    if open_tag is not None or expect_result:
        return False
    if answered:
        return response[response.rfind("</answer>") + len("</answer>"):].strip() == ""
    return True  # answered by \boxed{} outside the tags


def toolstar_reward(acc: float, fmt_ok: bool, used: Counter[str] | dict[str, int],
                    multi_tool_bonus: float = 0.1) -> float:
    """Tool-Star's hierarchical reward (spec §6.3) from the accuracy ``acc`` (F1 or EM)."""
    if not fmt_ok:
        return -1.0
    if acc <= 0:
        return 0.0
    r_m = multi_tool_bonus if used.get("search", 0) > 0 and used.get("python", 0) > 0 else 0.0
    return max(acc + r_m, acc)
