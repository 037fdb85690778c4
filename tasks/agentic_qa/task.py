"""Agentic QA: answer multi-hop questions by calling tools (``search``, ``python``) over several
turns; graded by SQuAD-normalised EM / F1 of the final ``<answer>`` (docs/tasks/agentic_qa.md).

Two variants (``task.variant``):

* ``tiny`` - a CPU testbed (:mod:`tasks.agentic_qa.testbed`): two-hop lookups ("manager of the
  founder of Zorb") over a generated corpus; only ``search`` (the best sentence, BM25); a
  held-out set of ``heldout`` problems; warm-start traces whose tool results are the tool's own;
  binary reward by normalised EM.
* ``full`` - HotpotQA / MuSiQue questions answerable from the shipped 10,001-paragraph corpus
  (:mod:`tasks.agentic_qa.datasets`), the closed-book sets (Bamboogle, 2Wiki, HotpotQA, MuSiQue
  dev-500) and user-supplied GAIA / WebWalkerQA; ``search`` (BM25, :mod:`tasks.agentic_qa.tools`)
  and ``python`` (sandboxed); reward F1 or EM, optionally Tool-Star's hierarchical reward.

The model writes ``<search>q</search>`` / ``<python>code</python>``; the rollout (not this
module) stops at the closing tag, calls ``tool_env().call`` and appends ``<result>...</result>``.
``verify`` reads the whole response, tool results included. Every knob is listed in
``conf/task/agentic_qa.yaml``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness import compat, sandbox
from harness.registry import register_task
from harness.task import EvalProtocol, VariantTask
from harness.tools import ToolEnv
from harness.types import Example, Score
from tasks.agentic_qa import datasets, testbed
from tasks.agentic_qa.grading import (
    exact_match,
    extract_answer,
    f1_score,
    format_ok,
    tool_calls,
    toolstar_reward,
)
from tasks.agentic_qa.tools import BM25Search, PythonTool, load_corpus

REWARDS = ("f1", "em")
TEMPLATES = ("text", "chat")
TOOLS = ("search", "python")
WARMSTART_TRACES = ("needed", "both_hops")  # task.tiny.warmstart_trace

TOOL_HELP = {
    "search": "<search>query</search> searches a Wikipedia corpus and returns the top passages",
    "python": "<python>code</python> runs Python code and returns what it prints",
}
TEMPLATE_TOOLS = (
    "Answer the question. You may call tools, as many times as you need: {tools}. Each tool's "
    "result comes back inside <result></result>. When you know the answer, write it as a short "
    "phrase inside <answer></answer>.\n\nQuestion: {question}\n"
)
TEMPLATE_CLOSED = (
    "Answer the question. Write the answer as a short phrase inside <answer></answer>.\n\n"
    "Question: {question}\n"
)


@dataclass
class TinyConfig:
    n_companies: int = 600      # companies (each with its own founder): 2 problems each
    n_managers: int = 60        # pool of managers (shared between founders)
    n_cities: int = 40          # pool of cities
    relations: list[str] = field(default_factory=lambda: list(testbed.RELATIONS))
    searches: list[int] = field(default_factory=lambda: [2])  # searches a question may need
    seed: int = 0               # generates the world and splits heldout/train
    heldout: int = 200
    warmstart_fraction: float = 0.3
    # the warm-start traces: ``needed`` searches exactly as often as the question needs;
    # ``both_hops`` searches both hops whatever it gives (an over-searching warm start: the
    # positive control of the tool-call testbed, conf/sweep/agentic_decide_control_both_hops.yaml)
    warmstart_trace: str = "needed"
    reward: str = "em"          # em | f1 (single-word answers: the same)
    max_calls: int = 4
    max_total_tokens: int = 200
    max_result_chars: int = 60
    max_new_tokens: int = 200
    eval: dict[str, EvalProtocol] = field(default_factory=lambda: {
        "heldout": EvalProtocol(n=8, k=[1, 8], temperature=1.0, max_new_tokens=200)})


@dataclass
class SearchConfig:
    corpus: str | None = None       # null = the shipped data/corpus/wiki_paragraphs.jsonl
    index_dir: str | None = None    # a bm25s index saved with its corpus (overrides corpus)
    cache_dir: str | None = None    # null = $RLBENCH_CACHE/bm25, else ~/.cache/rlbench/bm25
    k: int = 3
    snippet_chars: int = 300
    show_title: bool = True


@dataclass
class PythonConfig:
    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 2000


def _full_eval_default() -> dict[str, EvalProtocol]:
    return {"hotpotqa_distractor_100": EvalProtocol(
        n=4, k=[1, 4], temperature=0.6, top_p=0.95, max_new_tokens=2048)}


@dataclass
class FullConfig:
    data_dir: str | None = None
    paths: dict[str, str | None] = field(
        default_factory=lambda: {"gaia": None, "webwalkerqa": None})
    train: list[str] = field(
        default_factory=lambda: ["hotpotqa_train_100", "musique_train_100"])
    train_limit: int | None = None
    template: str = "text"
    tools: list[str] = field(default_factory=lambda: list(TOOLS))
    search: SearchConfig = field(default_factory=SearchConfig)
    python: PythonConfig = field(default_factory=PythonConfig)
    reward: str = "f1"
    hierarchical: bool = False
    multi_tool_bonus: float = 0.1
    max_calls: int = 8
    max_total_tokens: int = 4096
    max_result_chars: int = 1500
    max_new_tokens: int = 2048
    warmstart_limit: int = 200
    eval: dict[str, EvalProtocol] = field(default_factory=_full_eval_default)


@register_task("agentic_qa")
class AgenticQATask(VariantTask):
    """Multi-turn, tool-using QA (search + python), EM/F1-graded."""

    offers: ClassVar[frozenset[str]] = frozenset({compat.BINARY_CORRECT, compat.TOOLS})

    @classmethod
    def offers_for(cls, config: Any) -> frozenset[str]:
        """The full variant with ``full.tools: []`` is closed-book and single-turn: no tools."""
        if config.get("variant") == "full" and not list(config.full.tools):
            return cls.offers - {compat.TOOLS}
        return cls.offers

    name = "agentic_qa"

    @dataclass
    class Config:
        variant: str = "full"
        tiny: TinyConfig = field(default_factory=TinyConfig)
        full: FullConfig = field(default_factory=FullConfig)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        full = config.full
        for key, value, valid in (("tiny.reward", config.tiny.reward, REWARDS),
                                  ("full.reward", full.reward, REWARDS),
                                  ("tiny.warmstart_trace", config.tiny.warmstart_trace,
                                   WARMSTART_TRACES),
                                  ("full.template", full.template, TEMPLATES)):
            if value not in valid:
                raise ValueError(f"task.{key}={value!r} is not valid; valid: {', '.join(valid)}")
        for tool in full.tools:
            if tool not in TOOLS:
                raise ValueError(f"task.full.tools: unknown tool {tool!r}; valid: "
                                 f"{', '.join(TOOLS)}")
        for name in [*full.train, *full.eval]:
            if name not in datasets.NAMES:
                raise ValueError(f"task.full: unknown dataset {name!r}; valid: "
                                 f"{', '.join(datasets.NAMES)}")
        if set(config.tiny.eval) - {"heldout"}:
            raise ValueError("task.tiny.eval: the tiny variant has only the eval set 'heldout'")
        self._train: list[Example] | None = None
        self._evals: dict[str, list[Example]] | None = None
        self._env: ToolEnv | None = None
        self._world: testbed.World | None = None

    @property
    def tool_names(self) -> list[str]:
        return ["search"] if self.config.variant == "tiny" else list(self.config.full.tools)

    # -- tools ----------------------------------------------------------------------------------
    def tool_env(self) -> ToolEnv | None:
        """The variant's tools and per-trajectory budget (None when ``full.tools`` is empty:
        closed-book, single-turn)."""
        if self._env is None:
            if self.config.variant == "tiny":
                cfg = self.config.tiny
                search = BM25Search(self.world.passages(), k=1, snippet_chars=cfg.max_result_chars,
                                    show_title=False)
                self._env = ToolEnv(tools={"search": search}, max_calls=cfg.max_calls,
                                    max_total_tokens=cfg.max_total_tokens,
                                    max_result_chars=cfg.max_result_chars)
            else:
                cfg = self.config.full
                if not cfg.tools:
                    return None
                tools: dict[str, Any] = {}
                if "search" in cfg.tools:
                    tools["search"] = self._full_search()
                if "python" in cfg.tools:
                    p = cfg.python
                    limits = sandbox.Limits(wall_s=p.wall_s, cpu_s=p.cpu_s, memory_mb=p.memory_mb)
                    tools["python"] = PythonTool(limits, max_output_chars=p.max_output_chars)
                self._env = ToolEnv(tools=tools, max_calls=cfg.max_calls,
                                    max_total_tokens=cfg.max_total_tokens,
                                    max_result_chars=cfg.max_result_chars)
        return self._env

    def _full_search(self) -> BM25Search:
        s = self.config.full.search
        opts = {"k": s.k, "snippet_chars": s.snippet_chars, "show_title": s.show_title}
        if s.index_dir:
            return BM25Search.from_index(s.index_dir, **opts)
        corpus = load_corpus(s.corpus or datasets.CORPUS)
        return BM25Search(corpus, cache_dir=s.cache_dir, **opts)

    @property
    def world(self) -> testbed.World:
        if self._world is None:
            cfg = self.config.tiny
            self._world = testbed.make_world(cfg.n_companies, cfg.n_managers, cfg.n_cities,
                                             cfg.seed)
        return self._world

    # -- data -----------------------------------------------------------------------------------
    def _load(self) -> None:
        if self._train is not None:
            return
        if self.config.variant == "tiny":
            cfg = self.config.tiny
            examples = testbed.problems(self.world, cfg.relations, cfg.searches)
            if not 0 < cfg.heldout < len(examples):
                raise ValueError(f"task.tiny.heldout={cfg.heldout} must be in "
                                 f"1..{len(examples) - 1}")
            random.Random(cfg.seed).shuffle(examples)
            self._train, self._evals = examples[cfg.heldout:], {"heldout": examples[:cfg.heldout]}
            return
        cfg = self.config.full
        train = [qa for name in cfg.train for qa in self._records(name)]
        if cfg.train_limit is not None:
            train = train[: cfg.train_limit]
        self._train = [self._example(qa) for qa in train]
        self._evals = {name: [self._example(qa) for qa in self._records(name)]
                       for name in cfg.eval}

    def _records(self, name: str) -> list[datasets.QA]:
        cfg = self.config.full
        return datasets.load(name, cfg.data_dir, dict(cfg.paths))

    def render_prompt(self, question: str) -> str | list[dict[str, str]]:
        """The full variant's prompt: the tool tags of the enabled tools, then the question."""
        cfg = self.config.full
        if cfg.tools:
            tools = "; ".join(TOOL_HELP[t] for t in cfg.tools)
            text = TEMPLATE_TOOLS.format(tools=tools, question=question.strip())
        else:
            text = TEMPLATE_CLOSED.format(question=question.strip())
        return [{"role": "user", "content": text}] if cfg.template == "chat" else text

    def _example(self, qa: datasets.QA) -> Example:
        return Example(id=qa.id, prompt=self.render_prompt(qa.question),
                       answer={"answers": qa.answers}, meta={**qa.meta, "question": qa.question})

    def warmstart_examples(self) -> list[tuple[Example, str]]:
        """Tiny: the reference traces (``task.tiny.warmstart_trace``) of a share of the train
        pool. Full: one search with the question, its real result, then the gold answer (a
        format primer only)."""
        env = self.tool_env()
        if self.config.variant == "tiny":
            cfg = self.config.tiny
            if not 0.0 <= cfg.warmstart_fraction <= 1.0:
                raise ValueError(f"task.tiny.warmstart_fraction={cfg.warmstart_fraction} "
                                 "must be in [0, 1]")
            assert env is not None
            train = self.train_examples()
            pool = train[: round(cfg.warmstart_fraction * len(train))]
            both = cfg.warmstart_trace == "both_hops"
            return [(ex, testbed.trace(ex, env, both_hops=both)) for ex in pool]
        pairs = []
        for ex in self.train_examples()[: max(self.config.full.warmstart_limit, 0)]:
            gold = ex.answer["answers"][0]
            if env is not None and "search" in env.tools:
                query = ex.meta["question"]
                result, _ = env.call("search", query)
                pairs.append((ex, f"<search>{query}</search>{result}<answer>{gold}</answer>"))
            else:
                pairs.append((ex, f"<answer>{gold}</answer>"))
        return pairs

    # -- verification ---------------------------------------------------------------------------
    def verify(self, example: Example, response: str) -> Score:
        section = self._section
        golds = example.answer["answers"]
        prediction, method = extract_answer(response)
        names = self.tool_names
        used = tool_calls(response, names)
        fmt = format_ok(response, names)
        parsed = prediction is not None
        em = exact_match(prediction, golds) if parsed else 0.0
        f1 = f1_score(prediction, golds) if parsed else 0.0
        acc = f1 if section.reward == "f1" else em
        if self.config.variant == "full" and self.config.full.hierarchical:
            reward = toolstar_reward(acc, fmt, used, self.config.full.multi_tool_bonus)
        else:
            reward = acc
        info = {
            "em": em, "f1": f1, "prediction": None if prediction is None else prediction[:200],
            "extraction": method, "format_ok": fmt, "tool_calls": dict(used),
            "stats": {"em": em, "f1": f1, "format_ok": float(fmt),
                      "tool_calls": float(sum(used.values()))},
        }
        if "searches_needed" in example.meta:  # tiny: calls beyond, and short of, the need
            extra = float(sum(used.values())) - example.meta["searches_needed"]
            info["stats"]["calls_over_needed"] = max(extra, 0.0)
            info["stats"]["calls_under_needed"] = max(-extra, 0.0)
        return Score(reward=float(reward), correct=em == 1.0, parsed=parsed, info=info)
