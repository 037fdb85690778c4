"""The judge's side of the fork server: run many candidate programs in one sandbox, one fresh
process each, and call into them from trusted code outside the sandbox.

Why verdicts cannot be forged: the tests (and their expected values) never enter the sandbox.
The judge executes the tests itself, in its own process, with every top-level name the candidate
defined bound to a :class:`~harness.sandbox.codec.Proxy`. Calling a proxy sends the arguments,
as plain data, to the candidate's process, which runs the call and returns the result as plain
data (:mod:`harness.sandbox.codec`); the judge rebuilds it with its own types and the test's own
``==`` and ``assert`` run here. So exiting early, patching builtins or ``__eq__``, printing fake
success lines or writing to inherited descriptors changes nothing but the data the candidate
returns.

Channels: the judge controls the server (:mod:`harness.sandbox.forkserver`, the sandbox's PID 1)
over a unix socket, and gives each program channels of its own, passed as descriptors: a socket
(functional mode), or memory files with the source and stdin and pipes for stdout and stderr
(stdio mode). The judge talks to the program directly; the server forks it, waits for it and
ends it, and never sees its code, arguments, replies or output, so nothing of a program is left
in the memory the next one is forked from.

Everything a program sends is bounded and parsed strictly (:mod:`harness.sandbox.codec`); a
program past its time is ended; a server that stops answering in time is killed (whole PID
namespace) and replaced. Every program starts from a clean slate: after each problem
(:meth:`ForkServer.unload`) the server reports whether its state is as it was at start, and the
judge checks the sandbox group's memory charge; if either differs the whole sandbox is replaced
before the next program (:attr:`ForkServer.resets`).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.sandbox import (
    Limits,
    Sandbox,
    cgroup,
    codec,
    python_executable,
    require,
    spawn,
    wire,
)
from harness.sandbox.codec import (
    Proxy,
    RemoteDiedError,
    RemoteError,
    RemoteTimeoutError,
    ReplyTooLargeError,
    ServerFailureError,
    Spent,
    check_reply_size,
    copy_back,
    decode,
    encode,
    judge_module,
)

__all__ = ["ForkServer", "Proxy", "RemoteDiedError", "RemoteError", "RemoteTimeoutError",
           "ReplyTooLargeError", "ServerFailureError", "ServerPool", "Session", "StdioResult",
           "check_reply_size"]

SOURCE = (Path(__file__).parent / "forkserver.py").read_text()
GRACE_S = 3.0  # server overhead allowed beyond a candidate's own timeout before it is replaced
MEMORY_SLACK_MB = 32  # group memory a clean sandbox may gain over its lowest charge (page cache)
WORKDIR_PREFIX = "rlbench-forkserver-"


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
        self.ctl: socket.socket | None = None
        self.session: Session | None = None
        self.restarts = 0
        self.resets = 0  # sandboxes replaced because a program left them unclean
        self._workdir: str | None = None
        self._started = False
        self._memory_floor: int | None = None
        self.isolation = ""
        # what the current program (every process of it loaded for one problem: a program
        # reloaded after a failed call keeps counting) has sent the judge; reset by unload()
        self.spent = Spent()

    @property
    def proc(self) -> Any:
        return self.box.proc if self.box is not None else None

    def start(self) -> None:
        argv = [python_executable(), "-I", "-c", SOURCE]
        bwrap = self.iso.mode == "bwrap"
        if bwrap:
            argv.append("--pidns")  # PID 1 of its own PID namespace: kill(-1) is safe in there
        else:  # under bubblewrap the server works in the sandbox's own /tmp
            self._workdir = fallback_workdir()
        if self.tag:
            argv.append(f"--tag={self.tag}")
        debug = os.environ.get("RLBENCH_SANDBOX_DEBUG")
        ours, theirs = socket.socketpair()
        try:
            self.box = spawn(argv, self.limits, iso=self.iso, cwd=self._workdir,
                             stdin=theirs.fileno(), stdout=theirs.fileno(),
                             stderr=None if debug else subprocess.DEVNULL, as_pid_1=bwrap)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.ctl = ours
        self.isolation = self.box.isolation
        self._memory_floor = None

    def close(self) -> None:
        self._end_session()
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
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

    def _end_session(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    # -- control ---------------------------------------------------------------------------------
    def _control(self, header: dict[str, Any], fds: list[int], timeout: float
                 ) -> dict[str, Any]:
        """One request to the server (with descriptors for the program) and its reply."""
        if self.proc is None or self.proc.poll() is not None:
            self.restarts += self._started
            self.close()
            self.start()
            self._started = True
        assert self.ctl is not None
        try:
            socket.send_fds(self.ctl, [wire.frame(json.dumps(header).encode())], fds)
            deadline = time.monotonic() + timeout + GRACE_S
            reply = json.loads(wire.read_frame(self.ctl.fileno(), 1 << 16, deadline))
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
        return reply

    def end_program(self) -> dict[str, Any]:
        """Kill the current program and everything it started; the server wipes and checks."""
        self._end_session()
        return self._control({"op": "kill"}, [], 5.0)

    # -- operations ------------------------------------------------------------------------------
    def load(self, code: str, *, timeout: float, cpu_s: float, call_timeout: float,
             deadline: float | None = None) -> Session:
        """Start a fresh process for ``code`` (executed as module ``candidate``) and return a
        session whose :meth:`Session.namespace` holds proxies for the names it defined."""
        self._end_session()
        ours, theirs = socket.socketpair()
        try:
            self._control({"op": "spawn", "mode": "functional", "cpu_s": cpu_s},
                          [theirs.fileno()], timeout)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.session = Session(self, ours, call_timeout, deadline)
        msg = self.session.roundtrip(code.encode(), timeout)
        names = msg.get("names")
        if type(names) is not dict or not all(type(k) is str for k in names):
            raise RemoteError("malformed load reply from candidate")
        self.session.names = names
        return self.session

    def unload(self) -> None:
        """End the current program and make sure the next one starts from a clean slate: the
        server wipes and checks its sandbox; the judge checks the group's memory charge. If
        anything is not as it was, the sandbox is replaced now (:attr:`resets`)."""
        self.spent = Spent()
        if self.proc is None:
            return
        try:
            reply = self.end_program()
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
        self._end_session()
        start = time.monotonic()
        code_fd, in_fd = wire.memory_file(code.encode()), wire.memory_file(stdin.encode())
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            try:
                self._control({"op": "spawn", "mode": "stdio", "cpu_s": cpu_s},
                              [code_fd, in_fd, out_w, err_w], timeout)
            finally:
                for fd in (code_fd, in_fd, out_w, err_w):
                    os.close(fd)
            left = timeout - (time.monotonic() - start)
            out, err, timed_out, truncated = wire.collect(out_r, err_r, left, max_output)
        finally:
            os.close(out_r)
            os.close(err_r)
        status: dict[str, Any] = {}
        if not (timed_out or truncated):
            status = self._control({"op": "wait", "timeout": 1.0}, [], 1.0)
            timed_out = status.get("status") == "timeout"
        if timed_out or truncated:
            self.end_program()  # now, not at the next program: it may still be running
        return StdioResult(stdout=out, stderr=err[-2000:].decode("utf-8", "replace"),
                           exit_code=_opt_int(status.get("exit")),
                           signal=_opt_int(status.get("signal")),
                           timed_out=timed_out, truncated=truncated)


def _opt_int(v: Any) -> int | None:
    return v if type(v) is int else None


def fallback_workdir() -> str:
    """A host directory for a fork server without namespaces, named after this process; those
    of graders that were killed before they could remove theirs are removed first."""
    top = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for d in top.iterdir():
            owner = d.name[len(WORKDIR_PREFIX):].split("-")[0]
            dead = owner.isdigit() and not cgroup.alive(int(owner))
            if d.name.startswith(WORKDIR_PREFIX) and dead:
                shutil.rmtree(d, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")


class Session:
    """One loaded candidate, on a socket of its own. Every operation is bounded by
    ``call_timeout`` and the session's overall ``deadline``, and everything it receives by the
    limits of :mod:`harness.sandbox.codec`; after a timeout or crash the session is dead
    (operations raise) and the program has been ended."""

    def __init__(self, server: ForkServer, sock: socket.socket, call_timeout: float,
                 deadline: float | None) -> None:
        self.server = server
        self.sock = sock
        sock.setblocking(False)
        self.call_timeout = call_timeout
        self.deadline = deadline
        self.names: dict[str, Any] = {}
        self.dead: str | None = None
        self.spent = server.spent  # shared by every process of the program (codec.Channel)

    def close(self) -> None:
        self.sock.close()
        self.dead = self.dead or "closed"

    def namespace(self, reserved: Collection[str] = frozenset(),
                  allow: Collection[str] = frozenset()) -> dict[str, Any]:
        """The candidate's top-level names for the judge's test code. Never dunders, builtins
        or ``reserved`` names (the judge's own helpers): a candidate that defines ``abs``,
        ``set`` or ``isinstance`` must not change what the test's own calls compute. Only the
        problem's entry points (``allow``: MBPP 126 *asks* for a function named ``sum``) may
        take a builtin's name. A module the candidate imported is the judge's own copy of that
        standard-library module (:func:`~harness.sandbox.codec.judge_module`), or not bound."""
        out: dict[str, Any] = {}
        for name, value in self.names.items():
            if name.startswith("__") or (
                name not in allow and (name in reserved or hasattr(builtins, name))
            ):
                continue
            obj = decode(value, self)
            if isinstance(obj, Proxy) and obj._kind == "module":
                module = judge_module(name) if obj._type == name else None
                if module is None:
                    continue
                obj = module
            out[name] = obj
        return out

    def _fail(self, why: str) -> None:
        """The program cannot go on: end it now (the server kills everything it started). If
        the server itself is gone, that is no fault of the program: :class:`ServerFailureError`
        (the grader then caches nothing)."""
        self.dead = why
        proc = self.server.proc
        if proc is None or proc.poll() is not None:
            self.server.close()
            raise ServerFailureError("sandbox server died; replaced")
        self.server.end_program()  # ServerFailureError if the server fails now

    def roundtrip(self, data: bytes, timeout: float) -> dict[str, Any]:
        """Send one frame to the program and return its decoded reply (a dict with ok=True)."""
        deadline = time.monotonic() + timeout
        fd = self.sock.fileno()
        try:
            wire.send_all(fd, wire.frame(data), deadline)
            body = wire.read_frame(fd, codec.MAX_REPLY_BYTES, deadline)
        except wire.FrameTooLargeError as exc:
            self._fail("too_large")
            raise ReplyTooLargeError(f"reply of {exc.size} bytes (limit "
                                     f"{codec.MAX_REPLY_BYTES})") from None
        except TimeoutError:
            self._fail("timeout")
            raise RemoteTimeoutError("candidate timed out") from None
        except (EOFError, OSError) as exc:
            self._fail("died")
            raise RemoteDiedError(f"candidate process died ({type(exc).__name__})") from None
        return self.receive(body)

    def receive(self, body: bytes) -> dict[str, Any]:
        spent = self.spent
        spent.bytes += len(body)
        spent.containers += body.count(b"{")
        try:
            check_reply_size(body)
            if spent.bytes > codec.MAX_SESSION_BYTES:
                raise ReplyTooLargeError(f"replies of {spent.bytes} bytes in all from one "
                                         f"program (limit {codec.MAX_SESSION_BYTES})")
            if spent.containers > codec.MAX_SESSION_CONTAINERS:
                raise ReplyTooLargeError(f"replies with {spent.containers} objects in all from "
                                         f"one program (limit {codec.MAX_SESSION_CONTAINERS})")
        except ReplyTooLargeError:
            self._fail("too_large")
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
        self.spent.ops += 1
        if self.spent.ops > codec.MAX_SESSION_OPS:
            self._fail("too_large")
            raise ReplyTooLargeError(f"more than {codec.MAX_SESSION_OPS} operations on one "
                                     "program")
        timeout = self.call_timeout
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                self._fail("deadline")
                raise RemoteTimeoutError("problem time budget exhausted")
        return self.roundtrip(json.dumps(payload).encode(), timeout)

    def call(self, ref: Proxy, args: tuple, kwargs: dict[str, Any]) -> Any:
        enc_args = [encode(a) for a in args]
        msg = self.op({"op": "call", "ref": ref._id, "args": enc_args,
                       "kwargs": {str(k): encode(v) for k, v in kwargs.items()}})
        after = msg.get("args_after")
        if isinstance(after, list) and len(after) == len(args):
            for original, new in zip(args, after):
                copy_back(original, decode(new, self) if new is not None else None)
        return decode(msg.get("value"), self)


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
