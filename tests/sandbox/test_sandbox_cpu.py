"""CPU isolation per sandbox (issue 30, item 5): every sandbox's cgroup has a ``cpu`` group with the
default weight and a quota of one CPU, so a sandbox gets one share of the machine however many
processes, threads or sessions it starts (without it each ``setsid`` in the root cpu group was
a scheduler autogroup of its own: 12 spinning sessions slowed an honest neighbour 7x and turned
its 3/3 into a timeout). The cpu group goes with the sandbox, with a restarted fork server's
old sandbox and with a killed grader (stale groups); where no cpu controller is writable the
sandbox works without one and says so.

Figures: ``benchmarks/sandbox_cpu.py``, quoted in ``benchmarks/README.md``."""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.sandbox import Limits, cgroup, layers, python_executable, run_python, spawn
from harness.sandbox.remote import ForkServer
from tasks.code.grading import CodeGrader, GraderConfig

ROOT = Path(__file__).resolve().parents[2]


def _cpu_backend() -> cgroup.Backend | None:
    be = cgroup.backend()
    return be if be is not None and be.cpu else None


needs_cpu = pytest.mark.skipif(
    _cpu_backend() is None,
    reason="no writable cpu cgroup controller here (needs root, or RLBENCH_CGROUP naming a "
           "delegated cgroup whose cpu hierarchy/controller is writable)")

WORK = "def work(n):\n    s = 0\n    for i in range(n):\n        s += i * i % 7\n    return s\n"
SPINNERS = ("import os, time\nfor _ in range(12):\n    if os.fork() == 0:\n        os.setsid()\n"
            "        while True:\n            pass\n"
            "def f(x):\n    time.sleep(x)\n    return x\n")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setattr(layers, "_announced", set())
    monkeypatch.setenv(layers.ALLOW_WEAKER_VAR, "1")


@pytest.fixture
def cpu_iso() -> layers.Isolation:
    """The isolation sandboxes get here, with a cpu group per sandbox (else skip)."""
    iso = layers.probe()
    if iso.cgroups is None or not iso.cgroups.cpu:
        pytest.skip(f"sandboxes get no cpu group here: {iso.describe()}")
    return iso


def _expected_cpu(d: Path) -> tuple[str, str]:
    """(weight, quota) as written in a sandbox's cpu group, in the files' own format."""
    if (d / "cpu.weight").exists():
        return (d / "cpu.weight").read_text().strip(), (d / "cpu.max").read_text().strip()
    quota = int((d / "cpu.cfs_quota_us").read_text())
    period = int((d / "cpu.cfs_period_us").read_text())
    return (d / "cpu.shares").read_text().strip(), f"{quota} {period}"


# -- where the cpu group is made (fake hierarchies: runs anywhere) --------------------------------
def _fake_v1(tmp_path: Path, monkeypatch, controllers: tuple[str, ...]) -> None:
    v1 = {}
    for c in controllers:
        (tmp_path / c).mkdir()
        v1[c] = (str(tmp_path / c), "/")
    monkeypatch.setattr(cgroup, "_mounts", lambda: ([], v1))
    monkeypatch.setattr(cgroup, "_own", lambda: dict.fromkeys(controllers, "/"))


def test_a_writable_v1_cpu_hierarchy_gives_every_sandbox_a_cpu_group(tmp_path, monkeypatch):
    _fake_v1(tmp_path, monkeypatch, ("pids", "memory", "cpu"))
    be = cgroup._backend.__wrapped__(None, os.geteuid())
    assert be.version == 1 and be.cpu and be.parents["cpu"] == tmp_path / "cpu"
    assert "CPU per sandbox: equal weight, at most 1 CPU" in be.describe()


def test_without_a_cpu_hierarchy_groups_still_work_and_cpu_is_said_not_isolated(tmp_path,
                                                                                monkeypatch):
    _fake_v1(tmp_path, monkeypatch, ("pids", "memory"))
    be = cgroup._backend.__wrapped__(None, os.geteuid())
    assert be is not None and not be.cpu and set(be.parents) == {"pids", "memory"}
    assert "CPU NOT isolated per sandbox" in be.describe()


def test_on_v2_the_cpu_group_is_the_same_directory_when_cpu_is_handed_down(tmp_path,
                                                                         monkeypatch):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    monkeypatch.setattr(cgroup, "_mounts", lambda: ([(str(tmp_path), "/")], {}))
    monkeypatch.setattr(cgroup, "_own", lambda: {"": "/"})
    (tmp_path / "cgroup.subtree_control").write_text("memory pids\n")
    assert not cgroup._backend.__wrapped__(None, os.geteuid()).cpu
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    be = cgroup._backend.__wrapped__(None, os.geteuid())
    assert be.version == 2 and be.parents == dict.fromkeys(("pids", "memory", "cpu"), tmp_path)


# -- on this machine -----------------------------------------------------------------------------
@needs_cpu
def test_each_sandbox_gets_a_cpu_group_with_equal_weight_and_one_cpu_and_it_is_removed(cpu_iso):
    box = spawn([python_executable(), "-I", "-c", "import time; time.sleep(30)"],
                Limits(wall_s=30), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, iso=cpu_iso)
    group = box.group
    try:
        d = group.dirs["cpu"]
        weight, quota = _expected_cpu(d)
        assert weight == ("100" if (d / "cpu.weight").exists() else "1024")
        assert quota == f"{cgroup.CFS_PERIOD_US} {cgroup.CFS_PERIOD_US}"  # one CPU
        assert box.proc.pid in group.pids()
        procs = {int(p) for p in (d / "cgroup.procs").read_text().split()}
        assert box.proc.pid in procs  # the launcher joined the cpu group before exec
        assert group.stats()["cpu_throttled_us"] is not None
    finally:
        box.close()
    assert not d.exists()
    assert cgroup.leftovers(owner=os.getpid()) == []


