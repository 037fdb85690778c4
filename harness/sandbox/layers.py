"""Which isolation layers this machine offers, and the launcher that applies them.

The configured isolation is all of them:

1. **namespaces** - bubblewrap works (user, PID, network, IPC, UTS and mount namespaces);
2. **an unprivileged host uid** - the candidate's processes belong to a non-root uid on the
   host, so the kernel enforces ``RLIMIT_NPROC`` (it never does for host root, whatever the
   uid inside the namespace says) and no host file is the candidate's. A root grader drops to
   ``RLBENCH_SANDBOX_HOST_ID`` (``uid:gid``, default ``65534:65534``, *nobody*) with ``setpriv``
   before bubblewrap starts, so bubblewrap runs unprivileged and maps the sandbox's uid 65534
   to that host uid; a non-root grader already is one;
3. **group limits** - a cgroup per sandbox with ``pids.max`` and a memory limit for the whole
   group, and an equal CPU weight (at most one CPU) where ``cpu`` is writable
   (:mod:`harness.sandbox.cgroup`);
4. **a seccomp filter** - system calls that reach other processes (``ptrace``, ``pidfd_getfd``,
   ``prlimit64`` on another pid, ...) or leave state behind (SysV IPC, keyrings) fail
   (:mod:`harness.sandbox.seccomp`); bubblewrap loads it.

:func:`probe` finds out which of them work (by starting one real sandbox), :func:`require`
refuses to go on with fewer unless the caller allows it, and then prints **one** warning per
process naming what is missing and what is therefore not enforced.

One detail of dropping the uid: bubblewrap resolves every bind source with the caller's
permissions, so an interpreter installed under a directory other users cannot enter (pyenv or
conda under ``/root``, mode 700) cannot be bound by the unprivileged uid. The launcher then
runs in a private mount namespace of its own, where a tmpfs covers that directory and only the
interpreter's prefix is bound back at its own path (:func:`make_reachable`); the host's mounts
are untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import shutil
import stat
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.sandbox import cgroup, seccomp

ENV_VAR = "RLBENCH_SANDBOX"          # auto | bwrap | rlimits
HOST_ID_VAR = "RLBENCH_SANDBOX_HOST_ID"  # uid:gid a root grader drops the candidate to
ALLOW_WEAKER_VAR = "RLBENCH_ALLOW_WEAKER_ISOLATION"  # "1": as allow_weaker=True, process-wide
DEFAULT_HOST_ID = (65534, 65534)


class SandboxUnavailableError(RuntimeError):
    """``RLBENCH_SANDBOX=bwrap`` was asked for but bubblewrap does not work here."""


class WeakerIsolationError(SandboxUnavailableError):
    """The machine offers less isolation than configured and weaker isolation was not allowed."""


@dataclass(frozen=True)
class Isolation:
    """What a sandbox started now gets. ``mode`` is ``"bwrap"`` or ``"rlimits"`` (no
    namespaces); ``host_uid`` is the uid its processes have on the host; ``cgroups`` is where
    its group is made (None: no group limits); ``drop`` is the ``(uid, gid)`` a root grader
    switches to; ``reach`` are directories made reachable for that uid (see module doc);
    ``seccomp``: bubblewrap loads the filter of :mod:`harness.sandbox.seccomp`."""

    mode: str
    host_uid: int
    cgroups: cgroup.Backend | None = None
    drop: tuple[int, int] | None = None
    reach: tuple[str, ...] = ()
    seccomp: bool = False
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def missing(self) -> list[str]:
        """Each missing layer: what is missing, and what is then not enforced."""
        out = []
        if self.mode != "bwrap":
            why = "; ".join(self.notes) or "bubblewrap is missing or fails"
            out.append(f"namespaces ({why}): NOT enforced: file system, network and process "
                       "isolation - the candidate can read and write what its uid can, reach "
                       "the network and see host processes")
        if self.host_uid == 0:
            out.append("an unprivileged host uid (the candidate runs as host root): NOT "
                       "enforced: RLIMIT_NPROC (the kernel ignores it for root)"
                       + ("" if self.mode == "bwrap" else " and root's file permissions"))
        if self.cgroups is None:
            out.append("a writable cgroup with the pids and memory controllers (run as root, "
                       f"or set {cgroup.ENV_VAR} to one delegated to you): NOT enforced: "
                       "group limits - memory is bounded per process only (max_procs x "
                       "memory_mb), processes only by RLIMIT_NPROC")
        if not self.seccomp:
            why = seccomp.available() or ("needs bubblewrap" if self.mode != "bwrap" else "off")
            out.append(f"a seccomp filter ({why}; Debian package libseccomp2): NOT enforced: "
                       "the candidate may ptrace, read or copy descriptors of other processes "
                       "of its uid in the sandbox (the fork server: the judge's channel), change "
                       "their rlimits and priority, and keep SysV IPC and keyring state")
        return out

    def describe(self) -> str:
        parts = [self.mode, f"host uid {self.host_uid}",
                 self.cgroups.describe() if self.cgroups else "no cgroup",
                 "seccomp" if self.seccomp else "no seccomp"]
        return ", ".join(parts)


def host_id() -> tuple[int, int]:
    value = os.environ.get(HOST_ID_VAR)
    if not value:
        return DEFAULT_HOST_ID
    try:
        uid, gid = (int(x) for x in value.split(":"))
    except ValueError:
        raise ValueError(f"{HOST_ID_VAR}={value!r}: expected uid:gid, e.g. 65534:65534") from None
    if uid == 0 or gid == 0:
        raise ValueError(f"{HOST_ID_VAR}={value!r}: the sandbox's host uid/gid must not be 0")
    return uid, gid


def python_executable() -> str:
    """The real interpreter behind a venv (the sandbox sees no venv, only the base install)."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return str(base if base.exists() else Path(sys.executable).resolve())


