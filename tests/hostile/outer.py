"""An outer cap for the hostile suite: its runner (``tests/hostile/run.py``) is started in a cgroup
of its own (``pids.max``, memory) with a wall-clock timeout, optionally as another uid. The
sandboxes the runner creates are nested inside that cgroup, so if the sandbox ever regressed a
fork or memory bomb would hit this cap, not the machine that runs the tests.

Where no cgroup is writable (a non-root developer), the cap is ``RLIMIT_NPROC`` at the user's
current task count plus ``pids`` (the kernel counts it per user: a coarse but real bound) and
``RLIMIT_AS`` per process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import resource
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.sandbox import cgroup
from harness.sandbox.layers import make_reachable

OUTER_PIDS = 256
OUTER_MB = 3072


@dataclass
class Capped:
    returncode: int | None
    stdout: str
    stderr: str
    cap: str                       # the outer cap that was applied, in words
    timed_out: bool = False
    left_behind: list[str] = field(default_factory=list)  # processes/cgroups under the cap after


def free_uid(start: int = 61000) -> int:
    """A uid (and gid of the same number) with no passwd entry and no process: an identity that
    owns nothing on this machine (no user needs to be created for the kernel to enforce it)."""
    used = {p.pw_uid for p in pwd.getpwall()}
    running = set()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            status = Path(f"/proc/{entry}/status").read_text()
            running.add(int(status.split("\nUid:")[1].split()[1]))
    return next(u for u in range(start, start + 4000) if u not in used and u not in running)


def _user_tasks(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            status = Path(f"/proc/{entry}/status").read_text()
            if int(status.split("\nUid:")[1].split()[0]) == uid:
                n += int(status.split("\nThreads:")[1].split()[0])
    return n


def _delegate(group: cgroup.Group, uid: int, gid: int) -> Path | None:
    """Let ``uid`` create sandbox groups inside ``group`` (what a cgroup delegation is: owning
    the directory and its ``cgroup.procs``; the limits of the group itself stay root's). On
    cgroup v2 the runner must live in a leaf of its own (no processes where controllers are
    handed down): returns that leaf."""
    leaf = None
    if group.backend.version == 2:
        d = group.dirs["pids"]
        (d / "cgroup.subtree_control").write_text("+pids +memory")
        leaf = d / "runner"
        leaf.mkdir()
    extra = [leaf, leaf / "cgroup.procs"] if leaf else []
    for d in dict.fromkeys(group.dirs.values()):
        for item in (d, d / "cgroup.procs", d / "tasks", d / "cgroup.threads",
                     d / "cgroup.subtree_control", *extra):
            with contextlib.suppress(FileNotFoundError):
                os.chown(item, uid, gid)
    return leaf


def _setup(group: cgroup.Group | None, leaf: Path | None, reach: tuple[str, ...],
           ident: tuple[int, int] | None, nproc: int | None) -> None:
    if leaf is not None:
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
    elif group is not None:
        group.attach()
    if ident is not None:
        make_reachable(reach, *ident)
    if nproc is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        resource.setrlimit(resource.RLIMIT_AS, (OUTER_MB << 20, OUTER_MB << 20))


OUTER_CPU_WEIGHT = 4  # times a session's


def _weigh(group: cgroup.Group) -> None:
    """The cap's cpu group (where there is one) weighs as much as 4 sessions of the host: the
    suite measures its sandboxes against each other, and the tests of the other xdist worker,
    outside the cap, must not squeeze all of them into a quarter of the machine (a CI run saw
    an honest program beside spinners 3.3x slower than alone, half of it from outside)."""
    d = group.dirs.get("cpu")
    if d is None:
        return
    for name, one in (("cpu.shares", 1024), ("cpu.weight", 100)):  # v1, v2
        if (d / name).exists():  # cgroupfs refuses to create a file (EACCES)
            (d / name).write_text(str(one * OUTER_CPU_WEIGHT))


def run_capped(argv: list[str], *, name: str, ident: tuple[int, int] | None = None,
               timeout: float = 600, env: dict[str, str] | None = None,
               cwd: str | None = None) -> Capped:
    """Run ``argv`` under the outer cap (as ``ident`` = (uid, gid) if given; the caller must be
    root for that) and return its output and what it left under the cap."""
    be = cgroup.backend()
    group = leaf = None
    nproc = None
    if be is not None:
        # no CPU quota on the cap itself: the sandboxes nested in it have theirs, and a one-CPU
        # cap would put the judge and every sandbox on one CPU together
        group = cgroup.Group(be, OUTER_PIDS, OUTER_MB, name=f"{cgroup.PREFIX}{os.getpid()}-{name}",
                             cpus=None)
        _weigh(group)
        cap = f"cgroup {group.name}: pids.max={OUTER_PIDS}, memory {OUTER_MB} MiB"
        if ident is not None:
            leaf = _delegate(group, *ident)
    else:
        nproc = _user_tasks(os.geteuid()) + OUTER_PIDS
        cap = f"no writable cgroup: RLIMIT_NPROC={nproc} (per user), RLIMIT_AS={OUTER_MB} MiB"
    reach = tuple(dict.fromkeys(str(Path(p).resolve()) for p in
                                (sys.prefix, sys.base_prefix, cwd or os.getcwd())))
    if ident is not None:
        argv = ["setpriv", f"--reuid={ident[0]}", f"--regid={ident[1]}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--", *argv]
    setup = functools.partial(_setup, group, leaf, reach, ident, nproc)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, preexec_fn=setup, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        if group is not None:
            group.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        out, err = proc.communicate()
    left: list[str] = []
    if group is not None:
        left += [f"process {p}" for p in group.pids()]
        for d in dict.fromkeys(group.dirs.values()):
            left += [f"cgroup {c}" for c in d.iterdir() if c.is_dir() and c != leaf]
        group.remove()  # nested groups too
    return Capped(proc.returncode, out, err, cap, timed_out, left)
