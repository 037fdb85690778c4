"""Metric histories of whole runs read and written in one statement on a database-backed MLflow
store (SQLite, PostgreSQL, MySQL, MSSQL).

``rlbench board --runs`` and ``rlbench import`` load an export point by point, and a board's
export reads every metric's history back: through ``MlflowClient`` that is one ``log_batch`` per
1,000 points, each going through the ORM and the latest-value bookkeeping point by point, and one
``get_metric_history`` query per key. For the committed boards (a few hundred runs of a few
thousand points each) that is most of a rebuild. Here the same rows go in and come out through
MLflow's own table models (``SqlMetric``, ``SqlLatestMetric``) with SQLAlchemy Core: the
points as ``log_batch`` stores them (NaN as 0 with ``is_nan``, ±inf as ±max double, an exact
duplicate kept once), the latest value per key by MLflow's rule (largest ``(step, timestamp,
value)``, the first of equals), and histories in ``get_metric_history``'s order. A server
(``http://``) or a file store goes through ``MlflowClient`` as before
(:func:`harness.report.provenance.import_runs`). ``tests/report/test_metric_rows.py`` checks
both paths give the same store.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterable
from urllib.parse import urlsplit

from mlflow.store.db.db_types import DATABASE_ENGINES

__all__ = ["is_database", "read_histories", "write_histories"]

Point = tuple[int, float, int]  # step, value, timestamp (ms), as an export holds them
_DOUBLE_MAX = 1.7976931348623157e308  # what MLflow stores for ±inf (SQL has none)


def is_database(uri: str) -> bool:
    """Whether ``uri`` names a database MLflow's SQLAlchemy store opens (``sqlite:///...``,
    ``postgresql+psycopg2://...``), not a server or a folder."""
    return urlsplit(uri).scheme.partition("+")[0] in DATABASE_ENGINES


@functools.lru_cache(maxsize=16)
def _engine(uri: str):
    """One engine per store. The store was opened by ``MlflowClient`` first (its runs were
    created or read through it), which migrated a new database; checking the schema again on
    every call (alembic's revision map) costs more than the rows."""
    from mlflow.store.db.utils import create_sqlalchemy_engine_with_retry

    return create_sqlalchemy_engine_with_retry(uri)


def _stored(value: float) -> tuple[float, bool]:
    """A value as MLflow's SQL store holds it: (value, is_nan)."""
    if math.isnan(value):
        return 0.0, True
    if math.isinf(value):
        return math.copysign(_DOUBLE_MAX, value), False
    return value, False


def write_histories(uri: str, histories: Iterable[tuple[str, dict[str, list[Point]]]]) -> None:
    """Insert each run's metric points (``run_id -> {key: [(step, value, timestamp), ...]}``)
    and its latest value per key; the runs exist and have logged no metric yet."""
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric

    points, latest = [], []
    for run_id, metrics in histories:
        for key, history in metrics.items():
            seen: set[tuple] = set()
            last: dict | None = None
            for step, value, timestamp in history:
                stored, is_nan = _stored(float(value))
                row = {"run_uuid": run_id, "key": key, "value": stored, "is_nan": is_nan,
                       "step": int(step), "timestamp": int(timestamp)}
                identity = (row["timestamp"], row["step"], stored, is_nan)
                if identity in seen:  # log_batch keeps one of exact duplicates
                    continue
                seen.add(identity)
                points.append(row)
                if last is None or (row["step"], row["timestamp"], stored) > (
                        last["step"], last["timestamp"], last["value"]):
                    last = row
            if last is not None:
                latest.append(last)
    if not points:
        return
    with _engine(uri).begin() as conn:
        conn.execute(SqlMetric.__table__.insert(), points)
        conn.execute(SqlLatestMetric.__table__.insert(), latest)


def read_histories(uri: str, run_id: str) -> dict[str, list[Point]]:
    """Every metric history of ``run_id``: ``key -> [(step, value, timestamp), ...]`` in the
    order ``get_metric_history`` returns (timestamp, step, value), NaN restored (ordered at the
    0 it is stored as)."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels.models import SqlMetric

    t = SqlMetric.__table__
    query = (sa.select(t.c.key, t.c.step, t.c.value, t.c.timestamp, t.c.is_nan)
             .where(t.c.run_uuid == run_id)
             .order_by(t.c.timestamp, t.c.step, t.c.value))  # the keys are split below
    out: dict[str, list[Point]] = defaultdict(list)
    with _engine(uri).connect() as conn:
        for key, step, value, timestamp, is_nan in conn.execute(query):
            out[key].append((step, math.nan if is_nan else value, timestamp))
    return dict(out)
