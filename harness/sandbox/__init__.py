"""Run untrusted programs (model-written code) so that they cannot escape, hog or fool the host.

Layers, outermost first (threat model and what each layer stops: ``docs/sandbox.md``):

1. **bubblewrap** (``bwrap``, Debian package ``bubblewrap``) when it is installed and works:
   new user, PID, network, IPC, UTS and mount namespaces; the program runs as uid 65534 with no
   capabilities; the file system it sees is only the read-only Python installation and system
   libraries, a size-capped private ``/tmp`` (the only writable place) and a fresh ``/proc`` and
   ``/dev``; no network interface but an empty loopback; the sandbox dies with its parent and,
   because it owns a PID namespace, every process in it dies with it.
2. **Resource limits** (``setrlimit``, always): CPU seconds, address space, processes, file size,
   open files, no core dumps; the sandbox runs at lower priority (``nice``) so grading keeps the
   machine responsive.
3. **Supervision** by the parent (always): wall-clock timeout, output capped while it is read,
   the whole process group (or PID namespace) killed at the end, nothing left running.

Without bubblewrap only layers 2-3 remain; that is announced by a loud warning once per process
(``RLBENCH_SANDBOX=rlimits`` forces it, ``=bwrap`` insists on bubblewrap, ``auto`` is default).

Public API: :class:`Limits`, :class:`RunResult`, :func:`run`, :func:`run_python` for one-shot
runs (the agentic python tool), :func:`spawn` for a long-lived sandboxed process with pipes
(the fork server of :mod:`harness.sandbox.remote`), and :func:`isolation`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_SPAWNER = ThreadPoolExecutor(1, thread_name_prefix="rlbench-sandbox-spawner")
SANDBOX_UID = 65534  # "nobody": owns nothing on the host
ENV_VAR = "RLBENCH_SANDBOX"


class SandboxUnavailableError(RuntimeError):
    """``RLBENCH_SANDBOX=bwrap`` was asked for but bubblewrap does not work here."""


@dataclass
class Limits:
    """Per-sandbox limits. ``wall_s`` is enforced by the parent, the rest by the kernel."""

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_mb: int = 512         # RLIMIT_AS of every process in the sandbox
    max_procs: int = 16          # RLIMIT_NPROC: a fork bomb stops here
    max_output_bytes: int = 1 << 20  # stdout and stderr, each; more is dropped and flagged
    max_file_mb: int = 16        # RLIMIT_FSIZE of one file
    tmp_mb: int = 64             # size of the private /tmp (bubblewrap only)
    max_open_files: int = 64
    nice: int = 10


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


def python_executable() -> str:
    """The real interpreter behind a venv (the sandbox sees no venv, only the base install)."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return str(base if base.exists() else Path(sys.executable).resolve())


