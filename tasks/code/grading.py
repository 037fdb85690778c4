"""Grading code: the judge that runs every candidate in the sandbox and decides each test outside.

A problem's ``answer`` (see :mod:`tasks.code.datasets`) is one of two kinds:

* ``functional`` - ``units`` are Python sources (HumanEval ``check`` split into one assert per
  unit, MBPP asserts, LeetCode ``Solution`` checks). The candidate (with the problem's
  ``preamble``) is loaded into a fresh sandboxed process; each unit is executed **by the judge**
  with the candidate's names bound to proxies (:mod:`harness.sandbox.remote`), so a unit passes
  only if the judge's own ``assert`` held on plain data that came back.
* ``stdio`` - ``units`` are ``{"input", "output"}`` pairs; the candidate runs once per unit with
  that stdin, and the judge compares the captured stdout with the expected output, whitespace
  tolerant (tokens equal, numbers within 1e-6 when both are numbers). A run must also exit 0
  within its time and output limits.

Time: a problem gets ``timeout_base_s + timeout_per_test_s * n_units`` seconds in all (wall),
each remote call at most ``call_timeout_s``, each process ``cpu_s`` CPU seconds. Grading runs on
a bounded pool of sandboxes (``workers``; each sandbox runs at nice 10), one thread each.

Isolation: a grader refuses to start where the machine offers less sandbox isolation than
configured (namespaces, an unprivileged host uid, cgroup group limits: ``docs/sandbox.md``)
unless ``allow_weaker_isolation`` is true; then it warns once, naming what is not enforced.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import json
import math
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from harness.sandbox import Limits, SandboxUnavailableError, WeakerIsolationError, require
from harness.sandbox.remote import (
    ForkServer,
    RemoteError,
    RemoteTimeoutError,
    ReplyTooLargeError,
    ServerFailureError,
    ServerPool,
    Session,
)
from harness.typed_config import ConfigError


@dataclass
class GraderConfig:
    workers: int | None = None     # sandboxes graded in parallel (null = number of CPU cores)
    timeout_base_s: float = 5.0    # wall budget of one problem: base + per_test * n_tests
    timeout_per_test_s: float = 3.0
    call_timeout_s: float = 10.0   # one call into the candidate (or one stdio run)
    cpu_s: float = 10.0            # CPU seconds of one candidate process
    memory_mb: int = 512           # address space of every process in a sandbox
    group_memory_mb: int = 1024    # memory of a whole sandbox (cgroup)
    max_procs: int = 16            # tasks in a sandbox (fork bombs stop here)
    max_output_bytes: int = 1 << 20  # stdout of a stdio run
    stop_on_first_failure: bool = True  # binary reward: skip the rest once a test fails
    cache_size: int = 100_000      # (problem, program) -> result memo; identical samples are
                                   # graded once (programs are deterministic up to timeouts)
    allow_weaker_isolation: bool = False  # grade even where a sandbox layer is missing (with
                                          # one warning); false: refuse (docs/sandbox.md)


@dataclass
class GradeResult:
    passed: int
    total: int
    status: str = "ok"  # ok | load_error | timeout | died | no_tests
    error: str = ""
    seconds: float = 0.0
    per_test: list[bool] = field(default_factory=list)
    oversized: int = 0  # replies refused for their size (the call failed; nothing was decoded)

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def split_asserts(source: str, func: str = "check") -> list[str]:
    """One test source per top-level ``assert`` of ``func`` (or of the module when it has no such
    function), keeping every other statement, so a fraction-of-tests reward is meaningful.
    Asserts that assert nothing (:func:`asserts_nothing`: HumanEval's ``assert True``) are
    dropped, so no program earns credit for them; a source with no real assert stays one unit."""
    return split_asserts_counted(source, func)[0]


def split_asserts_counted(source: str, func: str = "check") -> tuple[list[str], int]:
    """:func:`split_asserts` and the number of asserts it dropped because they assert nothing."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [source], 0
    holder: Any = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), tree
    )
    asserts = {i for i, s in enumerate(holder.body) if isinstance(s, ast.Assert)}
    idx = [i for i in sorted(asserts) if not asserts_nothing(holder.body[i])]
    dropped = len(asserts) - len(idx)
    if not idx or (len(idx) == 1 and not dropped):
        return [source], 0
    # Unparse once with a marker line in place of each assert, then splice: unparsing the whole
    # tree once per assert was quadratic (a LeetCode test of 100 asserts beside a large data
    # literal took seconds to split). A marker is a bare name, alone on its line, so it cannot
    # read as a docstring; the result is what unparsing the tree without the other asserts gives.
    marks = {f"__rlbench_unit_{i}__": i for i in asserts}
    body = holder.body
    holder.body = [ast.Expr(ast.Name(f"__rlbench_unit_{i}__")) if i in asserts else s
                   for i, s in enumerate(body)]
    lines = ast.unparse(tree).split("\n")
    holder.body = body
    line_of = {marks[ln.strip()]: n for n, ln in enumerate(lines) if ln.strip() in marks}
    marker_lines = set(line_of.values())
    units = []
    for keep in idx:
        at = line_of[keep]
        own = lines[at].replace(f"__rlbench_unit_{keep}__", ast.unparse(body[keep]))
        units.append("\n".join(own if n == at else ln for n, ln in enumerate(lines)
                               if n == at or n not in marker_lines))
    return units, dropped


