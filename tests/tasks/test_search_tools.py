"""The agentic QA tools: BM25 search (retrieval quality on the shipped corpus, the on-disk index
cache, corpus layouts, errors as text) and the sandboxed python tool (output, errors, timeouts)."""

from __future__ import annotations

import json
from pathlib import Path

import bm25s
import pytest

from harness import sandbox
from harness.tools import ToolEnv
from tasks.agentic_qa import datasets
from tasks.agentic_qa.tools import BM25Search, Passage, PythonTool, load_corpus

SMALL = [
    Passage("a", "Eiffel Tower", "The Eiffel Tower is a wrought-iron tower in Paris."),
    Passage("b", "Big Ben", "Big Ben is the nickname of the bell of the clock at Westminster."),
    Passage("c", "Colosseum", "The Colosseum is an oval amphitheatre in the centre of Rome."),
]


@pytest.fixture(scope="module")
def wiki(tmp_path_factory: pytest.TempPathFactory) -> BM25Search:
    cache = tmp_path_factory.mktemp("bm25")
    return BM25Search(load_corpus(datasets.CORPUS), k=3, cache_dir=cache, memo=False)


def test_shipped_corpus_has_all_its_paragraphs():
    passages = load_corpus(datasets.CORPUS)
    assert len(passages) == 10_001
    assert passages[0].title == "Constantin Medien" and passages[0].id == "p0"


@pytest.mark.parametrize("question, gold", [
    ("If Gallu is a demon Lilu is what?", {"Lilu (mythology)", "Alû"}),
    ("VIVA Media AG changed it's name in 2004. What does their new acronym stand for?",
     {"VIVA Media"}),
])
def test_bm25_ranks_the_gold_paragraphs_of_known_questions_first(wiki, question, gold):
    titles = [p.title for p, _ in wiki.search(question, k=3)]
    assert gold & set(titles[:2]), titles


@pytest.mark.parametrize("name, floor", [
    ("hotpotqa_distractor_100", 0.95), ("hotpotqa_train_100", 0.95), ("musique_train_100", 0.85),
])
def test_bm25_finds_a_gold_paragraph_in_the_top_10_for_most_questions(wiki, name, floor):
    # measured: 100/100, 99/100, 93/100 with the question itself as the query
    records = datasets.load(name)
    found = sum(bool({p.title for p, _ in wiki.search(qa.question, k=10)}
                     & set(qa.meta["supporting_titles"])) for qa in records)
    assert found / len(records) >= floor


def test_the_index_is_built_once_then_loaded_from_the_disk_cache(tmp_path):
    first = BM25Search(SMALL, cache_dir=tmp_path, memo=False)
    assert first.built and (first.index_dir / "params.index.json").is_file()
    stamp = (first.index_dir / "params.index.json").stat().st_mtime_ns
    second = BM25Search(SMALL, cache_dir=tmp_path, memo=False)
    assert not second.built and second.index_dir == first.index_dir
    assert (second.index_dir / "params.index.json").stat().st_mtime_ns == stamp
    assert second("Paris tower") == first("Paris tower")
    assert [p.name for p in tmp_path.iterdir()] == [first.key]  # no temporary dirs left


def test_the_real_corpus_index_is_reused_too(wiki):
    again = BM25Search(wiki.passages, k=3, cache_dir=wiki.index_dir.parent, memo=False)
    assert wiki.built and not again.built
    assert again("If Gallu is a demon Lilu is what?") == wiki("If Gallu is a demon Lilu is what?")


def test_the_cache_key_follows_the_corpus_and_the_parameters(tmp_path):
    base = BM25Search(SMALL, cache_dir=tmp_path, memo=False)
    edited = [*SMALL[:2], Passage("c", "Colosseum", "An amphitheatre in Rome.")]
    assert BM25Search(edited, cache_dir=tmp_path, memo=False).key != base.key
    assert BM25Search(SMALL, cache_dir=tmp_path, memo=False, k1=1.2).key != base.key
    assert BM25Search(SMALL, cache_dir=tmp_path, memo=False, k=1).key == base.key


def test_a_corrupt_cached_index_is_rebuilt(tmp_path):
    first = BM25Search(SMALL, cache_dir=tmp_path, memo=False)
    (first.index_dir / "params.index.json").write_text("{not json")
    again = BM25Search(SMALL, cache_dir=tmp_path, memo=False)
    assert again.built and "Eiffel" in again("wrought iron Paris")


def test_in_process_instances_share_one_loaded_index(tmp_path):
    a = BM25Search(SMALL, cache_dir=tmp_path)
    b = BM25Search(SMALL, cache_dir=tmp_path, k=1)
    assert a.retriever is b.retriever


def test_top_k_snippets_are_numbered_with_titles_and_cut(tmp_path):
    tool = BM25Search(SMALL, k=2, snippet_chars=30, cache_dir=tmp_path, memo=False)
    text = tool("Paris tower")
    lines = text.split("\n")
    assert lines[0].startswith("[1] (Eiffel Tower) The Eiffel Tower")
    assert lines[0].endswith("...") and len(lines) <= 2
    bare = BM25Search(SMALL, k=1, show_title=False, cache_dir=tmp_path, memo=False)
    assert bare("Rome amphitheatre") == SMALL[2].text


