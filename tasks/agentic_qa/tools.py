"""The tools of the agentic QA task: BM25 ``search`` over a local corpus and a sandboxed
``python``. Both satisfy :class:`harness.tools.Tool` (``tool(query) -> str``) and never raise:
a bad query, an empty result, a timeout or a sandbox failure comes back to the model as text.

``BM25Search`` indexes passages with the ``bm25s`` library (Lucene BM25, k1 = 1.5, b = 0.75,
English stop words, lower-cased ``\\w\\w+`` tokens). The index is built once per corpus and
saved under ``$RLBENCH_CACHE/bm25/<key>`` (else ``~/.cache/rlbench/bm25/<key>``), where the key
hashes the passages, the BM25 parameters and the bm25s version, so any change rebuilds it and
every later run (and every process of a sweep) loads it. Builds are atomic (a temporary
directory renamed into place), so concurrent processes never see a half-written index. A user
may also point at an index saved by bm25s itself (:meth:`BM25Search.from_index`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness import sandbox
from harness.config import cache_home
from harness.tools import ToolFailure

MAX_QUERY_CHARS = 1000  # longer queries are cut (a runaway generation must not stall BM25)
_MEMO: dict[str, Any] = {}  # in-process: one loaded index per key, shared by every tool instance
_MEMO_LOCK = threading.Lock()


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


def load_corpus(path: str | Path) -> list[Passage]:
    """Passages of a corpus file. Layouts: JSON lines of ``{"title", "text"}`` (or FlashRAG's
    ``{"contents": "title\\ntext"}``), a JSON list of such objects, or a JSON object mapping a
    title to its list of sentences (HotpotQA's layout)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"search corpus {str(path)!r} does not exist")
    with path.open(encoding="utf-8") as fh:
        if path.suffix == ".jsonl":
            rows: Any = [json.loads(line) for line in fh if line.strip()]
        else:
            rows = json.load(fh)
    if isinstance(rows, dict):
        return [Passage(f"p{i}", str(t), "".join(s) if isinstance(s, list) else str(s))
                for i, (t, s) in enumerate(rows.items())]
    out = []
    for i, row in enumerate(rows):
        if "text" in row:
            title, text = str(row.get("title", "")), str(row["text"])
        elif "contents" in row:
            title, _, text = str(row["contents"]).partition("\n")
            title = title.strip('"')
        else:
            raise ValueError(f"{path} row {i}: expected 'text' (and 'title') or 'contents'")
        out.append(Passage(str(row.get("id", f"p{i}")), title, text))
    return out


class BM25Search:
    """``search``: the top-``k`` passages for a query, as text (see the module docstring).

    ``show_title`` prefixes each snippet with its title; with ``k == 1`` and no title the result
    is the bare passage text (the tiny variant). ``built`` says whether this instance built the
    index (True) or reused a cached one (False).
    """

    def __init__(
        self, passages: Sequence[Passage], *, k: int = 3, snippet_chars: int = 300,
        show_title: bool = True, cache_dir: str | Path | None = None, k1: float = 1.5,
        b: float = 0.75, method: str = "lucene", stopwords: str = "en", memo: bool = True,
    ) -> None:
        if not passages:
            raise ValueError("BM25Search: the corpus is empty")
        if k < 1:
            raise ValueError(f"BM25Search: k={k} must be >= 1")
        self.passages = list(passages)
        self.k, self.snippet_chars, self.show_title = k, snippet_chars, show_title
        self.stopwords = stopwords
        self.params = {"k1": k1, "b": b, "method": method, "stopwords": stopwords}
        self.key = self._key()
        self.index_dir = Path(cache_dir or cache_home() / "bm25") / self.key
        self.built = False
        with _MEMO_LOCK:
            retriever = _MEMO.get(self.key) if memo else None
            if retriever is None:
                retriever = self._load_or_build()
                if memo:
                    _MEMO[self.key] = retriever
        self.retriever = retriever

    @classmethod
    def from_index(cls, index_dir: str | Path, **kwargs: Any) -> BM25Search:
        """A search over an index saved by ``bm25s.BM25.save(dir, corpus=...)`` (a user's own;
        corpus entries may be strings or objects with ``text`` and optional ``title``)."""
        import bm25s

        retriever = bm25s.BM25.load(str(index_dir), load_corpus=True, show_progress=False)
        if retriever.corpus is None:
            raise ValueError(f"{index_dir}: the index was saved without its corpus")
        passages = []
        for i, row in enumerate(retriever.corpus):
            if isinstance(row, dict):
                passages.append(Passage(str(row.get("id", i)), str(row.get("title", "")),
                                        str(row.get("text", row.get("contents", "")))))
            else:
                passages.append(Passage(str(i), "", str(row)))
        retriever.corpus = None  # retrieve() then returns row numbers, as for our own indexes
        self = cls.__new__(cls)
        self.passages = passages
        self.k = kwargs.get("k", 3)
        self.snippet_chars = kwargs.get("snippet_chars", 300)
        self.show_title = kwargs.get("show_title", True)
        self.stopwords = kwargs.get("stopwords", "en")
        self.params, self.key, self.index_dir = {}, "user", Path(index_dir)
        self.built, self.retriever = False, retriever
        return self

    # -- index ----------------------------------------------------------------------------------
    def _key(self) -> str:
        import bm25s

        h = hashlib.sha256()
        h.update(json.dumps({**self.params, "bm25s": bm25s.__version__.rsplit(".", 1)[0],
                             "format": 1}, sort_keys=True).encode())
        for p in self.passages:
            h.update(p.title.encode())
            h.update(b"\x00")
            h.update(p.text.encode())
            h.update(b"\x01")
        return h.hexdigest()[:24]

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        import bm25s

        return bm25s.tokenize(texts, stopwords=self.stopwords, return_ids=False,
                              show_progress=False)

    def _load_or_build(self) -> Any:
        import bm25s

        if (self.index_dir / "params.index.json").is_file():
            with contextlib.suppress(Exception):  # a corrupt cache is rebuilt, not fatal
                return bm25s.BM25.load(str(self.index_dir), show_progress=False)
        retriever = bm25s.BM25(k1=self.params["k1"], b=self.params["b"],
                               method=self.params["method"])
        texts = [f"{p.title} {p.text}" for p in self.passages]  # titles are searchable
        retriever.index(self._tokenize(texts), show_progress=False)
        self.built = True
        self.index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.key}-", dir=self.index_dir.parent))
        try:
            retriever.save(str(tmp), show_progress=False)
            os.rename(tmp, self.index_dir)  # atomic; fails if another process got there first
        except OSError:
            pass  # theirs is the same index; ours stays in memory
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return retriever

    # -- search ---------------------------------------------------------------------------------
    def search(self, query: str, k: int | None = None) -> list[tuple[Passage, float]]:
        """The top-``k`` passages with a positive BM25 score, best first."""
        k = min(k or self.k, len(self.passages))
        tokens = self._tokenize([query[:MAX_QUERY_CHARS]])
        if not tokens[0]:
            return []
        docs, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [(self.passages[int(d)], float(s))
                for d, s in zip(np.asarray(docs[0]), np.asarray(scores[0])) if s > 0]

    def format(self, hits: list[tuple[Passage, float]]) -> str:
        if self.k == 1 and not self.show_title and hits:
            return _cut(hits[0][0].text, self.snippet_chars)
        lines = []
        for i, (p, _) in enumerate(hits, 1):
            head = f"({p.title}) " if self.show_title and p.title else ""
            lines.append(f"[{i}] {head}{_cut(p.text, self.snippet_chars)}")
        return "\n".join(lines)

    def __call__(self, query: str) -> str:
        try:
            if not isinstance(query, str) or not query.strip():
                return ToolFailure("error: empty search query")
            hits = self.search(query)
            return self.format(hits) if hits else f"no results for {query.strip()[:80]!r}"
        except Exception as exc:  # the model sees the failure; the trainer never does
            return ToolFailure(f"error: search failed: {type(exc).__name__}: {exc}")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)].rstrip() + "..."