def asserts_nothing(stmt: ast.stmt) -> bool:
    """True for an ``assert`` that every program passes: its test names nothing (no variable,
    function or candidate: ``assert True``, ``assert 1 == 1``) and holds. A constant assert that
    fails (``assert False``) is kept: it is part of what the problem's tests say."""
    if not isinstance(stmt, ast.Assert):
        return False
    if any(isinstance(n, ast.Name) for n in ast.walk(stmt.test)):
        return False
    try:  # trusted test source without names, as the judge would run it anyway
        return bool(eval(compile(ast.Expression(stmt.test), "<assert>", "eval"),
                         {"__builtins__": {}}))
    except Exception:
        return False


def called_names(sources: list[str]) -> list[str]:
    """Functions the tests call that are not builtins (the entry points); if every called name
    is a builtin's (MBPP 126 asks for ``sum``), all of them."""
    names: list[str] = []
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id not in names):
                names.append(node.func.id)
    own = [n for n in names if not hasattr(builtins, n)]
    return own or names


def outputs_match(got: str, expected: str) -> bool:
    """Whitespace-tolerant stdout comparison: equal tokens, or numbers within 1e-6."""
    a, b = got.split(), expected.split()
    if a == b:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not (math.isfinite(fx) and math.isfinite(fy)) or not math.isclose(
            fx, fy, rel_tol=1e-6, abs_tol=1e-6
        ):
            return False
    return True


def check_isolation(allow_weaker: bool) -> str:
    """The sandbox's isolation as one line; refuses a machine that offers less than configured
    (:class:`ConfigError`, so the command line exits 2) unless ``allow_weaker``."""
    try:
        return require(allow_weaker).describe()
    except WeakerIsolationError as exc:
        raise ConfigError(f"{exc}. Install what is missing (docs/sandbox.md) or set "
                          "task.grader.allow_weaker_isolation=true to grade anyway") from None
    except (SandboxUnavailableError, ValueError) as exc:  # RLBENCH_SANDBOX* set wrongly
        raise ConfigError(str(exc)) from None


