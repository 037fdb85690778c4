"""math-verify grading in a pool of worker processes, with a hard per-item timeout.

Why processes: math-verify 0.9's ``parse``/``verify`` time out with ``signal.alarm``, which only
works in the main thread, and sympy can spend unbounded time (or memory) on hostile input such as
``\\boxed{9^{9^{9^9}}}``. Each worker (:mod:`harness.mathgrade._worker`) is a separate interpreter
that bounds every item with its own ``setitimer`` alarm; the parent (:class:`MathGrader`)
additionally kills a worker whose current item overruns ``timeout_s + kill_grace_s`` (code stuck
in C never sees the alarm), scores that item 0 with status ``timeout``, and hands the worker's
remaining items to a fresh one. A worker that dies (crash, memory limit) costs its current item
(status ``error``) and is replaced. So a grading failure is always a 0 that is counted, never an
exception in the training step and never a hang.

Throughput: items travel in chunks over a socket pair and come back one result at a time; the
gold answer is parsed once per worker and cached; identical (gold, answer) pairs are graded once
per process (an LRU cache in the parent), which matters for RL where a group's samples often
agree.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

from harness.mathgrade.extract import METHODS

_WORKER = Path(__file__).with_name("_worker.py")
# Load the worker by path without putting harness/mathgrade on sys.path (its module names would
# shadow installed packages) and without importing rlbench (or torch).
_BOOTSTRAP = (
    "import importlib.util,sys;"
    "s=importlib.util.spec_from_file_location('rlbench_math_worker',sys.argv[1]);"
    "m=importlib.util.module_from_spec(s);s.loader.exec_module(m);"
    "m.main(int(sys.argv[2]),int(sys.argv[3]))"
)
STATUSES = ("ok", "timeout", "error", "gold_error", "too_long")


@dataclass
class GraderConfig:
    workers: int | None = None   # worker processes (null = CPU cores, at most 8)
    timeout_s: float = 5.0       # per item (parse + verify), enforced inside the worker
    kill_grace_s: float = 2.0    # the parent kills a worker this long after an item's timeout
    startup_timeout_s: float = 120.0  # a worker that has not started by then is replaced
    max_answer_chars: int = 1000  # longer extracted answers are not graded (status too_long)
    memory_mb: int = 4096        # address-space limit of each worker (0 = none)
    cache_size: int = 200_000    # (gold, answer) pairs remembered by the parent
    chunk_size: int = 32         # items sent to a worker at once


@dataclass
class GradeResult:
    correct: bool
    status: str           # one of STATUSES
    key: str | None = None  # canonical form of the parsed answer (for majority voting)


class _Proc:
    """One worker: its process, connection and the items it holds, oldest first."""

    def __init__(self, memory_mb: int) -> None:
        parent, child = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(_WORKER), str(child.fileno()),
             str(memory_mb)],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
            env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.pending: deque[int] = deque()
        self.since = time.monotonic()  # when the head item started (last progress)
        self.ready = False  # the worker has imported math-verify (start-up is not timed out)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.conn.close()

    def close(self) -> None:
        try:
            self.conn.send(None)
            self.proc.wait(timeout=2)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


class MathGrader:
    """``grade([(gold, answer), ...]) -> [GradeResult, ...]``, in order. Thread-safe; the
    workers start on first use and stop at :meth:`close` (or interpreter exit)."""

    def __init__(self, config: GraderConfig | None = None) -> None:
        self.config = config or GraderConfig()
        self.n_workers = self.config.workers or min(os.cpu_count() or 1, 8)
        if self.n_workers < 1:
            raise ValueError(f"grader.workers must be >= 1, got {self.config.workers}")
        self._procs: list[_Proc] = []
        self._cache: OrderedDict[tuple[str, str], GradeResult] = OrderedDict()
        self._lock = threading.Lock()
        self.counts: dict[str, int] = dict.fromkeys(STATUSES, 0)  # over this grader's life
        self.counts["killed"] = 0
        self.counts["cached"] = 0
        _LIVE.add(self)

    # -- public ---------------------------------------------------------------------------------
    def grade(self, items: list[tuple[str, str]]) -> list[GradeResult]:
        with self._lock:
            out: list[GradeResult | None] = [None] * len(items)
            todo: dict[tuple[str, str], list[int]] = {}
            for i, (gold, pred) in enumerate(items):
                key = (gold, pred)
                if len(pred) > self.config.max_answer_chars:
                    out[i] = GradeResult(False, "too_long")
                elif key in self._cache:
                    self._cache.move_to_end(key)
                    out[i] = self._cache[key]
                    self.counts["cached"] += 1
                else:
                    todo.setdefault(key, []).append(i)
            unique = list(todo)
            for key, result in zip(unique, self._run(unique)):
                self._remember(key, result)
                for i in todo[key]:
                    out[i] = result
            for r in out:
                assert r is not None
                self.counts[r.status] += 1
            return out  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            for p in self._procs:
                p.close()
            self._procs = []

    # -- internals ------------------------------------------------------------------------------
    def _remember(self, key: tuple[str, str], result: GradeResult) -> None:
        self._cache[key] = result
        if len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)

    def _run(self, pairs: list[tuple[str, str]]) -> list[GradeResult]:
        if not pairs:
            return []
        cfg = self.config
        while len(self._procs) < self.n_workers:
            self._procs.append(_Proc(cfg.memory_mb))
        results: list[GradeResult | None] = [None] * len(pairs)
        queue: deque[int] = deque(range(len(pairs)))
        # small chunks when there is little work, so every worker gets some
        chunk = max(1, min(cfg.chunk_size, -(-len(pairs) // (2 * self.n_workers))))
        remaining = len(pairs)
        while remaining:
            for p in self._procs:  # keep every worker busy with one chunk at a time
                if not p.pending and queue:
                    seqs = [queue.popleft() for _ in range(min(chunk, len(queue)))]
                    p.pending.extend(seqs)
                    p.since = time.monotonic()
                    try:
                        p.conn.send([(s, *pairs[s], cfg.timeout_s) for s in seqs])
                    except OSError:  # it died while idle: a fresh worker takes the chunk
                        queue.extendleft(reversed(p.pending))
                        p.pending.clear()
                        self._replace(p, results, queue, "error")
            busy = {p.conn: p for p in self._procs if p.pending}
            if not busy:  # a worker was just replaced; dispatch again
                continue
            now = time.monotonic()
            wait_s = max(0.0, min(p.since + self._limit(p) - now for p in busy.values()))
            for conn in wait(list(busy), timeout=wait_s):
                p = busy[conn]  # type: ignore[index]
                try:
                    while conn.poll():
                        msg = conn.recv()
                        if msg == "ready":
                            p.ready, p.since = True, time.monotonic()
                            continue
                        seq, correct, status, key = msg
                        if p.pending and p.pending[0] == seq:
                            p.pending.popleft()
                        results[seq] = GradeResult(bool(correct), status, key)
                        remaining -= 1
                        p.since = time.monotonic()
                except (EOFError, OSError):  # the worker died on its head item
                    remaining -= self._replace(p, results, queue, "error")
            now = time.monotonic()
            for p in list(self._procs):
                if p.pending and now - p.since > self._limit(p):
                    self.counts["killed"] += 1
                    remaining -= self._replace(p, results, queue, "timeout")
        return results  # type: ignore[return-value]

    def _limit(self, p: _Proc) -> float:
        """Seconds the head item of ``p`` may take since its last progress."""
        cfg = self.config
        return cfg.timeout_s + cfg.kill_grace_s if p.ready else cfg.startup_timeout_s

    def _replace(self, p: _Proc, results: list[GradeResult | None], queue: deque[int],
                 status: str) -> int:
        """Kill ``p``; its head item gets ``status``, the rest go back to the queue. Returns
        the number of items resolved (0 or 1)."""
        resolved = 0
        if p.pending:
            results[p.pending.popleft()] = GradeResult(False, status)
            resolved = 1
        queue.extendleft(reversed(p.pending))
        p.pending.clear()
        p.kill()
        self._procs[self._procs.index(p)] = _Proc(self.config.memory_mb)
        return resolved


_LIVE: weakref.WeakSet[MathGrader] = weakref.WeakSet()


def answer_reward(correct: bool, extracted: bool, correct_score: float,
                  format_score: float) -> float:
    """``correct_score`` for a correct answer, ``format_score`` for one that was extracted but
    is wrong, 0 when none was extracted."""
    if correct:
        return float(correct_score)
    return float(format_score) if extracted else 0.0


def grading_stats(method: str, status: str) -> dict[str, float]:
    """A sample's ``Score.info["stats"]``: which extraction method fired (``none`` when none
    did) and whether grading timed out or failed (``status`` of its :class:`GradeResult`)."""
    stats = {f"extract_{m}": float(method == m) for m in (*METHODS, "none")}
    stats["grade_timeout"] = float(status == "timeout")
    stats["grade_error"] = float(status in ("error", "gold_error", "too_long"))
    return stats


@atexit.register
def _close_all() -> None:
    for grader in list(_LIVE):
        grader.close()
