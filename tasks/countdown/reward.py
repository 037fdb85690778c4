"""Countdown's reward rule as a named verifier (``task=custom task.reward.verifier=countdown``).

The gold answer is ``{"target": int, "numbers": [int, ...]}`` (``nums`` is accepted for
``numbers``, as in TinyZero's data); with ``format: answer_tag`` the last
``<answer>...</answer>`` of the response is checked (TinyZero's format), with ``raw`` the whole
response. The expression is parsed by :mod:`tasks.countdown.verifier`, never evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.registry import register_verifier
from harness.typed_config import ConfigError, validate
from harness.types import Example, Score
from tasks.countdown.verifier import check_expression

FORMATS = ("answer_tag", "raw")


@register_verifier("countdown")
class CountdownVerifier:
    """Countdown: the expression uses each given number once and reaches the target."""

    @dataclass
    class Config:
        format: str = "answer_tag"  # answer_tag (last <answer>...</answer>) | raw
        correct_score: float = 1.0
        format_score: float = 0.1   # an expression was found but is wrong (TinyZero's 0.1)

    def __init__(self, options: dict[str, Any] | None = None, key: str = "verifier") -> None:
        self.config = validate(self.Config, options or {}, key)
        if self.config.format not in FORMATS:
            raise ConfigError(f"{key}.format={self.config.format!r} is not one of: "
                              f"{', '.join(FORMATS)}")
        self.key = key

    def _gold(self, ex: Example) -> tuple[list[int], int]:
        gold = ex.answer if isinstance(ex.answer, dict) else {}
        numbers = gold.get("numbers", gold.get("nums"))
        if numbers is None or "target" not in gold:
            raise ConfigError(f"{self.key}: example {ex.id!r} needs an answer "
                              "{\"target\": int, \"numbers\": [int, ...]}")
        return [int(n) for n in numbers], int(gold["target"])

    def __call__(self, examples: list[Example], responses: list[str]) -> list[Score]:
        from tasks.countdown.task import last_answer

        cfg = self.config
        scores = []
        for ex, response in zip(examples, responses):
            numbers, target = self._gold(ex)
            text = response if cfg.format == "raw" else last_answer(response)
            if text is None:
                scores.append(Score(0.0, False, False, {"reason": "no <answer>...</answer>"}))
                continue
            result = check_expression(text.strip(), numbers, target)
            parsed = result.parsed if cfg.format == "raw" else True
            reward = cfg.correct_score if result.correct else (cfg.format_score if parsed
                                                               else 0.0)
            scores.append(Score(float(reward), result.correct, parsed,
                                {"reason": result.reason}))
        return scores
