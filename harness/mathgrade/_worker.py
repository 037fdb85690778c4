"""Grading worker process (started by :class:`harness.mathgrade.grading.MathGrader`; not imported).

Runs as its own interpreter, loaded by file path so that it imports nothing of rlbench (and no
torch): only the standard library and math-verify. It reads batches of
``(seq, gold, pred, timeout_s)`` from a socket, grades each item and answers with
``(seq, correct, status, key)`` per item as soon as it is done, so the parent can tell which item
a stuck worker is on.

math-verify's own timeouts use ``signal.alarm`` and are switched off here
(``parsing_timeout=None``, ``timeout_seconds=None``); instead one ``setitimer`` alarm (this is
the worker's main thread, so signals work) bounds parse + verify of an item. Code that never
returns to the interpreter (a huge integer power inside sympy) cannot be interrupted by a signal:
the parent kills the whole worker when an item overruns its deadline.

Statuses: ``ok`` (graded), ``timeout``, ``error`` (math-verify raised), ``gold_error`` (the gold
answer did not parse). Anything but ``ok`` is scored as incorrect by the caller.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from multiprocessing.connection import Connection


class _Timeout(BaseException):  # BaseException: sympy's broad ``except Exception`` cannot eat it
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _Timeout


def _key(value: object) -> str:
    """Canonical string of a parsed answer, so that 0.75 and 3/4 vote together in maj@k."""
    if getattr(value, "is_Float", False):
        from sympy import nsimplify

        value = nsimplify(value, rational=True)
    return str(value)[:200]


def main(fd: int, memory_mb: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    signal.signal(signal.SIGALRM, _on_alarm)
    if memory_mb > 0:  # a runaway expression fails with MemoryError instead of swapping the host
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import logging

    from math_verify import parse, verify

    # it warns on every call that its own timeout is off; the alarm below is the timeout
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    # the first parse builds math-verify's LaTeX grammar (about a second): not an item's time
    half = parse("\\boxed{\\frac{1}{2}}", parsing_timeout=None)
    verify(half, parse("$0.5$", parsing_timeout=None), timeout_seconds=None)
    conn = Connection(fd)
    conn.send("ready")  # the parent's per-item deadlines start counting from here
    golds: dict[str, object] = {}  # gold answer string -> parsed gold (each parsed once)

    def parsed_gold(gold: str) -> object:
        if gold not in golds:
            if len(golds) > 50_000:
                golds.clear()
            golds[gold] = parse("\\boxed{" + gold + "}", parsing_timeout=None)
        return golds[gold]

    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for seq, gold, pred, timeout_s in batch:
            correct, status, key = False, "ok", None
            signal.setitimer(signal.ITIMER_REAL, max(timeout_s, 0.001))
            try:
                g = parsed_gold(gold)
                if not g:
                    status = "gold_error"
                else:
                    p = parse("\\boxed{" + pred + "}", parsing_timeout=None)
                    key = _key(p[0]) if p else None
                    correct = bool(p) and bool(verify(g, p, timeout_seconds=None))
            except _Timeout:
                correct, status = False, "timeout"
            except Exception:  # math-verify or sympy failed on hostile input: score 0, count it
                correct, status = False, "error"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            conn.send((seq, correct, status, key))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    os._exit(0)
