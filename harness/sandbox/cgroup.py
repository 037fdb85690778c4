"""One cgroup per sandbox: ``pids.max`` and a memory limit for the whole group, an equal CPU weight
and a quota of one CPU where the ``cpu`` controller is writable, and a way to kill everything in
it and remove it afterwards.

Hand-written on purpose, and kept small: the tools that would do this for us do not work on the
machines this project runs on (development and CI: containers whose PID 1 is not systemd, cgroup
v1 ``pids`` and ``memory`` hierarchies writable by root, an empty cgroup v2 hierarchy):
``systemd-run --scope`` needs systemd as PID 1 ("System has not been booted with systemd"), and
``cgexec``/``cgcreate`` (Debian ``cgroup-tools``) are not installed, would be one more apt
dependency and three more processes per sandbox, and kill nothing on removal. bubblewrap has no
cgroup option. What is needed is four file operations: ``mkdir``, write the limits, write the
sandbox's first PID into ``cgroup.procs`` (between fork and exec, so everything it starts is
inside), then kill and ``rmdir``.

Where groups are made (:func:`backend`):

* ``RLBENCH_CGROUP=/some/path`` (a cgroup path as in ``/proc/self/cgroup``) names a parent
  prepared for us, e.g. one delegated (``chown``) to a non-root grader;
* otherwise cgroup v2 if its hierarchy offers both controllers: the nearest ancestor of our own
  cgroup with ``pids`` and ``memory`` in its ``cgroup.subtree_control`` that we can write (v2
  forbids processes in a cgroup that hands controllers down, so not our own cgroup);
* otherwise cgroup v1: our own cgroup in the ``pids`` and in the ``memory`` hierarchy (limits of
  the cgroups above still apply: a grader in a capped container stays capped).

When none is writable (a non-root grader without delegation) there are no group limits; the
sandbox says so (``harness.sandbox.layers``).

CPU (optional: without it the sandbox works as before, and :meth:`Backend.describe` says so):
in the same v2 directory when it hands down ``cpu`` too, else in the v1 ``cpu`` hierarchy (the
same path as for the others) when it is mounted and writable. Each sandbox's group gets the
default weight (``cpu.shares`` 1024 / ``cpu.weight`` 100, as one session of the host) and at most
:data:`CPUS` CPUs (``cpu.cfs_quota_us`` / ``cpu.max``), however many processes, threads or
sessions it starts (the kernel makes autogroups only in the root cpu group). Without it every
session (``setsid``) there is a scheduler autogroup with the weight of a whole session: 12
spinners that each called ``setsid`` got 12 shares against an honest neighbour's one and slowed
it 7x (issue 30; ``docs/sandbox.md``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "RLBENCH_CGROUP"
PREFIX = "rlbench-"
CONTROLLERS = ("pids", "memory")  # required
OPTIONAL = ("cpu",)               # used where writable
CPUS = 1.0                        # CPU quota of one sandbox (None in Group: weight only)
CFS_PERIOD_US = 100_000
_counter = itertools.count()


@dataclass(frozen=True, eq=False)
class Backend:
    """Where sandbox groups are created: ``parents[controller]`` (the same directory for v2);
    ``parents["cpu"]`` only where the cpu controller is writable."""

    version: int
    parents: dict[str, Path]

    @property
    def dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.parents.values()))

    @property
    def cpu(self) -> bool:
        """Whether each sandbox gets a cpu group (equal weight, quota): CPU isolated per sandbox."""
        return "cpu" in self.parents

    def describe(self) -> str:
        cpu = (f"CPU per sandbox: equal weight, at most {CPUS:g} CPU" if self.cpu else
               "no cpu controller: CPU NOT isolated per sandbox")
        return f"cgroup v{self.version} ({', '.join(str(d) for d in self.dirs)}; {cpu})"


def _mounts() -> tuple[list[tuple[str, str]], dict[str, tuple[str, str]]]:
    """cgroup2 mounts and, per v1 controller, (mount point, root of the mount in the hierarchy)."""
    v2: list[tuple[str, str]] = []
    v1: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3].split(",")
            root, point = fields[3], fields[4]
            if fstype == "cgroup2":
                v2.append((point, root))
            elif fstype == "cgroup":
                for ctrl in CONTROLLERS + OPTIONAL:
                    if ctrl in options:
                        v1.setdefault(ctrl, (point, root))
    return v2, v1


def _own() -> dict[str, str]:
    """Our cgroup path per v1 controller, and under ``""`` the v2 one (``/proc/self/cgroup``)."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for ctrl in ctrls.split(",") if ctrls else [""]:
                own[ctrl] = path
    return own


