"""A new SQLite store is a copy of an empty store MLflow built once (``harness.tracking``):
the same schema, rows and Default experiment as a store MLflow builds itself, never written over
an existing store, and MLflow's own path whenever the template cannot be made."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from harness import tracking


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of this test's own, so the template is built here, from nothing."""
    root = tmp_path / "cache"
    monkeypatch.setenv("RLBENCH_CACHE", str(root))
    return root


def _dump(db: Path) -> tuple[Counter, dict[str, list]]:
    con = sqlite3.connect(db)
    try:
        # MLflow's own migrations order a table's constraints differently from one process to the
        # next (two stores it builds itself differ so): compare each statement's clauses as a set
        schema = Counter((kind, name, table, tuple(sorted((sql or "").split(", \n"))))
                         for kind, name, table, sql in con.execute(
                             "SELECT type, name, tbl_name, sql FROM sqlite_master"))
        rows = {}
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cols = [c[1] for c in con.execute(f"PRAGMA table_info('{table}')")]
            keep = [c for c in cols if c not in ("creation_time", "last_update_time")]
            rows[table] = sorted(map(repr, con.execute(
                f"SELECT {', '.join(keep)} FROM '{table}'")))
        return schema, rows
    finally:
        con.close()


def test_a_store_made_from_the_template_is_the_store_mlflow_builds(tmp_path, cache,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)  # the Default experiment's artifact root is ./mlruns of the cwd
    ours = tracking.open_client(f"sqlite:///{tmp_path / 'ours.db'}")
    theirs = MlflowClient(f"sqlite:///{tmp_path / 'theirs.db'}")
    assert (cache / "mlflow" / f"schema-{mlflow.__version__}.db").is_file()
    assert _dump(tmp_path / "ours.db") == _dump(tmp_path / "theirs.db")
    default = [(e.experiment_id, e.name, e.artifact_location) for e in ours.search_experiments()]
    assert default == [(e.experiment_id, e.name, e.artifact_location)
                       for e in theirs.search_experiments()]
    assert default == [("0", "Default", str(tmp_path / "mlruns" / "0"))]


def test_a_new_store_is_a_copy_of_the_cached_template(tmp_path, cache):
    template = tracking.schema_template()
    con = sqlite3.connect(template)
    con.execute("CREATE TABLE marker (x INTEGER)")  # only a copy of this file has it
    con.commit()
    con.close()
    # an empty file (touched, never built) is no store: it gets the template too
    (tmp_path / "empty.db").touch()
    for name in ("new.db", "empty.db"):
        tracking.open_client(f"sqlite:///{tmp_path / name}").search_experiments()
        tables = {r[0] for r in sqlite3.connect(tmp_path / name).execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "marker" in tables and "experiments" in tables, name
    assert not list(tmp_path.glob(".*.partial"))


def test_an_existing_store_is_never_replaced_by_the_template(tmp_path, cache):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = tracking.open_client(uri)
    run = client.create_run(client.create_experiment("kept"))
    client.log_metric(run.info.run_id, "m", 1.0)
    tracking.open_client(uri)
    # read the file itself: MLflow keeps one store object per URI in a process, whose open
    # connection would still see a file that was replaced
    con = sqlite3.connect(tmp_path / "mlruns.db")
    assert con.execute("SELECT run_uuid FROM runs").fetchall() == [(run.info.run_id,)]
    con.close()


def test_the_template_is_one_per_mlflow_version(cache, monkeypatch):
    first = tracking.schema_template()
    monkeypatch.setattr(mlflow, "__version__", "0.0.0-other")
    other = tracking.schema_template()
    assert first != other and first.is_file() and other.is_file()
    assert other.name == "schema-0.0.0-other.db"


def test_a_template_that_fails_to_build_is_not_left_behind_and_mlflow_builds_the_store(
        tmp_path, cache, monkeypatch):
    import mlflow.store.db.utils as db_utils

    real = db_utils._initialize_tables

    def half_then_fail(engine):
        with engine.begin() as con:
            con.exec_driver_sql("CREATE TABLE half (x INTEGER)")
        raise RuntimeError("migration failed halfway")

    monkeypatch.setattr(db_utils, "_initialize_tables", half_then_fail)
    assert tracking.schema_template() is None
    assert not list((cache / "mlflow").glob("*.db")) and not list((cache / "mlflow").glob(".*"))
    monkeypatch.setattr(db_utils, "_initialize_tables", real)
    client = tracking.open_client(f"sqlite:///{tmp_path / 'mlruns.db'}")
    assert [e.name for e in client.search_experiments()] == ["Default"]


def test_an_unwritable_cache_leaves_the_store_to_mlflow(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("RLBENCH_CACHE", str(blocker))  # root cannot mkdir under a file either
    assert tracking.schema_template() is None
    client = tracking.open_client(f"sqlite:///{tmp_path / 'mlruns.db'}")
    assert [e.name for e in client.search_experiments()] == ["Default"]
