"""The LANTERN board's provenance, as for every board: a dirty checkout is refused unless
allowed (and then the index says so), the index names the build commit and the two commands that
reproduce it, each task's runs are exported beside its page, and a cell run twice is never pooled
(the newest run is used, the others are listed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.entities import Metric

import lantern.transfer_board as board
from harness.report import provenance
from harness.report.config import BoardError
from harness.report.provenance import Checkout, read_export
from harness.tracking import open_client


def _store(tmp_path: Path, cells: list[tuple[str, int, float]]) -> tuple[str, list[str]]:
    """LANTERN runs (agent, seed, episodes to threshold) on one task, started in list order."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("lantern", artifact_location=(tmp_path / "a").as_uri())
    ids = []
    for i, (agent, seed, episodes) in enumerate(cells):
        tags = {"rlbench.kind": "lantern", "rlbench.task": "office_cmo", "rlbench.agent": agent,
                "rlbench.seed": str(seed), "rlbench.git_commit": "f" * 40}
        rid = client.create_run(exp, start_time=1000 + i, tags=tags).info.run_id
        client.log_batch(rid, metrics=[
            Metric("final/episodes_to_threshold", episodes, 0, 0),
            Metric("final/steps_to_threshold", 10 * episodes, 0, 0),
            Metric("final/auc", 0.5, 0, 0), Metric("final/success", 1.0, 0, 0),
            Metric("final/reached", 1.0, 0, 0),
            Metric("eval/success", 0.0, 0, 0), Metric("eval/success", 1.0, 0, 10)])
        client.set_terminated(rid, "FINISHED", end_time=10_000 - i)  # later start, earlier end
        ids.append(rid)
    return uri, ids


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.setattr(provenance, "checkout", lambda out: Checkout("c" * 40, ()))


def test_a_cell_run_twice_uses_the_newest_run_and_lists_the_other(tmp_path, clean):
    uri, ids = _store(tmp_path, [("qlearning", 0, 300.0), ("qlearning", 0, 500.0),
                                 ("qlearning", 0, 100.0), ("qlearning", 1, 200.0),
                                 ("lantern", 0, 10.0), ("lantern", 1, 12.0)])
    board.build_board(uri, out=str(tmp_path / "lb"), log_to_mlflow=False)
    page = (tmp_path / "lb" / "office_cmo" / "leaderboard.md").read_text()
    assert "| qlearning | 2 | 2/2 | 150.0" in page  # seeds 0 (newest start: 100) and 1 (200)
    assert f"- **qlearning** seed 0: `{ids[2]}` (used), `{ids[1]}`, `{ids[0]}`" in page
    index = (tmp_path / "lb" / "README.md").read_text()
    assert "(2 duplicate runs of a cell left out" in index  # runs, not cells


def test_index_names_the_commit_and_the_two_commands_and_the_runs_are_exported(tmp_path, clean):
    uri, ids = _store(tmp_path, [("qlearning", 0, 300.0), ("qlearning", 0, 100.0),
                                 ("lantern", 0, 10.0)])
    written = board.build_board(uri, out=str(tmp_path / "lb"), log_to_mlflow=False)
    index = (tmp_path / "lb" / "README.md").read_text()
    assert f"Board built at commit `{'c' * 40}`." in index
    assert (f"- Reproduce (from the repository root, at the runs' commit `{'f' * 12}`): "
            "`rlbench sweep track=lantern sweep=targets` and `rlbench sweep track=lantern "
            "sweep=targets_aa` (the A/A control), then `rlbench board --track lantern "
            "--out leaderboards/lantern`.") in index
    export = tmp_path / "lb" / "office_cmo" / "runs.jsonl.gz"
    assert export in written
    assert sorted(r["run_id"] for r in read_export(export)) == sorted(ids)  # duplicates too


def test_a_dirty_checkout_is_refused_unless_allowed_and_then_the_index_says_so(tmp_path,
                                                                              monkeypatch):
    uri, _ = _store(tmp_path, [("qlearning", 0, 300.0), ("lantern", 0, 10.0)])
    dirty = Checkout("d" * 40, ("lantern/agent.py",))
    monkeypatch.setattr(provenance, "checkout", lambda out: dirty)
    with pytest.raises(BoardError, match=r"uncommitted changes \(1 path\(s\): lantern/agent.py"):
        board.build_board(uri, out=str(tmp_path / "lb"), log_to_mlflow=False)
    assert not (tmp_path / "lb").exists()  # refused before writing anything
    board.build_board(uri, out=str(tmp_path / "lb"), log_to_mlflow=False, allow_dirty=True)
    assert "built with --allow-dirty" in (tmp_path / "lb" / "README.md").read_text()
