"""Shared fixtures: a quickly warm-started tiny model in a model cache shared by the session's
xdist workers, a tiny Qwen2.5-VL, ``rlbench`` run in this process, a lock that keeps the heavy
multi-process tests apart, and a host uid of its own for tests of the sandbox's rlimits
fallback; and the scheduling of ``-n 2`` (a test module per worker unit, longest first). Plain
helpers (config builders, fakes, constants) are in ``tests/helpers.py``."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from harness.cli import compose_config
from tests.helpers import FAST_PRETRAIN, cli_environment

HEAVY_GROUP = "machine_to_itself"
# the test modules whose tests use the ``machine_to_itself`` fixture (checked at collection)
HEAVY_MODULES = ("tests/sandbox/test_sandbox_hostile.py", "tests/engine/test_store_concurrency.py")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``-n 2`` with ``--dist loadfile`` (pyproject.toml): each test module is one unit of work
    for a worker, so its module-scoped fixtures are built once, not once per worker, and the
    modules of ``HEAVY_MODULES`` (the hostile sandbox suite, the store concurrency tests) are
    one unit together, so they run one after another on one worker while the other goes on
    with the rest instead of waiting for the ``machine_to_itself`` lock. (xdist's own
    ``loadgroup`` cannot do this under pytest 9: the group suffix it writes to ``_nodeid`` is
    lost.) Units start in collection order, which ``pytest_collection_modifyitems`` sorts
    longest first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return HEAVY_GROUP if module in HEAVY_MODULES else module

    return ModuleScheduling(config, log)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    """Long units first (see ``pytest_xdist_make_scheduler``): the ``machine_to_itself`` group,
    then the modules with the most ``slow`` tests, then the others in their usual order, so no
    worker is left alone with a long unit at the end."""
    slow = Counter(_module(i.nodeid) for i in items if i.get_closest_marker("slow"))
    rank: dict[int, tuple[int, int]] = {}
    for item in items:
        module = _module(item.nodeid)
        if HEAVY_GROUP in getattr(item, "fixturenames", ()) and module not in HEAVY_MODULES:
            raise pytest.UsageError(f"{module} uses {HEAVY_GROUP}: add it to HEAVY_MODULES in "
                                    "tests/conftest.py")
        rank[id(item)] = (0 if module in HEAVY_MODULES else 1, -slow[module])
    yield  # the other hooks (-m/-k selection, fixture-parameter ordering)
    # stable: a module's tests stay together and in the order pytest gave them
    items[:] = sorted(items, key=lambda i: rank[id(i)])


def _session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary directory of the whole session, shared by its xdist workers (each worker's
    own base directory is inside it)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    return shared


@pytest.fixture(scope="module")
def machine_to_itself(tmp_path_factory: pytest.TempPathFactory):
    """The heavy multi-process tests never overlap on the two xdist workers: the hostile
    sandbox suite (timing-bound: a starved fork server is replaced, which it asserts never
    happens) and the store concurrency tests (8 training processes, PostgreSQL and an MLflow
    server) each hold this lock, shared by the workers of the session, while they run.
    Under ``-n 2`` their modules are one unit of work, run first on one worker
    (``pytest_xdist_make_scheduler``), so the lock never leaves the other waiting."""
    from filelock import FileLock

    lock = FileLock(str(_session_dir(tmp_path_factory) / "machine-to-itself.lock"))
    with lock.acquire(timeout=3600):
        yield


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model cache (``model.cache_dir``, ``RLBENCH_CACHE``) of the session, one for all its
    xdist workers: a warm-started model is built once per session, not once per worker (a cache
    entry is written under a temporary name and renamed into place, so workers can share it)."""
    cache = _session_dir(tmp_path_factory) / "rlbench_cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(scope="session")
def tiny_model_path(model_cache: Path) -> str:
    """The warm-started tiny model of the default task (countdown), built once per session:
    the first worker builds it while the other waits for it."""
    from filelock import FileLock

    from harness.registry import MODELS, TASKS
    from harness.typed_config import build

    cfg = compose_config([*FAST_PRETRAIN, f"model.cache_dir={model_cache}"])
    task = build(TASKS, cfg.task, "task")
    with FileLock(str(model_cache / "tiny_model_path.lock")).acquire(timeout=1800):
        return MODELS.get("tiny")(cfg.model, task, progress=False)


