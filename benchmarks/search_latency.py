"""Latency of the agentic_qa BM25 search tool (bm25s): index build, cache load, per-query time.

Two corpora: the shipped ``wiki_paragraphs.jsonl`` (10,001 paragraphs) with the questions of the
three corpus-backed sets as queries (300, each run ``--repeat`` times; the tool's full path:
tokenise, retrieve top-k, format the snippets), and the tiny variant's generated corpus with the
warm-start traces' queries. Build and load use a fresh temporary cache, so nothing is reused from
earlier runs; the process-wide memo is off, so the load is a real read from disk.

    OMP_NUM_THREADS=1 python benchmarks/search_latency.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time

from tasks.agentic_qa import datasets
from tasks.agentic_qa.task import AgenticQATask
from tasks.agentic_qa.tools import BM25Search, Passage, load_corpus


def measure(name: str, passages: list[Passage], queries: list[str], repeat: int,
            **opts: object) -> None:
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        tool = BM25Search(passages, cache_dir=cache, memo=False, **opts)
        build_s = time.perf_counter() - start
        assert tool.built
        start = time.perf_counter()
        again = BM25Search(passages, cache_dir=cache, memo=False, **opts)
        load_s = time.perf_counter() - start
        assert not again.built
        times = []
        for _ in range(repeat):
            for q in queries:
                t0 = time.perf_counter()
                tool(q)
                times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    p95 = times[int(0.95 * (len(times) - 1))]
    print(f"{name}: {len(passages):,} passages; build {build_s:.2f} s, load from cache "
          f"{load_s * 1000:.0f} ms; {len(times):,} queries: mean {statistics.mean(times):.2f} ms, "
          f"median {statistics.median(times):.2f} ms, p95 {p95:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="passes over the query set")
    parser.add_argument("--k", type=int, default=3, help="passages per search (wiki)")
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    start = time.perf_counter()
    wiki = load_corpus(datasets.CORPUS)
    print(f"wiki corpus read: {time.perf_counter() - start:.2f} s")
    questions = [qa.question for name in datasets.WITH_CORPUS for qa in datasets.load(name)]
    measure("wiki_paragraphs (k=3)", wiki, questions, args.repeat, k=args.k)

    task = AgenticQATask(AgenticQATask.Config(variant="tiny"))
    queries = [q for _, trace in task.warmstart_examples()
               for q in re.findall(r"<search>(.*?)</search>", trace)]
    measure("tiny corpus (k=1)", task.world.passages(), queries, args.repeat,
            k=1, show_title=False, snippet_chars=60)


if __name__ == "__main__":
    main()
