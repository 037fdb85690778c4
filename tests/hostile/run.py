"""Run the hostile-program suite and the bomb measurements in a process of their own and print
one JSON object with what was measured. ``tests/sandbox/test_sandbox_hostile.py`` starts this module
under an outer cap (its own cgroup: if the sandbox regressed, a bomb would hit that cap, not the
machine), once as root and once as an unprivileged uid:

    python -m tests.hostile.run

Measured, not inferred: processes are counted on the host (``/proc``: the descendants of a
sandbox's bubblewrap monitor, or every process carrying a grader's tag in its command line),
the uid of each is read from ``/proc/<pid>/status``, and the kernel's own counters of the
sandbox's cgroup are read before it is removed (peak tasks, peak memory, OOM kills). The attacks
of ``tests/hostile/classes.py`` follow, class by class (``tests/hostile/by_class.py``, under
``"classes"``).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.sandbox import Limits, cgroup, probe, require
from harness.sandbox.layers import forced
from harness.sandbox.remote import ForkServer, RemoteError
from tasks.code.grading import CodeGrader, GraderConfig
from tests.hostile.by_class import run_all
from tests.hostile.cases import CASES, GOOD, PROBLEMS

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tasks" / "code" / "data"
MAX_PROCS = 16
GROUP_MB = 256       # group memory of the memory-bomb sandbox
BOMB_PROCESS_MB = 2048  # per-process RLIMIT_AS there: far above the group limit

# Each forked child loops on forking too; a failed fork waits a little and tries again.
FORK_BOMB = ("import os, time\ndef f(x):\n    while True:\n        try:\n            os.fork()\n"
             "        except OSError:\n            time.sleep(0.005)\n")
# One process: 16 MiB chunks, every page written (a lazy bytearray would not be charged).
MEMORY_BOMB = ("def f(x):\n    hog = []\n    while True:\n"
               "        hog.append(b'\\x01' * (16 << 20))\n")
# Eight processes of 64 MiB each, every one far below its own RLIMIT_AS.
MEMORY_BOMB_MANY = ("import os, time\ndef f(x):\n    for _ in range(8):\n"
                    "        if os.fork() == 0:\n            hog = b'\\x01' * (64 << 20)\n"
                    "            time.sleep(60)\n            os._exit(0)\n"
                    "    time.sleep(60)\n")
HONEST = "def f(x):\n    return 2 * x + 1\n"


def tagged(tag: str, exclude: int = -1) -> dict[int, tuple[str, int]]:
    """Host PID -> (program, host uid) of every process whose command line carries ``tag``."""
    found = {}
    mark = f"--tag={tag}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != exclude:
            with contextlib.suppress(OSError, IndexError, ValueError):
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                if mark in cmd:
                    status = Path(f"/proc/{entry}/status").read_text()
                    found[int(entry)] = (os.path.basename(cmd.split(b"\0")[0]).decode(),
                                         int(status.split("\nUid:")[1].split()[0]))
    return found


def descendants(pid: int) -> dict[int, tuple[str, int]]:
    """Host PID -> (program, host uid) of every descendant of ``pid``, found through
    ``/proc/<pid>/task/<tid>/children`` (cheap: a busy bomb makes reading every process's
    command line take seconds, which would miss the peak). Orphans in a sandbox are adopted by
    its PID 1, itself a descendant of bubblewrap's monitor: none escapes the count."""
    found: dict[int, tuple[str, int]] = {}
    stack = [pid]
    while stack:
        parent = stack.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{parent}/task"):
                with contextlib.suppress(OSError, ValueError):
                    for child in map(int, Path(f"/proc/{parent}/task/{tid}/children")
                                     .read_text().split()):
                        if child not in found:
                            found[child] = _who(child)
                            stack.append(child)
    return found


def _who(pid: int) -> tuple[str, int]:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        uid = int(Path(f"/proc/{pid}/status").read_text().split("\nUid:")[1].split()[0])
    except (OSError, IndexError, ValueError):
        return "?", -1
    return comm, uid


