"""Bytes between the judge and a sandbox: length-prefixed frames over sockets, with deadlines
(a program that does not read or write its channel must never block the judge), anonymous
memory files for a stdio program's source and stdin, and the capped collection of its output.
"""

from __future__ import annotations

import os
import select
import struct
import time


class FrameTooLargeError(ValueError):
    """A length prefix over the reader's limit; the frame itself was not read."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes (limit {limit})")
        self.size = size


def frame(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def read_frame(fd: int, limit: int, deadline: float) -> bytes:
    """One length-prefixed frame of at most ``limit`` bytes, by ``deadline``."""
    (n,) = struct.unpack(">I", read_exact(fd, 4, deadline))
    if n > limit:
        raise FrameTooLargeError(n, limit)
    return read_exact(fd, n, deadline)


def send_all(fd: int, data: bytes, deadline: float) -> None:
    """Write ``data`` to a non-blocking descriptor by ``deadline`` (a program that does not read
    its channel must not block the judge)."""
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [fd], [], left)[1]:
            raise TimeoutError
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            continue


def read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        try:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def memory_file(data: bytes) -> int:
    fd = os.memfd_create("rlbench-program", 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def collect(out_r: int, err_r: int, timeout: float, cap: int
             ) -> tuple[bytes, bytes, bool, bool]:
    """Read a stdio program's stdout and stderr until both close, ``timeout`` or ``cap``."""
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
    return bytes(bufs[out_r]), bytes(bufs[err_r]), timed_out, truncated
