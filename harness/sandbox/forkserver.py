"""The fork server that runs *inside* the sandbox (stdlib only; shipped to it with ``python -c``).

It is untrusted territory: nothing it says decides a verdict. The judge outside
(:mod:`harness.sandbox.remote`) sends control requests (start a program, wait for it, end it)
on a unix socket that is the server's fd 0 and 1, with the program's own descriptors attached
(``SCM_RIGHTS``), and reads one framed reply per request. **The server never sees a
program's code, arguments, replies or output**: the judge hands the child a socket (functional
mode) or memory files and pipes (stdio mode) of its own and talks to it directly. So nothing of
one program is left in the server's memory, which the next program's process is forked from.
Under bubblewrap (``--pidns``) the server is the sandbox's PID 1 (``bwrap --as-pid-1``): no other
process in the sandbox holds that socket, the kernel drops every signal sent to it from inside
the namespace (it installs no handler), and the seccomp filter
(:mod:`harness.sandbox.seccomp`) with ``PR_SET_DUMPABLE=0`` keeps candidates from tracing it,
reading its memory, copying its descriptors or changing its limits.

For every candidate program the server forks a fresh child that

* closes the control socket and every other descriptor but its own channel, points
  stdin/stdout/stderr at ``/dev/null`` (functional mode) or at the judge's memory file and
  pipes (stdio mode; stdin is never a path), works in a fresh directory under ``/tmp`` with an
  unpredictable name, created without following links, and gets its own CPU-seconds limit;
  once set up it says so on a pipe of its own, so a child that dies during setup is told apart
  from a candidate that exits (the judge then replaces the sandbox and caches nothing);
* reads its source from its own channel, ``exec``s it in a new namespace, then answers remote
  operations (call a function, get/set an attribute, iterate) over its own socket. Values
  cross as tagged JSON of plain data (None, bool, int, float, str, bytes, complex, list,
  tuple, set, frozenset, dict); anything else stays in the child and crosses as an opaque
  reference. So a candidate's object with a lying ``__eq__`` never reaches the judge, and the
  tests' expected values never enter the sandbox.

Every program starts from a clean slate. After each candidate (and on any timeout) the server
SIGKILLs the child and, inside bubblewrap's PID namespace, every other process but itself
(``kill(-1)``), reaps them, wipes every writable place (``/tmp`` and ``/dev/shm``; the root and
``/dev`` are read-only) and then checks that the state is as it was at start: no other process,
empty writable places, no SysV IPC object, its own rlimits, nice value and CPU affinity
unchanged. If anything differs the reply says ``dirty`` and the server runs nothing more: the
judge replaces the whole sandbox.
"""

import builtins
import contextlib
import json
import os
import resource
import secrets
import signal
import socket
import struct
import sys
import time
import traceback

MAX_FRAME = 16 << 20
PIDNS = "--pidns" in sys.argv  # PID 1 of its own PID namespace: kill(-1) reaches only the sandbox
BASE = os.getcwd()  # the private /tmp under bubblewrap, a private temporary dir otherwise
# Places a candidate can write: wiped after every program. /dev/shm only in the sandbox's own
# mount namespace (in the fallback it is the host's).
WRITABLE = (BASE, "/dev/shm") if PIDNS else (BASE,)
WIPE_BUDGET = 20000  # entries removed after one program; more means: replace the sandbox
SETUP_FAILED = 121


def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def recv(fd):
    (n,) = struct.unpack(">I", read_exact(fd, 4))
    if n > MAX_FRAME:
        raise ValueError("frame too large")
    return read_exact(fd, n)


def send(fd, data):
    if isinstance(data, str):
        data = data.encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


# -- child side: plain-data codec with opaque references ----------------------------------------
REFS = []


