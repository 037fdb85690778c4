"""The attacks of ``tests/hostile/classes.py``, class by class, each graded **followed by honest
programs in the same fork server** (a grader with one sandbox and no result cache, fraction
reward), with what was measured. Called from ``tests/hostile/run.py`` (``run_all``); the judge's
own resources and a grader's SIGKILL are measured in subprocesses of this module:

    python -m tests.hostile.by_class judge NAME     # one judge-resources attack, fresh process
    python -m tests.hostile.by_class persist NAME   # a grader that the caller SIGKILLs
    python -m tests.hostile.by_class next           # a later grader (removes stale groups)
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import re
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness.sandbox import Limits, cgroup
from harness.sandbox.remote import ForkServer
from tasks.code.grading import CodeGrader, GraderConfig, GradeResult
from tests.hostile import classes as C
from tests.hostile.payloads import MARK

ROOT = Path(__file__).resolve().parents[2]


def _cfg(**kw: Any) -> GraderConfig:
    base = dict(workers=1, timeout_base_s=2.0, timeout_per_test_s=1.0, call_timeout_s=2.0,
                cpu_s=3.0, memory_mb=256, group_memory_mb=384, max_procs=16,
                stop_on_first_failure=False, cache_size=0, allow_weaker_isolation=True)
    return GraderConfig(**{**base, **kw})


def _res(r: GradeResult) -> list[Any]:
    return [r.passed, r.total, r.status, r.error[:300]]


def _full(r: GradeResult) -> bool:
    return r.total > 0 and r.passed == r.total


def _tag(name: str) -> str:
    return f"hostile-class-{os.getpid()}-{name}"


def _procs(mark: str) -> list[int]:
    """PIDs of processes whose command line holds ``mark`` (a grader's tag)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if mark.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
    return sorted(found)


def sequence(name: str, items: list[tuple[str, str]], config: GraderConfig | None = None
             ) -> list[GradeResult]:
    """Grade (problem, code) pairs one after another in one fresh fork server."""
    grader = CodeGrader(config or _cfg(), tag=_tag(name))
    try:
        return [grader.grade(C.PROBLEMS[p], code) for p, code in items]
    finally:
        grader.close()


def _after(attack: C.Attack, extra: list[tuple[str, str]]) -> dict[str, Any]:
    """The attack, then a wrong program, honest programs and ``extra``, in one server."""
    p = "stdio" if attack.problem == "stdio" else "affine"
    rest = [(p, C.WRONG[p]), (p, C.HONEST[p]), (p, C.HONEST[p]), *extra]
    start = time.monotonic()
    rs = sequence(attack.name, [(attack.problem, attack.code), *rest])
    return {"attack": _res(rs[0]), "wrong_after": _res(rs[1]),
            "after": [_res(r) for r in rs[2:]], "honest_ok": all(_full(r) for r in rs[2:]),
            "wrong_zero": rs[1].passed == 0, "seconds": round(time.monotonic() - start, 2)}


def judge_channel() -> dict[str, Any]:
    return {a.name: _after(a, [("affine", C.NEEDY)]) for a in C.JUDGE_CHANNEL}


def pid1() -> dict[str, Any]:
    return {a.name: _after(a, []) for a in C.PID1}


def environment(secret: str) -> dict[str, Any]:
    from tasks.agentic_qa.tools import PythonTool

    out: dict[str, Any] = {a.name: _after(a, []) for a in C.ENVIRONMENT}
    tool = PythonTool()
    for i, code in enumerate(C.TOOL_CODE):
        text = str(tool(code))
        out[f"env_python_tool_{i}"] = {"leaked": secret in text, "chars": len(text)}
    out["leaks"] = sorted(k for k, v in out.items()
                          if secret in json.dumps(v) or v.get("leaked"))
    return out


def state() -> dict[str, Any]:
    """Each plant, then (same server) the honest programs that need what it takes and a wrong
    one; and separately the plant then the spy. Markers carry a token of this run."""
    token = "-" + secrets.token_hex(4)  # each plant and its spy: a marker of their own
    out: dict[str, Any] = {}
    for i, plant in enumerate(C.STATE):
        mark = f"{MARK}{token}-{i}"
        code, spy, start = plant.code.replace(MARK, mark), C.SPY.replace(MARK, mark), \
            time.monotonic()
        rs = sequence(plant.name, [("affine", code), ("affine", C.NEEDY),
                                   ("stdio", C.NEEDY_STDIO), ("affine", C.HONEST["affine"]),
                                   ("affine", C.WRONG["affine"])])
        seen = sequence(plant.name, [("affine", code), ("affine", spy)])[1]
        out[plant.name] = {
            "plant": _res(rs[0]), "needy": _res(rs[1]), "needy_stdio": _res(rs[2]),
            "honest": _res(rs[3]), "wrong": _res(rs[4]), "spy": _res(seen),
            "honest_ok": all(_full(r) for r in rs[1:4]), "wrong_zero": rs[4].passed == 0,
            "seconds": round(time.monotonic() - start, 2)}
    # a spy in another sandbox while a planting one is still open (kernel keyring: per host uid)
    keyring = next(a for a in C.STATE if a.name == "st_kernel_keyring")
    holder = CodeGrader(_cfg(), tag=_tag("holder"))
    try:
        holder.grade(C.PROBLEMS["affine"], keyring.code.replace(MARK, f"{MARK}{token}-x"))
        seen = sequence("cross", [("affine", C.SPY.replace(MARK, f"{MARK}{token}-x"))])[0]
    finally:
        holder.close()
    out["cross_sandbox_spy"] = _res(seen)
    # the same programs in a fresh server: the harness itself is sound
    rs = sequence("control", [("affine", C.SPY.replace(MARK, f"{MARK}{token}-c")),
                              ("affine", C.NEEDY), ("stdio", C.NEEDY_STDIO),
                              ("affine", C.HONEST["affine"])])
    out["control"] = {"spy": _res(rs[0]), "honest_ok": all(_full(r) for r in rs[1:]),
                      "results": [_res(r) for r in rs]}
    return out


# -- the judge's resources: one fresh process per attack ----------------------------------------
JUDGE_CFG = dict(timeout_base_s=3.0, timeout_per_test_s=0.1, call_timeout_s=5.0, cpu_s=10.0,
                 memory_mb=1024, group_memory_mb=1024)


def _hwm_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure_judge(name: str) -> dict[str, Any]:
    """In this (fresh) process: the judge's peak RSS growth and CPU seconds while grading the
    attack on a 20-test problem (an honest program graded first: server up, modules loaded)."""
    attack = next(a for a in C.JUDGE_RESOURCES if a.name == name)
    grader = CodeGrader(_cfg(**JUDGE_CFG), tag=_tag(name))
    try:
        warm = grader.grade(C.PROBLEMS["affine20"], C.HONEST["affine"])
        gc.collect()
        hwm, cpu, start = _hwm_kb(), _cpu(), time.monotonic()
        r = grader.grade(C.PROBLEMS[attack.problem], attack.code)
        budget = grader._budget(len(C.PROBLEMS[attack.problem]["units"]))
        out = {"rss_growth_mb": round((_hwm_kb() - hwm) / 1024, 1), "budget_s": budget,
               "judge_cpu_s": round(_cpu() - cpu, 2), "wall_s": round(time.monotonic() - start, 2),
               "attack": _res(r), "warm_ok": _full(warm)}
        out["honest_after_ok"] = _full(grader.grade(C.PROBLEMS["affine20"], C.HONEST["affine"]))
        return out
    finally:
        grader.close()


def _child(args: list[str], **kw: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.hostile.by_class", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def judge_resources() -> dict[str, Any]:
    """Each attack measured in a fresh judge process, two at a time (CPU seconds and peak RSS
    are the process's own, so the other one does not count in them)."""
    out: dict[str, Any] = {}
    todo = list(C.JUDGE_RESOURCES)
    while todo:
        batch, todo = todo[:2], todo[2:]
        procs = [(a, _child(["judge", a.name])) for a in batch]
        for attack, proc in procs:
            try:
                stdout, stderr = proc.communicate(timeout=120)
                out[attack.name] = json.loads(stdout.strip().splitlines()[-1])
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                proc.kill()
                stdout, stderr = proc.communicate()
                out[attack.name] = {"error": (stderr or "")[-500:]}
    return out


# -- grading logic: real HumanEval problems ------------------------------------------------------
def grading() -> dict[str, Any]:
    from tasks.code.datasets import load

    problems = load("humaneval")
    grader = CodeGrader(_cfg(workers=2, cpu_s=5.0), tag=_tag("grading"))
    out: dict[str, Any] = {}
    try:
        items, keys = [], []
        for idx, spec in C.HELPER_PROBLEMS.items():
            ex = problems[idx]
            for variant, completion in C.helper_redefinitions(*spec).items():
                items.append((ex.answer, ex.answer["prompt_code"] + completion))
                keys.append((variant, ex.id))
            items.append((ex.answer, ex.meta["reference"]))  # the reference still passes
            keys.append(("reference", ex.id))
        for (variant, pid), r in zip(keys, grader.grade_many(items)):
            out.setdefault(variant, {})[pid] = _res(r)
        rs = grader.grade_many([(ex.answer, ex.answer["prompt_code"] + C.STUBS["gl_stub_none"])
                                for ex in problems])
        credited = {ex.id: (ex, r) for ex, r in zip(problems, rs) if r.passed > 0}
        units = {pid: [_expects(unit) for ok, unit in zip(r.per_test, ex.answer["units"]) if ok]
                 for pid, (ex, r) in credited.items()}
        out["gl_stub_none"] = {"problems": len(problems), "credited": len(credited),
                               "credited_units": units}
        rs = grader.grade_many([(ex.answer, ex.answer["prompt_code"] + C.STUBS["gl_stub_raise"])
                                for ex, _ in credited.values()])
        out["gl_stub_raise"] = {pid: _res(r) for pid, r in zip(credited, rs) if r.passed > 0}
    finally:
        grader.close()
    return out


def _expects(unit: str) -> str:
    """What a test credited to a stub returning None checks: ``none`` (None is the expected
    value), ``falsy`` (``assert not f(...)``: False expected, None passes too) or ``other``."""
    asserts = [line.strip() for line in unit.splitlines() if line.strip().startswith("assert")]
    if any("None" in a for a in asserts):
        return "none"
    if asserts and all(re.match(r"assert\s+not\b", a) for a in asserts):
        return "falsy"
    return "other"


# -- a neighbouring sandbox's CPU ----------------------------------------------------------------
# a 9 s budget (5 s a call) for a ~1.3 s program of 0.4 s of CPU a call: room for a fair
# share on a loaded 2-core CI machine; a regression shows in the slowdown the test bounds
# (4-7x without the cpu group)
NEIGHBOUR_CFG = dict(workers=2, timeout_base_s=6.0, timeout_per_test_s=1.0, call_timeout_s=5.0,
                     cpu_s=3.0, memory_mb=512)


def _beside(name: str, attack: str | None) -> dict[str, Any]:
    """The CPU-bound honest program in one sandbox, ``attack`` in the other (both started)."""
    tag = _tag(name)
    grader = CodeGrader(_cfg(**NEIGHBOUR_CFG), tag=tag)
    try:
        with grader.pool.server() as one, grader.pool.server() as two:
            one.unload()
            two.unload()
        thread = None
        if attack is not None:
            thread = threading.Thread(target=grader.grade, args=(C.PROBLEMS["affine"], attack))
            thread.start()
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and len(_procs(tag)) < 14:
                time.sleep(0.02)
        r = grader.grade(C.PROBLEMS["affine"], C.CPU_HONEST)
        if thread is not None:
            thread.join()
        return {"passed": r.passed, "total": r.total, "status": r.status,
                "seconds": round(r.seconds, 2)}
    finally:
        grader.close()


NEIGHBOUR_LOCK = Path(tempfile.gettempdir()) / "rlbench-hostile-neighbour-cpu.lock"


def _exclusive() -> int:
    """A lock shared by the root and the non-root runs (they may run at once, on the two
    xdist workers): their CPU measurements must not compete with each other. Opened without
    O_CREAT when it exists (fs.protected_regular refuses O_CREAT on another user's file in a
    sticky directory)."""
    try:
        fd = os.open(NEIGHBOUR_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        try:
            fd = os.open(NEIGHBOUR_LOCK, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            fd = os.open(NEIGHBOUR_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def neighbour_cpu() -> dict[str, Any]:
    """Each attack beside the honest program, and the honest program alone just before it (the
    rest of the machine, e.g. the other xdist worker's tests, changes between attacks)."""
    fd = _exclusive()
    try:
        out: dict[str, Any] = {}
        for attack in C.NEIGHBOUR_CPU:
            alone = _beside("alone", None)
            out.setdefault("alone", alone)
            beside = _beside(attack.name, attack.code)
            beside["alone_s"] = alone["seconds"]
            beside["slowdown"] = round(beside["seconds"] / max(alone["seconds"], 1e-3), 2)
            out[attack.name] = beside
        return out
    finally:
        os.close(fd)


# -- outliving a SIGKILLed grader ----------------------------------------------------------------
def persist_child(name: str) -> None:
    """The grader to be killed: loads the attack, runs f(2) (the preparation), says READY and
    is SIGKILLed during f(3)."""
    attack = next(a for a in C.PERSISTENCE if a.name == name)
    server = ForkServer(Limits(memory_mb=256, group_memory_mb=384), tag=_tag(name),
                        allow_weaker=True)
    session = server.load(attack.code, timeout=10, cpu_s=5, call_timeout=10)
    f = session.namespace()["f"]
    print("READY", f(2), flush=True)
    f(3)


def persistence() -> dict[str, Any]:
    """Each attack in a grader of its own (all at once), SIGKILLed once the attack is prepared;
    then what is left: processes, cgroups, its temporary directory, /dev/shm files."""
    out: dict[str, Any] = {}
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    runs = []
    for attack in C.PERSISTENCE:
        tmp = tempfile.mkdtemp(prefix="rlbench-hostile-persist-")
        os.chmod(tmp, 0o777)
        runs.append((attack, tmp, _child(["persist", attack.name], env={**os.environ,
                                                                         "TMPDIR": tmp})))
    ready = {}
    for attack, _, proc in runs:
        line = ""
        if select.select([proc.stdout], [], [], 30)[0]:
            line = proc.stdout.readline().strip()
        ready[attack.name] = line
    time.sleep(1.0)  # the attack's own preparation after f(2) returned
    for _, _, proc in runs:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    time.sleep(1.5)
    dead = [proc.pid for _, _, proc in runs]
    for attack, tmp, proc in runs:
        groups = sorted({g.name for g in cgroup.leftovers(owner=proc.pid)})
        in_groups = {p for g in groups for p in _group_pids(g)}
        left = set(_procs(f"hostile-class-{proc.pid}-")) | in_groups
        out[attack.name] = {"ready": ready[attack.name], "processes_left": sorted(left),
                            "groups_left": groups, "tmp_left": sorted(os.listdir(tmp))}
        shutil.rmtree(tmp, ignore_errors=True)
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    out["host_shm_new"] = sorted(n for n in shm_after - shm_before if MARK in n)
    _child(["next"]).communicate(timeout=60)
    out["groups_after_next_grader"] = sorted({g.name for pid in dead
                                              for g in cgroup.leftovers(owner=pid)})
    for pid in dead:  # clean up after a breach: what survived is ours to end
        names = {g.name for g in cgroup.leftovers(owner=pid)}
        for p in {*_procs(f"hostile-class-{pid}-"), *(q for g in names for q in _group_pids(g))}:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.2)
        for g in cgroup.leftovers(owner=pid):
            for root, _, _ in os.walk(g, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(root)
    return out


def _group_pids(name: str) -> list[int]:
    out: list[int] = []
    be = cgroup.backend()
    for parent in be.dirs if be else []:
        for root, _, _ in os.walk(parent / name):
            with contextlib.suppress(OSError, ValueError):
                out += [int(x) for x in (Path(root) / "cgroup.procs").read_text().split()]
    return out


def next_grader() -> None:
    grader = CodeGrader(_cfg(), tag=_tag("next"))
    grader.grade(C.PROBLEMS["affine"], C.HONEST["affine"])
    grader.close()


SECTIONS = {"judge_channel": judge_channel, "pid1": pid1, "state": state,
            "judge_resources": judge_resources, "grading": grading,
            "neighbour_cpu": neighbour_cpu, "persistence": persistence}


def run_all(only: list[str] | None = None) -> dict[str, Any]:
    """Every class (or ``only`` these); the figures per class and what was left behind."""
    secret = os.environ.setdefault(C.SECRET_VAR, "rlbench-secret-" + secrets.token_hex(12))
    out: dict[str, Any] = {"secret_set": bool(secret)}
    seconds = {}
    for name in ["judge_channel", "pid1", "environment", *list(SECTIONS)[2:]]:
        if only and name not in only:
            continue
        start = time.monotonic()
        out[name] = environment(secret) if name == "environment" else SECTIONS[name]()
        seconds[name] = round(time.monotonic() - start, 1)
    out["seconds"] = seconds
    time.sleep(0.3)
    out["processes_left"] = _procs(f"hostile-class-{os.getpid()}-")
    out["secret_in_output"] = secret in json.dumps(out)
    return out


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "all"
    if mode == "judge":
        print(json.dumps(measure_judge(sys.argv[2])))
    elif mode == "persist":
        persist_child(sys.argv[2])
    elif mode == "next":
        next_grader()
    else:
        print(json.dumps(run_all(sys.argv[2:] or None)))


if __name__ == "__main__":
    main()
