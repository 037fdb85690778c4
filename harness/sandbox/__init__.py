"""Run untrusted programs (model-written code) so that they cannot escape, hog or fool the host.

Layers, outermost first (threat model, what each layer stops and what holds as root:
``docs/sandbox.md``):

1. **bubblewrap** (``bwrap``, Debian package ``bubblewrap``) when it is installed and works:
   new user, PID, network, IPC, UTS and mount namespaces; the program runs as uid 65534 with no
   capabilities and cannot create user namespaces; the file system it sees is only the
   read-only Python installation and system libraries, a size-capped private ``/tmp`` (the only
   writable place) and a fresh ``/proc`` and ``/dev``; no network interface but an empty
   loopback; the sandbox dies with its parent and, because it owns a PID namespace, every
   process in it dies with it.
2. **An unprivileged host uid**: a root grader starts bubblewrap through ``setpriv`` as
   ``RLBENCH_SANDBOX_HOST_ID`` (default 65534:65534), so the sandbox's uid maps to a non-root
   host uid and the kernel enforces ``RLIMIT_NPROC`` (it never does for host root).
3. **A cgroup per sandbox** (:mod:`harness.sandbox.cgroup`) where one is writable: ``pids.max``
   and a memory limit for the whole sandbox and, where the ``cpu`` controller is writable, an
   equal CPU weight and at most one CPU; killed and removed when the sandbox ends.
4. **Resource limits** (``setrlimit``): CPU seconds, address space, file size, open files, no
   core dumps, and ``RLIMIT_NPROC`` set *inside* the sandbox's user namespace (there the kernel
   counts only that sandbox's processes); lower priority (``nice``).
5. **Supervision** by the parent: wall-clock timeout, output capped while it is read, the whole
   process group (PID namespace, cgroup) killed at the end, nothing left running.
6. **A seccomp filter** (:mod:`harness.sandbox.seccomp`, loaded by bubblewrap): no ``ptrace``,
   ``pidfd_getfd``, ``process_vm_*``, no limit or scheduling changes of another process, no
   SysV IPC or keyrings. The environment is a fixed allow-list (``layers.SANDBOX_ENV``).

:mod:`harness.sandbox.layers` finds out which layers work here. A missing one is announced by one
warning per process naming what is then not enforced; callers that pass ``allow_weaker=False``
(the code grader, unless ``task.grader.allow_weaker_isolation=true``) get
:class:`WeakerIsolationError` instead. ``RLBENCH_SANDBOX=rlimits`` forces the fallback without
namespaces, ``=bwrap`` insists on bubblewrap, ``auto`` is the default.

Public API (the process itself: :mod:`harness.sandbox.process`): :class:`Limits`,
:class:`RunResult`, :func:`run`, :func:`run_python` for one-shot runs (the agentic python tool),
:func:`spawn` for a long-lived sandboxed process with pipes (the fork server of
:mod:`harness.sandbox.remote`), :func:`isolation`, :func:`probe` and :func:`require`.
"""

from harness.sandbox.layers import (
    ENV_VAR,
    SANDBOX_UID,
    Isolation,
    Limits,
    SandboxUnavailableError,
    WeakerIsolationError,
    probe,
    python_executable,
    require,
)
from harness.sandbox.process import RunResult, Sandbox, isolation, kill_tree, run, run_python, spawn

__all__ = ["ENV_VAR", "SANDBOX_UID", "Isolation", "Limits", "RunResult", "Sandbox",
           "SandboxUnavailableError", "WeakerIsolationError", "isolation", "kill_tree", "probe",
           "python_executable", "require", "run", "run_python", "spawn"]