class Sampler:
    """While it runs: the peak number of processes ``snapshot()`` returns, and the host uids
    seen per program (``setpriv`` is the root grader's launcher, root until it drops to the
    sandbox's uid and becomes bubblewrap)."""

    def __init__(self, snapshot: Any) -> None:
        self.snapshot = snapshot
        self.peak, self.uids = 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            procs = self.snapshot()
            self.peak = max(self.peak, len(procs))
            for program, uid in procs.values():
                if uid >= 0:
                    self.uids.setdefault(program, set()).add(uid)
            time.sleep(0.005)

    def uids_by_program(self) -> dict[str, list[int]]:
        return {k: sorted(v) for k, v in self.uids.items()}

    def stop(self) -> Sampler:
        self._stop.set()
        self._thread.join()
        return self


class Listener:
    """A host TCP listener on 127.0.0.1 that records every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


def suite() -> dict[str, Any]:
    """Every case of tests/hostile/cases.py, honest programs interleaved, through the grader."""
    tag = f"hostile-suite-{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="rlbench-hostile-"))
    sentinel = tmp / "sentinel.txt"
    sentinel.write_text("must survive")
    hostfile = Path("/tmp") / f"rlbench-hostile-{os.getpid()}-{time.time_ns()}"
    listener = Listener()
    grader = CodeGrader(GraderConfig(workers=2, timeout_base_s=2.0, timeout_per_test_s=1.0,
                                     call_timeout_s=2.0, cpu_s=1.0, memory_mb=256,
                                     group_memory_mb=384, max_procs=MAX_PROCS,
                                     max_output_bytes=1 << 20, stop_on_first_failure=False,
                                     cache_size=0, allow_weaker_isolation=True), tag=tag)
    subst = {"@SENTINEL@": str(sentinel), "@HOSTFILE@": str(hostfile),
             "@PORT@": str(listener.port), "@REPO@": str(ROOT), "@DATA@": str(DATA)}
    items = []
    for case in CASES:
        code = case.code
        for token, value in subst.items():
            code = code.replace(token, value)
        items.append((PROBLEMS[case.problem], code))
    goods = [(PROBLEMS[p], GOOD[p]) for p in GOOD for _ in range(3)]
    sampler = Sampler(lambda: tagged(tag))
    start = time.monotonic()
    results = grader.grade_many(items + goods)
    seconds = time.monotonic() - start
    after_goods = grader.grade_many([(PROBLEMS[p], GOOD[p]) for p in GOOD])
    sampler.stop()
    during = tagged(tag)
    for _ in range(30):  # a replaced server's namespace may take a moment to be torn down
        # per sandbox at most: bubblewrap's monitor, its PID 1 and the fork server
        if len(during) <= 3 * grader.workers:
            break
        time.sleep(0.1)
        during = tagged(tag)
    restarts = grader.pool.restarts
    grader.close()
    time.sleep(0.5)
    listener.close()
    out = {
        "results": {c.name: [r.passed, r.total, r.status] for c, r in zip(CASES, results)},
        "goods_all_passed": [r.all_passed for r in results[len(CASES):]],
        "goods_after_all_passed": [r.all_passed for r in after_goods],
        "processes_during": len(during), "processes_after": sorted(tagged(tag)),
        "host_uids": sampler.uids_by_program(), "peak_processes": sampler.peak,
        "listener_accepted": listener.accepted,
        "sentinel_intact": sentinel.read_text() == "must survive",
        "hostfile_exists": hostfile.exists(), "repo_pwned": (ROOT / "PWNED").exists(),
        "data_intact": (DATA / "humaneval.jsonl").is_file(),
        "seconds": seconds, "restarts": restarts,
    }
    hostfile.unlink(missing_ok=True)
    sentinel.unlink()
    tmp.rmdir()
    return out


def _call(server: ForkServer, code: str, call_timeout: float) -> str:
    """Load ``code`` and call its ``f(2)``; the outcome as a word."""
    try:
        value = server.load(code, timeout=5, cpu_s=5, call_timeout=call_timeout
                            ).namespace()["f"](2)
    except RemoteError as exc:
        return type(exc).__name__
    return f"returned {value!r}"


def _stats(server: ForkServer) -> dict[str, Any]:
    group = server.box.group if server.box is not None else None
    return group.stats() if group is not None else {}


def fork_bomb(name: str) -> dict[str, Any]:
    """A fork bomb in one fork server with ``max_procs=16``: peak process count in the sandbox
    (every descendant of bubblewrap's monitor, which is outside the namespace), the cgroup's own
    peak, then an honest program in the same server, then what is left."""
    tag = f"fork-bomb-{name}-{os.getpid()}"
    server = ForkServer(Limits(max_procs=MAX_PROCS, wall_s=30), tag=tag, allow_weaker=True)
    warm = _call(server, HONEST, 5)  # started before the sampler: its monitor is known
    monitor = server.proc.pid  # bubblewrap's monitor (outside the PID namespace): not counted
    sampler = Sampler(lambda: descendants(monitor))
    outcome = _call(server, FORK_BOMB, 3.0)
    sampler.stop()
    stats = _stats(server)
    honest = _call(server, HONEST, 5)
    group = server.box.group.name if server.box and server.box.group else None
    server.close()
    time.sleep(0.3)
    return {"isolation": server.iso.describe(), "warm": warm, "outcome": outcome,
            "peak_processes": sampler.peak, "host_uids": sampler.uids_by_program(),
            "cgroup": stats, "honest_after": honest, "processes_after": sorted(tagged(tag)),
            "group": group}


def memory_bombs() -> dict[str, Any]:
    """Two memory bombs in a sandbox whose group may use ``GROUP_MB`` while every process may
    map ``BOMB_PROCESS_MB``: only the group limit can stop them."""
    tag = f"memory-bomb-{os.getpid()}"
    limits = Limits(memory_mb=BOMB_PROCESS_MB, group_memory_mb=GROUP_MB, max_procs=MAX_PROCS,
                    wall_s=30)
    out: dict[str, Any] = {"group_mb": GROUP_MB, "process_mb": BOMB_PROCESS_MB}
    for name, code in (("one_process", MEMORY_BOMB), ("eight_processes", MEMORY_BOMB_MANY)):
        server = ForkServer(limits, tag=tag, allow_weaker=True)
        _call(server, HONEST, 5)
        outcome = _call(server, code, 8.0)
        stats = _stats(server)
        out[name] = {"outcome": outcome, "cgroup": stats, "honest_after": _call(server, HONEST, 5)}
        server.close()
    time.sleep(0.3)
    out["processes_after"] = sorted(tagged(tag))
    return out


def main() -> None:
    iso = require(allow_weaker=True)
    out: dict[str, Any] = {
        "euid": os.geteuid(), "isolation": iso.describe(), "mode": iso.mode,
        "host_uid": iso.host_uid, "missing": iso.missing, "cgroups": iso.cgroups is not None,
        "own_cgroup": Path("/proc/self/cgroup").read_text(),
        "nproc_rlimit": list(resource.getrlimit(resource.RLIMIT_NPROC)),
    }
    out["suite"] = suite()
    out["fork_bomb"] = fork_bomb("full")
    if iso.cgroups is not None and iso.host_uid != 0:
        with forced(replace(probe(), cgroups=None)):  # RLIMIT_NPROC in the namespace alone
            out["fork_bomb_rlimit_only"] = fork_bomb("rlimit-only")
    if iso.cgroups is not None:
        out["memory_bomb"] = memory_bombs()
    out["classes"] = run_all()  # tests/hostile/classes.py, class by class
    out["cgroups_left"] = [str(p) for p in cgroup.leftovers(owner=os.getpid())]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