class PythonTool:
    """``python``: run the code in :func:`harness.sandbox.run_python`; the result is stdout,
    then stderr and a non-zero exit status or timeout, as text. A ```` ```python ```` fence
    around the code is removed."""

    def __init__(self, limits: sandbox.Limits | None = None, max_output_chars: int = 2000) -> None:
        self.limits = limits or sandbox.Limits(wall_s=5.0, cpu_s=5.0, memory_mb=512)
        self.max_output_chars = max_output_chars

    def __call__(self, code: str) -> str:
        try:
            code = _strip_fence(code)
            if not code.strip():
                return ToolFailure("error: empty python code")
            res = sandbox.run_python(code, limits=self.limits)
        except Exception as exc:  # e.g. RLBENCH_SANDBOX=bwrap without bubblewrap
            return ToolFailure(f"error: python tool failed: {type(exc).__name__}: {exc}")
        out = res.stdout.decode("utf-8", "replace")
        err = res.stderr.decode("utf-8", "replace")
        parts = [out.rstrip("\n")] if out.strip() else []
        if err.strip():
            parts.append("stderr: " + err.strip()[-self.max_output_chars:])
        if res.timed_out:
            parts.append(f"error: timed out after {self.limits.wall_s:g}s")
        elif res.exit_code not in (0, None):
            parts.append(f"exit code {res.exit_code}")
        elif res.signal is not None:
            parts.append(f"error: killed by signal {res.signal}")
        if res.output_truncated:
            parts.append("(output truncated)")
        text = _cut("\n".join(parts) or "(no output)", self.max_output_chars)
        # the program did not run to a clean exit: a failed call (its output is still shown)
        failed = res.timed_out or res.exit_code not in (0, None) or res.signal is not None
        return ToolFailure(text) if failed else text


def _strip_fence(code: str) -> str:
    stripped = code.strip()
    if stripped.startswith("```"):
        body = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        return body[: body.rfind("```")] if "```" in body else body
    return code
