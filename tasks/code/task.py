"""Code: write a program that passes hidden unit tests, graded in a sandbox (PRIME-style).

Two variants (``task.variant``):

* ``tiny`` - a CPU testbed (:mod:`tasks.code.testbed`): infer ``def f(x): return x*3+1`` from three
  examples; the response is the bare program; 500 problems held out, the rest (7,195) are the RL
  pool and a share of them, solved, is the warm start.
* ``full`` - public benchmarks (:mod:`tasks.code.datasets`): HumanEval, MBPP (full, test and train
  splits), sanitized MBPP, DeepCoder LeetCode and PRIME/Eurus LeetCode (functional tests with the
  LeetCode import preamble), Codeforces and CodeContests (stdin/stdout). The program is the last
  fenced code block of the response (a HumanEval completion without the ``def`` gets the prompt's
  code prepended); no block means ``parsed=False`` and reward 0.

Model output is hostile by assumption. Every program runs in the sandbox (:mod:`harness.sandbox`)
and every verdict is reached by the judge outside it (:mod:`tasks.code.grading`); nothing the
program prints or does to its own process can earn credit. Reward: ``binary`` (all tests pass ->
``correct_score``) or ``fraction`` (share of tests passed), plus ``format_score`` for a program
that was extracted but did not pass. Every knob is in ``conf/task/code.yaml``.
"""

from __future__ import annotations

import ast
import atexit
import random
import re
import threading
from dataclasses import dataclass, field
from typing import ClassVar

from harness.compat import BINARY_CORRECT
from harness.registry import register_task
from harness.task import EvalProtocol, VariantTask
from harness.types import Example, Score
from tasks.code import datasets, testbed
from tasks.code.grading import CodeGrader, GraderConfig, GradeResult, check_isolation

REWARDS = ("binary", "fraction")
TEMPLATES = ("text", "chat")
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
MAX_RESPONSE_CHARS = 100_000  # longer responses are not graded (parse failure)


@dataclass
class TinyConfig:
    hidden: int = 2             # unseen test inputs per problem, on top of the 3 shown
    heldout: int = 500          # problems held out as eval set "heldout"
    warmstart_fraction: float = 0.1  # share of the train pool given solved to the warm start
    split_seed: int = 0         # shuffles the problems (and picks the hidden inputs)
    max_new_tokens: int = 32
    eval: dict[str, EvalProtocol] = field(
        default_factory=lambda: {
            "heldout": EvalProtocol(n=8, k=[1, 8], temperature=1.0, max_new_tokens=32)
        }
    )


def _full_eval_default() -> dict[str, EvalProtocol]:
    return {name: EvalProtocol(n=4, k=[1, 4], temperature=1.0, max_new_tokens=1024)
            for name in ("humaneval", "mbpp_test", "leetcode")}


@dataclass
class FullConfig:
    data_dir: str | None = None
    train: list[str] = field(default_factory=lambda: ["mbpp_train"])
    template: str = "text"      # text | chat (one user message)
    train_limit: int | None = None
    warmstart_limit: int = 2000
    max_new_tokens: int = 1024
    eval: dict[str, EvalProtocol] = field(default_factory=_full_eval_default)