def enc(x, depth=0):
    if depth > 100:
        raise ValueError("value nested too deeply")
    if x is None or isinstance(x, bool):  # bool cannot be subclassed
        return x
    if isinstance(x, str):
        return str.__str__(x)  # a str subclass crosses as its plain value
    if isinstance(x, int):
        return int.__int__(x)
    if isinstance(x, float):
        return float.__float__(x)
    if isinstance(x, complex):
        return {"t": "complex", "v": [x.real, x.imag]}
    if isinstance(x, (bytes, bytearray)):
        return {"t": "bytes", "v": bytes(x).hex()}
    for kind, cls in (("list", list), ("tuple", tuple), ("set", set), ("frozenset", frozenset)):
        if isinstance(x, cls):
            return {"t": kind, "v": [enc(e, depth + 1) for e in cls.__iter__(x)]}
    if isinstance(x, dict):
        return {"t": "dict", "v": [[enc(k, depth + 1), enc(v, depth + 1)]
                                   for k, v in dict.items(x)]}
    REFS.append(x)
    if isinstance(x, type(sys)):
        return {"t": "ref", "id": len(REFS) - 1, "kind": "module", "type": str(x.__name__)}
    kind = "class" if isinstance(x, type) else "callable" if callable(x) else "object"
    return {"t": "ref", "id": len(REFS) - 1, "kind": kind, "type": type(x).__name__}


def dec(x):
    if isinstance(x, list):
        return [dec(e) for e in x]
    if not isinstance(x, dict):
        return x
    t, v = x.get("t"), x.get("v")
    if t == "ref":
        return REFS[x["id"]]
    if t == "builtin":
        return getattr(builtins, v)
    if t == "bytes":
        return bytes.fromhex(v)
    if t == "complex":
        return complex(*v)
    if t == "dict":
        return {dec(k): dec(val) for k, val in v}
    return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[t](dec(e) for e in v)


def answer(op, msg):
    if op == "call":
        args = [dec(a) for a in msg["args"]]
        result = REFS[msg["ref"]](*args, **{k: dec(v) for k, v in msg["kwargs"].items()})
        # mutable arguments cross back so tests that check in-place changes see them
        after = [enc(a) if isinstance(a, (list, dict, set)) else None for a in args]
        return {"ok": True, "value": enc(result), "args_after": after}
    obj = REFS[msg["ref"]]
    if op == "getattr":
        return {"ok": True, "value": enc(getattr(obj, msg["name"]))}
    if op == "setattr":
        setattr(obj, msg["name"], dec(msg["value"]))
        return {"ok": True, "value": None}
    if op == "iter":
        return {"ok": True, "value": enc(iter(obj))}
    if op == "next":
        try:
            return {"ok": True, "value": enc(next(obj))}
        except StopIteration:
            return {"ok": True, "stop": True}
    if op == "bool":
        return {"ok": True, "value": bool(obj)}
    if op == "len":
        return {"ok": True, "value": enc(len(obj))}
    if op == "getitem":
        return {"ok": True, "value": enc(obj[dec(msg["key"])])}
    raise ValueError("unknown op " + repr(op))


def child_functional(sock):
    namespace = {"__name__": "candidate", "__builtins__": builtins}
    try:
        code = recv(sock)  # straight from the judge
        exec(compile(code, "<candidate>", "exec"), namespace)
        names = {}
        for k, v in list(namespace.items()):
            if k.startswith("__"):
                continue
            with contextlib.suppress(Exception):
                names[k] = enc(v)
        reply = {"ok": True, "names": names}
    except BaseException as exc:  # SystemExit included: exiting early is a failure
        reply = {"ok": False, "error": _describe(exc)}
    send(sock, json.dumps(reply))
    while True:
        msg = json.loads(recv(sock))
        try:
            reply = answer(msg["op"], msg)
        except BaseException as exc:
            reply = {"ok": False, "error": _describe(exc)}
        try:
            data = json.dumps(reply)
        except BaseException as exc:
            data = json.dumps({"ok": False, "error": "unencodable reply: " + _describe(exc)})
        send(sock, data)


def _describe(exc):
    return type(exc).__name__ + ": " + str(exc)[:300]


