"""The hostile-program suite, run twice: as root (as CI runs) and as a non-root uid ("nonroot").

Each run is ``python -m tests.hostile.run`` in a process of its own, under an outer cap
(``tests/hostile/outer.py``: a cgroup with ``pids.max`` and a memory limit, nested sandboxes
included), so a sandbox regression cannot take the machine down; it prints what it measured.
Every attack in ``tests/hostile/cases.py`` must earn no credit, honest programs in the same
sandboxes keep full credit, a fork bomb creates at most ``max_procs`` processes in its sandbox
(counted on the host), a memory bomb is killed at the sandbox's group memory (the kernel's own
counters), and nothing is left behind: no process, no file, no cgroup.

The non-root run ("nonroot") uses a uid with no passwd entry and no process (nothing to create or
remove) and a cgroup delegated to it by this fixture; it needs root to start and is skipped
otherwise (a non-root developer's own run is that run).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

import pytest

from harness.sandbox import probe
from tests.hostile.cases import CASES
from tests.hostile.outer import free_uid, run_capped
from tests.hostile.run import GROUP_MB, MAX_PROCS

ROOT = Path(__file__).resolve().parents[1]
IDENTITIES = ["root", "nonroot"]

pytestmark = pytest.mark.skipif(
    os.environ.get("RLBENCH_SANDBOX") == "rlimits" or probe().mode != "bwrap",
    reason="the hostile suite needs bubblewrap (apt-get install bubblewrap): without namespaces "
           "the file-system and network attacks are not contained")


def _run(identity: str) -> dict:
    euid = os.geteuid()
    if identity == "root" and euid != 0:
        pytest.skip("the root run needs root (CI runs as root)")
    ident = None
    if identity == "nonroot" and euid == 0:
        uid = free_uid()
        ident = (uid, uid)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1",
           "OMP_NUM_THREADS": "1", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    for key in ("RLBENCH_SANDBOX", "RLBENCH_SANDBOX_HOST_ID", "RLBENCH_CGROUP"):
        if key in os.environ:
            env[key] = os.environ[key]
    capped = run_capped([sys.executable, "-m", "tests.hostile.run"], name=f"outer-{identity}",
                        ident=ident, timeout=540, env=env, cwd=str(ROOT))
    assert capped.returncode == 0 and not capped.timed_out, (capped.cap, capped.stderr[-3000:])
    data = json.loads(capped.stdout.strip().splitlines()[-1])
    data.update(outer_cap=capped.cap, outer_left=capped.left_behind, run_as=ident or euid)
    return data


@pytest.fixture(scope="module", params=IDENTITIES)
def outcome(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run per identity, shared by the xdist workers of this session (file lock)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    path = shared / f"hostile-{request.param}.json"
    with open(shared / f"hostile-{request.param}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            data = json.loads(path.read_text())
        else:
            try:
                data = _run(request.param)
            except pytest.skip.Exception as exc:
                data = {"skip": str(exc.msg)}
            path.write_text(json.dumps(data))
    if "skip" in data:
        pytest.skip(data["skip"])
    return data


def test_the_suite_has_at_least_30_hostile_programs():
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_hostile_program_earns_no_credit(outcome, name):
    passed, total, status = outcome["suite"]["results"][name]
    assert passed == 0 and total > 0, (name, status)


def test_honest_programs_in_the_same_sandboxes_keep_full_credit(outcome):
    assert all(outcome["suite"]["goods_all_passed"])
    assert all(outcome["suite"]["goods_after_all_passed"])  # after every bomb


def test_root_gets_every_isolation_layer_and_the_candidate_an_unprivileged_host_uid(outcome):
    if outcome["euid"] == 0:
        assert outcome["missing"] == [], outcome["missing"]
    assert outcome["mode"] == "bwrap" and outcome["host_uid"] != 0
    uids = outcome["suite"]["host_uids"]
    # setpriv is the launcher of a root grader: root until it drops and becomes bubblewrap
    inside = {program: u for program, u in uids.items() if program != "setpriv"}
    assert inside and all(0 not in u for u in inside.values()), uids
    bomb_uids = outcome["fork_bomb"]["host_uids"]
    assert bomb_uids and all(0 not in u for u in bomb_uids.values()), bomb_uids


def test_a_fork_bomb_creates_at_most_max_procs_processes_in_its_sandbox(outcome):
    bomb = outcome["fork_bomb"]
    assert bomb["warm"] == "returned 5" and bomb["outcome"] != "returned 5"
    # it did fork (many) and was stopped at the limit: every descendant of bubblewrap's monitor
    # (which is outside the sandbox's PID namespace) counted on the host
    assert MAX_PROCS // 2 <= bomb["peak_processes"] <= MAX_PROCS, bomb
    if outcome["cgroups"]:  # the kernel's count: every task of the group, the monitor included
        assert bomb["cgroup"]["pids_peak"] is None or bomb["cgroup"]["pids_peak"] <= MAX_PROCS + 1
    assert bomb["honest_after"] == "returned 5"


def test_without_cgroups_rlimit_nproc_in_the_user_namespace_still_holds(outcome):
    bomb = outcome.get("fork_bomb_rlimit_only")
    if bomb is None:
        pytest.skip(f"this run had no cgroups to switch off ({outcome['isolation']})")
    assert bomb["cgroup"] == {} and "no cgroup" in bomb["isolation"]
    assert MAX_PROCS // 2 <= bomb["peak_processes"] <= MAX_PROCS, bomb
    assert bomb["honest_after"] == "returned 5"


def test_fork_bombs_earn_no_credit(outcome):
    for name in ("fork_bomb_at_import", "fork_bomb_in_call", "subprocess_bomb"):
        assert outcome["suite"]["results"][name][0] == 0


def test_a_memory_bomb_is_killed_at_the_group_memory_limit(outcome):
    if "memory_bomb" not in outcome:
        pytest.skip(f"no cgroup in this run ({outcome['isolation']}): group memory is not "
                    "enforced, memory is bounded per process only")
    mem = outcome["memory_bomb"]
    assert mem["group_mb"] == GROUP_MB and mem["process_mb"] > 4 * GROUP_MB
    for name in ("one_process", "eight_processes"):
        run = mem[name]
        assert run["outcome"] in ("RemoteDiedError", "RemoteTimeoutError"), run
        assert run["cgroup"]["oom_kills"] >= 1, run  # killed by the group's limit ...
        assert run["cgroup"]["memory_peak"] <= GROUP_MB << 20, run  # ... and never above it
        assert run["honest_after"] == "returned 5"
    assert mem["processes_after"] == []


def test_no_connection_reached_the_host_listener(outcome):
    assert outcome["suite"]["listener_accepted"] == 0


def test_no_host_file_was_written_or_deleted(outcome):
    suite = outcome["suite"]
    assert suite["sentinel_intact"] and not suite["hostfile_exists"]
    assert not suite["repo_pwned"] and suite["data_intact"]
    assert not (ROOT / "PWNED").exists()


def test_no_process_is_left_running(outcome):
    suite = outcome["suite"]
    # while the grader was open, per sandbox at most bubblewrap's monitor, its PID 1 and the
    # fork server (no forked leftovers); after close, none at all
    assert suite["processes_during"] <= 6, suite["processes_during"]
    assert suite["processes_after"] == []
    assert outcome["fork_bomb"]["processes_after"] == []


def test_no_cgroup_and_nothing_else_is_left_under_the_outer_cap(outcome):
    assert outcome["cgroups_left"] == []
    assert outcome["outer_left"] == [], outcome["outer_left"]


def test_the_suite_ran_under_an_outer_cap_of_its_own(outcome):
    cap = outcome["outer_cap"]
    assert "pids.max" in cap or "RLIMIT_NPROC" in cap
    if "cgroup" in cap.split(":")[0]:
        name = cap.split()[1].rstrip(":")
        assert name in outcome["own_cgroup"], (cap, outcome["own_cgroup"])


def test_daemons_started_by_a_candidate_die_with_it(outcome):
    # the daemon would have created the host file 30 s later if it had survived; its sandbox
    # (PID namespace, cgroup) is gone, so no process of it is left to do so
    assert outcome["suite"]["processes_after"] == []
    assert outcome["suite"]["results"]["daemon_survives"][0] == 0


def test_attacks_on_the_server_are_survived_by_replacing_it(outcome):
    # kill_parent, kill_everything and stop_parent take their fork server down; grading goes on
    assert outcome["suite"]["restarts"] >= 2


def test_the_whole_suite_is_graded_in_bounded_time(outcome):
    assert outcome["suite"]["seconds"] < 120