@needs_cpu
def test_a_restarted_fork_server_gets_a_fresh_cpu_group_and_the_old_one_goes(cpu_iso):
    server = ForkServer(Limits(), tag="cpu-restart")
    try:
        server.load("x = 1\n", timeout=5, cpu_s=5, call_timeout=5)
        first = server.box.group.dirs["cpu"]
        assert first.is_dir()
        server.box.group.kill()  # the whole sandbox dies (as in a crash of the server)
        server.box.proc.wait(timeout=10)
        server.load("x = 1\n", timeout=5, cpu_s=5, call_timeout=5)  # restarts the server
        second = server.box.group.dirs["cpu"]
        assert server.restarts == 1 and second != first and second.is_dir()
        assert not first.exists()
    finally:
        server.close()
    assert not second.exists()
    assert cgroup.leftovers(owner=os.getpid()) == []


@needs_cpu
@pytest.mark.slow
def test_cpu_groups_left_by_a_killed_grader_are_removed(monkeypatch):
    be = _cpu_backend()
    grader = subprocess.Popen(
        [sys.executable, "-c", "from harness.sandbox import cgroup; import sys, time\n"
         "g = cgroup.Group(cgroup.backend(), 4, 64)\nprint(g.dirs['cpu'], flush=True)\n"
         "time.sleep(60)\n"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        stale = Path(grader.stdout.readline().strip())
        assert stale.parent == be.parents["cpu"] and stale.is_dir()
    finally:
        grader.kill()  # SIGKILL: it never removes its group
        grader.wait()
    assert stale in cgroup.leftovers(be, owner=grader.pid)
    monkeypatch.setattr(cgroup, "_cleaned", set())
    group = cgroup.Group(be, 4, 64)  # the next grader's first group cleans up
    try:
        assert not stale.exists()
        assert cgroup.leftovers(be, owner=grader.pid) == []
    finally:
        group.remove()


@needs_cpu
def test_a_quota_above_the_parents_leaves_the_parents_in_force(monkeypatch):
    be = _cpu_backend()
    parent = cgroup.Group(be, 8, 64, cpus=0.5)
    try:
        if (parent.dirs["cpu"] / "cpu.weight").exists():
            pytest.skip("cgroup v2 accepts a child's cpu.max above its parent's")
        nested = dataclasses.replace(be, parents=dict(parent.dirs))
        child = cgroup.Group(nested, 4, 64)  # 1 CPU under 0.5: refused by the kernel, no error
        try:
            assert (child.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "-1"
        finally:
            child.remove()
    finally:
        parent.remove()


@needs_cpu
def test_without_the_cpu_group_a_sandbox_still_runs_and_says_cpu_is_not_isolated(cpu_iso):
    be = cpu_iso.cgroups
    stripped = dataclasses.replace(be, parents={k: v for k, v in be.parents.items()
                                                if k != "cpu"})
    iso = dataclasses.replace(cpu_iso, cgroups=stripped)
    assert "CPU NOT isolated per sandbox" in iso.describe()
    with layers.forced(iso):
        result = run_python("print(6 * 7)")
    assert result.ok and result.stdout.strip() == b"42"
    assert cgroup.leftovers(owner=os.getpid()) == []


def _calibrate(seconds: float) -> tuple[int, float]:
    """``n`` such that ``work(n)`` takes about ``seconds`` in a sandbox here, and that time."""
    server = ForkServer(Limits(), tag="cpu-calibrate")
    try:
        ns = server.load(WORK, timeout=30, cpu_s=60, call_timeout=30).namespace()
        n = 500_000
        while True:
            start = time.perf_counter()
            ns["work"](n)
            took = time.perf_counter() - start
            if took >= 0.15:
                n = int(n * seconds / took)
                break
            n *= 3
        times = []
        for _ in range(2):
            start = time.perf_counter()
            ns["work"](n)
            times.append(time.perf_counter() - start)
        return n, statistics.median(times)
    finally:
        server.close()


@pytest.mark.slow
@needs_cpu
def test_setsid_spinners_next_door_do_not_flip_an_honest_cpu_bound_verdict(cpu_iso):
    """Two graded sandboxes side by side on this machine: 12 spinners that each ``setsid`` in
    one, an honest CPU-bound program (3 tests, ~0.4 s each alone) in the other. Its budget is
    4x what it takes alone (measured here, just before): with the old 12-to-1 share it took ~7x
    and timed out; with a cpu group per sandbox it gets at least its share (~1-2x)."""
    n, per_call = _calibrate(0.4)
    call_timeout = max(1.5, 4 * per_call)
    honest = ({"kind": "functional", "units": [f"assert work({n} + {i}) >= 0" for i in range(3)]},
              WORK)
    # the attack's tests sleep while its spinners run, for as long as the honest budget
    attack = ({"kind": "functional", "units": [f"assert f({0.8 * call_timeout}) > 0"] * 3},
              SPINNERS)
    config = GraderConfig(workers=2, cache_size=0, stop_on_first_failure=False,
                          allow_weaker_isolation=True, timeout_base_s=1.0,
                          timeout_per_test_s=call_timeout, call_timeout_s=call_timeout)
    grader = CodeGrader(config)
    try:
        alone = grader.grade(*honest)
        beside = grader.grade_many([attack, honest])[1]
    finally:
        grader.close()
    assert alone.all_passed, alone
    assert beside.all_passed, (beside, alone.seconds)
    assert beside.seconds < 3.5 * alone.seconds, (beside.seconds, alone.seconds)
    assert cgroup.leftovers(owner=os.getpid()) == []
