"""Countdown: combine the given numbers with + - * / (each exactly once) to reach a target.

Two variants (``task.variant``):

* ``tiny`` - a CPU testbed for tiny models: every multiset of 3 numbers from 1..15 with every
  positive integer target reachable with ``+ - *`` (9,367 problems), split deterministically into
  a held-out eval set (500) and a train pool (8,867); ``tiny.validation`` > 0 moves that many
  problems from the end of the pool (never in the warm start) to the eval set ``validation``,
  disjoint from ``heldout``, for choosing hyperparameters (conf/sweep/lpo_lr_tuning.yaml). The
  space is large enough that RL has to generalise rather than memorise the pool (with numbers up
  to 9 there are only 1,973 problems, and RL mostly overfits them; docs/design.md, "Testbed
  calibration"). The prompt is ``"3 6 7=15:"``, the response is the bare expression, and the
  reward is binary by default so group baselines are clean.
* ``full`` - TinyZero's Countdown-Tasks-3to4 problems (8,001 train, 2,001 test; see
  ``data/SOURCE.md``) with TinyZero's prompt and a safe version of its reward: the last
  ``<answer>...</answer>`` is parsed (never evaluated) by :mod:`tasks.countdown.verifier`.

Every knob is documented in ``conf/task/countdown.yaml``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.compat import BINARY_CORRECT
from harness.registry import register_task
from harness.task import EvalProtocol, VariantTask
from harness.types import Example, Score
from tasks.countdown.solver import enumerate_tiny_problems, solve
from tasks.countdown.verifier import CheckResult, check_expression

TEMPLATES = ("base", "qwen-instruct")
DATA_DIR = Path(__file__).parent / "data"

# TinyZero's "base" template: exactly the text of `prompt[0].content` in its parquet files.
BASE_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer.\nUser: Using the numbers {numbers}, create an equation "
    "that equals {target}. You can use basic arithmetic operations (+, -, *, /) and each number "
    "can only be used once. Show your work in <think> </think> tags. And return the final answer "
    "in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.\nAssistant: Let me "
    "solve this step by step.\n<think>"
)
# TinyZero's "qwen-instruct" template, written from its examples/data_preprocess/countdown.py
# (it is not in the shipped data, which uses "base"). TinyZero writes one raw string:
#   <|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n {USER}<|im_end|>\n
#   <|im_start|>assistant\nLet me solve this step by step.\n<think>
# Here it is a chat-message list, so the chat template renders the first two turns exactly
# (the user content keeps TinyZero's leading space). A message list cannot end inside the
# assistant turn, so TinyZero's assistant prefill (INSTRUCT_PREFILL) is not part of the prompt;
# the warm-start completions of this template start with it instead.
INSTRUCT_SYSTEM = (
    "You are a helpful assistant. You first thinks about the reasoning process in the mind and "
    "then provides the user with the answer."
)
INSTRUCT_USER = (
    " Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>."
)
INSTRUCT_PREFILL = "Let me solve this step by step.\n<think>"


@dataclass
class TinyConfig:
    count: int = 3
    max_number: int = 15
    ops: str = "+-*"
    heldout: int = 500
    validation: int = 0
    warmstart_fraction: float = 0.3
    split_seed: int = 0
    max_new_tokens: int = 12
    correct_score: float = 1.0
    format_score: float = 0.0
    eval: dict[str, EvalProtocol] = field(
        default_factory=lambda: {
            "heldout": EvalProtocol(n=8, k=[1, 8], temperature=1.0, top_p=1.0, max_new_tokens=12)
        }
    )


def _full_eval_default() -> dict[str, EvalProtocol]:
    return {
        name: EvalProtocol(n=8, k=[1, 8], temperature=1.0, max_new_tokens=1024)
        for name in ("countdown34", "countdown4")
    }


@dataclass
class FullConfig:
    data_dir: str | None = None
    template: str = "base"
    train_limit: int | None = None
    warmstart_limit: int = 2000
    max_new_tokens: int = 1024
    correct_score: float = 1.0
    format_score: float = 0.1
    eval: dict[str, EvalProtocol] = field(default_factory=_full_eval_default)


_EVAL_SETS = {"tiny": ("heldout", "validation"), "full": ("countdown34", "countdown4")}


@register_task("countdown")
class CountdownTask(VariantTask):
    """Countdown (TinyZero problems, or the enumerated tiny testbed)."""

    offers: ClassVar[frozenset[str]] = frozenset({BINARY_CORRECT})  # harness.compat

    name = "countdown"

    @dataclass
    class Config:
        variant: str = "full"
        tiny: TinyConfig = field(default_factory=TinyConfig)
        full: FullConfig = field(default_factory=FullConfig)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        if config.full.template not in TEMPLATES:
            raise ValueError(
                f"task.full.template={config.full.template!r} is not valid; valid templates: "
                f"{', '.join(TEMPLATES)}"
            )
        section = self._section
        for key in section.eval:
            if key not in _EVAL_SETS[config.variant]:
                raise ValueError(
                    f"task.{config.variant}.eval.{key} is not an eval set of variant "
                    f"{config.variant!r}; valid: {', '.join(_EVAL_SETS[config.variant])}"
                )
        if config.variant == "tiny" and "validation" in section.eval and section.validation < 1:
            raise ValueError("task.tiny.eval.validation needs task.tiny.validation > 0 (the "
                             "number of train-pool problems set aside for it)")
        self._train: list[Example] | None = None
        self._evals: dict[str, list[Example]] | None = None
        self._pool: list[Example] = []  # the tiny train pool before validation is set aside
        self._warmstart: list[tuple[Example, str]] | None = None

    # -- data -----------------------------------------------------------------------------------
    def warmstart_examples(self) -> list[tuple[Example, str]]:
        if self._warmstart is None:
            if self.config.variant == "tiny":
                self._warmstart = self._tiny_warmstart()
            else:
                self._warmstart = self._full_warmstart()
        return self._warmstart

    # -- tiny variant ---------------------------------------------------------------------------
    def _tiny_split(self) -> tuple[list[Example], dict[str, list[Example]]]:
        cfg = self.config.tiny
        problems = enumerate_tiny_problems(cfg.count, cfg.max_number, cfg.ops)
        if not 0 < cfg.heldout < len(problems):
            raise ValueError(
                f"task.tiny.heldout={cfg.heldout} must be between 1 and {len(problems) - 1} "
                f"(there are {len(problems)} tiny problems)"
            )
        examples = [
            Example(
                id=f"tiny-{i:05d}",
                prompt=f"{' '.join(str(n) for n in nums)}={target}:",
                answer={"target": target, "numbers": list(nums)},
                meta={"n_numbers": len(nums)},
            )
            for i, (nums, target) in enumerate(problems)
        ]
        random.Random(cfg.split_seed).shuffle(examples)
        self._pool = pool = examples[cfg.heldout :]
        # validation comes from the end of the pool, past the warm-start share, so the warm start
        # (and the cached model) is the same with or without it
        free = len(pool) - self._warmstart_count(len(pool))
        if not 0 <= cfg.validation <= free:
            raise ValueError(f"task.tiny.validation={cfg.validation} must be between 0 and {free} "
                             "(the train-pool problems outside the warm start)")
        cut = len(pool) - cfg.validation
        return pool[:cut], {"heldout": examples[: cfg.heldout], "validation": pool[cut:]}

    def _warmstart_count(self, pool_size: int) -> int:
        fraction = self.config.tiny.warmstart_fraction
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"task.tiny.warmstart_fraction={fraction} must be in [0, 1]")
        return round(fraction * pool_size)

    def _tiny_warmstart(self) -> list[tuple[Example, str]]:
        cfg = self.config.tiny
        self._load()
        pairs = []
        for ex in self._pool[: self._warmstart_count(len(self._pool))]:
            expr = solve(ex.answer["numbers"], ex.answer["target"], cfg.ops)
            assert expr is not None, f"{ex.id} is unsolvable, but tiny problems are by design"
            pairs.append((ex, expr))
        return pairs

    # -- full variant ---------------------------------------------------------------------------
    def _full_data(self) -> tuple[list[Example], dict[str, list[Example]]]:
        cfg = self.config.full
        directory = Path(cfg.data_dir).expanduser() if cfg.data_dir else DATA_DIR
        train_rows = _read_split(directory, "train")
        test_rows = _read_split(directory, "test")
        if cfg.train_limit is not None:
            train_rows = train_rows[: cfg.train_limit]
        train = [self._full_example("train", i, r) for i, r in enumerate(train_rows)]
        test = [self._full_example("test", i, r) for i, r in enumerate(test_rows)]
        four = [ex for ex in test if ex.meta["n_numbers"] == 4]
        return train, {"countdown34": test, "countdown4": four}

    def _full_example(self, split: str, index: int, row: dict[str, Any]) -> Example:
        nums, target = row["nums"], row["target"]
        if self.config.full.template == "base":
            prompt: str | list[dict[str, Any]] = BASE_TEMPLATE.format(numbers=nums, target=target)
        else:
            prompt = [
                {"role": "system", "content": INSTRUCT_SYSTEM},
                {"role": "user", "content": INSTRUCT_USER.format(numbers=nums, target=target)},
            ]
        return Example(
            id=f"countdown-{split}-{index:05d}",
            prompt=prompt,
            answer={"target": target, "numbers": list(nums)},
            meta={"split": split, "index": index, "n_numbers": len(nums)},
        )

    def _full_warmstart(self) -> list[tuple[Example, str]]:
        cfg = self.config.full
        prefix = "" if cfg.template == "base" else INSTRUCT_PREFILL
        pairs = []
        for ex in self.train_examples()[: max(cfg.warmstart_limit, 0)]:
            nums, target = ex.answer["numbers"], ex.answer["target"]
            expr = solve(nums, target)
            if expr is None:
                continue  # every shipped problem is solvable; a user's data may not be
            listed = ", ".join(str(n) for n in nums)
            reasoning = f"I must reach {target} using {listed} once each. {expr} = {target}."
            pairs.append((ex, f"{prefix} {reasoning}</think>\n<answer>{expr}</answer>"))
        return pairs

    # -- verification ---------------------------------------------------------------------------
    def verify(self, example: Example, response: str) -> Score:
        numbers, target = example.answer["numbers"], example.answer["target"]
        if self.config.variant == "tiny":
            cfg = self.config.tiny
            result = check_expression(response.strip(), numbers, target)
            return _score(result, cfg.correct_score, cfg.format_score, parsed=result.parsed)
        cfg = self.config.full
        answer = last_answer(response)
        if answer is None:
            info = {"numbers_ok": False, "value": None, "reason": "no <answer>...</answer>"}
            return Score(reward=0.0, correct=False, parsed=False, info=info)
        result = check_expression(answer.strip(), numbers, target)
        return _score(result, cfg.correct_score, cfg.format_score, parsed=True)


def _score(result: CheckResult, correct_score: float, format_score: float, parsed: bool) -> Score:
    if result.correct:
        reward = correct_score
    elif parsed:
        reward = format_score
    else:
        reward = 0.0
    info = {
        "numbers_ok": result.numbers_ok,
        "value": None if result.value is None else str(result.value),
        "reason": result.reason,
        "expression_parsed": result.parsed,
    }
    return Score(reward=float(reward), correct=result.correct, parsed=parsed, info=info)


def last_answer(text: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` (the same match as TinyZero's
    ``re.finditer(r"<answer>(.*?)</answer>")[-1]``, but across lines and in linear time)."""
    found = None
    pos = 0
    while True:
        start = text.find("<answer>", pos)
        if start < 0:
            return found
        end = text.find("</answer>", start + len("<answer>"))
        if end < 0:
            return found
        found = text[start + len("<answer>") : end]
        pos = end + len("</answer>")


