"""Grading throughput of the code task, and what hostile replies cost the judge: this checkout
against another commit, side by side in one run.

Every program goes through the full path (sandbox, fresh forked process per program, judge-side
tests). Two worker processes, one per side, each import the grader of its own tree (this
checkout, and ``git archive --baseline`` in a temporary directory) and grade the **same** items
(the 164 HumanEval reference solutions as this checkout loads them, result cache off) on
``--workers`` sandboxes; rounds alternate between the sides, ``--repeat`` rounds each, so both
see the same machine. The figure to read is the throughput ratio.

``--attacks`` then grades, in a fresh worker process per side and per program, replies built
to grow the judge (nested lists, a long flat list, 750,000 top-level names on a 20-test problem
with fractional reward, a reply just over this checkout's size limit) and reports the judge
process's own peak RSS growth over the program (``VmHWM`` after resetting it through
``/proc/self/clear_refs``) and CPU seconds (its children, the sandboxes, not counted).

    python benchmarks/code_grading.py --baseline c1493d2 --workers 2 --repeat 6 --attacks
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each reply is as large as the side's limits let it be; "over" is just over this checkout's
# byte limit (8 MiB).
ATTACKS = {
    "nested_lists_100k": "def f(x):\n    return [[] for _ in range(99_000)]\n",
    "flat_list_900k": "def f(x):\n    return [0] * 900_000\n",
    "empty_lists_650k": "def f(x):\n    return [[]] * 650_000\n",
    # 750,000 names exceed the candidate's own 512 MiB; 250,000 fit and reach the judge
    "names_250k": "".join(f"n{i} = {i}\n" for i in range(250_000)) + "def f(x):\n    return -1\n",
    "over_the_byte_limit": "def f(x):\n    return 'x' * (9 << 20)\n",
    "hash_collisions_80k": ("def f(x):\n"
                            "    return [k * ((1 << 61) - 1) for k in range(1, 80_001)]\n"),
    "iterator_of_8mb_strings": ("def f(x):\n    i = 0\n    while True:\n        i += 1\n"
                                "        yield str(i) + 'a' * 8_000_000\n"),
}
# 20 tests, each hashing and sorting what f returns, as real tests do; fractional reward
PROBLEM = {"kind": "functional", "preamble": "",
           "units": [f"assert sorted(set(f({i}))) == [{i}]\n" for i in range(20)]}
HONEST = "def f(x):\n    return [x]\n"
JUDGE_CAP_GIB = 8


def _worker(root: str, items_path: str, workers: int) -> None:
    """One side: build a grader from ``root``'s code, then grade the items on every "go"."""
    sys.path.insert(0, root)
    import tasks.code.grading as graded
    from tasks.code.grading import CodeGrader, GraderConfig

    if not Path(graded.__file__).resolve().is_relative_to(Path(root).resolve()):
        raise SystemExit(f"worker for {root} imported {graded.__file__}")
    items = [tuple(x) for x in json.loads(Path(items_path).read_text())]
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        grader = CodeGrader(GraderConfig(workers=workers, cache_size=0,
                                         stop_on_first_failure=False,
                                         allow_weaker_isolation=True))
        grader.grade_many(items[:workers])  # start the sandboxes
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        start = time.perf_counter()
        passed = sum(r.all_passed for r in grader.grade_many(items))
        print(json.dumps({"seconds": time.perf_counter() - start, "passed": passed}),
              flush=True)
    grader.close()


