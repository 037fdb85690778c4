"""Sweeps under load (issue 32, item 3): concurrent cells on one store lose no run, metric or tag,
and a cell launched twice at once is trained once.

Real ``rlbench train`` processes (``benchmarks/store_concurrency.py``, which also prints these
measurements as tables) against one SQLite file and against an MLflow tracking server backed by a
PostgreSQL cluster started from the distribution's binaries. Each cell writes what it logged to
``<output_dir>/logged.json``; the store is read back and compared, key by key.

The server test skips when PostgreSQL (or psycopg2) is missing, unless
``RLBENCH_REQUIRE_POSTGRES=1`` (set by ``.ci/run`` once it installed PostgreSQL): then it fails,
so CI cannot pass by skipping it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import load_benchmark

REPO = Path(__file__).resolve().parents[2]


sc = load_benchmark("store_concurrency")
CELLS = 8
# never beside the hostile sandbox suite on the other xdist worker (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("machine_to_itself")


def _report(result: dict) -> str:
    """What a failure shows: what is missing, exit codes and the failed cells' stderr."""
    lines = [f"exit codes: {result.get('exit_codes')}"]
    if "missing" in result:
        lines.append(f"missing: {result['missing']}")
    for cell in result.get("per_cell", []):
        if cell["exit"] != 0:
            lines.append(f"cell{cell['cell']} exit {cell['exit']}:\n{cell['stderr_tail']}")
    for i, tail in enumerate(result.get("stderr_tails", [])):
        lines.append(f"process {i}:\n{tail[-1500:]}")
    return "\n".join(lines)


def _assert_nothing_lost(result: dict) -> None:
    assert result["exit_codes"] == [0] * CELLS, _report(result)
    assert result["missing"] == [], _report(result)
    assert result["runs_found"] == CELLS and result["distinct_run_ids_logged"] == CELLS
    assert result["metrics_expected"] > 0 and result["params_expected"] > 0
    assert result["tags_expected"] > 0
    assert result["metrics_found"] == result["metrics_expected"]
    assert result["params_found"] == result["params_expected"]
    assert result["tags_found"] == result["tags_expected"]
    assert result["cells_trained_twice"] == 0


def _assert_trained_once(dup: dict) -> None:
    assert dup["first_still_running"] == [True], "the first copy ended before the second started"
    assert dup["exit_codes"] == [0, 0], _report(dup)
    assert dup["runs"] == 1 and list(dup["runs_per_hash"].values()) == [1], _report(dup)
    # the copy that started a second later finds the cell claimed by the live one and skips
    assert dup["claimed"] == [False, True], _report(dup)


def test_the_checker_counts_a_lost_metric_value_param_and_tag_as_missing(tmp_path):
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    run_id = client.create_run(client.create_experiment("x"), tags={"a": "1"}).info.run_id
    client.log_batch(run_id, metrics=[Metric("m", 0.5, 0, s) for s in range(2)],
                     params=[Param("p", "1")])
    client.set_terminated(run_id, "FINISHED")
    whole = sc.check_run(client, {"run_id": run_id, "metrics": {"m": 2}, "params": 1,
                                  "tags": {"a": "1"}})
    assert whole["missing"] == [] and whole["metrics_found"] == whole["metrics_expected"] == 2
    lost = sc.check_run(client, {"run_id": run_id, "metrics": {"m": 3, "n": 1}, "params": 2,
                                 "tags": {"a": "1", "b": "2"}})
    assert (lost["metrics_expected"], lost["metrics_found"]) == (4, 2)
    assert (lost["params_expected"], lost["params_found"]) == (2, 1)
    assert (lost["tags_expected"], lost["tags_found"]) == (2, 1)
    assert len(lost["missing"]) == 4  # m, n, params, tag b


@pytest.mark.slow
def test_a_fresh_sqlite_store_opened_by_8_processes_at_once_opens_for_all(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    race = sc.fresh_store_race(lambda: uri, processes=8, experiment="race")
    assert race["exit_codes"] == [0] * 8, _report(race)
    assert not any("Traceback" in tail for tail in race["stderr_tails"]), _report(race)
    client = MlflowClient(uri)
    assert [e.name for e in client.search_experiments(filter_string="name = 'race'")] == ["race"]


@pytest.mark.slow
def test_the_same_cell_launched_twice_a_second_apart_trains_once_on_sqlite(
        tmp_path, tiny_model_path, model_cache):
    dup = sc.duplicate_launch(f"sqlite:///{tmp_path / 'mlruns.db'}", tmp_path, copies=2,
                              delay_s=1.0, cache=model_cache, build_model=False, timeout_s=300)
    _assert_trained_once(dup)


@pytest.mark.slow
def test_8_concurrent_cells_on_one_sqlite_store_lose_no_run_metric_param_or_tag(
        tmp_path, tiny_model_path, model_cache):
    result = sc.run_cells(f"sqlite:///{tmp_path / 'mlruns.db'}", tmp_path, CELLS,
                          cache=model_cache, build_model=False, timeout_s=400)
    _assert_nothing_lost(result)


@pytest.fixture
def postgres_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An MLflow server (4 workers) over a fresh PostgreSQL cluster; both stopped afterwards.
    The tiny model is requested only once PostgreSQL is known to be there, so a skip is quick."""
    reason = sc.postgres_unavailable()
    if reason:
        if os.environ.get("RLBENCH_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"RLBENCH_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)
    request.getfixturevalue("tiny_model_path")
    pg_uri, stop_pg = sc.start_postgres(tmp_path / "pg")
    try:
        base, stop_server = sc.start_mlflow_server(pg_uri, tmp_path / "server", workers=4)
        try:
            yield base
        finally:
            stop_server()
    finally:
        stop_pg()


@pytest.mark.slow
def test_8_concurrent_cells_on_a_postgresql_backed_server_lose_nothing_and_a_doubled_cell_trains_once(  # noqa: E501
        tmp_path, model_cache, postgres_server):
    # one server for both checks: starting PostgreSQL and MLflow's migrations take ~20 s
    result = sc.run_cells(postgres_server, tmp_path / "cells", CELLS, cache=model_cache,
                          build_model=False, timeout_s=400)
    _assert_nothing_lost(result)
    dup = sc.duplicate_launch(postgres_server, tmp_path / "dup", copies=2, delay_s=1.0,
                              cache=model_cache, build_model=False, timeout_s=300)
    _assert_trained_once(dup)
