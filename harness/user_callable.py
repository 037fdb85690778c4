"""A user's Python callable, named by a path in the config, run in worker processes with a timeout.

``load_callable(spec, key)`` accepts ``package.module:function``, ``package.module.function`` or
``path/to/file.py:function`` (relative paths and module names are resolved from the working
directory, which is put on ``sys.path`` as for ``python -m``). A name that cannot be imported is a
:class:`~harness.typed_config.ConfigError` naming the key, so the run never starts.

:class:`CallablePool` calls such a function on chunks of a batch in a pool of forked worker
processes (pebble's ``ProcessPool``, as PyTorch's DataLoader forks its workers): a call that
runs longer than ``timeout_s`` is abandoned, its worker killed and replaced, and its chunk gets
``None`` results that the caller scores 0 and counts; an exception in the function is reported
the same way with its message. A reward function can therefore never hang or crash training.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import inspect
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.typed_config import ConfigError


def load_callable(spec: str, key: str) -> Callable[..., Any]:
    """The callable named by ``spec`` (see the module docstring); ``key`` is the config key."""
    target, _, attr = spec.rpartition(":" if ":" in spec else ".")
    if not target or not attr:
        raise ConfigError(f"{key}={spec!r}: expected package.module:function or "
                          "path/to/file.py:function")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if target.endswith(".py"):
            path = Path(target).expanduser().resolve()
            if not path.is_file():
                raise ConfigError(f"{key}={spec!r}: file {str(path)!r} does not exist")
            name = f"rlbench_user_{path.stem}"
            module = sys.modules.get(name)
            if module is None or getattr(module, "__file__", None) != str(path):
                module_spec = importlib.util.spec_from_file_location(name, path)
                assert module_spec is not None and module_spec.loader is not None
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ConfigError:
        raise
    except Exception as exc:  # ImportError, or the module itself failing at import
        raise ConfigError(f"{key}={spec!r}: cannot import {target!r} ({type(exc).__name__}: "
                          f"{exc}); it must be importable from {cwd} or be a .py path") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{key}={spec!r}: {target!r} has no callable {attr!r}")
    return fn


def accepts(fn: Callable[..., Any], name: str) -> bool:
    """Does ``fn`` take a keyword argument ``name`` (or ``**kwargs``)?"""
    params = inspect.signature(fn).parameters.values()
    return any(p.kind is p.VAR_KEYWORD or p.name == name for p in params)


_FN: Callable[..., Any] | None = None


def _set_fn(fn: Callable[..., Any]) -> None:
    global _FN
    _FN = fn


def _call(kwargs: dict[str, Any]) -> list[Any]:
    assert _FN is not None
    out = _FN(**kwargs)
    return list(out)


@dataclass
class CallResult:
    values: list[Any] | None  # None: the call failed (status says how)
    status: str = "ok"       # ok | timeout | error
    error: str = ""


class CallablePool:
    """``fn(**kwargs)`` on chunks, in ``workers`` forked processes with a per-call timeout.
    ``workers=0`` calls in this process (no timeout: for debugging a reward function)."""

    def __init__(self, fn: Callable[..., Any], workers: int, timeout_s: float) -> None:
        self.fn = fn
        self.workers = workers
        self.timeout_s = timeout_s
        self._pool: Any = None
        self._pid = os.getpid()

    def _get_pool(self) -> Any:
        if self._pool is None or self._pid != os.getpid():
            from pebble import ProcessPool

            self._pid = os.getpid()
            self._pool = ProcessPool(max_workers=self.workers, initializer=_set_fn,
                                     initargs=(self.fn,),
                                     context=multiprocessing.get_context("fork"))
            atexit.register(self.close)
        return self._pool

    def map(self, chunks: list[dict[str, Any]]) -> list[CallResult]:
        """One :class:`CallResult` per chunk (keyword arguments of one call)."""
        if self.workers <= 0:
            out = []
            for kwargs in chunks:
                try:
                    out.append(CallResult(list(self.fn(**kwargs))))
                except Exception as exc:
                    out.append(CallResult(None, "error", f"{type(exc).__name__}: {exc}"))
            return out
        pool = self._get_pool()
        futures = [pool.schedule(_call, args=(kwargs,), timeout=self.timeout_s)
                   for kwargs in chunks]
        results = []
        for future in futures:
            try:
                results.append(CallResult(future.result()))
            except FutureTimeout:
                results.append(CallResult(None, "timeout", f"over {self.timeout_s}s"))
            except Exception as exc:  # raised inside the function, or the worker died
                results.append(CallResult(None, "error", f"{type(exc).__name__}: {exc}"))
        return results

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.stop()
            self._pool.join()
        self._pool = None