def _attack(root: str, name: str) -> None:
    """Grade one hostile program with a fresh grader; print the judge's own cost."""
    sys.path.insert(0, root)
    from tasks.code.grading import CodeGrader, GraderConfig

    # the judge is capped here so that an unbounded one fails with MemoryError instead of
    # taking the machine (a remote iterator of 8 MiB strings grows it by ~200 MB/s)
    resource.setrlimit(resource.RLIMIT_AS, (JUDGE_CAP_GIB << 30, JUDGE_CAP_GIB << 30))
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        grader = CodeGrader(GraderConfig(workers=1, cache_size=0, stop_on_first_failure=False,
                                         allow_weaker_isolation=True))
        grader.grade(PROBLEM, HONEST)  # warm: the server is started
        Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from now
        rss_before = _status_kib("VmRSS")
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        try:
            result = grader.grade(PROBLEM, ATTACKS[name])
        except MemoryError:
            print(json.dumps({"judge": f"MemoryError: over its {JUDGE_CAP_GIB} GiB cap"}))
            return
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        peak = _status_kib("VmHWM")
        honest = grader.grade(PROBLEM, HONEST)
        grader.close()
    print(json.dumps({
        "peak_rss_growth_mb": round((peak - rss_before) / 1024, 1),
        "judge_cpu_s": round((after.ru_utime + after.ru_stime)
                             - (before.ru_utime + before.ru_stime), 2),
        "wall_s": round(wall, 2), "passed": result.passed, "total": result.total,
        "status": result.status,
        "oversized": getattr(result, "oversized", None), "honest_after": honest.passed}))


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _export(ref: str, dest: Path) -> str:
    """``git archive ref`` unpacked into ``dest``; returns the full commit id."""
    commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, check=True, text=True,
                            capture_output=True).stdout.strip()
    data = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return commit


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd="/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="commit to compare with (default: none, this only)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--attacks", action="store_true", help="also measure hostile replies")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--attack", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args.worker[0], args.worker[1], int(args.worker[2]))
    if args.attack:
        return _attack(*args.attack)

    sys.path.insert(0, str(ROOT))
    from tasks.code import datasets

    with tempfile.TemporaryDirectory(prefix="rlbench-bench-") as tmp:
        sides = {"this": str(ROOT)}
        if args.baseline:
            base = Path(tmp) / "baseline"
            commit = _export(args.baseline, base)
            sides["baseline"] = str(base)
            print(f"baseline: {commit}")
        examples = datasets.load("humaneval")
        items = [(ex.answer, ex.meta["reference"]) for ex in examples]
        items_path = Path(tmp) / "items.json"
        items_path.write_text(json.dumps(items))
        print(f"workers={args.workers} cpus={os.cpu_count()} repeat={args.repeat} "
              f"load={os.getloadavg()[0]:.2f}")
        procs = {k: _spawn(["--worker", root, str(items_path), str(args.workers)])
                 for k, root in sides.items()} if args.repeat else {}
        for proc in procs.values():
            assert proc.stdout.readline().strip() == "ready"
        seconds = dict.fromkeys(procs, 0.0)
        passed = dict.fromkeys(procs, 0)
        order = list(procs)
        for r in range(args.repeat):
            for name in order if r % 2 == 0 else order[::-1]:
                procs[name].stdin.write("go\n")
                procs[name].stdin.flush()
                out = json.loads(procs[name].stdout.readline())
                seconds[name] += out["seconds"]
                passed[name] += out["passed"]
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
        n = len(items) * args.repeat
        rate = {k: n / seconds[k] for k in procs}
        for name in procs:
            print(f"fork server, {name}: {n} programs ({passed[name]} passed) in "
                  f"{seconds[name]:.2f} s = {rate[name]:.1f} programs/s")
        if "baseline" in rate:
            ratio = rate["this"] / rate["baseline"]
            print(f"this/baseline throughput: {ratio:.3f} (this is "
                  f"{100 * abs(1 - ratio):.1f}% {'slower' if ratio < 1 else 'faster'})")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        if args.attacks:
            for name in ATTACKS:
                for side, root in sides.items():
                    proc = _spawn(["--attack", root, name])
                    out, _ = proc.communicate(timeout=600)
                    print(f"{name:22s} {side:8s} {out.strip()}")


if __name__ == "__main__":
    main()
