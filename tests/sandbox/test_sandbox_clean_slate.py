"""The fork server's guarantees, one behaviour per test (the hostile suite attacks them by class:
``tests/sandbox/test_sandbox_hostile.py``):

* nothing a candidate can reach holds a judge channel: the server is the sandbox's PID 1, the
  seccomp filter denies ``ptrace``, ``pidfd_open``/``pidfd_getfd``, ``process_vm_*`` and limits
  or scheduling changes of other processes;
* the candidate's environment is an allow-list, nothing of the grader's;
* every program starts from a clean slate: writable places wiped, a server whose state changed
  is replaced before the next program;
* the judge is bounded: replies over the limits fail the call without being decoded;
* a sandbox that fails during setup yields no cached verdict.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from harness.sandbox import Limits, codec, probe, run_python
from harness.sandbox import remote as remote_mod
from harness.sandbox.layers import SANDBOX_ENV, forced
from harness.sandbox.remote import ForkServer, ReplyTooLargeError, check_reply_size
from tasks.code.grading import CodeGrader, GraderConfig

ISO = probe()
needs_bwrap = pytest.mark.skipif(ISO.mode != "bwrap", reason="needs bubblewrap (namespaces)")
needs_seccomp = pytest.mark.skipif(not (ISO.mode == "bwrap" and ISO.seccomp),
                                   reason="needs bubblewrap and libseccomp")
SECRET = "rlbench-test-secret-2f9c"
HONEST = "def f(x):\n    return 2 * x + 1\n"
AFFINE = {"kind": "functional", "preamble": "",
          "units": ["assert f(2) == 5\n", "assert f(3) == 7\n", "assert f(10) == 21\n"]}


def _call(server: ForkServer, code: str, *args: object) -> object:
    session = server.load(code, timeout=10, cpu_s=5, call_timeout=10)
    return session.namespace()["f"](*args)


@pytest.fixture
def server():
    s = ForkServer(Limits(), tag="clean-slate")
    yield s
    s.close()


PROBE = r"""
import ctypes, errno, os, resource
libc = ctypes.CDLL(None, use_errno=True)
def _errno(result):
    return 0 if result >= 0 else ctypes.get_errno()
def f(x):
    out = {"pid": os.getpid(), "ppid": os.getppid(),
           "others": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()
                            and int(p) != os.getpid())}
    target = out["ppid"]
    out["ptrace"] = _errno(libc.ptrace(16, target, 0, 0))
    out["pidfd_open"] = _errno(libc.syscall(434, target, 0))
    out["process_vm_readv"] = _errno(libc.syscall(310, target, 0, 0, 0, 0, 0))
    out["setpriority"] = _errno(libc.setpriority(0, target, 19))
    out["shmget"] = _errno(libc.shmget(0, 4096, 0o1600))
    try:
        resource.prlimit(target, resource.RLIMIT_NOFILE, (5, 5))
        out["prlimit"] = 0
    except OSError as exc:
        out["prlimit"] = exc.errno
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (3, 3))  # its own limits: allowed
        out["own_setrlimit"] = 0
    except OSError as exc:
        out["own_setrlimit"] = exc.errno
    return out