def test_search_errors_and_misses_come_back_as_text(tmp_path):
    tool = BM25Search(SMALL, cache_dir=tmp_path, memo=False)
    assert tool("").startswith("error: empty")
    assert tool(None).startswith("error: empty")  # type: ignore[arg-type]
    assert tool("the of and").startswith("no results")  # only stop words
    assert tool("zyzzyva").startswith("no results")  # unknown word: no positive score
    assert "Eiffel" in tool("Paris " * 100_000)  # a runaway query is cut, not fatal

    def broken(query: str, k: int | None = None):
        raise RuntimeError("disk gone")

    tool.search = broken  # type: ignore[method-assign]
    assert tool("Paris") == "error: search failed: RuntimeError: disk gone"


def test_tool_env_wraps_search_results(tmp_path):
    env = ToolEnv(tools={"search": BM25Search(SMALL, k=1, show_title=False, cache_dir=tmp_path)})
    assert env.call("search", "Westminster bell") == (f"<result>{SMALL[1].text}</result>", True)


def test_corpus_layouts_load(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"title": "T", "text": "x y"}) + "\n" + json.dumps({"contents": '"U"\nz w'}))
    (tmp_path / "b.json").write_text(json.dumps({"V": ["one.", " two."]}))
    (tmp_path / "c.json").write_text(json.dumps([{"id": "q", "title": "W", "text": "t"}]))
    assert load_corpus(tmp_path / "a.jsonl") == [Passage("p0", "T", "x y"),
                                                 Passage("p1", "U", "z w")]
    assert load_corpus(tmp_path / "b.json") == [Passage("p0", "V", "one. two.")]
    assert load_corpus(tmp_path / "c.json") == [Passage("q", "W", "t")]
    with pytest.raises(FileNotFoundError):
        load_corpus(tmp_path / "missing.jsonl")


def test_a_user_saved_bm25s_index_is_searchable(tmp_path):
    corpus = [{"id": p.id, "title": p.title, "text": p.text} for p in SMALL]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([c["text"] for c in corpus], stopwords="en",
                                   show_progress=False), show_progress=False)
    retriever.save(str(tmp_path / "idx"), corpus=corpus, show_progress=False)
    tool = BM25Search.from_index(tmp_path / "idx", k=1)
    assert tool("Rome amphitheatre").startswith("[1] (Colosseum)")


# -- python tool ------------------------------------------------------------------------------

FAST = sandbox.Limits(wall_s=3.0, cpu_s=2.0, memory_mb=256)


def test_python_tool_returns_stdout():
    assert PythonTool(FAST)("print(sum(range(10)))") == "45"
    assert PythonTool(FAST)("```python\nprint('fenced')\n```") == "fenced"
    assert PythonTool(FAST)("x = 1") == "(no output)"


def test_python_errors_come_back_with_stderr_and_exit_code():
    text = PythonTool(FAST)("print('before')\n1/0")
    assert text.startswith("before\nstderr: Traceback")
    assert "ZeroDivisionError" in text and text.endswith("exit code 1")
    assert PythonTool(FAST)("  ").startswith("error: empty")


def test_an_infinite_loop_times_out_as_text():
    text = PythonTool(sandbox.Limits(wall_s=1.0, cpu_s=5.0))("while True:\n    pass")
    assert "timed out" in text


def test_a_flood_of_output_is_cut():
    text = PythonTool(FAST, max_output_chars=100)("print('x' * 10**6)")
    assert len(text) <= 100


def test_python_runs_inside_the_sandbox():
    if sandbox.isolation() != "bwrap":
        pytest.skip("bubblewrap is not available: only rlimits isolate the tool here")
    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = PythonTool(FAST)(f"print(open({str(readme)!r}).read()[:20])")
    assert "No such file" in text and "exit code 1" in text


def test_a_sandbox_failure_is_returned_not_raised(monkeypatch):
    def unavailable(*args, **kwargs):
        raise sandbox.SandboxUnavailableError("no bwrap")

    monkeypatch.setattr(sandbox, "run_python", unavailable)
    assert PythonTool(FAST)("print(1)") == (
        "error: python tool failed: SandboxUnavailableError: no bwrap")


def test_failed_calls_are_tool_failures_and_the_env_records_them_not_ok():
    from harness.tools import ToolEnv, ToolFailure

    python = PythonTool(FAST)
    assert not isinstance(python("print(2)"), ToolFailure)
    assert isinstance(python("1/0"), ToolFailure)  # non-zero exit
    assert isinstance(python("  "), ToolFailure)
    search = BM25Search([Passage("p0", "Paris", "Paris is the capital of France.")], k=1)
    assert not isinstance(search("capital of France"), ToolFailure)
    assert isinstance(search(""), ToolFailure)
    env = ToolEnv(tools={"python": python, "search": search})
    assert env.call("python", "print(2)") == ("<result>2</result>", True)
    text, ok = env.call("search", " ")
    assert (text, ok) == ("<result>error: empty search query</result>", False)
    assert env.call("nope", "x")[1] is False