def _read_split(directory: Path, split: str) -> list[dict[str, Any]]:
    """Rows ``{"target": int, "nums": [int, ...]}`` of ``<split>.jsonl`` or ``<split>.parquet``."""
    jsonl, parquet = directory / f"{split}.jsonl", directory / f"{split}.parquet"
    if jsonl.is_file():
        rows = []
        with jsonl.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    record = json.loads(line)
                    rows.append({"target": record["target"], "nums": record["nums"]})
    elif parquet.is_file():
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {parquet} needs pyarrow: pip install pyarrow") from exc
        table = pq.read_table(parquet, columns=["target", "nums"])
        rows = table.to_pylist()
    else:
        where = "does not exist" if not directory.is_dir() else f"has no {split} split"
        raise FileNotFoundError(
            f"task.full.data_dir: {str(directory)!r} {where}; expected train.jsonl and "
            f"test.jsonl (lines of {{\"target\", \"nums\"}}) or TinyZero/verl train.parquet and "
            f"test.parquet (columns target, nums) in that directory"
        )
    for i, row in enumerate(rows):
        nums, target = row["nums"], row["target"]
        if not isinstance(target, int) or not (
            isinstance(nums, list) and nums and all(isinstance(n, int) for n in nums)
        ):
            raise ValueError(f"{directory}/{split} row {i}: expected int target and int nums")
        row["nums"] = list(nums)
    return rows
