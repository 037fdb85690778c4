"""The shared fixtures of tests/conftest.py that change what a test starts from."""

from __future__ import annotations

import sqlite3


def test_a_subprocess_store_starts_as_mlflow_leaves_a_new_one(cli_env, tmp_path):
    """``cli_env``'s store is a copy of one MLflow migrated: at the newest schema (MLflow
    opens it without migrating), with no experiment or run in it and no path of another
    test's."""
    import sqlalchemy
    from mlflow.store.db import utils
    from mlflow.tracking import MlflowClient

    db = cli_env["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from experiments").fetchone() == (0,)
        assert conn.execute("select count(*) from runs").fetchone() == (0,)
        dump = "\n".join(conn.iterdump())
    assert "/tmp" not in dump and "pytest" not in dump
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    assert utils._all_tables_exist(engine)
    utils._verify_schema(engine)  # raises when the schema is behind the installed MLflow
    engine.dispose()
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    exp = client.create_experiment("x", artifact_location=(tmp_path / "a").as_uri())
    assert client.get_experiment(exp).name == "x"
