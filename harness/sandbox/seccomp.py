"""The sandbox's seccomp filter: system calls a candidate never needs and that reach other
processes, or leave state behind, fail with ``EPERM``.

bubblewrap loads it (``--seccomp FD``) into the sandbox's first process just before ``exec``, so
everything in the sandbox - the fork server and every candidate it forks - runs under it, and a
filter can only ever be tightened, never removed. The program is compiled with libseccomp (the
system's ``libseccomp.so.2`` through ``pyseccomp``), which also refuses every other system-call
ABI of the machine (the 32-bit ``int 0x80`` entry on x86-64, x32): those are killed, not
filtered by number.

What is denied, and why (the threat model is ``docs/sandbox.md``):

* **Reaching another process**: ``ptrace``, ``process_vm_readv``/``process_vm_writev``,
  ``pidfd_open``, ``pidfd_getfd``, ``pidfd_send_signal``, ``kcmp``. The fork server runs with the
  candidate's uid; with these it could be traced, rewritten, or have its descriptors (the
  judge's control socket) copied out. ``PR_SET_DUMPABLE=0`` in the server already refuses the
  same to the kernel's ptrace checks; the filter refuses the calls themselves.
* **Changing another process's limits or scheduling**: ``prlimit64``, ``setpriority``,
  ``sched_setaffinity``, ``sched_setscheduler``, ``sched_setparam``, ``sched_setattr``,
  ``ioprio_set``, ``migrate_pages``, ``move_pages`` - allowed on the caller itself (pid 0), denied
  on any other pid: same-uid processes may otherwise lower the server's ``RLIMIT_CPU``,
  ``RLIMIT_AS`` or ``RLIMIT_NOFILE``, raise its nice value or pin it to one CPU, and every later
  candidate would inherit that.
* **State outside the file system that outlives a program**: SysV IPC (``shmget``, ``semget``,
  ``msgget``), POSIX message queues (``mq_open``), kernel keyrings (``add_key``, ``keyctl``,
  ``request_key``). They belong to the sandbox's IPC namespace or user, not to a process, so
  they would survive into the next program of a fork server (and stay charged to its memory).
  Python's own shared memory and semaphores use files in ``/dev/shm``, which the server wipes.
* **Ways around a system-call filter or into the kernel**: ``io_uring_setup``/``_enter``/
  ``_register``, ``bpf``, ``perf_event_open``, ``userfaultfd``; and, although the sandbox has no
  capabilities for them anyway, ``mount``, ``umount2``, ``pivot_root``, ``chroot``, ``unshare``,
  ``setns``, ``personality``.
"""

from __future__ import annotations

import errno
import functools
import os

# Denied outright.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "kcmp",
    "shmget", "semget", "msgget", "mq_open", "add_key", "keyctl", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
    "userfaultfd", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "personality",
)
# Denied unless argument ``index`` is 0 (the calling process itself).
OWN_PROCESS_ONLY = {
    "prlimit64": 0, "sched_setaffinity": 0, "sched_setscheduler": 0, "sched_setparam": 0,
    "sched_setattr": 0, "migrate_pages": 0, "move_pages": 0,
    "setpriority": 1, "ioprio_set": 1,  # (which, who, ...): who = 0 is the caller
}


class SeccompUnavailableError(RuntimeError):
    """libseccomp (or its Python binding) is missing, or cannot compile the filter."""


@functools.lru_cache(maxsize=1)
def program() -> bytes:
    """The filter as a classic-BPF program, the format ``bwrap --seccomp`` reads."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:  # the binding, or libseccomp.so.2 itself
        raise SeccompUnavailableError(f"libseccomp is not usable: {exc}") from None
    deny = sc.ERRNO(errno.EPERM)
    try:
        flt = sc.SyscallFilter(sc.ALLOW)
        for name in DENIED:
            flt.add_rule(deny, name)
        for name, index in OWN_PROCESS_ONLY.items():
            flt.add_rule(deny, name, sc.Arg(index, sc.NE, 0))
        # export_bpf writes to the file's descriptor: an anonymous memory file
        with os.fdopen(os.memfd_create("rlbench-seccomp", os.MFD_CLOEXEC), "w+b") as fh:
            flt.export_bpf(fh)
            fh.seek(0)
            data = fh.read()
    except (OSError, RuntimeError, ValueError) as exc:
        raise SeccompUnavailableError(f"cannot compile the seccomp filter: {exc}") from None
    if not data or len(data) % 8:
        raise SeccompUnavailableError("libseccomp produced no BPF program")
    return data


def available() -> str | None:
    """None if the filter can be built here, else why not."""
    try:
        program()
    except SeccompUnavailableError as exc:
        return str(exc)
    return None


def fd() -> int:
    """A fresh descriptor holding the program (bubblewrap reads it to the end), inheritable so
    it can be passed to the launcher; the caller closes it once the sandbox has started."""
    data = program()
    memfd = os.memfd_create("rlbench-seccomp", 0)
    os.write(memfd, data)
    os.lseek(memfd, 0, os.SEEK_SET)
    return memfd
