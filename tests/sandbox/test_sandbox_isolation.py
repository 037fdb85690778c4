"""The isolation layers of harness.sandbox: what the machine offers is found out by starting real
sandboxes; less than configured is refused unless allowed, and then one warning names what is
not enforced; the candidate runs as an unprivileged host uid; every sandbox gets a cgroup with
its limits, removed afterwards; a root grader's interpreter under a private directory is made
reachable for the unprivileged uid without exposing anything else there.

(Bombs are not run here: they belong to the hostile suite, which runs under an outer cap.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.sandbox import Limits, cgroup, layers, python_executable, spawn
from harness.sandbox.remote import ForkServer
from harness.typed_config import ConfigError
from tasks.code.grading import CodeGrader, GraderConfig

ROOT = Path(__file__).resolve().parents[2]
NO_CGROUP = "/rlbench-no-such-cgroup"  # RLBENCH_CGROUP naming a cgroup that does not exist
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (dropping to another uid)")
needs_cgroups = pytest.mark.skipif(cgroup.backend() is None,
                                   reason="no writable cgroup with pids and memory here")
AFFINE = {"kind": "functional", "preamble": "", "units": ["assert f(2) == 5\n"]}


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(layers, "_announced", set())
    monkeypatch.delenv(layers.ALLOW_WEAKER_VAR, raising=False)


def test_a_missing_cgroup_is_detected_and_refused_naming_what_is_not_enforced(monkeypatch):
    monkeypatch.setenv(cgroup.ENV_VAR, NO_CGROUP)
    iso = layers.probe()
    assert iso.cgroups is None
    with pytest.raises(layers.WeakerIsolationError) as err:
        layers.require(allow_weaker=False)
    text = str(err.value)
    assert "cgroup" in text and "NOT enforced: group limits" in text and "\n" not in text


def test_a_machine_without_namespaces_is_refused(own_host_uid, monkeypatch):
    monkeypatch.setenv(layers.ENV_VAR, "rlimits")
    with pytest.raises(layers.WeakerIsolationError, match="missing namespaces"):
        layers.require(allow_weaker=False)


def test_the_grader_refuses_weaker_isolation_unless_allowed(monkeypatch):
    monkeypatch.setenv(cgroup.ENV_VAR, NO_CGROUP)
    with pytest.raises(ConfigError, match=r"task\.grader\.allow_weaker_isolation=true"):
        CodeGrader(GraderConfig(workers=1))


def test_allowed_weaker_isolation_grades_with_one_warning(monkeypatch, capfd):
    monkeypatch.setenv(cgroup.ENV_VAR, NO_CGROUP)
    with pytest.warns(RuntimeWarning, match="cgroup"):
        grader = CodeGrader(GraderConfig(workers=1, allow_weaker_isolation=True))
    try:
        result = grader.grade(AFFINE, "def f(x):\n    return 2 * x + 1\n")
        assert result.all_passed
        with grader.pool.server() as server:
            assert server.box is not None and server.box.group is None
        CodeGrader(GraderConfig(workers=1, allow_weaker_isolation=True)).close()
    finally:
        grader.close()
    assert capfd.readouterr().err.count("weaker than configured") == 1


def test_the_environment_can_allow_weaker_isolation_for_a_whole_process(monkeypatch):
    monkeypatch.setenv(cgroup.ENV_VAR, NO_CGROUP)
    monkeypatch.setenv(layers.ALLOW_WEAKER_VAR, "1")
    with pytest.warns(RuntimeWarning, match="cgroup"):
        CodeGrader(GraderConfig(workers=1)).close()


@pytest.mark.slow
def test_the_command_line_refuses_with_one_line_and_exit_2(tmp_path, cli_env):
    env = {**cli_env, cgroup.ENV_VAR: NO_CGROUP}
    env.pop(layers.ALLOW_WEAKER_VAR, None)
    out = subprocess.run([sys.executable, "-m", "harness.cli", "train", "algorithm=grpo",
                          "task=code", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlbench: error: sandbox isolation is weaker")
    assert "task.grader.allow_weaker_isolation=true" in lines[0]


def test_a_bad_sandbox_setting_is_one_config_error_naming_it(monkeypatch):
    monkeypatch.setenv(layers.HOST_ID_VAR, "0:0")
    with pytest.raises(ConfigError, match=r"RLBENCH_SANDBOX_HOST_ID='0:0'.*must not be 0"):
        CodeGrader(GraderConfig(workers=1))
    monkeypatch.setenv(layers.HOST_ID_VAR, "nobody")
    with pytest.raises(ConfigError, match="expected uid:gid"):
        CodeGrader(GraderConfig(workers=1))
    monkeypatch.delenv(layers.HOST_ID_VAR)
    monkeypatch.setenv(layers.ENV_VAR, "docker")
    with pytest.raises(ConfigError, match="RLBENCH_SANDBOX='docker': expected auto, bwrap"):
        CodeGrader(GraderConfig(workers=1))


def _marked(marker: str) -> dict[str, set[int]]:
    """Host uids of the processes whose command line carries ``marker``, per program."""
    seen: dict[str, set[int]] = {}
    for entry in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            if marker.encode() in cmd:
                uid = int(Path(f"/proc/{entry}/status").read_text().split("\nUid:")[1].split()[0])
                seen.setdefault(os.path.basename(cmd.split(b"\0")[0]).decode(), set()).add(uid)
        except (OSError, IndexError, ValueError):
            continue
    return seen


@needs_root
def test_a_root_grader_runs_the_candidate_as_an_unprivileged_host_uid():
    marker = f"rlbench-uid-{os.getpid()}-{time.time_ns()}"
    box = spawn([python_executable(), "-I", "-c", "import time; time.sleep(30)", marker],
                Limits(wall_s=30), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
    try:
        seen: dict[str, set[int]] = {}
        for _ in range(100):
            seen = _marked(marker)
            if "setpriv" not in seen and len(seen) >= 2:  # launcher gone: bwrap + python
                break
            time.sleep(0.05)
    finally:
        box.close()
    uid = layers.host_id()[0]
    assert "bwrap" in seen and any(p.startswith("python") for p in seen), seen
    assert all(uids == {uid} for p, uids in seen.items() if p != "setpriv"), seen


@needs_cgroups
def test_each_sandbox_gets_its_own_cgroup_with_its_limits_and_it_is_removed():
    box = spawn([python_executable(), "-I", "-c", "import time; time.sleep(30)"],
                Limits(max_procs=7, group_memory_mb=99, wall_s=30), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    group = box.group
    try:
        assert group is not None
        pdir, mdir = group.dirs["pids"], group.dirs["memory"]
        bwrap = box.isolation == "bwrap"
        assert (pdir / "pids.max").read_text().strip() == str(7 + bwrap)  # + the monitor
        limit = "memory.max" if group.backend.version == 2 else "memory.limit_in_bytes"
        assert int((mdir / limit).read_text()) == 99 << 20
        assert box.proc.pid in group.pids()
    finally:
        box.close()
    assert not pdir.exists() and not mdir.exists()
    assert cgroup.leftovers(owner=os.getpid()) == []


@needs_cgroups
def test_a_fork_server_replaced_after_a_crash_gets_a_fresh_cgroup_and_the_old_one_goes():
    server = ForkServer(Limits(), tag="cgroup-restart")
    try:
        ns = server.load("import time\ndef f():\n    time.sleep(2)\n",
                         timeout=5, cpu_s=5, call_timeout=5).namespace()
        first = server.box.group.dirs["pids"]
        # a candidate cannot kill its server any more (PID 1 of the sandbox): crash it from
        # outside, as an OOM kill or a bug would
        threading.Timer(0.3, os.kill, (server.proc.pid, 9)).start()
        with pytest.raises(Exception):  # noqa: B017 - the server dies, the call fails
            ns["f"]()
        server.load("x = 1\n", timeout=5, cpu_s=5, call_timeout=5)  # restarts the server
        assert server.restarts == 1 and server.box.group.dirs["pids"] != first
        assert not first.exists()
    finally:
        server.close()
    assert cgroup.leftovers(owner=os.getpid()) == []


@needs_cgroups
def test_empty_groups_left_by_a_killed_grader_are_removed(monkeypatch):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid now belongs to nobody (reuse within the test is not plausible)
    be = cgroup.backend()
    stale = [p / f"{cgroup.PREFIX}{dead.pid}-0" for p in be.dirs]
    for d in stale:
        (d / f"{cgroup.PREFIX}{dead.pid}-1").mkdir(parents=True)  # nested, as under an outer cap
    monkeypatch.setattr(cgroup, "_cleaned", set())
    group = cgroup.Group(be, 4, 64)
    try:
        assert not any(d.exists() for d in stale)
    finally:
        group.remove()


@needs_cgroups
def test_a_process_that_outlived_its_grader_is_killed_with_the_stale_group(monkeypatch):
    dead = subprocess.Popen(["true"])
    dead.wait()
    be = cgroup.backend()
    stale = [p / f"{cgroup.PREFIX}{dead.pid}-0" for p in be.dirs]
    for d in stale:
        d.mkdir()
    survivor = subprocess.Popen(["sleep", "60"])
    try:
        for d in stale:
            (d / "cgroup.procs").write_text(str(survivor.pid))
        monkeypatch.setattr(cgroup, "_cleaned", set())
        group = cgroup.Group(be, 4, 64)  # a later grader's first sandbox cleans up
        group.remove()
        assert survivor.wait(timeout=5) == -9
        assert not any(d.exists() for d in stale)
    finally:
        survivor.kill()
        survivor.wait()


@needs_root
def test_a_directory_under_a_private_one_is_made_reachable_and_nothing_else(tmp_path):
    private = tmp_path / "private"
    (private / "python" / "lib").mkdir(parents=True)
    (private / "python" / "lib" / "os.py").write_text("reachable\n")
    (private / "secret.txt").write_text("hidden")
    for d in (private / "python", private / "python" / "lib"):
        d.chmod(0o755)
    (private / "python" / "lib" / "os.py").chmod(0o644)
    private.chmod(0o700)
    uid, gid = layers.host_id()
    assert layers.blocked_ancestor(private / "python", uid, gid) is not None
    read = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "sh", "-c",
            f"cat {private}/python/lib/os.py; ls {private}"]

    def reach() -> None:
        layers.make_reachable((str(private / "python"),), uid, gid)

    out = subprocess.run(read, capture_output=True, text=True, preexec_fn=reach)
    assert out.stdout.split() == ["reachable", "python"]  # secret.txt is covered
    out = subprocess.run(read, capture_output=True, text=True)  # without: not even that
    assert "reachable" not in out.stdout and "Permission denied" in out.stderr
    assert (private / "secret.txt").read_text() == "hidden"  # the host's view is unchanged