class CodeGrader:
    """Grades (problem, program) pairs; safe to call from several threads."""

    def __init__(self, config: GraderConfig | None = None, tag: str = "") -> None:
        self.config = config or GraderConfig()
        self.tag = tag
        c = self.config
        self.workers = c.workers or os.cpu_count() or 1
        self.limits = Limits(memory_mb=c.memory_mb, group_memory_mb=c.group_memory_mb,
                             max_procs=c.max_procs, max_output_bytes=c.max_output_bytes)
        check_isolation(c.allow_weaker_isolation)
        self._pool: ServerPool | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, GradeResult] = OrderedDict()
        self._compiled: dict[str, Any] = {}
        self._judge_globals: dict[str, dict[str, Any]] = {}

    @property
    def pool(self) -> ServerPool:
        with self._lock:
            if self._pool is None:
                self._pool = ServerPool(self.workers, self.limits, self.tag,
                                        self.config.allow_weaker_isolation)
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    # -- public ----------------------------------------------------------------------------------
    def grade(self, answer: dict[str, Any], code: str) -> GradeResult:
        key = hashlib.sha256(json.dumps([answer, code], sort_keys=True).encode()).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        with self.pool.server() as server:
            start = time.monotonic()
            try:
                if answer["kind"] == "stdio":
                    result = self._grade_stdio(server, answer, code)
                else:
                    result = self._grade_functional(server, answer, code)
            finally:
                server.unload()
            result.seconds = time.monotonic() - start
        if result.status != "died":  # a crashed sandbox is not a property of the program
            with self._lock:
                self._cache[key] = result
                while len(self._cache) > self.config.cache_size:
                    self._cache.popitem(last=False)
        return result

    def grade_many(self, items: list[tuple[dict[str, Any], str]]) -> list[GradeResult]:
        if len(items) <= 1 or self.workers == 1:
            return [self.grade(a, c) for a, c in items]
        with ThreadPoolExecutor(self.workers) as ex:
            return list(ex.map(lambda item: self.grade(*item), items))

    # -- functional tests ------------------------------------------------------------------------
    def _budget(self, n: int) -> float:
        return self.config.timeout_base_s + self.config.timeout_per_test_s * n

    def _load(self, server: ForkServer, program: str, deadline: float) -> Session:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return server.load(program, timeout=min(left, self.config.call_timeout_s + 1.0),
                           cpu_s=self.config.cpu_s, call_timeout=self.config.call_timeout_s,
                           deadline=deadline)

    def _grade_functional(self, server: ForkServer, answer: dict[str, Any], code: str
                          ) -> GradeResult:
        units: list[str] = answer["units"]
        result = GradeResult(passed=0, total=len(units))
        if not units:
            result.status = "no_tests"
            return result
        deadline = time.monotonic() + self._budget(len(units))
        program = answer.get("preamble", "") + code
        base = self._judge_base(answer)
        session: Session | None = None
        names: dict[str, Any] = {}  # the candidate's names, decoded once per loaded process
        for unit in units:
            ok = False
            try:
                if session is None or session.dead:
                    session = self._load(server, program, deadline)
                    names = session.namespace(reserved=base.keys(),
                                              allow=answer.get("entry_points", ()))
            except (TimeoutError, RemoteTimeoutError):
                result.status = "timeout"
                break
            except ServerFailureError as exc:
                result.status, result.error = "died", str(exc)
                break
            except RemoteError as exc:  # syntax error, exception or exit at import time
                result.oversized += isinstance(exc, ReplyTooLargeError)
                result.status, result.error = "load_error", str(exc)[:300]
                break
            except Exception as exc:  # nothing the candidate defines may stop the grader
                result.status, result.error = "load_error", f"{type(exc).__name__}: {exc}"[:300]
                break
            try:
                ns = {**base, **names}
                for setup in answer.get("judge_setup", []):
                    exec(self._compile(setup), ns)
                exec(self._compile(unit), ns)
                ok = True
            except ServerFailureError as exc:
                result.status, result.error = "died", str(exc)
            except RemoteTimeoutError as exc:
                result.status, result.error = "timeout", str(exc)
            except ReplyTooLargeError as exc:
                result.oversized += 1
                result.error = result.error or f"{type(exc).__name__}: {str(exc)[:200]}"
            except Exception as exc:  # the trusted test failed (assert, remote error, ...)
                result.error = result.error or f"{type(exc).__name__}: {str(exc)[:200]}"
            result.per_test.append(ok)
            result.passed += ok
            if not ok and self.config.stop_on_first_failure:
                break
        result.per_test += [False] * (len(units) - len(result.per_test))
        return result

    def _judge_base(self, answer: dict[str, Any]) -> dict[str, Any]:
        """Globals of a test unit: the builtins, the problem's preamble (e.g. LeetCode's imports)
        and its ``judge_helpers`` (the prompt's helpers the tests call: HumanEval's ``poly``,
        ``encode_cyclic``), executed by the judge itself; never anything the candidate provides.
        The candidate's names that collide with these are not bound (:meth:`Session.namespace`),
        so the tests call the judge's helpers. The entry points are never in here: they are the
        candidate's."""
        source = answer.get("preamble", "") + "\n" + answer.get("judge_helpers", "")
        entries = sorted({answer.get("entry_point") or "", *answer.get("entry_points", ())} - {""})
        key = "\0".join([source, *entries])
        ns = self._judge_globals.get(key)
        if ns is None:
            ns = {"__builtins__": builtins, "__name__": "judge"}
            exec(source, ns)
            for name in entries:
                ns.pop(name, None)
            if len(self._judge_globals) > 10_000:
                self._judge_globals.clear()
            self._judge_globals[key] = ns
        return ns

    def _compile(self, source: str) -> Any:
        code = self._compiled.get(source)
        if code is None:
            code = compile(source, "<test>", "exec")
            if len(self._compiled) > 50_000:
                self._compiled.clear()
            self._compiled[source] = code
        return code

    # -- stdin/stdout tests ----------------------------------------------------------------------
    def _grade_stdio(self, server: ForkServer, answer: dict[str, Any], code: str) -> GradeResult:
        units: list[dict[str, str]] = answer["units"]
        result = GradeResult(passed=0, total=len(units))
        if not units:
            result.status = "no_tests"
            return result
        deadline = time.monotonic() + self._budget(len(units))
        program = answer.get("preamble", "") + code
        for unit in units:
            left = deadline - time.monotonic()
            ok = False
            if left <= 0:
                result.status = "timeout"
            else:
                try:
                    run = server.run_stdio(program, unit["input"],
                                           timeout=min(left, self.config.call_timeout_s),
                                           cpu_s=self.config.cpu_s,
                                           max_output=self.config.max_output_bytes)
                    if run.timed_out:
                        result.status = "timeout"
                    ok = (run.exit_code == 0 and not run.timed_out and not run.truncated
                          and outputs_match(run.stdout.decode("utf-8", "replace"),
                                            unit["output"]))
                    if not ok and not result.error:
                        result.error = run.stderr[-300:]
                except ServerFailureError as exc:
                    result.status, result.error = "died", str(exc)
            result.per_test.append(ok)
            result.passed += ok
            if not ok and self.config.stop_on_first_failure:
                break
        result.per_test += [False] * (len(units) - len(result.per_test))
        return result
