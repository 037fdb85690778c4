"""MATH: competition mathematics with a final ``\\boxed{}`` answer, graded by math-verify.

Two variants (``task.variant``):

* ``full`` - RL on MATH train (the 7,472 problems with a gold answer) and the eval suite of the
  LPO paper - AIME24, AIME25, AMC23, MATH500, Minerva Math, OlympiadBench - plus GSM8K
  (``data/SOURCE.md``, :mod:`tasks.math.datasets`). Each eval set has its own protocol in
  ``conf/task/math.yaml`` (samples per problem, temperature 0.6, top-p 0.95, max tokens, pass@k
  and maj@k lists).
  Prompt templates: ``qwen-math`` (Qwen2.5-Math's chat-formatted text with "Please reason step by
  step, and put your final answer within \\boxed{}." as system prompt, the usual choice for base
  models), ``base`` (the problem then that instruction, plain text), ``chat`` (one user message,
  problem + instruction, rendered by the model's chat template) and ``chat-system`` (the
  instruction as the system message).
* ``tiny`` - short synthetic problems (:mod:`tasks.math.testbed`: linear equations with fraction
  answers, integer arithmetic) that the 0.8 M-parameter tiny model learns on a CPU, with eval sets
  ``linear`` and ``arith``. ``conf/task/math_tiny.yaml`` selects it.

Grading is identical in both: the answer is extracted from the response
(:mod:`harness.mathgrade.extract`: last ``\\boxed{}``, then ``Answer:``, then the last number; each
method counted) and compared with the gold answer by math-verify in worker processes with a hard
per-item timeout (:mod:`harness.mathgrade.grading`). A timeout or grading error scores 0 and is
counted (``eval/<set>/grade_timeout``, ``grade_error``), never raised. Reward: ``correct_score``
when correct, ``format_score`` when an answer was extracted but is wrong, else 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.compat import BINARY_CORRECT
from harness.mathgrade.extract import METHODS, check_methods, extract_answer
from harness.mathgrade.grading import GraderConfig, MathGrader, answer_reward, grading_stats
from harness.registry import register_task
from harness.task import EvalProtocol, VariantTask
from harness.types import Example, Score
from tasks.math import datasets, testbed

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# Qwen2.5-Math's "qwen25-math-cot" prompt (its evaluation/utils.py), as plain text so that a base
# model without a chat template sees exactly the string the Qwen-math papers use.
QWEN_MATH = ("<|im_start|>system\n" + INSTRUCTION + "<|im_end|>\n<|im_start|>user\n{problem}"
             "<|im_end|>\n<|im_start|>assistant\n")
TEMPLATES = ("qwen-math", "base", "chat", "chat-system")


def render_prompt(template: str, problem: str) -> str | list[dict[str, str]]:
    """The prompt of ``problem`` under ``template`` (text, or chat messages)."""
    if template == "qwen-math":
        return QWEN_MATH.replace("{problem}", problem)
    if template == "base":
        return f"{problem}\n{INSTRUCTION}\n"
    if template == "chat":
        return [{"role": "user", "content": f"{problem}\n{INSTRUCTION}"}]
    if template == "chat-system":
        return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": problem}]
    raise ValueError(f"task.full.template={template!r} is not valid; valid: {', '.join(TEMPLATES)}")


def _proto(n: int, k: list[int], max_new_tokens: int, **kw: Any) -> EvalProtocol:
    return EvalProtocol(n=n, k=k, temperature=kw.get("temperature", 0.6),
                        top_p=kw.get("top_p", 0.95), max_new_tokens=max_new_tokens)


def _full_eval_default() -> dict[str, EvalProtocol]:
    small = {name: _proto(32, [1, 8, 32], 3072) for name in ("aime24", "aime25", "amc23")}
    large = {name: _proto(4, [1, 4], 3072)
             for name in ("math500", "minerva", "olympiadbench", "gsm8k")}
    return {**small, **large}


@dataclass
class TinyConfig:
    heldout: int = 100            # problems held out per family (eval sets "linear", "arith")
    warmstart_fraction: float = 0.3  # share of the train pool given solved to the warm start
    split_seed: int = 0
    max_new_tokens: int = 40
    eval: dict[str, EvalProtocol] = field(default_factory=lambda: {
        name: EvalProtocol(n=8, k=[1, 8], temperature=1.0, top_p=1.0, max_new_tokens=40,
                           maj_k=[8])
        for name in testbed.FAMILIES})


@dataclass
class FullConfig:
    data_dir: str | None = None   # null: tasks/math/data; else a dir with the same file names
    template: str = "qwen-math"   # qwen-math | base | chat | chat-system
    train_limit: int | None = None
    warmstart_limit: int = 2000
    max_new_tokens: int = 3072
    eval: dict[str, EvalProtocol] = field(default_factory=_full_eval_default)


@register_task("math")
class MathTask(VariantTask):
    """MATH-family problems with boxed answers, graded by math-verify in worker processes."""

    offers: ClassVar[frozenset[str]] = frozenset({BINARY_CORRECT})  # harness.compat

    name = "math"

    @dataclass
    class Config:
        variant: str = "full"
        extraction: list[str] = field(default_factory=lambda: list(METHODS))
        correct_score: float = 1.0
        format_score: float = 0.0
        grader: GraderConfig = field(default_factory=GraderConfig)
        tiny: TinyConfig = field(default_factory=TinyConfig)
        full: FullConfig = field(default_factory=FullConfig)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        check_methods(config.extraction)
        render_prompt(config.full.template, "")  # fail early on an unknown template
        valid = testbed.FAMILIES if config.variant == "tiny" else datasets.EVAL_SETS
        for key, proto in self._section.eval.items():
            if key not in valid:
                raise ValueError(f"task.{config.variant}.eval.{key} is not an eval set of "
                                 f"variant {config.variant!r}; valid: {', '.join(valid)} (your "
                                 "own eval sets: task=custom task.reward.verifier=math)")
            if max([*proto.k, *(proto.maj_k or [])]) > proto.n:
                raise ValueError(f"task.{config.variant}.eval.{key}: every k must be <= n")
        self.grader = MathGrader(config.grader)
        self._train: list[Example] | None = None
        self._evals: dict[str, list[Example]] | None = None

    # -- data -----------------------------------------------------------------------------------
    def warmstart_examples(self) -> list[tuple[Example, str]]:
        """Tiny: the reference derivations of a ``warmstart_fraction`` share of the train pool.
        Full: MATH train has no worked solutions, so the pairs only teach the answer format
        (``\\boxed{gold}``) - enough to check the plumbing, not to learn mathematics."""
        train = self.train_examples()
        if self.config.variant == "tiny":
            frac = self.config.tiny.warmstart_fraction
            if not 0.0 <= frac <= 1.0:
                raise ValueError(f"task.tiny.warmstart_fraction={frac} must be in [0, 1]")
            return [(ex, ex.meta["reference"]) for ex in train[: round(frac * len(train))]]
        limit = max(self.config.full.warmstart_limit, 0)
        return [(ex, f"\\boxed{{{ex.answer['gold']}}}") for ex in train[:limit]]

    def _tiny_split(self) -> tuple[list[Example], dict[str, list[Example]]]:
        cfg = self.config.tiny
        train: list[Example] = []
        evals: dict[str, list[Example]] = {}
        for family, problems in testbed.problems().items():
            if not 0 < cfg.heldout < len(problems):
                raise ValueError(f"task.tiny.heldout={cfg.heldout} must be between 1 and "
                                 f"{len(problems) - 1} (family {family})")
            random.Random(f"{cfg.split_seed}/{family}").shuffle(problems)
            evals[family] = problems[: cfg.heldout]
            train += problems[cfg.heldout :]
        random.Random(cfg.split_seed).shuffle(train)  # the warm-start share mixes both families
        return train, evals

    def _full_data(self) -> tuple[list[Example], dict[str, list[Example]]]:
        cfg = self.config.full
        rows = datasets.load("math_train", cfg.data_dir)
        if cfg.train_limit is not None:
            rows = rows[: cfg.train_limit]
        train = [self._example("math_train", r) for r in rows]
        evals = {name: [self._example(name, r) for r in datasets.load(name, cfg.data_dir)]
                 for name in cfg.eval}
        return train, evals

    def _example(self, dataset: str, row: dict[str, Any]) -> Example:
        return Example(id=f"{dataset}-{row['index']:05d}",
                       prompt=render_prompt(self.config.full.template, row["problem"]),
                       answer={"gold": row["gold"]},
                       meta={"dataset": dataset, "index": row["index"], **row["meta"]})

    # -- verification ---------------------------------------------------------------------------
    def verify(self, example: Example, response: str) -> Score:
        return self.verify_batch([example], [response])[0]

    def verify_batch(self, examples: list[Example], responses: list[str]) -> list[Score]:
        extracted = [extract_answer(r, self.config.extraction) for r in responses]
        todo = [i for i, (answer, _) in enumerate(extracted) if answer is not None]
        graded = self.grader.grade([(examples[i].answer["gold"], extracted[i][0])
                                    for i in todo])
        results = dict(zip(todo, graded))
        scores = []
        for i, (answer, method) in enumerate(extracted):
            result = results.get(i)
            correct = bool(result and result.correct)
            status = result.status if result else "none"
            reward = answer_reward(correct, answer is not None, self.config.correct_score,
                                   self.config.format_score)
            stats = grading_stats(method, status)
            key = (result.key if result and result.key is not None else answer)
            scores.append(Score(reward=reward, correct=correct, parsed=answer is not None,
                                info={"extract": method, "answer": (answer or "")[:200],
                                      "grade": status, "answer_key": key, "stats": stats}))
        return scores