@functools.lru_cache(maxsize=1)
def _bwrap_works() -> bool:
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    try:
        proc = subprocess.run(
            [*_bwrap_prefix(Limits(), None), python_executable(), "-I", "-S", "-c", "print(7*6)"],
            capture_output=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == b"42"


_warned = False


def isolation() -> str:
    """``"bwrap"`` or ``"rlimits"`` (the fallback, with a loud warning the first time)."""
    global _warned
    wanted = os.environ.get(ENV_VAR, "auto")
    if wanted not in ("auto", "bwrap", "rlimits"):
        raise ValueError(f"{ENV_VAR}={wanted!r}: expected auto, bwrap or rlimits")
    if wanted != "rlimits" and _bwrap_works():
        return "bwrap"
    if wanted == "bwrap":
        raise SandboxUnavailableError(
            f"{ENV_VAR}=bwrap but bubblewrap is missing or does not work here "
            "(apt-get install bubblewrap)"
        )
    if not _warned:
        _warned = True
        msg = (
            "\n" + "!" * 78 + "\nrlbench sandbox: bubblewrap (bwrap) is NOT available - untrusted "
            "code runs with\nrlimits and process-group kill ONLY: it can read your files, use the "
            "network and\nwrite where your user can. Install it: apt-get install bubblewrap\n"
            + "!" * 78
        )
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        print(msg, file=sys.stderr, flush=True)
    return "rlimits"


def _bwrap_prefix(limits: Limits, chdir: str | None) -> list[str]:
    """bubblewrap arguments: namespaces, uid 65534, read-only system + Python, private /tmp."""
    args = ["bwrap", "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID), "--die-with-parent", "--new-session",
            "--disable-userns", "--cap-drop", "ALL", "--clearenv",
            "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    # Only the interpreter's own installation is visible (not the venv, repo, data or home).
    prefix = str(Path(sys.base_prefix).resolve())
    if not prefix.startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]
    args += ["--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
             "--dev", "/dev", "--proc", "/proc", "--chdir", chdir or "/tmp"]
    return args


def _limit_preexec(limits: Limits) -> None:
    """Runs in the child between fork and exec: inherited by everything the program starts."""
    def lim(which: int, value: int) -> None:
        # a hard limit below ours raises: the stricter one stays
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (value, value))

    cpu = max(1, int(limits.cpu_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    lim(resource.RLIMIT_AS, limits.memory_mb << 20)
    lim(resource.RLIMIT_NPROC, limits.max_procs)
    lim(resource.RLIMIT_FSIZE, limits.max_file_mb << 20)
    lim(resource.RLIMIT_NOFILE, limits.max_open_files)
    lim(resource.RLIMIT_CORE, 0)
    os.nice(limits.nice)


def spawn(
    argv: list[str], limits: Limits, *, cwd: str | None = None, pass_fds: tuple[int, ...] = (),
    stdin: int | None = subprocess.PIPE, stdout: int | None = subprocess.PIPE,
    stderr: int | None = subprocess.PIPE,
) -> tuple[subprocess.Popen, str]:
    """Start ``argv`` in the sandbox in its own session (process group); returns the process and
    the isolation used. Under bubblewrap the program's cwd is its private ``/tmp``; in the fallback
    it is ``cwd`` (a temporary directory the caller owns)."""
    mode = isolation()
    if mode == "bwrap":
        # RLIMIT_NPROC must not stop bwrap itself (it runs as root outside): bwrap inherits the
        # limits, which the kernel applies to the unprivileged sandbox user inside.
        full = [*_bwrap_prefix(limits, None), *argv]
        popen_cwd = None
    else:
        full, popen_cwd = list(argv), cwd
    # bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that forked it ends,
    # so every sandbox is forked by one long-lived thread, whoever asks for it.
    proc = _SPAWNER.submit(
        subprocess.Popen, full, stdin=stdin, stdout=stdout, stderr=stderr, cwd=popen_cwd,
        pass_fds=pass_fds, start_new_session=True,
        preexec_fn=functools.partial(_limit_preexec, limits),
        env=None if mode == "bwrap" else _fallback_env(),
    ).result()
    return proc, mode


def _fallback_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (bwrap's: its PID namespace dies with it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def run(argv: list[str], stdin: bytes = b"", limits: Limits | None = None) -> RunResult:
    """Run ``argv`` in the sandbox with ``stdin``; capture capped stdout/stderr.

    The wall clock starts at launch; on timeout or output overflow the whole process tree is
    killed. The fallback's working directory is a fresh temporary directory, removed afterwards.
    """
    limits = limits or Limits()
    workdir = tempfile.mkdtemp(prefix="rlbench-sandbox-")
    start = time.monotonic()
    try:
        proc, mode = spawn(argv, limits, cwd=workdir)
        out, err, timed_out, truncated = _communicate(proc, stdin, limits, start)
        kill_tree(proc)  # stragglers in the group (daemons) die with the leader
        code = proc.returncode
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return RunResult(
        stdout=out, stderr=err,
        exit_code=code if code is not None and code >= 0 and not timed_out else None,
        signal=-code if code is not None and code < 0 else (signal.SIGKILL if timed_out else None),
        timed_out=timed_out, output_truncated=truncated,
        wall_s=time.monotonic() - start, isolation=mode,
    )


def run_python(code: str, stdin: bytes = b"", limits: Limits | None = None) -> RunResult:
    """Run Python source ``code`` as ``__main__`` in the sandbox (isolated mode: no user site,
    no environment variables, no current directory on ``sys.path``)."""
    return run([python_executable(), "-I", "-c", code], stdin=stdin, limits=limits)


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
