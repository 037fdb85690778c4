"""The judge's side of the fork server: run many candidate programs in one sandbox, one fresh
process each, and call into them from trusted code outside the sandbox.

Why verdicts cannot be forged: the tests (and their expected values) never enter the sandbox.
The judge executes the tests itself, in its own process, with every top-level name the candidate
defined bound to a :class:`Proxy`. Calling a proxy sends the arguments, as plain data, to the
candidate's process, which runs the call and returns the result as plain data (see the codec in
:mod:`harness.sandbox.forkserver`); the judge rebuilds it with its own types and the test's own
``==`` and ``assert`` run here. So exiting early (``sys.exit``/``os._exit``/``SystemExit`` in a
call), patching builtins or ``__eq__``, printing fake success lines or writing to inherited file
descriptors changes nothing but the data the candidate returns; a candidate object that is not
plain data stays an opaque reference whose truth value, equality and hash are the judge's own
(identity; ``bool()`` raises).

Everything the server says is parsed strictly, with size and nesting caps; a server that stops
answering in time is killed (whole PID namespace) and replaced.

The judge's own resources are bounded: a candidate's reply may hold at most
:data:`MAX_REPLY_BYTES` bytes, :data:`MAX_REPLY_VALUES` JSON values and
:data:`MAX_REPLY_CONTAINERS` containers (every list, tuple, set, dict, bytes or reference is one
tagged object), counted on the raw bytes *before* anything is decoded. A larger reply is
refused by the server (it never crosses) or by the judge, raises :class:`ReplyTooLargeError`,
and the call fails.

Every program starts from a clean slate: after each problem (:meth:`ForkServer.unload`) the
server reports whether its state is as it was at start (``harness/sandbox/forkserver.py``), and
the judge checks the sandbox group's memory charge; if either differs the whole sandbox is
replaced before the next program (:attr:`ForkServer.resets`).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import json
import os
import queue
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.sandbox import Limits, Sandbox, python_executable, require, spawn

SOURCE = (Path(__file__).parent / "forkserver.py").read_text()
# A reply of MAX_REPLY_CONTAINERS nested lists costs the judge about 60 MB while it is decoded
# (benchmarks/code_grading.py --attacks measures it); the largest HumanEval/MBPP/LeetCode
# reference return values are far below every limit.
MAX_REPLY_BYTES = 8 << 20
MAX_REPLY_VALUES = 1_000_000
MAX_REPLY_CONTAINERS = 100_000
# Over one loaded program (every call, attribute, iteration step of every test): replies in all,
# and operations. A remote iterator yielding 8 MiB strings would otherwise grow the judge by
# gigabytes within a problem's time budget.
MAX_SESSION_BYTES = 64 << 20
MAX_SESSION_OPS = 1_000_000
# Distinct hashable values whose hash equals another's, counted over one loaded program's
# containers of 64 or more elements: a set, dict or `in` test over n such values costs the judge
# O(n^2) with the GIL held (ints k * (2**61 - 1) all hash to 0).
MAX_HASH_CLASHES = 1000
GRACE_S = 3.0  # server overhead allowed beyond a candidate's own timeout before it is replaced
MAX_DEPTH = 200
MEMORY_SLACK_MB = 32  # group memory a clean sandbox may gain over its lowest charge (page cache)


class RemoteError(Exception):
    """The candidate raised (the message is its exception), or returned something invalid."""


class RemoteTimeoutError(RemoteError):
    """The candidate ran past its time; its process tree was killed."""


class RemoteDiedError(RemoteError):
    """The candidate's process (or the whole sandbox) is gone."""


class ServerFailureError(RemoteDiedError):
    """The fork server itself stopped answering properly, or its sandbox is no longer clean;
    it has been replaced."""


class ReplyTooLargeError(RemoteError):
    """The candidate's reply is over the judge's limits; nothing of it was decoded."""


