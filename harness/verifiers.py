"""Reward rules that need no task of their own, looked up by name (``harness.registry.VERIFIERS``).

A verifier is built from an options dict (its ``Config`` dataclass, validated like every other
config node) and called on a batch: ``verifier(examples, responses) -> list[Score]``, with the
gold answer in ``Example.answer``. Two live here, in the engine, because they use nothing but
the engine: ``math`` (the MATH task's rule: last ``\\boxed{}`` with counted fallbacks, graded by
math-verify in worker processes with per-item timeouts, :mod:`harness.mathgrade`) and
``exact_match``. Tasks register the rules they own (``countdown``, ``code_tests``) with
``@register_verifier``, so ``task=custom`` finds every rule by name and no task imports another.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from harness.mathgrade.extract import METHODS, check_methods, extract_answer, last_boxed
from harness.mathgrade.grading import GraderConfig, MathGrader, answer_reward, grading_stats
from harness.typed_config import ConfigError, validate
from harness.types import Example, Score


class MathVerifier:
    """math-verify equivalence of the extracted final answer with the gold answer (MATH's rule)."""

    @dataclass
    class Config:
        extraction: list[str] = field(default_factory=lambda: list(METHODS))
        correct_score: float = 1.0
        format_score: float = 0.0
        grader: GraderConfig = field(default_factory=GraderConfig)

    def __init__(self, options: dict[str, Any] | None = None, key: str = "verifier") -> None:
        self.config = validate(self.Config, options or {}, key)
        check_methods(self.config.extraction)
        self.grader = MathGrader(self.config.grader)

    def __call__(self, examples: list[Example], responses: list[str]) -> list[Score]:
        cfg = self.config
        extracted = [extract_answer(r, cfg.extraction) for r in responses]
        todo = [i for i, (answer, _) in enumerate(extracted) if answer is not None]
        graded = self.grader.grade([(str(examples[i].answer), extracted[i][0]) for i in todo])
        results = dict(zip(todo, graded))
        scores = []
        for i, (answer, method) in enumerate(extracted):
            result = results.get(i)
            correct = bool(result and result.correct)
            status = result.status if result else "none"
            key = result.key if result and result.key is not None else answer
            scores.append(Score(
                reward=answer_reward(correct, answer is not None, cfg.correct_score,
                                     cfg.format_score),
                correct=correct, parsed=answer is not None,
                info={"answer": (answer or "")[:200], "answer_key": key,
                      "stats": grading_stats(method, status)}))
        return scores


EXTRACT = ("full", "last_line", "boxed", "answer_tag")


class ExactMatchVerifier:
    """The extracted answer equals the gold answer (or one of a list) after normalisation."""

    @dataclass
    class Config:
        extract: str = "full"   # full | last_line | boxed (last \\boxed{}) | answer_tag (<answer>)
        case_sensitive: bool = False
        strip_punctuation: bool = True  # trailing . , ; ! and surrounding quotes/whitespace
        correct_score: float = 1.0
        format_score: float = 0.0   # an answer was extracted but does not match

    def __init__(self, options: dict[str, Any] | None = None, key: str = "verifier") -> None:
        self.config = validate(self.Config, options or {}, key)
        if self.config.extract not in EXTRACT:
            raise ConfigError(f"{key}.extract={self.config.extract!r} is not one of: "
                              f"{', '.join(EXTRACT)}")

    def normalise(self, text: str) -> str:
        text = " ".join(text.split())
        if self.config.strip_punctuation:
            text = text.strip(" .,;!\"'`")
        return text if self.config.case_sensitive else text.lower()

    def extract(self, response: str) -> str | None:
        how = self.config.extract
        if how == "full":
            return response if response.strip() else None
        if how == "last_line":
            lines = [ln for ln in response.splitlines() if ln.strip()]
            return lines[-1] if lines else None
        if how == "boxed":
            return last_boxed(response)
        found = re.findall(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
        return found[-1] if found else None

    def __call__(self, examples: list[Example], responses: list[str]) -> list[Score]:
        cfg = self.config
        scores = []
        for ex, response in zip(examples, responses):
            answer = self.extract(response)
            golds = ex.answer if isinstance(ex.answer, (list, tuple)) else [ex.answer]
            norm = None if answer is None else self.normalise(answer)
            correct = norm is not None and norm in {self.normalise(str(g)) for g in golds}
            reward = cfg.correct_score if correct else (
                cfg.format_score if answer is not None else 0.0)
            scores.append(Score(reward=float(reward), correct=correct, parsed=answer is not None,
                                info={"answer": (answer or "")[:200], "answer_key": norm}))
        return scores
