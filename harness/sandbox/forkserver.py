"""The fork server that runs *inside* the sandbox (stdlib only; shipped to it with ``python -c``).

It is untrusted territory: nothing it says decides a verdict. The judge outside
(:mod:`harness.sandbox.remote`) sends framed requests on fd 0 and reads framed replies on fd 1.
For every candidate program the server forks a fresh child that

* closes the protocol pipes and every other inherited descriptor, points stdin/stdout/stderr at
  ``/dev/null`` (functional mode) or at capped pipes (stdio mode), works in a fresh directory
  under ``/tmp`` and gets its own CPU-seconds limit;
* ``exec``s the candidate source in a new namespace, then answers remote operations (call a
  function, get/set an attribute, iterate) over its own socketpair. Values cross as tagged JSON
  of plain data (None, bool, int, float, str, bytes, complex, list, tuple, set, frozenset, dict);
  anything else stays in the child and crosses as an opaque reference. So a candidate's object
  with a lying ``__eq__`` never reaches the judge, and the tests' expected values never enter
  the sandbox.

After each candidate (and on any timeout) the server SIGKILLs the child and, inside bubblewrap's
PID namespace, every other process but itself and init (``kill(-1)``), then wipes the work
directory, so nothing a candidate started survives into the next one. The server makes itself
non-dumpable so that a candidate (same uid, no capabilities) cannot ptrace it or open its
``/proc/<pid>/mem`` or ``/proc/<pid>/fd``. A candidate can still kill the server: the judge sees
the pipe close, scores that candidate's unfinished tests as failed and restarts a fresh sandbox.
"""

import builtins
import contextlib
import json
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback

MAX_FRAME = 16 << 20
PIDNS = "--pidns" in sys.argv  # alone in a PID namespace: kill(-1) reaches only the sandbox
BASE = os.getcwd()  # the private /tmp under bubblewrap, a private temporary dir otherwise


def read_exact(fd, n, deadline=None):
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def recv(fd, deadline=None):
    (n,) = struct.unpack(">I", read_exact(fd, 4, deadline))
    if n > MAX_FRAME:
        raise ValueError("frame too large")
    return read_exact(fd, n, deadline)


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


def child_functional(sock, code):
    namespace = {"__name__": "candidate", "__builtins__": builtins}
    try:
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


def child_stdio(code):
    try:
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
class Server:
    def __init__(self):
        self.child = None
        self.sock = None
        self.count = 0

    def workdir(self):
        return os.path.join(BASE, "w" + str(self.count))

    def fork(self, cpu_s, setup):
        self.count += 1
        os.makedirs(self.workdir(), exist_ok=True)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()  # own group: the fallback kills the group, bwrap the whole namespace
                setup()
                os.chdir(self.workdir())
                cpu = max(1, int(cpu_s + 0.999))
                resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            except BaseException:
                os._exit(121)
            return 0
        self.child = pid
        return pid

    def cleanup(self):
        if self.child is not None:
            for target in ((-self.child, self.child) if not PIDNS else (-1,)):
                with contextlib.suppress(OSError):
                    os.kill(target, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.child, 0)
            self.child = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        _reap()
        shutil.rmtree(self.workdir(), ignore_errors=True)

    def load(self, hdr):
        self.cleanup()
        parent, child = socket.socketpair()
        code = hdr["code"]

        def setup():
            parent.close()
            _redirect_null()
            os.closerange(3, child.fileno())
            os.closerange(child.fileno() + 1, 1 << 16)

        if self.fork(hdr["cpu_s"], setup) == 0:
            try:
                child_functional(child.fileno(), code)
            finally:
                os._exit(0)
        child.close()
        self.sock = parent
        return self.wait_reply(hdr["timeout"])

    def wait_reply(self, timeout):
        try:
            body = recv(self.sock.fileno(), time.monotonic() + timeout)
        except TimeoutError:
            self.cleanup()
            return {"status": "timeout"}, None
        except (EOFError, OSError, ValueError) as exc:
            self.cleanup()
            return {"status": "died", "error": type(exc).__name__}, None
        return {"status": "ok"}, body

    def request(self, hdr, body):
        if self.sock is None:
            return {"status": "died", "error": "no candidate loaded"}, None
        try:
            send(self.sock.fileno(), body)
        except OSError:
            self.cleanup()
            return {"status": "died", "error": "send failed"}, None
        return self.wait_reply(hdr["timeout"])

    def stdio(self, hdr):
        self.cleanup()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_path = os.path.join(BASE, "stdin" + str(self.count + 1))
        with open(in_path, "wb") as fh:
            fh.write(hdr["stdin"].encode())

        def setup():
            os.close(out_r)
            os.close(err_r)
            fd = os.open(in_path, os.O_RDONLY)
            os.dup2(fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 1 << 16)
            os.unlink(in_path)

        if self.fork(hdr["cpu_s"], setup) == 0:
            child_stdio(hdr["code"])
        os.close(out_w)
        os.close(err_w)
        out, err, timed_out, truncated = _collect(out_r, err_r, hdr["timeout"], hdr["max_output"])
        status = None
        if not (timed_out or truncated):
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                pid, st = os.waitpid(self.child, os.WNOHANG)
                if pid:
                    status = st
                    self.child = None
                    break
                time.sleep(0.002)
            else:
                timed_out = True
        self.cleanup()
        with contextlib.suppress(OSError):
            os.unlink(in_path)
        head = {"status": "ok", "timed_out": timed_out, "truncated": truncated,
                "exit": os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status)
                else None,
                "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status)
                else None,
                "stderr": err[-2000:].decode("utf-8", "replace")}
        return head, out


def _collect(out_r, err_r, timeout, cap):
    bufs = {out_r: bytearray(), err_r: bytearray()}
    deadline = time.monotonic() + timeout
    live = [out_r, err_r]
    timed_out = truncated = False
    while live:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for fd in select.select(live, [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                live.remove(fd)
            elif len(bufs[fd]) + len(chunk) > cap:
                truncated = True
                live = []
                break
            else:
                bufs[fd] += chunk
    os.close(out_r)
    os.close(err_r)
    return bytes(bufs[out_r]), bytes(bufs[err_r]), timed_out, truncated


def _redirect_null():
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _non_dumpable():
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def main():
    _non_dumpable()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    server = Server()
    inp, out = 0, 1
    while True:
        try:
            hdr = json.loads(recv(inp))
        except (EOFError, OSError):
            server.cleanup()
            return
        op = hdr["op"]
        body = recv(inp) if op == "req" else None
        if op == "load":
            reply, data = server.load(hdr)
        elif op == "req":
            reply, data = server.request(hdr, body)
        elif op == "stdio":
            reply, data = server.stdio(hdr)
        elif op == "unload":
            server.cleanup()
            reply, data = {"status": "ok"}, None
        else:
            reply, data = {"status": "error", "error": "unknown op"}, None
        send(out, json.dumps(reply))
        send(out, data or b"")


if __name__ == "__main__":
    main()