def check_reply_size(body: bytes) -> None:
    """Refuse a reply over the limits before decoding it. Every JSON value but the first
    follows a ``[``, ``,`` or ``:``, and every tagged object is a ``{``: counting those bytes
    bounds what ``json.loads`` would build (strings containing them only make it stricter)."""
    if len(body) > MAX_REPLY_BYTES:
        raise ReplyTooLargeError(f"reply of {len(body)} bytes (limit {MAX_REPLY_BYTES})")
    containers = body.count(b"{")
    if containers > MAX_REPLY_CONTAINERS:
        raise ReplyTooLargeError(f"reply with {containers} objects "
                                 f"(limit {MAX_REPLY_CONTAINERS})")
    values = body.count(b",") + body.count(b"[") + body.count(b":")
    if values > MAX_REPLY_VALUES:
        raise ReplyTooLargeError(f"reply with {values} values (limit {MAX_REPLY_VALUES})")


@dataclass
class StdioResult:
    stdout: bytes
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    truncated: bool


class ForkServer:
    """One long-lived sandbox running :mod:`harness.sandbox.forkserver`. Not thread-safe: use one
    per thread (:class:`ServerPool` hands them out)."""

    def __init__(self, limits: Limits | None = None, tag: str = "",
                 allow_weaker: bool = True) -> None:
        self.tag = tag  # shows in the command line of the server and its forks (ps, tests)
        # The server itself lives long: its own CPU limit is generous; each candidate child
        # gets its own limit from the request.
        self.limits = replace(limits or Limits(), cpu_s=24 * 3600.0, wall_s=24 * 3600.0)
        self.iso = require(allow_weaker)  # checked (and fixed) once: restarts get the same
        self.box: Sandbox | None = None
        self.restarts = 0
        self.resets = 0  # sandboxes replaced because a program left them unclean
        self._workdir: str | None = None
        self._started = False
        self._memory_floor: int | None = None
        self.isolation = ""

    @property
    def proc(self) -> Any:
        return self.box.proc if self.box is not None else None

    def start(self) -> None:
        argv = [python_executable(), "-I", "-c", SOURCE]
        bwrap = self.iso.mode == "bwrap"
        if not bwrap:  # under bubblewrap the server works in the sandbox's own /tmp
            self._workdir = fallback_workdir()
        if bwrap:
            argv.append("--pidns")  # PID 1 of its own PID namespace: kill(-1) is safe in there
        if self.tag:
            argv.append(f"--tag={self.tag}")
        debug = os.environ.get("RLBENCH_SANDBOX_DEBUG")
        self.box = spawn(argv, self.limits, iso=self.iso, cwd=self._workdir,
                         stderr=None if debug else subprocess.DEVNULL, as_pid_1=bwrap)
        self.isolation = self.box.isolation
        self._memory_floor = None

    def close(self) -> None:
        if self.box is not None:
            self.box.close()
            self.box = None
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may already be gone
            return

    # -- framing ---------------------------------------------------------------------------------
    def _exchange(self, header: dict[str, Any], body: bytes | None, timeout: float
                  ) -> tuple[dict[str, Any], bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.restarts += self._started
            self.close()
            self.start()
            self._started = True
        try:
            data = json.dumps(header).encode()
            frames = struct.pack(">I", len(data)) + data
            if body is not None:
                frames += struct.pack(">I", len(body)) + body
            self.proc.stdin.write(frames)
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout + GRACE_S
            reply = json.loads(self._recv(deadline, 1 << 16))
            payload = self._recv(deadline, max(MAX_REPLY_BYTES, header.get("max_output", 0)))
            if not isinstance(reply, dict):
                raise ValueError("bad reply")
        except (OSError, ValueError, EOFError, TimeoutError) as exc:
            self.close()
            raise ServerFailureError(
                f"sandbox server failed ({type(exc).__name__}); replaced") from None
        if reply.get("status") in ("dirty", "setup_failed"):
            # the program never ran: the sandbox is not as it was, or could not set it up
            self.close()
            self.resets += reply.get("status") == "dirty"
            raise ServerFailureError(f"sandbox {reply.get('status')}: "
                                     f"{str(reply.get('error', ''))[:200]}; replaced")
        return reply, payload

    def _recv(self, deadline: float, limit: int) -> bytes:
        fd = self.proc.stdout.fileno()
        head = self._read(fd, 4, deadline)
        (n,) = struct.unpack(">I", head)
        if n > limit:
            raise ValueError("frame too large")
        return self._read(fd, n, deadline)

    @staticmethod
    def _read(fd: int, n: int, deadline: float) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    # -- operations ------------------------------------------------------------------------------
    def load(self, code: str, *, timeout: float, cpu_s: float, call_timeout: float,
             deadline: float | None = None) -> Session:
        """Start a fresh process for ``code`` (executed as module ``candidate``) and return a
        session whose :meth:`Session.namespace` holds proxies for the names it defined."""
        session = Session(self, call_timeout, deadline)
        reply, body = self._exchange(
            {"op": "load", "code": code, "cpu_s": cpu_s, "timeout": timeout,
             "max_reply": MAX_REPLY_BYTES}, None, timeout)
        names = session.receive(reply, body).get("names")
        if type(names) is not dict or not all(type(k) is str for k in names):
            raise RemoteError("malformed load reply from candidate")
        session.names = names
        return session

    def unload(self) -> None:
        """End the current program and make sure the next one starts from a clean slate: the
        server wipes and checks its sandbox; the judge checks the group's memory charge. If
        anything is not as it was, the sandbox is replaced now (:attr:`resets`)."""
        if self.proc is None:
            return
        try:
            reply, _ = self._exchange({"op": "unload"}, None, 5.0)
        except ServerFailureError:
            return  # already replaced
        if reply.get("dirty") or not self._memory_ok():
            self.resets += 1
            self.close()

    def _memory_ok(self) -> bool:
        """The group's memory charge is back within :data:`MEMORY_SLACK_MB` (or a quarter of
        the group limit, if larger) of the lowest charge seen since the sandbox started: what
        outlives a program (a file kept in a tmpfs, a shared-memory segment) stays charged."""
        group = self.box.group if self.box is not None else None
        usage = group.memory_current() if group is not None else None
        if usage is None:
            return True
        floor = usage if self._memory_floor is None else min(self._memory_floor, usage)
        self._memory_floor = floor
        slack = max(MEMORY_SLACK_MB, self.limits.group_memory_mb // 4) << 20
        if usage > floor + slack:  # sockets in flight are freed asynchronously: look again
            time.sleep(0.1)
            usage = group.memory_current() or 0
        return usage <= floor + slack

    def run_stdio(self, code: str, stdin: str, *, timeout: float, cpu_s: float,
                  max_output: int = 1 << 20) -> StdioResult:
        """Run ``code`` as ``__main__`` with ``stdin`` in a fresh process; capture stdout."""
        reply, body = self._exchange(
            {"op": "stdio", "code": code, "stdin": stdin, "timeout": timeout, "cpu_s": cpu_s,
             "max_output": max_output}, None, timeout)
        if reply.get("status") != "ok":
            raise ServerFailureError(f"stdio run failed: {reply.get('error')}")
        return StdioResult(stdout=body, stderr=str(reply.get("stderr", ""))[:2000],
                           exit_code=_opt_int(reply.get("exit")),
                           signal=_opt_int(reply.get("signal")),
                           timed_out=bool(reply.get("timed_out")),
                           truncated=bool(reply.get("truncated")))


def _opt_int(v: Any) -> int | None:
    return v if type(v) is int else None


WORKDIR_PREFIX = "rlbench-forkserver-"


def fallback_workdir() -> str:
    """A host directory for a fork server without namespaces, named after this process; those
    of graders that were killed before they could remove theirs are removed first."""
    top = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for d in top.iterdir():
            owner = d.name[len(WORKDIR_PREFIX):].split("-")[0]
            if d.name.startswith(WORKDIR_PREFIX) and owner.isdigit() and not _alive(int(owner)):
                shutil.rmtree(d, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Standard-library modules without side effects on import, which a test may use through the
# candidate's `import` (the tests run with the candidate's names).
JUDGE_MODULES = frozenset({
    "array", "bisect", "cmath", "collections", "copy", "datetime", "decimal", "fractions",
    "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers", "operator",
    "random", "re", "statistics", "string", "sys", "typing",
})


def _judge_module(name: str) -> Any:
    """The judge's own module ``name``, or None (see :meth:`Session.namespace`)."""
    module = sys.modules.get(name)
    if module is None and name in JUDGE_MODULES:
        with contextlib.suppress(Exception):
            module = importlib.import_module(name)
    return module if name in sys.stdlib_module_names else None


class Session:
    """One loaded candidate. Every operation is bounded by ``call_timeout`` and the session's
    overall ``deadline``; after a timeout or crash the session is dead (operations raise)."""

    def __init__(self, server: ForkServer, call_timeout: float, deadline: float | None) -> None:
        self.server = server
        self.call_timeout = call_timeout
        self.deadline = deadline
        self.names: dict[str, Any] = {}
        self.dead: str | None = None
        self.bytes_in = 0
        self.ops = 0
        self.clashes = 0

    def namespace(self, reserved: Collection[str] = frozenset(),
                  allow: Collection[str] = frozenset()) -> dict[str, Any]:
        """The candidate's top-level names for the judge's test code. Never dunders, builtins
        or ``reserved`` names (the judge's own helpers): a candidate that defines ``abs``,
        ``set`` or ``isinstance`` must not change what the test's own calls compute. Only the
        problem's entry points (``allow``: MBPP 126 *asks* for a function named ``sum``) may
        take a builtin's name. A module the candidate imported is the judge's own copy of that
        standard-library module, if the judge has already imported it or it is one of
        :data:`JUDGE_MODULES`; the judge never imports a module because a candidate named it
        (``this``, ``antigravity`` and ``msvcrt`` would print, open a browser or fail)."""
        out: dict[str, Any] = {}
        for name, value in self.names.items():
            if name.startswith("__") or (
                name not in allow and (name in reserved or hasattr(builtins, name))
            ):
                continue
            obj = decode(value, self)
            if isinstance(obj, Proxy) and obj._kind == "module":
                module = _judge_module(name) if obj._type == name else None
                if module is None:
                    continue
                obj = module
            out[name] = obj
        return out

    def receive(self, reply: dict[str, Any], body: bytes) -> dict[str, Any]:
        status = reply.get("status")
        if status == "timeout":
            self.dead = "timeout"
            raise RemoteTimeoutError("candidate timed out")
        if status == "too_large":
            self.dead = "too_large"
            raise ReplyTooLargeError(f"reply of {_opt_int(reply.get('bytes'))} bytes "
                                     f"(limit {MAX_REPLY_BYTES})")
        if status != "ok":
            self.dead = "died"
            raise RemoteDiedError(f"candidate process died ({reply.get('error')})")
        self.bytes_in += len(body)
        try:
            check_reply_size(body)
            if self.bytes_in > MAX_SESSION_BYTES:
                raise ReplyTooLargeError(f"replies of {self.bytes_in} bytes in all from one "
                                         f"program (limit {MAX_SESSION_BYTES})")
        except ReplyTooLargeError:
            self.dead = "too_large"  # the candidate is still running: the next load kills it
            raise
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):
            raise RemoteError("candidate sent an unreadable reply") from None
        if not isinstance(msg, dict) or msg.get("ok") is not True:
            err = msg.get("error") if isinstance(msg, dict) else None
            raise RemoteError(str(err)[:300] if err else "candidate error")
        return msg

    def op(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.dead:
            raise RemoteDiedError(f"candidate is gone ({self.dead})")
        self.ops += 1
        if self.ops > MAX_SESSION_OPS:
            self.dead = "too_large"
            raise ReplyTooLargeError(f"more than {MAX_SESSION_OPS} operations on one program")
        timeout = self.call_timeout
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                self.dead = "deadline"
                raise RemoteTimeoutError("problem time budget exhausted")
        try:
            reply, body = self.server._exchange(
                {"op": "req", "timeout": timeout, "max_reply": MAX_REPLY_BYTES},
                json.dumps(payload).encode(), timeout)
        except ServerFailureError:
            self.dead = "server"
            raise
        return self.receive(reply, body)

    def call(self, ref: Proxy, args: tuple, kwargs: dict[str, Any]) -> Any:
        enc_args = [encode(a) for a in args]
        msg = self.op({"op": "call", "ref": ref._id, "args": enc_args,
                       "kwargs": {str(k): encode(v) for k, v in kwargs.items()}})
        after = msg.get("args_after")
        if isinstance(after, list) and len(after) == len(args):
            for original, new in zip(args, after):
                _copy_back(original, decode(new, self) if new is not None else None)
        return decode(msg.get("value"), self)


def _copy_back(original: Any, new: Any) -> None:
    """Mirror the candidate's in-place change of a list/dict/set argument onto the judge's."""
    with contextlib.suppress(TypeError, ValueError):
        if type(original) is list and type(new) is list:
            original[:] = new
        elif type(original) in (dict, set) and type(new) is type(original):
            original.clear()
            original.update(new)


class Proxy:
    """An opaque candidate object. Calls, attribute access and iteration run in the candidate's
    process; equality and hashing are the judge's (identity), never the candidate's; the truth
    value comes back as a plain bool."""

    __slots__ = ("_id", "_kind", "_session", "_type")

    def __init__(self, session: Session, ref_id: int, kind: str, type_name: str) -> None:
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_id", ref_id)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_type", type_name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.call(self, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return decode(self._session.op({"op": "getattr", "ref": self._id, "name": name})["value"],
                      self._session)

    def __setattr__(self, name: str, value: Any) -> None:
        self._session.op({"op": "setattr", "ref": self._id, "name": name,
                          "value": encode(value)})

    def __iter__(self) -> Iterator[Any]:
        it = decode(self._session.op({"op": "iter", "ref": self._id})["value"], self._session)
        if not isinstance(it, Proxy):
            raise RemoteError("iterator is not an object")
        while True:
            msg = self._session.op({"op": "next", "ref": it._id})
            if msg.get("stop") is True:
                return
            yield decode(msg.get("value"), self._session)

    def __len__(self) -> int:
        try:
            n = decode(self._session.op({"op": "len", "ref": self._id})["value"],
                       self._session)
        except (RemoteDiedError, RemoteTimeoutError, ReplyTooLargeError):
            raise
        except RemoteError as exc:
            # the candidate's own len() raised (a generator has none): a TypeError, so that
            # list(), sorted(), tuple() fall back to iterating, as on a local object
            raise TypeError(str(exc)) from None
        if type(n) is not int or n < 0 or n > MAX_REPLY_VALUES:
            # a huge len() makes tuple()/list() preallocate in the judge before iterating
            raise RemoteError(f"len() of a candidate object is not an int in [0, "
                              f"{MAX_REPLY_VALUES}]")
        return n

    def __getitem__(self, key: Any) -> Any:
        msg = self._session.op({"op": "getitem", "ref": self._id, "key": encode(key)})
        return decode(msg["value"], self._session)

    def __bool__(self) -> bool:
        # Evaluated by the candidate, but it returns only a bool: no more power than returning
        # True/False itself (re.Match results, custom truthy objects in MBPP tests).
        value = self._session.op({"op": "bool", "ref": self._id})["value"]
        if type(value) is not bool:
            raise RemoteError("bool() of a candidate object is not a bool")
        return value

    def __repr__(self) -> str:
        return f"<candidate {self._kind} {self._type!s:.40}>"


_PLAIN = (type(None), bool, int, float, str)
_CONTAINERS = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}


def encode(x: Any, depth: int = 0) -> Any:
    """Judge value -> tagged JSON for the candidate (plain data and this session's proxies)."""
    if depth > MAX_DEPTH:
        raise ValueError("argument nested too deeply")
    if type(x) in _PLAIN:
        return x
    if isinstance(x, Proxy):
        return {"t": "ref", "id": x._id}
    name = getattr(x, "__name__", None)
    if isinstance(name, str) and getattr(builtins, name, None) is x:
        return {"t": "builtin", "v": name}  # int, str, len, ... (MBPP passes types)
    if isinstance(x, (bytes, bytearray)):
        return {"t": "bytes", "v": bytes(x).hex()}
    if isinstance(x, complex):
        return {"t": "complex", "v": [x.real, x.imag]}
    if isinstance(x, dict):
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)]
                                   for k, v in x.items()]}
    for cls, tag in _CONTAINERS.items():
        if isinstance(x, cls):
            return {"t": tag, "v": [encode(e, depth + 1) for e in x]}
    if isinstance(x, (int, float, str)):
        return type(x).__mro__[-2](x)  # subclasses (IntEnum, ...) cross as their base value
    raise TypeError(f"cannot pass a {type(x).__name__} to a sandboxed candidate")