def _join(point: str, root: str, path: str) -> Path:
    if root != "/" and path.startswith(root):
        path = path[len(root):]
    return Path(point) / path.lstrip("/")


def _usable(d: Path, v2: bool, controllers: tuple[str, ...] = CONTROLLERS) -> bool:
    if not (d.is_dir() and os.access(d, os.W_OK | os.X_OK)):
        return False
    if not v2:
        return True
    with contextlib.suppress(OSError):
        return set(controllers) <= set((d / "cgroup.subtree_control").read_text().split())
    return False


def backend() -> Backend | None:
    """The writable place for sandbox groups with both controllers, or None."""
    return _backend(os.environ.get(ENV_VAR) or None, os.geteuid())


@functools.lru_cache(maxsize=8)
def _backend(wanted: str | None, euid: int) -> Backend | None:
    del euid  # part of the cache key only
    v2_mounts, v1 = _mounts()
    own = _own()
    for point, root in v2_mounts:
        try:
            available = set((Path(point) / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if not set(CONTROLLERS) <= available:
            continue  # the controllers are bound to v1 hierarchies (hybrid layout)
        mount = Path(point)
        here = _join(point, root, wanted or own.get("", "/"))
        if wanted or here == mount:
            candidates = [here]
        else:
            candidates = [p for p in here.parents if p == mount or mount in p.parents]
        for d in candidates:
            if _usable(d, v2=True):
                parents = {c: d for c in CONTROLLERS}
                cpu = d if _usable(d, v2=True, controllers=("cpu",)) else _v1_cpu(v1, own, wanted)
                return Backend(2, parents | ({"cpu": cpu} if cpu else {}))
    if all(c in v1 for c in CONTROLLERS):
        parents = {c: _join(*v1[c], wanted or own.get(c, "/")) for c in CONTROLLERS}
        if all(_usable(d, v2=False) for d in parents.values()):
            cpu = _v1_cpu(v1, own, wanted)
            return Backend(1, parents | ({"cpu": cpu} if cpu else {}))
    return None


def _v1_cpu(v1: dict[str, tuple[str, str]], own: dict[str, str], wanted: str | None
            ) -> Path | None:
    """Our cgroup (or ``wanted``) in the v1 ``cpu`` hierarchy, if it is mounted and writable."""
    if "cpu" not in v1:
        return None
    d = _join(*v1["cpu"], wanted or own.get("cpu", "/"))
    return d if _usable(d, v2=False) else None


class Group:
    """A cgroup of its own for one sandbox: ``pids.max = pids`` and ``memory_mb`` for the whole
    group (no swap); where the backend has the cpu controller, the default CPU weight and at
    most ``cpus`` CPUs (None: no quota). :meth:`attach` puts a process in it; :meth:`remove`
    kills what is left."""

    def __init__(self, be: Backend, pids: int, memory_mb: int, name: str = "", *,
                 cpus: float | None = CPUS) -> None:
        _remove_stale(be)
        self.backend = be
        self.name = name or f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.dirs = {c: p / self.name for c, p in be.parents.items()}
        created: list[Path] = []
        try:
            for d in dict.fromkeys(self.dirs.values()):
                d.mkdir()
                created.append(d)
            mem = memory_mb << 20
            self._write(self.dirs["pids"] / "pids.max", str(pids))
            if be.version == 2:
                self._write(self.dirs["memory"] / "memory.max", str(mem))
                self._write(self.dirs["memory"] / "memory.swap.max", "0", optional=True)
            else:
                self._write(self.dirs["memory"] / "memory.limit_in_bytes", str(mem))
                self._write(self.dirs["memory"] / "memory.memsw.limit_in_bytes", str(mem),
                            optional=True)
            if "cpu" in self.dirs:
                self._cpu(self.dirs["cpu"], cpus)
        except OSError:
            for d in created:
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        # encoded once here: attach() runs between fork and exec and should do nothing else
        self._procs = [os.fsencode(d / "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def _cpu(self, d: Path, cpus: float | None) -> None:
        """Equal weight for every sandbox (the default, written so that it holds whatever the
        parent's default is) and the quota. A quota above the parent's is refused by v1
        (EINVAL): then the parent's stricter one applies and ours is left unset."""
        quota = max(1000, int(cpus * CFS_PERIOD_US)) if cpus else None
        if (d / "cpu.weight").exists():  # v2 (also in a hybrid layout: decided by the files)
            self._write(d / "cpu.weight", "100")
            if quota:
                self._write(d / "cpu.max", f"{quota} {CFS_PERIOD_US}")
            return
        self._write(d / "cpu.shares", "1024")
        if quota:
            self._write(d / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            try:
                self._write(d / "cpu.cfs_quota_us", str(quota))
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise

    @staticmethod
    def _write(path: Path, value: str, optional: bool = False) -> None:
        try:
            path.write_text(value)
        except FileNotFoundError:
            if not optional:
                raise

    def attach(self, pid: int = 0) -> None:
        """Move ``pid`` (default: the calling process) into the group; its children follow."""
        data = str(pid or os.getpid()).encode()
        for path in self._procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    def _tree(self) -> list[Path]:
        """The group's directories and any nested below them, deepest first."""
        found: list[Path] = []
        for d in dict.fromkeys(self.dirs.values()):
            found += [Path(root) for root, _, _ in os.walk(d, topdown=False)]
        return found

    def pids(self) -> list[int]:
        """Every process in the group, nested groups included."""
        out: set[int] = set()
        for d in self._tree():
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return sorted(out)

    def kill(self) -> None:
        """SIGKILL everything in the group (``cgroup.kill`` on v2; on v1 until it is empty:
        ``pids.max`` bounds how many a process can fork while the loop runs)."""
        kill_file = self.dirs["pids"] / "cgroup.kill"
        if self.backend.version == 2 and kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        for _ in range(200):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> bool:
        """Kill what is left and remove the group (nested groups first); False if it could
        not be removed."""
        self.kill()
        gone = True
        for d in self._tree():
            for delay in (0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0):
                time.sleep(delay)
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # exiting processes still counted for a moment
                    self.kill()
            else:
                gone = False
        return gone

    def memory_current(self) -> int | None:
        """The group's memory charge now, in bytes (its tmpfs files and page cache included)."""
        v2 = self.backend.version == 2
        return _read_int(self.dirs["memory"] / ("memory.current" if v2 else
                                                 "memory.usage_in_bytes"))

    def stats(self) -> dict[str, int | None]:
        """Measured by the kernel: peak tasks, peak memory (bytes) and OOM kills in the group;
        with a cpu group, the time its quota held it back (``cpu_throttled_us``; None without)."""
        pdir, mdir = self.dirs["pids"], self.dirs["memory"]
        v2 = self.backend.version == 2
        throttled = None
        if "cpu" in self.dirs:
            stat = self.dirs["cpu"] / "cpu.stat"
            throttled = _read_key(stat, "throttled_usec")  # v2
            if throttled is None and (ns := _read_key(stat, "throttled_time")) is not None:
                throttled = ns // 1000  # v1: nanoseconds
        return {
            "pids_current": _read_int(pdir / "pids.current"),
            "pids_peak": _read_int(pdir / "pids.peak"),
            "memory_peak": _read_int(mdir / ("memory.peak" if v2 else "memory.max_usage_in_bytes")),
            "oom_kills": _read_key(mdir / ("memory.events" if v2 else "memory.oom_control"),
                                   "oom_kill"),
            "cpu_throttled_us": throttled,
        }


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(path: Path, key: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_cleaned: set[tuple[Path, ...]] = set()


def _remove_stale(be: Backend) -> None:
    """Groups left by graders that were killed before they could remove them. Their sandboxes
    die with them (``--die-with-parent``), so such a group is normally empty; anything still in
    it is a process that outlived its grader, and is killed before the group is removed. Once
    per process."""
    if tuple(be.dirs) in _cleaned:
        return
    _cleaned.add(tuple(be.dirs))
    for parent in be.dirs:
        with contextlib.suppress(OSError):
            for d in parent.iterdir():
                owner = d.name[len(PREFIX):].split("-")[0]
                if d.name.startswith(PREFIX) and owner.isdigit() and not alive(int(owner)):
                    _kill_all_in(d)
                    for root, _, _ in os.walk(d, topdown=False):  # nested groups first
                        for delay in (0, 0.01, 0.05, 0.2):
                            time.sleep(delay)
                            try:
                                os.rmdir(root)
                                break
                            except FileNotFoundError:
                                break
                            except OSError:  # a killed process still counted for a moment
                                _kill_all_in(d)


def _kill_all_in(d: Path) -> None:
    """SIGKILL every process in group ``d`` and the groups nested in it."""
    for root, _, _ in os.walk(d):
        with contextlib.suppress(OSError, ValueError):
            for pid in map(int, (Path(root) / "cgroup.procs").read_text().split()):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def leftovers(be: Backend | None = None, owner: int | None = None) -> list[Path]:
    """Sandbox groups that still exist (of process ``owner``, or of anyone)."""
    be = be or backend()
    if be is None:
        return []
    mark = f"{PREFIX}{owner}-" if owner is not None else PREFIX
    return sorted(d for parent in be.dirs if parent.is_dir()
                  for d in parent.iterdir() if d.is_dir() and d.name.startswith(mark))
