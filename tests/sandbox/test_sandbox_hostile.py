"""The hostile-program suite, run twice: as root (as CI runs) and as a non-root uid ("nonroot").

Each run is ``python -m tests.hostile.run`` in a process of its own, under an outer cap
(``tests/hostile/outer.py``: a cgroup with ``pids.max`` and a memory limit, nested sandboxes
included), so a sandbox regression cannot take the machine down; it prints what it measured.
Every attack in ``tests/hostile/cases.py`` must earn no credit, honest programs in the same
sandboxes keep full credit, a fork bomb creates at most ``max_procs`` processes in its sandbox
(counted on the host), a memory bomb is killed at the sandbox's group memory (the kernel's own
counters), and nothing is left behind: no process, no file, no cgroup. The attacks of
``tests/hostile/classes.py`` (issue 30: judge channel, PID 1 and other processes, environment,
state left for the next program, the judge's own memory and CPU, grading logic, a neighbour's
CPU, outliving a SIGKILLed grader) are run in the same process and asserted below, class by class.

The non-root run ("nonroot") uses a uid with no passwd entry and no process (nothing to create or
remove) and a cgroup delegated to it by this fixture; it needs root to start and is skipped
otherwise (a non-root developer's own run is that run).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.sandbox import probe
from tests.hostile import classes as C
from tests.hostile.cases import CASES
from tests.hostile.outer import free_uid, run_capped
from tests.hostile.run import GROUP_MB, MAX_PROCS

ROOT = Path(__file__).resolve().parents[2]
IDENTITIES = ["root", "nonroot"]
SECRET_VAR = C.SECRET_VAR
SECRET = "rlbench-secret-" + secrets.token_hex(16)

# slow: the two runs of the suite take ~100 s at once on 2 cores (all tests but two read them)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    os.environ.get("RLBENCH_SANDBOX") == "rlimits" or probe().mode != "bwrap",
    reason="the hostile suite needs bubblewrap (apt-get install bubblewrap): without namespaces "
           "the file-system and network attacks are not contained")]


def _run(identity: str) -> dict:
    euid = os.geteuid()
    if identity == "root" and euid != 0:
        pytest.skip("the root run needs root (CI runs as root)")
    ident = None
    if identity == "nonroot" and euid == 0:
        uid = free_uid()
        ident = (uid, uid)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1",
           "OMP_NUM_THREADS": "1", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           SECRET_VAR: SECRET}  # a secret of the grader's: must never come back
    for key in ("RLBENCH_SANDBOX", "RLBENCH_SANDBOX_HOST_ID", "RLBENCH_CGROUP"):
        if key in os.environ:
            env[key] = os.environ[key]
    capped = run_capped([sys.executable, "-m", "tests.hostile.run"], name=f"outer-{identity}",
                        ident=ident, timeout=540, env=env, cwd=str(ROOT))
    assert capped.returncode == 0 and not capped.timed_out, (capped.cap, capped.stderr[-3000:])
    data = json.loads(capped.stdout.strip().splitlines()[-1])
    data.update(outer_cap=capped.cap, outer_left=capped.left_behind, run_as=ident or euid,
                secret_in_runner_output=SECRET in capped.stdout + capped.stderr)
    return data


def _run_or_skip(identity: str) -> dict:
    try:
        return _run(identity)
    except pytest.skip.Exception as exc:
        return {"skip": str(exc.msg)}


@pytest.fixture(scope="module", params=IDENTITIES)
def outcome(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            machine_to_itself: None) -> dict:
    """The root and the non-root run at once (each mostly waits on timeouts and sleeps; their CPU
    measurements take turns, ``tests/hostile/by_class.py:_exclusive``), once per session, shared
    by its xdist workers (file lock)."""
    # a sandbox runs at the harness's nice value + 10; at 19 (the kernel's ceiling) a fresh
    # sandbox already looks reniced by a previous program, and every state probe fires
    if os.getpriority(os.PRIO_PROCESS, 0) >= 9:
        pytest.fail("the hostile suite needs a nice value below 9 (it runs sandboxes at +10 "
                    "and probes for nice 19); run it without `nice -n 19`", pytrace=False)
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    paths = {identity: shared / f"hostile-{identity}.json" for identity in IDENTITIES}
    with open(shared / "hostile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not paths[request.param].exists():
            with ThreadPoolExecutor(len(IDENTITIES)) as pool:
                for identity, data in zip(IDENTITIES, pool.map(_run_or_skip, IDENTITIES)):
                    paths[identity].write_text(json.dumps(data))
        data = json.loads(paths[request.param].read_text())
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


def test_signals_to_the_server_do_not_reach_it(outcome):
    # kill_parent, kill_everything, stop_parent, interrupt_parent: the fork server is its
    # sandbox's PID 1, which no signal from inside reaches; no server had to be replaced
    for name in ("kill_parent", "kill_everything", "stop_parent", "interrupt_parent"):
        assert outcome["suite"]["results"][name][0] == 0
    assert outcome["suite"]["restarts"] == 0


def test_the_whole_suite_is_graded_in_bounded_time(outcome):
    assert outcome["suite"]["seconds"] < 120


# -- attacks by class (tests/hostile/classes.py, run by tests/hostile/by_class.py) ---------------
# Each class: several variants, each graded and then followed, in the same fork server, by a
# wrong program (must get 0) and honest programs (must keep full credit). Issue 30.
def test_every_class_has_several_variants():
    by_class: dict[str, int] = {}
    for attack in C.ALL:
        by_class[attack.cls] = by_class.get(attack.cls, 0) + 1
    assert set(by_class) == {"judge_channel", "pid1", "environment", "state",
                             "judge_resources", "neighbour_cpu", "persistence"}
    assert all(n >= 3 for n in by_class.values()), by_class
    assert by_class["state"] >= 12
    assert len({a.name for a in C.ALL}) == len(C.ALL)


def _cls(outcome: dict, name: str) -> dict:
    return outcome["classes"][name]


def _held(r: dict) -> bool:
    return r["attack"][0] == 0 and r["wrong_zero"] and r["honest_ok"]


@pytest.mark.parametrize("name", [a.name for a in C.JUDGE_CHANNEL])
def test_the_judge_channel_cannot_be_reached_or_forged(outcome, name):
    """No credit for the attack, and the judge's stream stays in step: a wrong program after it
    gets nothing, honest ones keep full credit (a taken-over channel answers for both)."""
    r = _cls(outcome, "judge_channel")[name]
    assert _held(r), r


@pytest.mark.parametrize("name", [a.name for a in C.PID1])
def test_no_other_process_of_the_sandbox_can_be_reached(outcome, name):
    r = _cls(outcome, "pid1")[name]
    assert _held(r), r


@pytest.mark.parametrize("name", [a.name for a in C.ENVIRONMENT])
def test_the_graders_environment_is_not_in_the_sandbox(outcome, name):
    env = _cls(outcome, "environment")
    assert _held(env[name]), env[name]
    assert name not in env["leaks"]  # not in an error, a returned value or stderr


def test_the_python_tool_does_not_show_the_graders_environment(outcome):
    env = _cls(outcome, "environment")
    tools = {k: v for k, v in env.items() if k.startswith("env_python_tool_")}
    assert tools and not any(v["leaked"] for v in tools.values()), tools


def test_the_secret_appears_nowhere_in_what_the_runner_got_back(outcome):
    assert not outcome["secret_in_runner_output"]
    assert not _cls(outcome, "environment")["leaks"]


@pytest.mark.parametrize("name", [a.name for a in C.STATE])
def test_no_state_of_one_program_reaches_the_next(outcome, name):
    """A plant, then programs that need what it takes (150 MiB, files, CPU, threads, their
    work directory, a stdio run), an honest and a wrong one; apart: the plant then a spy that
    answers right only if it sees anything the plant left."""
    r = _cls(outcome, "state")[name]
    assert r["spy"][0] == 0, r["spy"]
    assert r["honest_ok"] and r["wrong_zero"], r


def test_the_state_probes_pass_in_a_fresh_sandbox(outcome):
    control = _cls(outcome, "state")["control"]  # the harness itself: not a breach
    assert control["spy"][0] == 0 and control["honest_ok"], control


def test_no_sandbox_sees_the_kernel_keys_of_another(outcome):
    assert _cls(outcome, "state")["cross_sandbox_spy"][0] == 0


@pytest.mark.parametrize("name", [a.name for a in C.JUDGE_RESOURCES])
def test_a_candidate_cannot_make_the_judge_use_much_memory_or_cpu(outcome, name):
    r = _cls(outcome, "judge_resources")[name]
    assert "error" not in r and r["warm_ok"], r
    assert r["attack"][0] == 0 and r["honest_after_ok"], r
    assert r["rss_growth_mb"] < 100, r  # the judge's own peak RSS
    assert r["judge_cpu_s"] < 3.0, r    # the judge's own CPU for the whole attack program


@pytest.mark.parametrize("variant", ["gl_redefine_def", "gl_redefine_globals", "gl_redefine_lambda",
                                     "gl_redefine_callable_instance", "gl_redefine_via_exec"])
def test_humaneval_helpers_are_the_judges_not_the_candidates(outcome, variant):
    grading = _cls(outcome, "grading")
    assert all(r[0] == r[1] > 0 for r in grading["reference"].values()), grading["reference"]
    assert all(r[0] == 0 for r in grading[variant].values()), grading[variant]


def test_a_stub_earns_credit_only_from_tests_that_expect_none_or_false(outcome):
    grading = _cls(outcome, "grading")
    assert grading["gl_stub_raise"] == {}  # a test no program can fail is no test
    units = grading["gl_stub_none"]["credited_units"]  # HumanEval, all 164, fraction reward
    assert all(kind in ("none", "falsy") for kinds in units.values() for kind in kinds), units


@pytest.mark.parametrize("name", [a.name for a in C.NEIGHBOUR_CPU])
def test_a_neighbouring_sandbox_keeps_its_cpu(outcome, name):
    cpu = _cls(outcome, "neighbour_cpu")
    assert cpu["alone"]["passed"] == cpu["alone"]["total"] > 0, cpu["alone"]
    r = cpu[name]
    assert r["passed"] == r["total"], r  # the verdict did not flip
    # each sandbox has an equal share: at most 2x on 2 cores, with room for the other xdist
    # worker's tests, which take CPU from both measurements but not equally
    assert r["slowdown"] < 3.0, (r, cpu["alone"])


@pytest.mark.parametrize("name", [a.name for a in C.PERSISTENCE])
def test_nothing_of_a_sandbox_outlives_its_sigkilled_grader(outcome, name):
    r = _cls(outcome, "persistence")[name]
    assert r["ready"].startswith("READY"), r  # the attack was prepared before the kill
    assert r["processes_left"] == [], r


@pytest.mark.parametrize("name", [a.name for a in C.PERSISTENCE])
def test_a_sigkilled_grader_leaves_no_host_temporary_files(outcome, name):
    assert _cls(outcome, "persistence")[name]["tmp_left"] == []


def test_a_later_grader_removes_the_groups_of_a_killed_one(outcome):
    persist = _cls(outcome, "persistence")
    assert persist["groups_after_next_grader"] == [] and persist["host_shm_new"] == []


def test_the_class_attacks_leave_no_process_behind(outcome):
    assert _cls(outcome, "processes_left") == []


def test_the_class_attacks_run_in_bounded_time(outcome):
    assert sum(outcome["classes"]["seconds"].values()) < 180, outcome["classes"]["seconds"]
