"""Progress that suits where it is shown: a tqdm bar on a terminal, periodic log lines elsewhere.

A bar's carriage returns flood a file or a CI log, so when stderr is not a TTY (or
``RLBENCH_PROGRESS=lines``) progress is one log line at the start, then at most one every
``every_s`` seconds, and one at the end, each with the count, elapsed time and an ETA.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from types import TracebackType
from typing import Any

log = logging.getLogger("rlbench")


def use_bars() -> bool:
    mode = os.environ.get("RLBENCH_PROGRESS", "auto")
    return mode == "bars" or (mode == "auto" and sys.stderr.isatty())


def fmt_seconds(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """``with Progress(total, "eval") as p: ... p.update(n)``."""

    def __init__(self, total: int, desc: str, unit: str = "it", every_s: float = 15.0,
                 final_line: bool = True) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.final_line = final_line
        self.postfix: dict[str, Any] = {}
        self.done = 0
        self.start = self.last = time.perf_counter()
        self.bar: Any = None
        if use_bars():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr,
                            dynamic_ncols=True)
        else:
            log.info("%s: 0/%d %s", desc, total, unit)

    def _extra(self) -> str:
        return "".join(f", {k} {v}" for k, v in self.postfix.items())

    def update(self, n: int = 1, **postfix: Any) -> None:
        """``n`` more done; ``postfix`` (e.g. ``loss="1.23"``) is shown beside the count."""
        self.done += n
        self.postfix.update(postfix)
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(self.postfix, refresh=False)
            self.bar.update(n)
            return
        now = time.perf_counter()
        if now - self.last >= self.every_s and self.done < self.total:
            self.last = now
            elapsed = now - self.start
            eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
            log.info("%s: %d/%d %s, %s elapsed, eta %s%s", self.desc, self.done, self.total,
                     self.unit, fmt_seconds(elapsed), fmt_seconds(eta), self._extra())

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.final_line:
            self.final_line = False
            log.info("%s: %d/%d %s in %s%s", self.desc, self.done, self.total, self.unit,
                     fmt_seconds(time.perf_counter() - self.start), self._extra())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
