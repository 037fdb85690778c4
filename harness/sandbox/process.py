"""A sandboxed process: :func:`spawn` a long-lived one with pipes, :func:`run` / :func:`run_python`
one to completion under :class:`Limits`, and :func:`kill_tree`. The layers and the threat model are
described in :mod:`harness.sandbox` (the package's docstring) and docs/sandbox.md.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from harness.sandbox import cgroup
from harness.sandbox.layers import (
    Isolation,
    Limits,
    plan,
    python_executable,
    require,
)

_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="rlbench-sandbox-spawner")


@dataclass
class RunResult:
    stdout: bytes
    stderr: bytes
    exit_code: int | None   # None when killed by a signal
    signal: int | None      # the signal that ended it (SIGKILL on timeout)
    timed_out: bool
    output_truncated: bool
    wall_s: float
    isolation: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_truncated


def isolation() -> str:
    """``"bwrap"`` or ``"rlimits"`` (no namespaces); warns once if any layer is missing."""
    return require(allow_weaker=True).mode


@dataclass
class Sandbox:
    """A started sandbox: its first process (bubblewrap, or the program in the fallback), the
    isolation it got and its cgroup. :meth:`close` kills everything in it and removes the group."""

    proc: subprocess.Popen
    isolation: str
    group: cgroup.Group | None

    def close(self) -> None:
        kill_tree(self.proc)
        if self.group is not None:
            self.group.remove()


def spawn(
    argv: list[str], limits: Limits, *, allow_weaker: bool = True, cwd: str | None = None,
    pass_fds: tuple[int, ...] = (), stdin: int | None = subprocess.PIPE,
    stdout: int | None = subprocess.PIPE, stderr: int | None = subprocess.PIPE,
    iso: Isolation | None = None, as_pid_1: bool = False,
) -> Sandbox:
    """Start ``argv`` in the sandbox in its own session (process group). Under bubblewrap the
    program's cwd is its private ``/tmp``; in the fallback it is ``cwd`` (a temporary directory
    the caller owns). ``allow_weaker=False`` raises :class:`WeakerIsolationError` where a layer
    is missing (:func:`harness.sandbox.layers.require`); ``iso`` is one already checked.
    ``as_pid_1``: under bubblewrap the program is the sandbox's PID 1 (the fork server: no
    other process in the sandbox holds its channel, and no signal from inside reaches it)."""
    iso = iso or require(allow_weaker)
    launch = plan(iso, limits, argv, cwd, as_pid_1=as_pid_1)
    # bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that forked it ends,
    # so every sandbox is forked by one long-lived thread, whoever asks for it.
    try:
        proc = _SPAWNER.submit(
            subprocess.Popen, launch.argv, stdin=stdin, stdout=stdout, stderr=stderr,
            cwd=launch.cwd, pass_fds=(*pass_fds, *launch.pass_fds), start_new_session=True,
            preexec_fn=launch.preexec, env=launch.env,
        ).result()
    except BaseException:
        if launch.group is not None:
            launch.group.remove()
        raise
    finally:
        launch.started()
    return Sandbox(proc, iso.mode, launch.group)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (bwrap's: its PID namespace dies with it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def run(argv: list[str], stdin: bytes = b"", limits: Limits | None = None, *,
        allow_weaker: bool = True) -> RunResult:
    """Run ``argv`` in the sandbox with ``stdin``; capture capped stdout/stderr.

    The wall clock starts at launch; on timeout or output overflow the whole process tree is
    killed. The fallback's working directory is a fresh temporary directory, removed afterwards.
    """
    limits = limits or Limits()
    workdir = tempfile.mkdtemp(prefix="rlbench-sandbox-")
    start = time.monotonic()
    try:
        box = spawn(argv, limits, allow_weaker=allow_weaker, cwd=workdir)
        try:
            out, err, timed_out, truncated = _communicate(box.proc, stdin, limits, start)
        finally:
            box.close()  # stragglers (daemons) die with the leader, the cgroup goes
        code = box.proc.returncode
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return RunResult(
        stdout=out, stderr=err,
        exit_code=code if code is not None and code >= 0 and not timed_out else None,
        signal=-code if code is not None and code < 0 else (signal.SIGKILL if timed_out else None),
        timed_out=timed_out, output_truncated=truncated,
        wall_s=time.monotonic() - start, isolation=box.isolation,
    )


def run_python(code: str, stdin: bytes = b"", limits: Limits | None = None, *,
               allow_weaker: bool = True) -> RunResult:
    """Run Python source ``code`` as ``__main__`` in the sandbox (isolated mode: no user site,
    no environment variables, no current directory on ``sys.path``)."""
    return run([python_executable(), "-I", "-c", code], stdin=stdin, limits=limits,
               allow_weaker=allow_weaker)


def _communicate(
    proc: subprocess.Popen, stdin: bytes, limits: Limits, start: float
) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and read both outputs until exit, deadline or overflow (then kill)."""
    assert proc.stdin and proc.stdout and proc.stderr
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pending = memoryview(stdin)
    in_fd = proc.stdin.fileno()
    if pending:
        os.set_blocking(in_fd, False)
        sel.register(in_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    timed_out = truncated = False
    open_fds = set(bufs)
    while open_fds:
        left = limits.wall_s - (time.monotonic() - start)
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            fd = key.fd
            if fd == in_fd:
                try:
                    sent = os.write(fd, pending[:65536])
                    pending = pending[sent:]
                except (BrokenPipeError, OSError):
                    pending = pending[:0]
                if not pending:
                    sel.unregister(fd)
                    proc.stdin.close()
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                sel.unregister(fd)
                open_fds.discard(fd)
                continue
            room = limits.max_output_bytes - len(bufs[fd])
            bufs[fd] += chunk[:room]
            if len(chunk) > room:
                truncated = True
                open_fds.clear()
                break
    sel.close()
    if timed_out or truncated:
        kill_tree(proc)
    else:
        try:
            proc.wait(timeout=max(0.1, limits.wall_s - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f and not f.closed:
            f.close()
    out, err = (bytes(b) for b in bufs.values())
    return out, err, timed_out, truncated