def decode(x: Any, session: Session, depth: int = 0) -> Any:
    """Tagged JSON from the candidate -> judge values built only from builtin types."""
    if depth > MAX_DEPTH:
        raise RemoteError("value nested too deeply")
    if type(x) in _PLAIN:
        return x
    if type(x) is not dict or type(x.get("t")) is not str:
        raise RemoteError("malformed value from candidate")
    t, v = x["t"], x.get("v")
    try:
        if t == "ref":
            return Proxy(session, int(x["id"]), str(x.get("kind", "object"))[:20],
                         str(x.get("type", "?"))[:60])
        if t == "bytes":
            return bytes.fromhex(v)
        if t == "complex":
            return complex(float(v[0]), float(v[1]))
        if t == "dict":
            pairs = [(decode(k, session, depth + 1), decode(val, session, depth + 1))
                     for k, val in v]
            _count_clashes([k for k, _ in pairs], session)
            return dict(pairs)
        items = [decode(e, session, depth + 1) for e in v]
        _count_clashes(items, session)
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[t](items)
    except RemoteError:
        raise
    except Exception as exc:
        raise RemoteError(f"malformed value from candidate ({type(exc).__name__})") from None


def _count_clashes(items: list[Any], session: Session) -> None:
    """Count values in ``items`` whose hash equals an earlier, different value's; refuse the
    reply past :data:`MAX_HASH_CLASHES` for the session. O(n): only the first value per hash is
    kept, and the hashes themselves are distinct ints (their own hashes do not clash)."""
    if len(items) < 64:
        return
    first: dict[int, Any] = {}
    for item in items:
        try:
            h = hash(item)
        except TypeError:  # lists, dicts, sets: not a key of anything the judge builds
            continue
        seen = first.setdefault(h, item)
        if seen is not item and seen != item:
            session.clashes += 1
    if session.clashes > MAX_HASH_CLASHES:
        session.dead = "too_large"
        raise ReplyTooLargeError(f"{session.clashes} values with colliding hashes "
                                 f"(limit {MAX_HASH_CLASHES})")


class ServerPool:
    """A bounded pool of fork servers (one sandbox each), shared by grading threads."""

    def __init__(self, size: int, limits: Limits | None = None, tag: str = "",
                 allow_weaker: bool = True) -> None:
        self.size = max(1, size)
        self.limits = limits or Limits()
        self._free: queue.SimpleQueue[ForkServer] = queue.SimpleQueue()
        self._all: list[ForkServer] = []
        self._lock = threading.Lock()
        for _ in range(self.size):
            server = ForkServer(self.limits, tag, allow_weaker)
            self._all.append(server)
            self._free.put(server)

    @contextlib.contextmanager
    def server(self) -> Iterator[ForkServer]:
        server = self._free.get()
        try:
            yield server
        finally:
            self._free.put(server)

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self._all)

    @property
    def resets(self) -> int:
        return sum(s.resets for s in self._all)

    def close(self) -> None:
        with self._lock:
            for server in self._all:
                server.close()