def child_stdio(code_fd):
    try:
        with os.fdopen(code_fd, "rb") as fh:  # a memory file the judge wrote
            code = fh.read()
        exec(compile(code, "<candidate>", "exec"), {"__name__": "__main__",
                                                    "__builtins__": builtins})
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = status or 1
    os._exit(status & 0xFF)


# -- server side --------------------------------------------------------------------------------
def _keep_only(keep):
    """Close every descriptor but ``keep``."""
    low = 0
    for fd in sorted(keep):
        if fd > low:  # closerange(n, n) would close everything (CPython passes n - 1 on)
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _state():
    """What must be the same before every program: the server's own limits and scheduling."""
    limits = {name: resource.getrlimit(getattr(resource, name))
              for name in dir(resource) if name.startswith("RLIMIT_")}
    modes = {}
    for place in WRITABLE:
        try:
            modes[place] = os.stat(place).st_mode
        except OSError as exc:
            modes[place] = str(exc)
    return {"rlimits": limits, "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "affinity": sorted(os.sched_getaffinity(0)), "umask": _umask(), "modes": modes}


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _wipe(top, budget):
    """Remove everything under ``top`` (a candidate's uid owns it all: mode-000 directories are
    opened up first; links are removed, never followed). Returns the budget left (< 0: gave up)."""
    stack = [top]
    dirs = []
    while stack and budget >= 0:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            budget -= 1
            continue
        for entry in entries:
            budget -= 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    os.chmod(entry.path, 0o700)
                    stack.append(entry.path)
                    dirs.append(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass
    for d in reversed(dirs):  # deepest last found first
        with contextlib.suppress(OSError):
            os.rmdir(d)
    return budget


def _sysv_objects():
    n = 0
    for kind in ("shm", "sem", "msg"):
        with contextlib.suppress(OSError), open("/proc/sysvipc/" + kind) as fh:
            n += max(0, len(fh.read().splitlines()) - 1)
    return n


class Server:
    def __init__(self):
        self.child = None
        self.workdir = None
        self.baseline = _state()
        self.dirty = None  # why the state differs from the baseline (then nothing more runs)

    def fork(self, cpu_s, setup, keep):
        """Fork a child for one program; the parent gets ``(pid, ready)``: ``ready`` is False if
        the child died before it was set up (the program never ran)."""
        self.workdir = os.path.join(BASE, "w-" + secrets.token_hex(12))
        os.mkdir(self.workdir, 0o700)  # fails on anything already there, link or not
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                os.setsid()  # own group: the fallback kills the group, bwrap the whole namespace
                setup()
                _keep_only({*keep, ready_w})
                os.chdir(self.workdir)
                cpu = max(1, int(cpu_s + 0.999))
                resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
                os.write(ready_w, b"R")
                os.close(ready_w)
            except BaseException:
                os._exit(SETUP_FAILED)
            return 0, True
        os.close(ready_w)
        self.child = pid
        try:
            ready = _read_ready(ready_r)
        finally:
            os.close(ready_r)
        return pid, ready

    def cleanup(self):
        """Kill and reap every process of the last program, wipe the writable places, then check
        the state against the baseline (``self.dirty``)."""
        if PIDNS and self.workdir is not None:  # a program ran: everything but us goes
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)
        if self.child is not None:
            for target in (-self.child, self.child):
                with contextlib.suppress(OSError):
                    os.kill(target, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.child, 0)
            self.child = None
        if self.workdir is None:
            return
        self.workdir = None
        problems = []
        if not _reap(time.monotonic() + 2.0):
            problems.append("processes survive SIGKILL")
        budget = WIPE_BUDGET
        for place in WRITABLE:
            with contextlib.suppress(OSError, TypeError):  # a candidate may chmod it 000
                os.chmod(place, self.baseline["modes"][place] & 0o7777)
            budget = _wipe(place, budget)
            try:
                left = os.listdir(place)
            except OSError as exc:
                left = [str(exc)]
            if left:
                problems.append(f"{place} not empty ({len(left)} left)")
        if PIDNS:
            if _sysv_objects():
                problems.append("SysV IPC objects left")
            others = [p for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())]
            if others:
                problems.append(f"{len(others)} other processes")
        state = _state()
        for key, value in self.baseline.items():
            if state[key] != value:
                problems.append(f"the server's {key} changed")
        if problems and self.dirty is None:
            self.dirty = "; ".join(problems)

    def spawn(self, hdr, fds):
        """Start one program with the descriptors the judge sent: functional mode, its socket;
        stdio mode, memory files holding the source and stdin, and the stdout/stderr pipes."""
        self.cleanup()
        if self.dirty or len(fds) != (1 if hdr.get("mode") == "functional" else 4):
            for fd in fds:
                os.close(fd)
            return {"status": "dirty", "error": self.dirty or "bad descriptors"}
        if hdr["mode"] == "functional":
            (sock,) = fds
            setup, keep = _redirect_null, {0, 1, 2, sock}
        else:
            code_fd, in_fd, out_fd, err_fd = fds

            def setup():
                for fd, std in ((in_fd, 0), (out_fd, 1), (err_fd, 2)):
                    os.dup2(fd, std)

            keep = {0, 1, 2, code_fd}
        pid, ready = self.fork(hdr["cpu_s"], setup, keep)
        if pid == 0:
            if hdr["mode"] == "functional":
                try:
                    child_functional(sock)
                finally:
                    os._exit(0)
            child_stdio(code_fd)
        for fd in fds:
            os.close(fd)
        if not ready:
            self.cleanup()
            return {"status": "setup_failed"}
        return {"status": "ok"}

    def wait(self, hdr):
        """The exit status of the current program (stdio mode), waited for up to ``timeout``."""
        if self.child is None:
            return {"status": "died", "error": "no program"}
        deadline = time.monotonic() + hdr["timeout"]
        while True:
            pid, st = os.waitpid(self.child, os.WNOHANG)
            if pid:
                self.child = None
                return {"status": "ok",
                        "exit": os.WEXITSTATUS(st) if os.WIFEXITED(st) else None,
                        "signal": os.WTERMSIG(st) if os.WIFSIGNALED(st) else None}
            if time.monotonic() > deadline:
                return {"status": "timeout"}
            time.sleep(0.001)