def interpreter_prefix() -> str:
    return str(Path(sys.base_prefix).resolve())


# -- reaching an interpreter under a private directory -------------------------------------------
def blocked_ancestor(path: str | Path, uid: int, gid: int) -> Path | None:
    """The highest directory on the way to ``path`` that ``uid``/``gid`` may not enter."""
    p = Path(path).resolve()
    for d in [*reversed(p.parents), p]:
        try:
            st = d.stat()
        except OSError:
            return None
        bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid \
            else stat.S_IXOTH
        if not st.st_mode & bit:
            return d
    return None


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18


def _sys(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def make_reachable(paths: tuple[str, ...], uid: int, gid: int) -> None:
    """In a new private mount namespace of the calling process (it must be root): cover each
    blocked ancestor of ``paths`` with a tmpfs and bind each path back at its own place, so
    ``uid`` can reach them and nothing else under that ancestor. Runs between fork and exec."""
    tops: dict[Path, list[str]] = {}
    for p in paths:
        top = blocked_ancestor(p, uid, gid)
        if top is not None:
            tops.setdefault(top, []).append(str(Path(p).resolve()))
    if not tops:
        return
    _sys(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _sys(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for top, inside in tops.items():
        fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in inside]
        _sys(_libc.mount(b"rlbench", os.fsencode(top), b"tmpfs", 0, b"mode=755,size=64k"),
             f"tmpfs on {top}")
        for p, fd in zip(inside, fds):
            os.makedirs(p, exist_ok=True)
            _sys(_libc.mount(f"/proc/self/fd/{fd}".encode(), os.fsencode(p), None,
                             MS_BIND | MS_REC, None), f"bind {p}")
            os.close(fd)


# -- the launcher --------------------------------------------------------------------------------
def _setpriv(uid: int, gid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--"]


NPROC_SHIM = ("import os, resource, sys; n = int(sys.argv[1]); "
              "resource.setrlimit(resource.RLIMIT_NPROC, (n, n)); os.execv(sys.argv[2], "
              "sys.argv[2:])")


@functools.lru_cache(maxsize=1)
def _prlimit() -> str | None:
    found = shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin")
    return found if found and Path(found).resolve().is_relative_to("/usr") else None


def nproc_inside(n: int) -> list[str]:
    """Sets ``RLIMIT_NPROC`` *inside* the sandbox's user namespace, where the kernel counts only
    that sandbox's processes (set before bubblewrap it would also count every other process
    of the same host uid: all other sandboxes, or the non-root grader's own threads)."""
    exe = _prlimit()
    if exe:
        return [exe, f"--nproc={n}:{n}", "--"]
    return [python_executable(), "-I", "-S", "-c", NPROC_SHIM, str(n)]



@dataclass
class Limits:
    """Per-sandbox limits. ``wall_s`` is enforced by the parent, the rest by the kernel."""

    wall_s: float = 10.0
    cpu_s: float = 10.0
    memory_mb: int = 512         # RLIMIT_AS of every process in the sandbox
    group_memory_mb: int = 1024  # memory of the whole sandbox (cgroup; its /tmp included)
    max_procs: int = 16          # tasks (processes and threads) in the sandbox: fork bombs stop
    max_output_bytes: int = 1 << 20  # stdout and stderr, each; more is dropped and flagged
    max_file_mb: int = 16        # RLIMIT_FSIZE of one file
    tmp_mb: int = 64             # size of the private /tmp (bubblewrap only)
    max_open_files: int = 64
    nice: int = 10


SANDBOX_UID = 65534  # the uid inside the sandbox ("nobody")


# The whole environment of a sandbox and of its launcher: fixed values, nothing inherited (the
# grader's environment may hold credentials; a process's environment is readable by every
# process of its uid through /proc/<pid>/environ).
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}


def bwrap_args(limits: Limits, *, as_pid_1: bool = False, seccomp_fd: int | None = None
               ) -> list[str]:
    """bubblewrap arguments: namespaces, uid 65534, read-only system + Python, a read-only root
    and ``/dev``, size-capped private ``/tmp`` and ``/dev/shm`` (the only writable places).
    ``as_pid_1``: the program is the sandbox's PID 1 (no bubblewrap init beside it holding its
    descriptors and environment; signals from inside the sandbox do not reach it).
    ``seccomp_fd``: a descriptor holding the filter (:func:`seccomp.fd`)."""
    args = ["bwrap", "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID), "--die-with-parent", "--new-session",
            "--disable-userns", "--cap-drop", "ALL", "--clearenv"]
    for key, value in SANDBOX_ENV.items():
        args += ["--setenv", key, value]
    if as_pid_1:
        args.append("--as-pid-1")
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    # Only the interpreter's own installation is visible (not the venv, repo, data or home).
    prefix = interpreter_prefix()
    if not prefix.startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]
    size = str(limits.tmp_mb << 20)
    args += ["--size", size, "--tmpfs", "/tmp", "--dev", "/dev", "--size", size, "--tmpfs",
             "/dev/shm", "--proc", "/proc", "--remount-ro", "/", "--remount-ro", "/dev",
             "--chdir", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return args


@dataclass
class Launch:
    """How to start one sandbox: the command, the code run between fork and exec (as the
    grader's uid: cgroup, mount detour, rlimits), environment, cwd, and its cgroup."""

    argv: list[str]
    preexec: Callable[[], None]
    env: dict[str, str]
    cwd: str | None
    group: cgroup.Group | None
    pass_fds: tuple[int, ...] = ()

    def started(self) -> None:
        """The launcher has its copies of ``pass_fds`` (or failed): close ours."""
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pass_fds = ()


def plan(iso: Isolation, limits: Limits, argv: list[str], cwd: str | None, *,
         as_pid_1: bool = False) -> Launch:
    """The launch of ``argv`` under ``iso``. Creates the sandbox's cgroup (the caller removes
    it: :meth:`cgroup.Group.remove`) and the seccomp descriptor (closed by
    :meth:`Launch.started`). ``as_pid_1``: see :func:`bwrap_args` (the fork server)."""
    bwrap = iso.mode == "bwrap"
    group = None
    if iso.cgroups is not None:
        # bubblewrap's monitor process lives outside the sandbox's PID namespace, in its group
        group = cgroup.Group(iso.cgroups, limits.max_procs + bwrap, limits.group_memory_mb)
    fds: tuple[int, ...] = ()
    if bwrap:
        fds = (seccomp.fd(),) if iso.seccomp else ()
        box = bwrap_args(limits, as_pid_1=as_pid_1, seccomp_fd=fds[0] if fds else None)
    if bwrap and iso.host_uid != 0:
        full, popen_cwd, nproc = [*box, *nproc_inside(limits.max_procs), *argv], "/", None
    elif bwrap:  # host root: the kernel ignores RLIMIT_NPROC anyway; set it the cheap way
        full, popen_cwd, nproc = [*box, *argv], "/", limits.max_procs
    else:
        full, popen_cwd, nproc = list(argv), cwd, limits.max_procs
        if iso.drop and cwd:
            os.chown(cwd, *iso.drop)
    if iso.drop:
        full = [*_setpriv(*iso.drop), *full]
    preexec = functools.partial(_child_setup, limits, group, iso.reach, iso.drop, nproc)
    return Launch(full, preexec, dict(SANDBOX_ENV), popen_cwd, group, fds)


def _child_setup(limits: Limits, group: cgroup.Group | None, reach: tuple[str, ...],
                 drop: tuple[int, int] | None, nproc: int | None) -> None:
    """Between fork and exec, still as the grader: inherited by everything the sandbox starts."""
    if group is not None:
        group.attach()
    if drop and reach:
        make_reachable(reach, *drop)

    def lim(which: int, value: int) -> None:
        # a hard limit below ours raises: the stricter one stays
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (value, value))

    cpu = max(1, int(limits.cpu_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    lim(resource.RLIMIT_AS, limits.memory_mb << 20)
    if nproc is not None:
        lim(resource.RLIMIT_NPROC, nproc)
    lim(resource.RLIMIT_FSIZE, limits.max_file_mb << 20)
    lim(resource.RLIMIT_NOFILE, limits.max_open_files)
    lim(resource.RLIMIT_CORE, 0)
    os.nice(limits.nice)


# -- probing -------------------------------------------------------------------------------------
def _try(iso: Isolation) -> str | None:
    """Start one real sandbox with ``iso``; None if it works, else a short reason."""
    try:
        launch = plan(iso, Limits(), [python_executable(), "-I", "-S", "-c", "print(7*6)"],
                      "/")
    except OSError as exc:
        return f"cannot create its cgroup: {exc}"[:200]
    try:
        proc = subprocess.run(launch.argv, capture_output=True, timeout=30, env=launch.env,
                              cwd=launch.cwd, preexec_fn=launch.preexec,
                              pass_fds=launch.pass_fds)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    finally:
        launch.started()
        if launch.group is not None:
            launch.group.remove()
    if proc.returncode == 0 and proc.stdout.strip() == b"42":
        return None
    lines = proc.stderr.decode(errors="replace").strip().splitlines()
    return (lines[-1] if lines else f"exit status {proc.returncode}")[:200]


@functools.lru_cache(maxsize=8)
def _probe(wanted: str, host: tuple[int, int], cg_env: str | None, euid: int) -> Isolation:
    del cg_env  # part of the cache key only
    notes: list[str] = []
    backend = cgroup.backend()
    drop = host if euid == 0 and shutil.which("setpriv") else None
    if euid == 0 and drop is None:
        notes.append("setpriv (util-linux) is missing")
    reach = (interpreter_prefix(),) if drop else ()
    uid = host[0] if drop else euid
    tries: list[Isolation] = []
    filtered = seccomp.available() is None
    if wanted == "rlimits":
        notes.append(f"{ENV_VAR}=rlimits")
    elif shutil.which("bwrap") is None:
        notes.append("bwrap is not installed")
    else:
        tries.append(Isolation("bwrap", uid, backend, drop, reach, seccomp=filtered))
        if drop:  # unprivileged user namespaces refused: bubblewrap as root maps to host root
            tries.append(Isolation("bwrap", 0, backend, seccomp=filtered))
    tries.append(Isolation("rlimits", uid, backend, drop, reach))
    for iso in tries:
        for candidate in [iso, replace(iso, cgroups=None)] if iso.cgroups else [iso]:
            error = _try(candidate)
            if error is None:
                return replace(candidate, notes=tuple(notes))
            notes.append(f"{candidate.describe()} fails: {error}")
    raise SandboxUnavailableError("no sandbox can be started here: " + "; ".join(notes))


_forced: Isolation | None = None


@contextlib.contextmanager
def forced(iso: Isolation) -> Iterator[None]:
    """Use ``iso`` instead of what :func:`probe` finds, e.g. ``Isolation("bwrap", 0)`` for the
    isolation before issue 17 (measurements side by side; tests of the refusal)."""
    global _forced
    previous, _forced = _forced, iso
    try:
        yield
    finally:
        _forced = previous


def probe() -> Isolation:
    """The isolation a sandbox gets on this machine now (cached; the first call starts a
    sandbox per combination it tries, best first)."""
    if _forced is not None:
        return _forced
    wanted = os.environ.get(ENV_VAR, "auto")
    if wanted not in ("auto", "bwrap", "rlimits"):
        raise ValueError(f"{ENV_VAR}={wanted!r}: expected auto, bwrap or rlimits")
    iso = _probe(wanted, host_id(), os.environ.get(cgroup.ENV_VAR), os.geteuid())
    if wanted == "bwrap" and iso.mode != "bwrap":
        raise SandboxUnavailableError(
            f"{ENV_VAR}=bwrap but bubblewrap is missing or does not work here "
            f"(apt-get install bubblewrap): {'; '.join(iso.notes)}")
    return iso


_announced: set[tuple[str, ...]] = set()


def require(allow_weaker: bool) -> Isolation:
    """The isolation to use. If a layer is missing: raise :class:`WeakerIsolationError` unless
    ``allow_weaker`` (or ``RLBENCH_ALLOW_WEAKER_ISOLATION=1`` for the whole process, e.g. a
    non-root developer's test run), else warn (once per process and set of missing layers)."""
    iso = probe()
    missing = tuple(iso.missing)
    if not missing:
        return iso
    text = "sandbox isolation is weaker than configured: missing " + "; missing ".join(missing)
    if not (allow_weaker or os.environ.get(ALLOW_WEAKER_VAR) == "1"):
        raise WeakerIsolationError(text)
    if missing not in _announced:
        _announced.add(missing)
        msg = "\n" + "!" * 78 + f"\nrlbench {text}\n" + "!" * 78
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        print(msg, file=sys.stderr, flush=True)
    return iso
