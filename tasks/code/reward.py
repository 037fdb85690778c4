"""The code task's reward rule as a named verifier
(``task=custom task.reward.verifier=code_tests``).

The gold answer is the tests: a list of ``assert`` statements (each one test, run against the
candidate's definitions), a test source string (its top-level asserts, or those of a ``check``
function, become the tests), or the code task's own answer dict. The program is the last
```-fenced block of the response (``extract: fenced``) or the whole response (``raw``); it runs in
the sandbox (:mod:`harness.sandbox`) and every test is judged outside it (:mod:`.grading`).
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field
from typing import Any

from harness.registry import register_verifier
from harness.typed_config import ConfigError, validate
from harness.types import Example, Score
from tasks.code.grading import CodeGrader, GraderConfig, called_names, split_asserts

EXTRACT = ("fenced", "raw")
REWARDS = ("binary", "fraction")


def tests_answer(gold: Any) -> dict[str, Any]:
    """The grader's answer dict for ``gold`` (asserts, a test source, or such a dict)."""
    if isinstance(gold, dict) and "units" in gold:
        return gold
    units = list(gold) if isinstance(gold, (list, tuple)) else split_asserts(str(gold))
    return {"kind": "functional", "units": units, "preamble": "",
            "entry_points": called_names(units)}


@register_verifier("code_tests")
class CodeTestsVerifier:
    """Program synthesis: the program passes the example's tests, run in the sandbox."""

    @dataclass
    class Config:
        extract: str = "fenced"     # fenced (last ```-block) | raw (the whole response)
        reward: str = "binary"      # binary | fraction (of tests passed)
        correct_score: float = 1.0
        format_score: float = 0.0   # a program was found but fails
        grader: GraderConfig = field(default_factory=GraderConfig)

    def __init__(self, options: dict[str, Any] | None = None, key: str = "verifier") -> None:
        self.config = validate(self.Config, options or {}, key)
        for name, valid in (("extract", EXTRACT), ("reward", REWARDS)):
            if getattr(self.config, name) not in valid:
                raise ConfigError(f"{key}.{name}={getattr(self.config, name)!r} is not one of: "
                                  f"{', '.join(valid)}")
        self._grader: CodeGrader | None = None

    @property
    def grader(self) -> CodeGrader:
        if self._grader is None:
            self._grader = CodeGrader(self.config.grader)
            atexit.register(self._grader.close)
        return self._grader

    def program(self, response: str) -> str | None:
        from tasks.code.task import compiles, last_fenced_block

        code = response.strip() if self.config.extract == "raw" else last_fenced_block(response)
        return code + "\n" if code and compiles(code) else None

    def __call__(self, examples: list[Example], responses: list[str]) -> list[Score]:
        cfg = self.config
        programs = [self.program(r) for r in responses]
        todo = [i for i, p in enumerate(programs) if p is not None]
        graded = dict(zip(todo, self.grader.grade_many(
            [(tests_answer(examples[i].answer), programs[i]) for i in todo])))
        scores = []
        for i in range(len(examples)):
            result = graded.get(i)
            if result is None:
                scores.append(Score(0.0, False, False, {"status": "no_code"}))
                continue
            info = {"status": result.status, "passed": result.passed, "total": result.total}
            if result.all_passed:
                scores.append(Score(float(cfg.correct_score), True, True, info))
                continue
            reward = cfg.format_score
            if cfg.reward == "fraction":
                reward += (cfg.correct_score - cfg.format_score) * result.fraction
            scores.append(Score(float(reward), False, True, info))
        return scores