@pytest.fixture(autouse=True)
def no_command_from_another_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rlbench`` records the command it was started with in ``RLBENCH_COMMAND`` (MLflow's
    ``mlflow.source.name``; inherited by a sweep's workers). A test that calls ``main`` in this
    process must not hand its command to the next test's runs or subprocesses."""
    monkeypatch.delenv("RLBENCH_COMMAND", raising=False)


@pytest.fixture(scope="session")
def mlflow_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite MLflow store with every migration applied, made once per session: the
    state MLflow leaves a new store in before its first write, with no path or experiment in
    it. Migrating a new store takes 2-3 s on a 2-core machine, paid by each ``rlbench``
    subprocess of a test otherwise (:func:`cli_env` hands them a copy)."""
    import sqlalchemy
    from filelock import FileLock
    from mlflow.store.db import utils

    template = _session_dir(tmp_path_factory) / "mlflow-schema.db"
    with FileLock(f"{template}.lock").acquire(timeout=600):
        if not template.exists():
            partial = template.with_name("mlflow-schema.partial.db")
            partial.unlink(missing_ok=True)
            engine = sqlalchemy.create_engine(f"sqlite:///{partial}")
            utils._initialize_tables(engine)
            engine.dispose()
            partial.rename(template)
    return template


@pytest.fixture
def cli_env(tmp_path: Path, model_cache: Path, mlflow_schema: Path) -> dict[str, str]:
    """Environment for `rlbench` subprocesses: private cache, MLflow store and cwd. The store
    starts as a copy of the session's migrated empty one (:func:`mlflow_schema`)."""
    return cli_environment(tmp_path, model_cache, mlflow_schema)


@pytest.fixture
def rlbench_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """``rlbench ARGS`` run in this process, as ``harness.cli.main.main`` (what ``python -m
    harness.cli`` runs): a ``CompletedProcess`` with the exit code and what went to stdout and
    stderr. The root logger writes to stderr as in a process of its own (INFO once the command
    set up logging, else WARNING: Python's last-resort handler). For what ends before any run:
    the argparse commands (``board``, ``power``, ``list``) and the refusals of ``train``,
    ``sweep`` and ``eval``; reaching Hydra's own main (a run, Hydra's logging set up in this
    process) fails the test instead. Saves a subprocess's interpreter start and imports (2-4 s
    on a 2-core machine)."""
    import logging
    import subprocess
    import sys

    from harness.cli import hydra_app
    from harness.cli.main import main

    QUIETED_LOGGERS = ("transformers", "huggingface_hub", "mlflow", "alembic", "urllib3")

    def no_run(*args, **kwargs):
        raise AssertionError("rlbench_in_process reached Hydra's main: run it in a subprocess")

    monkeypatch.setattr(hydra_app, "_hydra_main", no_run)

    def run(*args: str, cwd: Path, env: dict[str, str] | None = None):
        monkeypatch.chdir(cwd)
        for key, value in (env or {}).items():
            if os.environ.get(key) != value:
                monkeypatch.setenv(key, value)
        capsys.readouterr()
        environ = dict(os.environ)  # main sets HF_HUB_OFFLINE and others for its process
        quieted = {name: logging.getLogger(name).level for name in QUIETED_LOGGERS}
        root = logging.getLogger()
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
        handler.setLevel(logging.WARNING if args[0] in ("train", "sweep") else logging.INFO)
        level = root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        code: int = 0
        try:
            main(list(args))
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            root.removeHandler(handler)
            root.setLevel(level)
            for name, was in quieted.items():
                logging.getLogger(name).setLevel(was)
            os.environ.clear()
            os.environ.update(environ)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["rlbench", *args], code, out.out, out.err)

    return run


@pytest.fixture(scope="session")
def qwen_vl_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny, randomly initialised Qwen2.5-VL saved once per session (tests.helpers)."""
    from tests.helpers import QWEN_VL_IMAGE_PROCESSOR, build_qwen_vl

    pytest.importorskip(QWEN_VL_IMAGE_PROCESSOR)
    return build_qwen_vl(tmp_path_factory.mktemp("qwen2p5_vl_tiny"))


@pytest.fixture
def own_host_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A root grader's sandboxes run as one host uid (default nobody); without namespaces (the
    rlimits fallback) RLIMIT_NPROC counts every process of that uid on the host, so a fork bomb
    of the hostile suite on the other xdist worker made a fallback sandbox fail to start
    (setpriv: Resource temporarily unavailable). Tests of the fallback get a uid no process has
    (``RLBENCH_SANDBOX_HOST_ID``, docs/sandbox.md), as a grader should be given."""
    from harness.sandbox import layers
    from tests.hostile.outer import free_uid

    if os.geteuid() == 0:
        # not the hostile suite's range: its non-root run takes the first free uid from 61000
        uid = free_uid(start=62000)
        monkeypatch.setenv(layers.HOST_ID_VAR, f"{uid}:{uid}")
