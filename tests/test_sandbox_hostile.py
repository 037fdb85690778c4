"""The hostile-program suite: every attack in tests/hostile/cases.py is contained, earns no credit
for tests it did not pass, and leaves the machine clean (no stray processes, no files outside the
sandbox's temporary directory); honest programs graded in the same batch keep full credit."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from harness.sandbox import isolation
from tasks.code.grading import CodeGrader, GraderConfig
from tests.hostile.cases import CASES, GOOD, PROBLEMS

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tasks" / "code" / "data"
# Unique to this module's grader, so sandboxes of tests running in parallel (xdist) don't count.
TAG = f"hostile-suite-{os.getpid()}-{time.time_ns()}"
SERVER_MARKER = f"--tag={TAG}"

pytestmark = pytest.mark.skipif(
    os.environ.get("RLBENCH_SANDBOX") == "rlimits" or isolation() != "bwrap",
    reason="the hostile suite needs bubblewrap (apt-get install bubblewrap): without it a fork "
           "bomb running as root is not contained",
)


def sandbox_processes(python_only: bool = False) -> list[int]:
    """Host PIDs of sandboxes: bubblewrap (outer process and its PID-1 reaper, whose command line
    carries the server's source), fork servers and everything they forked (same command line)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if SERVER_MARKER.encode() in cmd and not (
                python_only and os.path.basename(cmd.split(b"\0")[0]) == b"bwrap"
            ):
                pids.append(int(entry))
    return pids


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


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("hostile")
    sentinel = tmp / "sentinel.txt"
    sentinel.write_text("must survive")
    hostfile = Path("/tmp") / f"rlbench-hostile-{os.getpid()}-{time.time_ns()}"
    listener = Listener()
    before = set(sandbox_processes())
    grader = CodeGrader(GraderConfig(workers=2, timeout_base_s=2.0, timeout_per_test_s=1.0,
                                     call_timeout_s=2.0, cpu_s=1.0, memory_mb=256,
                                     max_procs=16, max_output_bytes=1 << 20,
                                     stop_on_first_failure=False, cache_size=0), tag=TAG)
    subst = {"@SENTINEL@": str(sentinel), "@HOSTFILE@": str(hostfile), "@PORT@": str(listener.port),
             "@REPO@": str(ROOT), "@DATA@": str(DATA)}
    items = []
    for case in CASES:
        code = case.code
        for token, value in subst.items():
            code = code.replace(token, value)
        items.append((PROBLEMS[case.problem], code))
    # honest programs interleaved with the attacks, in the same sandboxes
    goods = [(PROBLEMS[p], GOOD[p]) for p in GOOD for _ in range(3)]
    start = time.monotonic()
    results = grader.grade_many(items + goods)
    seconds = time.monotonic() - start
    during = set(sandbox_processes(python_only=True)) - before
    for _ in range(30):  # a replaced server's namespace may take a moment to be torn down
        if len(during) <= 2:
            break
        time.sleep(0.1)
        during = set(sandbox_processes(python_only=True)) - before
    restarts = grader.pool.restarts
    grader.close()
    time.sleep(0.5)
    after = set(sandbox_processes()) - before
    listener.close()
    yield {
        "results": dict(zip([c.name for c in CASES], results[: len(CASES)])),
        "goods": results[len(CASES):], "during": during, "after": after,
        "sentinel": sentinel, "hostfile": hostfile, "listener": listener, "seconds": seconds,
        "restarts": restarts,
    }
    hostfile.unlink(missing_ok=True)


def test_the_suite_has_at_least_30_hostile_programs():
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_hostile_program_earns_no_credit(outcome, name):
    result = outcome["results"][name]
    assert result.passed == 0, (name, result)
    assert not result.all_passed


def test_honest_programs_in_the_same_sandboxes_keep_full_credit(outcome):
    failed = [r for r in outcome["goods"] if not r.all_passed]
    assert not failed, failed


def test_no_connection_reached_the_host_listener(outcome):
    assert outcome["listener"].accepted == 0


def test_no_host_file_was_written_or_deleted(outcome):
    assert outcome["sentinel"].read_text() == "must survive"
    assert not outcome["hostfile"].exists()
    assert not (ROOT / "PWNED").exists()
    assert (DATA / "humaneval.jsonl").is_file()


def test_no_process_is_left_running(outcome):
    # while the grader was open, at most one fork server per sandbox (no forked leftovers);
    # after close, none at all
    assert len(outcome["during"]) <= 2, outcome["during"]
    assert not outcome["after"], outcome["after"]


def test_daemons_started_by_a_candidate_die_with_it(outcome):
    # the daemon would have created the host file 30 s later if it had survived; its sandbox
    # (PID namespace) is gone, so no process of it is left to do so
    assert not outcome["after"]
    assert outcome["results"]["daemon_survives"].passed == 0


def test_attacks_on_the_server_are_survived_by_replacing_it(outcome):
    # kill_parent, kill_everything and stop_parent take their fork server down; grading goes on
    assert outcome["restarts"] >= 2


def test_the_whole_suite_is_graded_in_bounded_time(outcome):
    assert outcome["seconds"] < 120
