"""Shared fixtures: a quickly warm-started tiny model in a temporary cache, configs, and a host
uid of its own for tests of the sandbox's rlimits fallback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.cli import compose_config

# A short warm start keeps the fixture fast; the real recipe is conf/model/tiny.yaml.
FAST_PRETRAIN = ["model.pretrain.steps=30", "model.pretrain.batch_size=64"]


@pytest.fixture(scope="module")
def machine_to_itself(tmp_path_factory: pytest.TempPathFactory):
    """The heavy multi-process tests never overlap on the two xdist workers: the hostile
    sandbox suite (timing-bound: a starved fork server is replaced, which it asserts never
    happens) and the store concurrency tests (8 training processes, PostgreSQL and an MLflow
    server) each hold this lock, shared by the workers of the session, while they run."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    with FileLock(str(shared / "machine-to-itself.lock")).acquire(timeout=3600):
        yield


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rlbench_cache")


def make_config(tmp_path: Path, cache: Path, *overrides: str):
    """A composed config writing MLflow data and outputs under ``tmp_path``."""
    return compose_config([
        *FAST_PRETRAIN,
        f"model.cache_dir={cache}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlruns.db'}",
        f"trainer.output_dir={tmp_path / 'out'}",
        "trainer.status_every=0",
        "backend.threads=1",
        *overrides,
    ])


@pytest.fixture(scope="session")
def tiny_model_path(model_cache: Path) -> str:
    from harness.components import build
    from harness.registry import MODELS, TASKS

    cfg = compose_config([*FAST_PRETRAIN, f"model.cache_dir={model_cache}"])
    task = build(TASKS, cfg.task, "task")
    return MODELS.get("tiny")(cfg.model, task, progress=False)


@pytest.fixture
def cli_env(tmp_path: Path, model_cache: Path) -> dict[str, str]:
    """Environment for `rlbench` subprocesses: private cache, MLflow store and cwd."""
    env = dict(os.environ)
    env["RLBENCH_CACHE"] = str(model_cache)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlruns.db'}"
    return env


def rollout_batch(cfg, prompts_per_step: int):
    """A set-up ``Trainer`` for ``cfg`` and one batch sampled by its algorithm's rollout, as a
    training step would (no update yet): for tests that drive ``Trainer.update`` by hand."""
    from harness.rollout import RolloutContext
    from harness.trainer import Trainer

    tr = Trainer(cfg)
    tr._t_start = 0.0
    tr.setup()
    ctx = RolloutContext(engine=tr.engine, task=tr.task, draw_prompts=tr.sampler.draw,
                         prompts_per_step=prompts_per_step, sampling=tr.sampling,
                         shape_rewards=tr.algorithm.shape_rewards)
    return tr, tr.algorithm.rollout(ctx)


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