@register_task("code")
class CodeTask(VariantTask):
    """Program synthesis graded by sandboxed unit tests."""

    offers: ClassVar[frozenset[str]] = frozenset({BINARY_CORRECT})  # harness.compat

    name = "code"

    @dataclass
    class Config:
        variant: str = "full"
        reward: str = "binary"      # binary | fraction
        correct_score: float = 1.0
        format_score: float = 0.0   # added for a program that was extracted but did not pass
        grader: GraderConfig = field(default_factory=GraderConfig)
        tiny: TinyConfig = field(default_factory=TinyConfig)
        full: FullConfig = field(default_factory=FullConfig)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        for key, value, valid in (("reward", config.reward, REWARDS),
                                  ("full.template", config.full.template, TEMPLATES)):
            if value not in valid:
                raise ValueError(f"task.{key}={value!r} is not valid; valid: {', '.join(valid)}")
        for name in [*config.full.train, *config.full.eval]:
            if name not in datasets.LOADERS:
                raise ValueError(f"task.full: unknown dataset {name!r}; valid: "
                                 f"{', '.join(datasets.LOADERS)}")
        if config.variant == "tiny" and set(config.tiny.eval) - {"heldout"}:
            raise ValueError("task.tiny.eval: the tiny variant has only the eval set 'heldout'")
        grader_cfg = config.grader
        if config.reward == "fraction":  # every test must run for a fraction
            grader_cfg = GraderConfig(**{**vars(grader_cfg), "stop_on_first_failure": False})
        self._grader_config = grader_cfg
        check_isolation(grader_cfg.allow_weaker_isolation)  # refuse now, not mid-training
        self._grader: CodeGrader | None = None
        self._lock = threading.Lock()
        self._train: list[Example] | None = None
        self._evals: dict[str, list[Example]] | None = None

    @property
    def grader(self) -> CodeGrader:
        with self._lock:
            if self._grader is None:
                self._grader = CodeGrader(self._grader_config)
                atexit.register(self._grader.close)
            return self._grader

    # -- data -----------------------------------------------------------------------------------
    def _load(self) -> None:
        if self._train is not None:
            return
        if self.config.variant == "tiny":
            cfg = self.config.tiny
            examples = testbed.problems(cfg.hidden, cfg.split_seed)
            if not 0 < cfg.heldout < len(examples):
                raise ValueError(f"task.tiny.heldout={cfg.heldout} must be in 1..{len(examples)-1}")
            random.Random(cfg.split_seed).shuffle(examples)
            self._train, self._evals = examples[cfg.heldout:], {"heldout": examples[:cfg.heldout]}
            return
        cfg = self.config.full
        train = [ex for name in cfg.train for ex in datasets.load(name, cfg.data_dir)]
        if cfg.train_limit is not None:
            train = train[: cfg.train_limit]
        self._train = [self._wrap(ex) for ex in train]
        self._evals = {name: [self._wrap(ex) for ex in datasets.load(name, cfg.data_dir)]
                       for name in cfg.eval}

    def _wrap(self, ex: Example) -> Example:
        if self.config.full.template == "chat":
            ex.prompt = [{"role": "user", "content": ex.prompt}]
        return ex

    def warmstart_examples(self) -> list[tuple[Example, str]]:
        if self.config.variant == "tiny":
            cfg = self.config.tiny
            if not 0.0 <= cfg.warmstart_fraction <= 1.0:
                raise ValueError(f"task.tiny.warmstart_fraction={cfg.warmstart_fraction} "
                                 "must be in [0, 1]")
            train = self.train_examples()
            pool = train[: round(cfg.warmstart_fraction * len(train))]
            return [(ex, ex.meta["reference"]) for ex in pool]
        pairs = []
        for ex in self.train_examples()[: max(self.config.full.warmstart_limit, 0)]:
            if ex.meta.get("reference"):
                pairs.append((ex, "```python\n" + ex.meta["reference"].strip() + "\n```"))
        return pairs

    # -- verification ---------------------------------------------------------------------------
    def extract(self, example: Example, response: str) -> str | None:
        """The program to run, or None when the response has none."""
        if len(response) > MAX_RESPONSE_CHARS:
            return None
        if self.config.variant == "tiny":
            code = response.strip()
            return code + "\n" if code and compiles(code) else None
        code = last_fenced_block(response)
        if code is None:
            return None
        entry = example.answer.get("entry_point")
        if entry and not re.search(rf"\bdef\s+{re.escape(entry)}\s*\(", code):
            code = example.answer["prompt_code"] + code  # a completion of the function body
        elif entry:
            # a whole function may still call the prompt's helpers without repeating them (as
            # HumanEval's harness runs prompt + completion); the tests use the judge's copies
            code = example.answer.get("judge_helpers", "") + code
        return code

    def verify(self, example: Example, response: str) -> Score:
        return self.verify_batch([example], [response])[0]

    def verify_batch(self, examples: list[Example], responses: list[str]) -> list[Score]:
        programs = [self.extract(ex, r) for ex, r in zip(examples, responses)]
        todo = [i for i, p in enumerate(programs) if p is not None]
        graded = self.grader.grade_many([(examples[i].answer, programs[i]) for i in todo])
        results: dict[int, GradeResult] = dict(zip(todo, graded))
        return [self._score(results.get(i)) for i in range(len(examples))]

    def _score(self, result: GradeResult | None) -> Score:
        cfg = self.config
        if result is None:
            return Score(reward=0.0, correct=False, parsed=False,
                         info={"status": "no_code", "passed": 0, "total": 0})
        # logged as rollout/<stat> and eval/<set>/<stat> (means over the samples scored)
        stats = {"grade_timeout": float(result.status == "timeout"),
                 "sandbox_died": float(result.status == "died"),
                 "reply_oversized": float(result.oversized)}
        info = {"status": result.status, "passed": result.passed, "total": result.total,
                "error": result.error[:200], "stats": stats}
        if result.all_passed:
            return Score(reward=float(cfg.correct_score), correct=True, parsed=True, info=info)
        reward = cfg.format_score
        if cfg.reward == "fraction":
            reward += (cfg.correct_score - cfg.format_score) * result.fraction
        return Score(reward=float(reward), correct=False, parsed=True, info=info)


def last_fenced_block(text: str) -> str | None:
    """The body of the last complete ```-fenced block (any language tag), or None."""
    blocks = FENCE.findall(text)
    return blocks[-1][1] if blocks else None


def compiles(code: str) -> bool:
    """Syntax check only (``ast.parse`` never runs the code); deep nesting counts as invalid."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True
