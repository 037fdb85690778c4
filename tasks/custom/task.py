"""``task=custom``: your prompts, your answers, your reward; eval sets named in the config.

Data (``task.train``, and ``task.eval.<name>.path`` per eval set): a jsonl / json / parquet / csv
file or a local Hugging Face ``datasets`` directory (:mod:`tasks.custom.data`). Column mapping
(``task.columns``): ``prompt`` (text, or a list of chat messages ``{"role", "content"}``),
``answer`` (the gold answer handed to the reward; null: none), ``id`` (null: the row number),
``solution`` (a reference completion, only to warm-start ``model=tiny``). A dotted column name
reaches into nested records (verl's ``reward_model.ground_truth``). A text prompt is rendered by
``task.template`` (a ``str.format`` string over the row's columns, ``{prompt}`` by default) and
sent as plain text, or as one user message (after ``task.system_prompt``) with ``task.chat=true``.

Reward (``task.reward``), exactly one of:

* ``verifier: <name>`` - a registered rule (``rlbench list verifiers``): ``math`` (math-verify on
  the last ``\\boxed{}``), ``exact_match``, ``countdown``, ``code_tests``; its knobs go in
  ``task.reward.options``;
* ``fn: <module:function>`` (or ``path/to/file.py:function``) - your function, called on a batch::

      def reward(prompts: list, completions: list[str], answer: list, **columns) -> list

  ``prompts`` are the rendered prompts, ``completions`` the sampled responses, ``answer`` the
  gold answers, and every other column of the data arrives as a keyword list of the same length
  (TRL's ``reward_funcs`` convention; a function that names only some of these gets only those).
  It returns one score per completion: a number (the reward; correct when
  ``>= task.reward.correct_threshold``), ``None`` (no answer could be parsed: reward 0), or a dict
  ``{"reward": float, "correct": bool, "parsed": bool}``. Calls run on chunks of
  ``task.reward.chunk_size`` in ``task.reward.workers`` worker processes; a call over
  ``task.reward.timeout_s`` or one that raises scores its chunk 0, counted as
  ``reward_timeout`` / ``reward_error`` (``eval/<set>/reward_error``), never stopping training.

Eval sets: ``task.eval`` maps a name to ``{path, split, limit, n, k, maj_k, temperature, top_p,
max_new_tokens}``; add one with ``+task.eval.<name>.path=<file>``, drop one with
``~task.eval.<name>``. Sources: TRL's ``GRPOTrainer(reward_funcs=...)`` signature and verl's
``data.train_files`` / ``custom_reward_function`` conventions, which this task follows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.compat import BINARY_CORRECT
from harness.registry import VERIFIERS, register_task
from harness.task import EvalProtocol, EvalSet, Task
from harness.typed_config import ConfigError
from harness.types import Example, Score
from tasks.custom.data import column, load_rows

log = logging.getLogger("rlbench")


@dataclass
class ColumnsConfig:
    prompt: str = "prompt"
    answer: str | None = "answer"
    id: str | None = None
    solution: str | None = None


@dataclass
class RewardConfig:
    verifier: str | None = None
    fn: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    workers: int = 2
    timeout_s: float = 30.0
    chunk_size: int = 64
    correct_threshold: float = 1.0


@dataclass
class EvalSetConfig:
    path: str | None = None
    split: str | None = None
    limit: int | None = None
    n: int = 4
    k: list[int] = field(default_factory=lambda: [1])
    maj_k: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None


@register_task("custom")
class CustomTask(Task):
    """Your data and reward: prompts from a file or datasets dir, a verifier or a function."""

    offers: ClassVar[frozenset[str]] = frozenset({BINARY_CORRECT})  # harness.compat

    name = "custom"

    @dataclass
    class Config:
        train: str | None = None
        train_split: str | None = None
        train_limit: int | None = None
        columns: ColumnsConfig = field(default_factory=ColumnsConfig)
        template: str = "{prompt}"
        chat: bool = False
        system_prompt: str | None = None
        max_new_tokens: int = 256
        reward: RewardConfig = field(default_factory=RewardConfig)
        eval: dict[str, EvalSetConfig] = field(default_factory=dict)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        if not config.train:
            raise ConfigError("task.train is not set: give the path of your prompts (a .jsonl, "
                              ".parquet or .csv file, or a datasets directory), e.g. "
                              "task.train=data/train.jsonl")
        if config.system_prompt and not config.chat:
            raise ConfigError("task.system_prompt needs task.chat=true (a system message "
                              "exists only in a chat-formatted prompt)")
        for name, es in config.eval.items():
            if not es.path:
                raise ConfigError(f"task.eval.{name}.path is not set: give the eval set's file "
                                  f"(+task.eval.{name}.path=<file>), or drop it with "
                                  f"~task.eval.{name}")
            if max([*es.k, *(es.maj_k or [])]) > es.n:
                raise ConfigError(f"task.eval.{name}: every k ({es.k}, maj_k {es.maj_k}) must "
                                  f"be <= n={es.n}")
        self.reward = build_reward(config.reward)
        self._train: list[Example] | None = None
        self._evals: list[EvalSet] | None = None

    # -- data -----------------------------------------------------------------------------------
    def _examples(self, rows: list[dict[str, Any]], where: str, key: str) -> list[Example]:
        cols = self.config.columns
        out = []
        for i, row in enumerate(rows):
            prompt = self._render(column(row, cols.prompt, "task.columns.prompt", where), row)
            answer = column(row, cols.answer, "task.columns.answer", where) if cols.answer \
                else None
            ident = column(row, cols.id, "task.columns.id", where) if cols.id else f"{key}-{i}"
            out.append(Example(id=str(ident), prompt=prompt, answer=answer,
                               meta={"row": row, "index": i, "dataset": key}))
        return out

    def _render(self, prompt: Any, row: dict[str, Any]) -> str | list[dict[str, Any]]:
        cfg = self.config
        if isinstance(prompt, list):  # chat messages already
            return prompt
        try:
            text = cfg.template.format_map({**row, "prompt": prompt})
        except (KeyError, IndexError) as exc:
            raise ConfigError(f"task.template={cfg.template!r} names {exc}, which is not a "
                              f"column (columns: {', '.join(map(str, row))})") from None
        if not cfg.chat:
            return text
        system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
        return [*system, {"role": "user", "content": text}]

    def train_examples(self) -> list[Example]:
        if self._train is None:
            cfg = self.config
            rows = load_rows(cfg.train, cfg.train_split, "task.train", "task.train_split")
            if cfg.train_limit is not None:
                rows = rows[: cfg.train_limit]
            if not rows:
                raise ConfigError(f"task.train={cfg.train!r} has no rows")
            self._train = self._examples(rows, str(cfg.train), "train")
            self.reward.check_columns(rows[0], self.config.columns)
        return self._train

    def eval_sets(self) -> list[EvalSet]:
        if self._evals is None:
            self._evals = []
            for name, es in self.config.eval.items():
                rows = load_rows(str(es.path), es.split, f"task.eval.{name}.path",
                                 f"task.eval.{name}.split")
                if es.limit is not None:
                    rows = rows[: es.limit]
                if not rows:
                    raise ConfigError(f"task.eval.{name}: {es.path!r} has no rows"
                                      + (f" (limit={es.limit})" if es.limit is not None else ""))
                protocol = EvalProtocol(
                    n=es.n, k=list(es.k), temperature=es.temperature, top_p=es.top_p,
                    max_new_tokens=es.max_new_tokens or self.config.max_new_tokens,
                    maj_k=None if es.maj_k is None else list(es.maj_k))
                self._evals.append(EvalSet(name, self._examples(rows, str(es.path), name),
                                           protocol))
        return self._evals

    def warmstart_examples(self) -> list[tuple[Example, str]]:
        sol = self.config.columns.solution
        if not sol:
            raise ConfigError("task=custom with a locally built model (model=tiny) needs "
                              "reference completions to warm-start on: set "
                              "task.columns.solution=<column>, or bring a model: model=hf "
                              "model.path=<dir>")
        return [(ex, str(column(ex.meta["row"], sol, "task.columns.solution", "task.train")))
                for ex in self.train_examples()]

    @property
    def default_max_new_tokens(self) -> int:
        return int(self.config.max_new_tokens)

    # -- verification ---------------------------------------------------------------------------
    def verify(self, example: Example, response: str) -> Score:
        return self.verify_batch([example], [response])[0]

    def verify_batch(self, examples: list[Example], responses: list[str]) -> list[Score]:
        return self.reward(examples, responses)


def build_reward(cfg: RewardConfig) -> Any:
    if (cfg.verifier is None) == (cfg.fn is None):
        raise ConfigError(
            "task.reward: set exactly one of task.reward.verifier=<name> (one of: "
            f"{', '.join(VERIFIERS.names())}) or task.reward.fn=<module:function>")
    if cfg.verifier is not None:
        return VerifierReward(VERIFIERS.get(cfg.verifier)(cfg.options, "task.reward.options"))
    if cfg.options:
        raise ConfigError("task.reward.options are a verifier's knobs; a reward fn gets none")
    return FunctionReward(cfg)


class VerifierReward:
    """A registered verifier (it reads only ``Example.answer``)."""

    def __init__(self, verifier: Any) -> None:
        self.verifier = verifier

    def check_columns(self, row: dict[str, Any], cols: ColumnsConfig) -> None:
        if cols.answer is None:
            raise ConfigError("task.columns.answer=null, but a verifier needs the gold answer: "
                              "name its column (task.columns.answer=<column>)")

    def __call__(self, examples: list[Example], responses: list[str]) -> list[Score]:
        return self.verifier(examples, responses)


class FunctionReward:
    """The user's function, on chunks, in worker processes with a timeout."""

    def __init__(self, cfg: RewardConfig) -> None:
        import inspect

        from harness.user_callable import CallablePool, load_callable

        self.cfg = cfg
        self.fn = load_callable(cfg.fn, "task.reward.fn")
        try:
            self.params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            self.params = {}
        self.all_kwargs = not self.params or any(
            p.kind is p.VAR_KEYWORD for p in self.params.values())
        self.pool = CallablePool(self.fn, cfg.workers, cfg.timeout_s)
        self._warned = 0.0

    def check_columns(self, row: dict[str, Any], cols: ColumnsConfig) -> None:
        available = {"prompts", "completions", "answer", *row}
        missing = [name for name, p in self.params.items()
                   if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                   and name not in available]
        if missing:
            raise ConfigError(
                f"task.reward.fn={self.cfg.fn!r} requires {', '.join(missing)}, which is "
                f"neither prompts, completions, answer nor a column of task.train (columns: "
                f"{', '.join(map(str, row))})")

    def _kwargs(self, examples: list[Example], responses: list[str]) -> dict[str, Any]:
        rows = [ex.meta.get("row", {}) for ex in examples]
        kwargs: dict[str, Any] = {name: [r.get(name) for r in rows] for name in rows[0]} \
            if rows else {}
        kwargs.update(prompts=[ex.prompt for ex in examples], completions=list(responses),
                      answer=[ex.answer for ex in examples])
        if not self.all_kwargs:
            kwargs = {k: v for k, v in kwargs.items() if k in self.params}
        return kwargs

    def __call__(self, examples: list[Example], responses: list[str]) -> list[Score]:
        size = max(1, self.cfg.chunk_size)
        spans = [(i, min(i + size, len(examples))) for i in range(0, len(examples), size)]
        results = self.pool.map([self._kwargs(examples[a:b], responses[a:b]) for a, b in spans])
        scores: list[Score] = []
        failures = []
        for (a, b), result in zip(spans, results):
            values, status = result.values, result.status
            if values is not None and len(values) != b - a:
                values, status = None, "error"
                result.error = f"returned {len(result.values or [])} scores for {b - a} samples"
            if values is None:
                failures.append(f"{status}: {result.error}")
                stats = {"reward_timeout": float(status == "timeout"),
                         "reward_error": float(status == "error")}
                scores += [Score(0.0, False, False, {"status": status, "stats": stats})
                           for _ in range(b - a)]
                continue
            scores += [self._score(v) for v in values]
        if failures and time.monotonic() - self._warned > 60:
            self._warned = time.monotonic()
            log.warning("task.reward.fn=%s failed on %d of %d chunks (scored 0): %s",
                        self.cfg.fn, len(failures), len(spans), failures[0])
        return scores

    def _score(self, value: Any) -> Score:
        ok = {"stats": {"reward_timeout": 0.0, "reward_error": 0.0}}
        if value is None:
            return Score(0.0, False, False, ok)
        if isinstance(value, dict):
            reward = float(value.get("reward", value.get("score", 0.0)))
            correct = bool(value.get("correct", reward >= self.cfg.correct_threshold))
            return Score(reward, correct, bool(value.get("parsed", True)), ok)
        reward = float(value)
        return Score(reward, reward >= self.cfg.correct_threshold, True, ok)
