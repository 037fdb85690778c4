"""Loaders of the agentic QA question sets, each to a list of :class:`QA` records.

Shipped (``tasks/agentic_qa/data``, provenance in its SOURCE.md):

* answerable from the shipped corpus ``corpus/wiki_paragraphs.jsonl`` (train and eval):
  ``hotpotqa_distractor_100`` (HotpotQA dev, distractor setting), ``hotpotqa_train_100``,
  ``musique_train_100`` (MuSiQue-Ans, with answer aliases);
* question + answer only, for closed-book evaluation or a user-supplied index (their corpus, the
  KILT Wikipedia, is not shipped): ``bamboogle`` (125), ``2wiki_dev_500``, ``hotpotqa_dev_500``,
  ``musique_dev_500``.

From a user-supplied path only (``task.full.paths.<name>``):

* ``gaia`` - the Hugging Face ``gaia-benchmark/GAIA`` layout (a ``metadata.jsonl`` file, or a
  directory holding one: ``task_id``, ``Question``, ``Level``, ``Final answer``, ``file_name``)
  or WebThinker's JSON list (``Question``, ``answer``, ``Level``). Tasks with an attached file
  are kept, with the file name in ``meta`` (the text tools cannot open it). GAIA is not shipped:
  its authors ask that it not be redistributed.
* ``webwalkerqa`` - WebThinker's ``test.json`` (``Question``, ``answer``, ``root_url``, ...) or
  the Hugging Face layout (``question``, ``answer``, ``root_url``, ``info``), JSON or JSON lines.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).parent / "data"
CORPUS = DATA_DIR / "corpus" / "wiki_paragraphs.jsonl"


@dataclass
class QA:
    id: str
    question: str
    answers: list[str]  # the gold answer first, then aliases
    meta: dict[str, Any] = field(default_factory=dict)


def _read(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"agentic_qa: {str(path)!r} does not exist")
    with path.open(encoding="utf-8") as fh:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in fh if line.strip()]
        return json.load(fh)


def _aliases(value: Any) -> list[str]:
    """A gold answer as a list: a string, a list, or a stringified list (ARPO's files)."""
    if isinstance(value, list):
        return [str(v) for v in value]
    text = str(value)
    if text.startswith("[") and text.endswith("]"):
        try:  # literal_eval parses data, it does not run code
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return [text]
        if isinstance(parsed, list):
            return [str(v) for v in parsed]
    return [text]


def _closed_book(name: str, file: str) -> Callable[[Path], list[QA]]:
    def load(directory: Path) -> list[QA]:
        return [QA(f"{name}/{r['idx']}", r["question"], _aliases(r["answer"]),
                   {"dataset": name}) for r in _read(directory / file)]
    return load


def _hotpot_distractor(directory: Path) -> list[QA]:
    out = []
    for r in _read(directory / "hotpotqa_dev_distractor_100.jsonl"):
        sf = r["supporting_facts"]
        out.append(QA(f"hotpotqa_distractor_100/{r['id']}", r["question"], [r["answer"]],
                      {"dataset": "hotpotqa_distractor_100", "type": r["type"],
                       "level": r["level"], "supporting_titles": sorted(set(sf["title"]))}))
    return out


def _hotpot_train(directory: Path) -> list[QA]:
    return [QA(f"hotpotqa_train_100/{r['_id']}", r["question"], [r["answer"]],
               {"dataset": "hotpotqa_train_100", "type": r["type"], "level": r["level"],
                "supporting_titles": sorted({t for t, _ in r["supporting_facts"]})})
            for r in _read(directory / "hotpotqa_train_100_context.json")]


def _musique_train(directory: Path) -> list[QA]:
    out = []
    for r in _read(directory / "musique_train_100_paragraphs.json"):
        titles = sorted({p["title"] for p in r["paragraphs"] if p["is_supporting"]})
        out.append(QA(f"musique_train_100/{r['id']}", r["question"],
                      [r["answer"], *r.get("answer_aliases", [])],
                      {"dataset": "musique_train_100", "hops": len(r["question_decomposition"]),
                       "supporting_titles": titles}))
    return out


def load_gaia(path: str | Path) -> list[QA]:
    """GAIA from a user's copy (see the module docstring)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "metadata.jsonl"
    rows = _read(path)
    out = []
    for i, r in enumerate(rows):
        question = r.get("Question", r.get("question"))
        answer = r.get("Final answer", r.get("answer"))
        if question is None or answer is None:
            raise ValueError(f"{path} row {i}: expected 'Question' and 'Final answer' (or "
                             "'answer')")
        out.append(QA(f"gaia/{r.get('task_id', r.get('id', i))}", str(question),
                      _aliases(answer),
                      {"dataset": "gaia", "level": r.get("Level"),
                       "file_name": r.get("file_name") or None}))
    return out


def load_webwalkerqa(path: str | Path) -> list[QA]:
    """WebWalkerQA from a user's copy (see the module docstring)."""
    path = Path(path).expanduser()
    rows = _read(path)
    out = []
    for i, r in enumerate(rows):
        question = r.get("Question", r.get("question"))
        if question is None or "answer" not in r:
            raise ValueError(f"{path} row {i}: expected 'Question' (or 'question') and 'answer'")
        info = r.get("info") or {}
        out.append(QA(f"webwalkerqa/{i}", str(question), _aliases(r["answer"]),
                      {"dataset": "webwalkerqa", "root_url": r.get("root_url"),
                       "type": r.get("type", info.get("type")),
                       "difficulty": r.get("difficulty_level", info.get("difficulty_level")),
                       "lang": r.get("lang", info.get("lang"))}))
    return out


# name -> loader of the shipped sets (from a directory with the shipped file names)
SHIPPED: dict[str, Callable[[Path], list[QA]]] = {
    "hotpotqa_distractor_100": _hotpot_distractor,
    "hotpotqa_train_100": _hotpot_train,
    "musique_train_100": _musique_train,
    "bamboogle": _closed_book("bamboogle", "bamboogle.jsonl"),
    "2wiki_dev_500": _closed_book("2wiki_dev_500", "2wiki_dev_500.jsonl"),
    "hotpotqa_dev_500": _closed_book("hotpotqa_dev_500", "hotpotqa_dev_500.jsonl"),
    "musique_dev_500": _closed_book("musique_dev_500", "musique_dev_500.jsonl"),
}
USER_SUPPLIED: dict[str, Callable[[str | Path], list[QA]]] = {
    "gaia": load_gaia, "webwalkerqa": load_webwalkerqa,
}
NAMES = (*SHIPPED, *USER_SUPPLIED)
# the sets the shipped corpus answers (the others have no local corpus)
WITH_CORPUS = ("hotpotqa_distractor_100", "hotpotqa_train_100", "musique_train_100")


def load(name: str, data_dir: str | Path | None = None,
         paths: dict[str, str | None] | None = None) -> list[QA]:
    """The records of dataset ``name`` (see :data:`NAMES`)."""
    if name in USER_SUPPLIED:
        path = (paths or {}).get(name)
        if not path:
            raise ValueError(f"agentic_qa: dataset {name!r} is not shipped; set "
                             f"task.full.paths.{name} to your copy")
        return USER_SUPPLIED[name](path)
    if name not in SHIPPED:
        raise ValueError(f"agentic_qa: unknown dataset {name!r}; valid: {', '.join(NAMES)}")
    return SHIPPED[name](Path(data_dir).expanduser() if data_dir else DATA_DIR)
