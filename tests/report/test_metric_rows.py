"""Metric histories written and read in bulk on a database-backed store
(harness/report/metric_rows.py) leave the store as ``log_batch`` leaves it and read back as
``get_metric_history`` reads it: the same points, latest values and export bytes, with NaN,
infinities, exact duplicates and points tied on step and timestamp."""

from __future__ import annotations

import gzip
import json
import math

import pytest
from mlflow.tracking import MlflowClient

from harness.report import provenance
from harness.report.metric_rows import is_database, read_histories
from harness.tracking import open_client

# per key: [step, value, timestamp] as an export holds them (NaN and infinities included)
METRICS = {
    "loss": [[0, 1.0, 10], [1, 0.5, 20], [2, math.nan, 30], [3, 0.25, 40]],
    "tied": [[5, 0.3, 50], [5, 0.7, 50], [5, 0.1, 50], [4, 0.9, 60]],  # latest: largest value
    "dup": [[1, 0.2, 11], [1, 0.2, 11], [2, 0.4, 12]],  # an exact duplicate is kept once
    "inf": [[0, math.inf, 5], [1, -math.inf, 6]],
    "last_nan": [[0, 0.5, 1], [1, math.nan, 2]],  # the latest value is NaN
    "final/heldout/pass_at_1": [[60, 0.21, 99]],
    "nan_tie": [[7, 0.5, 70], [7, math.nan, 70]],  # NaN sorts and ranks as the 0 it is stored as
    "zero_nan": [[3, 0.0, 30], [3, math.nan, 30]],  # tied on (step, time, stored): first is latest
    "order": [[1, 0.5, 90], [2, 0.4, 85], [2, 0.1, 80], [1, 0.9, 80]],  # time order != step order
}
MANY = {"m": [[s, s / 1000.0, 1000 + s] for s in range(2500)]}  # over one log_batch's 1,000


def _export(path, records: list[dict]) -> None:
    with gzip.open(path, "wt") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")


def _record(run_id: str, metrics: dict) -> dict:
    return {"run_id": run_id, "status": "FINISHED", "start_time": 1, "end_time": 2,
            "tags": {"rlbench.algorithm": "grpo"}, "params": {"seed": "0"}, "metrics": metrics}


def _load(tmp_path, name: str, bulk: bool, monkeypatch) -> MlflowClient:
    uri = f"sqlite:///{tmp_path / name}.db"
    src = tmp_path / "in.jsonl.gz"
    _export(src, [_record("a" * 32, METRICS), _record("b" * 32, MANY)])
    with monkeypatch.context() as m:
        m.setattr(provenance, "is_database", lambda uri: bulk)
        assert provenance.import_runs(src, uri, "x") == (2, 0)
    return open_client(uri)


def _store(client: MlflowClient) -> dict:
    """Everything the board reads of the runs: latest values, histories in the client's
    order, params and tags, by original run id."""
    exp = client.get_experiment_by_name("x")
    out = {}
    for run in client.search_runs([exp.experiment_id]):
        rid = run.info.run_id
        hist = {k: [(m.step, repr(m.value), m.timestamp)
                    for m in client.get_metric_history(rid, k)] for k in run.data.metrics}
        tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
        out[tags[provenance.EXPORTED_ID_TAG]] = (
            {k: repr(v) for k, v in run.data.metrics.items()}, hist, run.data.params, tags,
            run.info.status)
    return out


def test_database_uris_are_told_from_servers_and_folders():
    assert is_database("sqlite:////tmp/x.db") and is_database("postgresql+psycopg2://h/db")
    assert not is_database("http://127.0.0.1:5000") and not is_database("file:///tmp/mlruns")
    assert not is_database("/tmp/mlruns")


@pytest.mark.slow
def test_bulk_import_leaves_the_store_as_log_batch_does(tmp_path, monkeypatch):
    bulk = _store(_load(tmp_path, "bulk", True, monkeypatch))
    plain = _store(_load(tmp_path, "plain", False, monkeypatch))
    assert bulk == plain
    latest, hist, *_ = bulk["a" * 32]
    assert latest["tied"] == repr(0.7) and latest["last_nan"] == "nan"
    assert latest["nan_tie"] == repr(0.5) and latest["zero_nan"] == repr(0.0)
    assert latest["inf"] == repr(-1.7976931348623157e308)
    assert len(hist["dup"]) == 2 and len(bulk["b" * 32][1]["m"]) == 2500


def test_bulk_export_writes_the_bytes_the_per_key_export_writes(tmp_path, monkeypatch):
    client = _load(tmp_path, "store", True, monkeypatch)
    ids = [r.info.run_id for r in client.search_runs(
        [client.get_experiment_by_name("x").experiment_id])]
    fast = provenance.export_runs(client, ids, tmp_path / "fast.jsonl.gz").read_bytes()
    with monkeypatch.context() as m:
        m.setattr(provenance, "is_database", lambda uri: False)
        slow = provenance.export_runs(client, ids, tmp_path / "slow.jsonl.gz").read_bytes()
    assert fast == slow
    back = {r["run_id"]: r for r in provenance.read_export(tmp_path / "fast.jsonl.gz")}
    assert back["a" * 32]["metrics"]["tied"] == [[4, 0.9, 60], [5, 0.1, 50], [5, 0.3, 50],
                                                  [5, 0.7, 50]]


@pytest.mark.parametrize("bulk", [True, False])
@pytest.mark.slow
def test_importing_an_export_twice_with_skip_present_loads_it_once(tmp_path, monkeypatch, bulk):
    client = _load(tmp_path, "twice", bulk, monkeypatch)
    uri = str(client.tracking_uri)
    with monkeypatch.context() as m:
        m.setattr(provenance, "is_database", lambda uri: bulk)
        assert provenance.import_runs(tmp_path / "in.jsonl.gz", uri, "x",
                                      skip_present=True) == (0, 2)


def test_histories_read_in_bulk_come_in_get_metric_history_order(tmp_path, monkeypatch):
    client = _load(tmp_path, "order", True, monkeypatch)
    uri = str(client.tracking_uri)
    for run in client.search_runs([client.get_experiment_by_name("x").experiment_id]):
        rid = run.info.run_id
        bulk = read_histories(uri, rid)
        assert set(bulk) == set(run.data.metrics)
        for key in run.data.metrics:
            one_by_one = [(m.step, repr(m.value), m.timestamp)
                          for m in client.get_metric_history(rid, key)]
            assert [(s, repr(v), t) for s, v, t in bulk[key]] == one_by_one, key
    order = read_histories(uri, next(r.info.run_id for r in client.search_runs(
        [client.get_experiment_by_name("x").experiment_id]) if "order" in r.data.metrics))
    assert order["order"] == [(1, 0.9, 80), (2, 0.1, 80), (2, 0.4, 85), (1, 0.5, 90)]
    assert [repr(v) for _, v, _ in order["nan_tie"]] == ["nan", "0.5"]