def _read_ready(fd):
    """The child's one-byte "set up" signal; EOF first means it died during setup."""
    while True:
        try:
            return os.read(fd, 1) == b"R"
        except InterruptedError:
            continue


def _redirect_null():
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _reap(deadline):
    """Reap every child (as PID 1: every process of the sandbox, orphans included). True once
    there is none left; False if some are still alive at ``deadline``."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if not PIDNS:
                return True  # the fallback: only our own children are ours to wait for
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)


def _non_dumpable():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def main():
    _non_dumpable()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # As PID 1 of its namespace, a signal whose action is the default is not delivered from
    # inside the namespace; Python's own SIGINT handler would let a candidate stop the server.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    ctl = socket.socket(fileno=0)  # the judge's control socket (fd 1 is the same socket)
    server = Server()
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(ctl, 4, 8)
            if len(head) < 4:
                raise EOFError
            (n,) = struct.unpack(">I", head)
            if n > 1 << 16:
                raise ValueError("control frame too large")
            hdr = json.loads(read_exact(0, n))
        except (EOFError, OSError, ValueError):
            server.cleanup()
            return
        op = hdr.get("op")
        if op == "spawn":
            reply = server.spawn(hdr, fds)
        elif op == "wait":
            reply = server.wait(hdr)
        elif op == "kill":
            server.cleanup()
            reply = {"status": "ok", "dirty": server.dirty}
        else:
            reply = {"status": "error", "error": "unknown op"}
        send(1, json.dumps(reply))


if __name__ == "__main__":
    main()