"""


@needs_seccomp
def test_the_server_is_pid_1_and_the_filter_denies_reaching_it(server):
    out = _call(server, PROBE, 0)
    assert out["pid"] != 1 and out["ppid"] == 1 and out["others"] == [1], out
    for call in ("ptrace", "pidfd_open", "process_vm_readv", "setpriority", "shmget",
                 "prlimit"):
        assert out[call] == 1, (call, out)  # EPERM
    assert out["own_setrlimit"] == 0


@needs_bwrap
def test_without_the_filter_the_same_calls_reach_the_server(server):
    # the control: with seccomp off the probe's calls are not all refused, so the test above
    # would fail if the filter were not loaded
    with forced(replace(ISO, seccomp=False)):
        s = ForkServer(Limits(), tag="clean-slate-noseccomp")
        try:
            out = _call(s, PROBE, 0)
        finally:
            s.close()
    assert out["pidfd_open"] == 0 and out["prlimit"] == 0 and out["shmget"] == 0, out


@needs_bwrap
def test_signals_from_inside_do_not_reach_the_server(server):
    code = ("import os, signal\ndef f(x):\n    for sig in (signal.SIGKILL, signal.SIGSTOP, "
            "signal.SIGINT, signal.SIGTERM):\n        os.kill(os.getppid(), sig)\n"
            "    return 2 * x + 1\n")
    assert _call(server, code, 2) == 5
    assert _call(server, HONEST, 3) == 7 and server.restarts == 0


@needs_bwrap
def test_the_candidate_environment_is_the_allow_list(server, monkeypatch):
    monkeypatch.setenv("RLBENCH_TEST_SECRET", SECRET)
    code = ("import os\ndef f(x):\n    seen = {'own': dict(os.environ)}\n"
            "    for p in os.listdir('/proc'):\n        try:\n"
            "            seen[p] = open('/proc/%s/environ' % p, 'rb').read().decode()\n"
            "        except OSError:\n            pass\n    return seen\n")
    seen = _call(server, code, 0)
    assert SECRET not in repr(seen) and "RLBENCH_TEST_SECRET" not in repr(seen)
    assert seen["own"] == {**SANDBOX_ENV, "PWD": "/tmp"}
    one_shot = run_python("import os\nprint(sorted(os.environ))\n"
                          "print(open('/proc/1/environ').read())")
    assert SECRET not in one_shot.stdout.decode() and one_shot.ok, one_shot


@needs_bwrap
def test_what_a_program_leaves_in_writable_places_is_gone_for_the_next(server):
    plant = ("import os\ndef f(x):\n    for top in ('/tmp', '/dev/shm'):\n"
             "        os.makedirs(top + '/deep/er', exist_ok=True)\n"
             "        open(top + '/deep/er/file', 'w').write('x')\n"
             "        os.chmod(top + '/deep', 0)\n        open(top + '/stdin1', 'w')\n"
             "        os.symlink('/proc/self', top + '/w-link')\n"
             "        os.mkfifo(top + '/fifo')\n"
             "    for ro in ('/', '/dev'):\n        try:\n"
             "            open(ro + '/planted', 'w')\n            return 'wrote ' + ro\n"
             "        except OSError:\n            pass\n    return 'planted'\n")
    assert _call(server, plant, 0) == "planted"
    server.unload()
    look = ("import os\ndef f(x):\n    return sorted(os.listdir('/tmp')) + "
            "sorted(os.listdir('/dev/shm'))\n")
    left = _call(server, look, 0)
    assert len(left) == 1 and left[0].startswith("w-"), left  # only its own work directory
    assert server.resets == 0  # wiped, no replacement needed


@needs_bwrap
def test_a_server_whose_limits_were_changed_is_replaced_before_the_next_program(server):
    # Without the filter a candidate can lower the server's RLIMIT_AS; every later child would
    # inherit it. The per-program check must notice and replace the sandbox.
    with forced(replace(ISO, seccomp=False)):
        s = ForkServer(Limits(), tag="clean-slate-rlimit")
        try:
            poison = ("import os, resource\ndef f(x):\n"
                      "    cap = (64 << 20, 64 << 20)\n"
                      "    resource.prlimit(os.getppid(), resource.RLIMIT_AS, cap)\n"
                      "    return 1\n")
            assert _call(s, poison, 0) == 1
            s.unload()
            assert s.resets == 1
            big = "def f(x):\n    return len(bytearray(150 << 20))\n"
            assert _call(s, big, 0) == 150 << 20  # a fresh sandbox: the honest program fits
        finally:
            s.close()


@needs_bwrap
def test_a_reply_over_the_limits_fails_the_call_and_is_counted(monkeypatch):
    monkeypatch.setattr(codec, "MAX_REPLY_CONTAINERS", 1000)
    grader = CodeGrader(GraderConfig(workers=1, cache_size=0, stop_on_first_failure=False,
                                     allow_weaker_isolation=True))
    try:
        big = grader.grade(AFFINE, "def f(x):\n    return [[] for _ in range(5000)]\n")
        assert big.passed == 0 and big.oversized == 3, big
        assert grader.grade(AFFINE, HONEST).passed == 3
    finally:
        grader.close()
    with pytest.raises(ReplyTooLargeError):
        check_reply_size(b"[" + b"0," * (codec.MAX_REPLY_VALUES + 1) + b"0]")
    check_reply_size(b'{"ok": true, "value": ' + b"7" * 1000 + b"}")


@needs_bwrap
def test_a_reply_over_the_byte_limit_never_reaches_the_judge(server, monkeypatch):
    monkeypatch.setattr(codec, "MAX_REPLY_BYTES", 1 << 16)
    with pytest.raises(ReplyTooLargeError, match="bytes"):
        _call(server, "def f(x):\n    return 'x' * (1 << 20)\n", 0)
    assert _call(server, HONEST, 2) == 5 and server.restarts == 0


@needs_bwrap
def test_a_sandbox_that_fails_during_setup_gives_no_cached_verdict(monkeypatch):
    grader = CodeGrader(GraderConfig(workers=1, cache_size=100, allow_weaker_isolation=True))
    try:
        grader.grade(AFFINE, "x = 1\n")  # the server is up
        # the next program's work directory cannot be made: its setup fails
        patched = remote_mod.SOURCE.replace("os.mkdir(self.workdir, 0o700)",
                                            "os.mkdir(self.workdir, 0o700); "
                                            "os.chmod(self.workdir, 0)")
        assert patched != remote_mod.SOURCE
        monkeypatch.setattr(remote_mod, "SOURCE", patched)
        with grader.pool.server() as server:
            server.close()  # the next exchange starts a server from the patched source
        failed = grader.grade(AFFINE, HONEST)
        assert failed.status == "died" and failed.passed == 0, failed
    finally:
        monkeypatch.undo()
    try:
        with grader.pool.server() as server:
            server.close()
        assert grader.grade(AFFINE, HONEST).passed == 3  # not served from the cache
    finally:
        grader.close()



def test_a_killed_graders_fallback_workdir_is_removed_by_the_next_one(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{remote_mod.WORKDIR_PREFIX}{dead.pid}-abc"
    (stale / "w-1").mkdir(parents=True)
    mine = remote_mod.fallback_workdir()
    try:
        assert not stale.exists()
        assert Path(mine).parent == tmp_path and Path(mine).name.startswith(
            f"{remote_mod.WORKDIR_PREFIX}{os.getpid()}-")
    finally:
        os.rmdir(mine)


@needs_bwrap
def test_under_bubblewrap_the_server_needs_no_host_directory(server):
    assert _call(server, HONEST, 2) == 5
    assert server._workdir is None


# -- the judge is bounded: what a candidate names or returns cannot make it import, hash,
# allocate or receive without limit ------------------------------------------------------------
def _fraction_grader() -> CodeGrader:
    return CodeGrader(GraderConfig(workers=1, cache_size=0, stop_on_first_failure=False,
                                   allow_weaker_isolation=True))


@needs_bwrap
def test_the_judge_never_imports_a_module_because_a_candidate_named_it():
    grader = _fraction_grader()
    try:
        for fake in ("this", "antigravity", "msvcrt", "winreg"):
            program = f"import types\n{fake} = types.ModuleType({fake!r})\n" + HONEST
            result = grader.grade(AFFINE, program)  # must not raise, nor import it
            assert result.passed == 3, (fake, result)
            assert fake not in sys.modules
        real = grader.grade(AFFINE, "import math\ndef f(x):\n    return math.floor(2 * x + 1)\n")
        assert real.passed == 3
    finally:
        grader.close()


@needs_bwrap
def test_values_with_colliding_hashes_are_refused_before_the_test_hashes_them():
    # every k * (2**61 - 1) hashes to 0: a set of n of them costs the judge O(n^2)
    problem = {"kind": "functional", "preamble": "",
               "units": ["assert len(set(f(2))) == 5\n", "assert f(3) in {1, 2}\n"]}
    bomb = "def f(x):\n    return [k * ((1 << 61) - 1) for k in range(1, 20001)]\n"
    grader = _fraction_grader()
    try:
        start = time.monotonic()
        result = grader.grade(problem, bomb)
        assert time.monotonic() - start < 20  # O(n^2) would be minutes
        assert result.passed == 0 and result.oversized >= 1, result
        honest = [k * ((1 << 61) - 1) for k in range(1, 6)]
        assert grader.grade(problem, f"def f(x):\n    return {honest}\n").passed == 1
    finally:
        grader.close()


@needs_bwrap
def test_a_remote_len_beyond_the_value_limit_is_refused():
    problem = {"kind": "functional", "preamble": "", "units": ["assert tuple(f(3)) == ()\n"]}
    program = ("class It:\n    def __len__(self):\n        return 200_000_000\n"
               "    def __iter__(self):\n        return iter([])\ndef f(x):\n    return It()\n")
    grader = _fraction_grader()
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert grader.grade(problem, program).passed == 0
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB
    finally:
        grader.close()


@needs_bwrap
def test_one_program_cannot_send_more_than_the_session_budget(monkeypatch):
    monkeypatch.setattr(codec, "MAX_SESSION_BYTES", 1 << 20)
    problem = {"kind": "functional", "preamble": "", "units": ["assert sorted(f(3)) == []\n"]}
    program = ("def f(x):\n    i = 0\n    while True:\n        i += 1\n"
               "        yield str(i) + 'a' * 100_000\n")
    grader = _fraction_grader()
    try:
        result = grader.grade(problem, program)
        assert result.passed == 0 and result.oversized == 1, result
        finite = "def f(x):\n    yield from ()\n"  # a generator has no len(): still iterated
        assert grader.grade(problem, finite).passed == 1
    finally:
        grader.close()


# -- nothing of one program is in the memory of the next ------------------------------------------
SCAN = r'''
import ctypes, hashlib, re
def f(wanted):
    found = []
    with open("/proc/self/maps") as fh:
        regions = [line.split() for line in fh]
    for r in regions:
        if len(r) < 2 or not r[1].startswith("rw"):
            continue
        lo, hi = (int(x, 16) for x in r[0].split("-"))
        try:
            data = ctypes.string_at(lo, hi - lo)
        except Exception:
            continue
        for m in re.finditer(rb"(?:CODE|REPLY|OUT)_([0-9a-f]{32})", data):
            if hashlib.sha256(m.group(1)).hexdigest() in wanted:
                found.append(m.group(0)[:5].decode())
    return sorted(set(found))
'''


@needs_bwrap
def test_a_program_finds_nothing_of_the_previous_ones_in_its_memory(server):
    import hashlib
    import secrets

    tokens = {kind: secrets.token_hex(16) for kind in ("CODE", "REPLY", "OUT")}
    wanted = [hashlib.sha256(t.encode()).hexdigest() for t in tokens.values()]
    code = (f"KEEP = 'CODE_{tokens['CODE']}'\n"
            f"def f(x):\n    return 'REPLY_{tokens['REPLY']}'\n")
    assert _call(server, code, 0) == "REPLY_" + tokens["REPLY"]
    printed = server.run_stdio(f"print('OUT_{tokens['OUT']}')\n", "", timeout=10, cpu_s=5)
    assert printed.stdout.decode().strip() == "OUT_" + tokens["OUT"]
    server.unload()
    assert _call(server, SCAN, wanted) == []


@needs_bwrap
def test_one_program_cannot_send_more_objects_in_all_than_the_session_allows(monkeypatch):
    monkeypatch.setattr(codec, "MAX_SESSION_CONTAINERS", 2500)
    problem = {"kind": "functional", "preamble": "",
               "units": [f"assert len(f({i})) == 1000\n" for i in range(5)]}
    grader = _fraction_grader()
    try:
        result = grader.grade(problem, "def f(x):\n    return [[] for _ in range(1000)]\n")
        # each reply is 1,001 objects: two fit in the program's 2,500, the third does not, and
        # a reloaded program keeps counting (no fresh budget for dying on purpose)
        assert result.passed == 2 and result.oversized == 2, result
        assert result.per_test == [True, True, False, False, False]
        assert grader.grade(problem, "def f(x):\n    return [[]] * 1000\n").passed == 2
    finally:
        grader.close()
