"""Start and stop the stores the concurrency benchmark and its test run against: a PostgreSQL
cluster from the distribution's binaries, an MLflow tracking server on it.

Used by ``benchmarks/store_concurrency.py`` (which loads this file by path: ``benchmarks/`` is not
a package) and, through it, by ``tests/engine/test_store_concurrency.py``. PostgreSQL runs as the
``postgres`` system user when started as root; :func:`postgres_unavailable` says why it cannot
start here, if it cannot.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

PG_USER = "rlbench"
PG_DB = "rlbench"
TAIL = 3000  # characters of a log or stderr kept in an error message


# -- helpers ------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, limit: int = TAIL) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def _stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """End a process started here with ``start_new_session=True`` and its children (its group)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)
    # children left in the group after the leader exited (uvicorn workers, a job runner)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


# -- PostgreSQL ---------------------------------------------------------------------------------
def postgres_bin() -> Path | None:
    """The directory of ``initdb``/``pg_ctl``: the newest /usr/lib/postgresql/*/bin (Debian's
    layout keeps them off PATH), else wherever PATH has ``initdb``."""
    def version(path: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", Path(path).parent.name))

    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if (Path(cand) / "initdb").exists() and (Path(cand) / "pg_ctl").exists():
            return Path(cand)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def postgres_unavailable() -> str | None:
    """Why a PostgreSQL-backed store cannot be started here, or None when it can."""
    if postgres_bin() is None:
        return "PostgreSQL binaries (initdb, pg_ctl) not found (Debian package: postgresql)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not importable (pip install psycopg2-binary, in the dev extra)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' system user to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return "running as root and runuser (util-linux) is missing"
    return None


def _reachable_by(path: Path, uid: int, gid: int) -> bool:
    """Whether ``uid`` may traverse every directory down to ``path`` (pytest's temporary
    directories are 0700 root, so a cluster run as ``postgres`` cannot live under them)."""
    for part in [path, *path.parents]:
        st = part.stat()
        if st.st_uid == uid:
            ok = st.st_mode & 0o100
        elif st.st_gid == gid:
            ok = st.st_mode & 0o010
        else:
            ok = st.st_mode & 0o001
        if not ok:
            return False
    return True


def start_postgres(workdir: Path) -> tuple[str, Callable[[], None]]:
    """A fresh PostgreSQL cluster on 127.0.0.1 with one database; returns its SQLAlchemy URI and
    a function that stops it (``pg_ctl stop -m fast``) and removes what it made outside workdir.

    PostgreSQL refuses to run as root: as root, initdb and the server run as the ``postgres``
    system user (``runuser``) and the cluster's directory is chowned to it. When that user cannot
    reach ``workdir`` (a 0700 parent, as pytest's), the cluster goes to a fresh directory under
    the system temporary directory instead, removed on stop. Authentication is ``trust``: the
    server only listens on 127.0.0.1 (and a Unix socket in the cluster's directory).
    """
    reason = postgres_unavailable()
    if reason:
        raise RuntimeError(reason)
    bindir = postgres_bin()
    assert bindir is not None
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    owned_elsewhere = False
    root = workdir / "postgres"
    if as_root:
        pg = pwd.getpwnam("postgres")
        prefix = ["runuser", "-u", "postgres", "--"]
        if not _reachable_by(workdir, pg.pw_uid, pg.pw_gid):
            root = Path(tempfile.mkdtemp(prefix="rlbench-pg-"))
            owned_elsewhere = True
            (workdir / "postgres.location").write_text(f"{root}\n")
    root.mkdir(parents=True, exist_ok=True)
    if as_root:
        for path in [root, *root.rglob("*")]:
            os.chown(path, pg.pw_uid, pg.pw_gid)
    data, log = root / "data", root / "postgres.log"
    # a Unix socket path is limited to about 107 bytes; past that, TCP only
    sockets = str(root) if len(str(root)) < 80 else ""
    port = free_port()

    def pg(*cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run([*prefix, *cmd], cwd=root, capture_output=True, text=True,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-TAIL:]}"
                               f"\n{out.stderr[-TAIL:]}\n{_tail(log)}")
        return out

    pg(str(bindir / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust",
       "--encoding=UTF8", "--locale=C", "--no-sync")
    options = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories='{sockets}'"
               " -c max_connections=200")
    pg(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
       "-o", options, "start")
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        try:
            pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop",
               check=False)
        finally:
            if owned_elsewhere:
                shutil.rmtree(root, ignore_errors=True)

    try:
        create_database(f"postgresql+psycopg2://{PG_USER}@127.0.0.1:{port}/postgres", PG_DB)
    except Exception:
        stop()
        raise
    return f"postgresql+psycopg2://{PG_USER}@127.0.0.1:{port}/{PG_DB}", stop


def create_database(uri: str, name: str) -> str:
    """Create database ``name`` on the server of ``uri``; returns the URI of the new database."""
    import psycopg2

    head, _, _ = uri.rpartition("/")
    dsn = head.replace("postgresql+psycopg2://", "postgresql://", 1) + "/postgres"
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = psycopg2.connect(dsn)
            break
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return f"{head}/{name}"


# -- MLflow tracking server ---------------------------------------------------------------------
def start_mlflow_server(backend_uri: str, workdir: Path, workers: int = 4,
                        timeout_s: float = 90.0) -> tuple[str, Callable[[], None]]:
    """``mlflow server`` on 127.0.0.1 (a free port, ``workers`` uvicorn workers, artifacts proxied
    to ``workdir/artifacts``) over ``backend_uri``; waits for ``GET /health``. Returns its URL and
    a function that ends its process group. MLflow's host check allows 127.0.0.1 by default, so
    no security flag is loosened."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = workdir / "mlflow-server.log"
    log = open(log_path, "wb")  # noqa: SIM115 (closed by stop)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
         "--artifacts-destination", str(workdir / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)],
        stdout=log, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def stop() -> None:
        try:
            _stop_group(proc)
        finally:
            log.close()

    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
            if resp.read().strip() == b"OK":
                return base, stop
        if proc.poll() is not None or time.monotonic() > deadline:
            log.flush()
            stop()
            raise RuntimeError(f"mlflow server did not answer /health within {timeout_s:.0f} s "
                               f"(exit {proc.returncode}):\n{_tail(log_path)}")
        time.sleep(0.5)
