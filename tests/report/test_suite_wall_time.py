"""benchmarks/suite_wall_time.py: the suite's measured cell seconds, its machine runs and the
projection of the unfinished cells against the 6-hour target are read from exports only."""

from __future__ import annotations

import gzip
import json

from tests.helpers import load_benchmark

wall_time = load_benchmark("suite_wall_time")
PAIRS = [("grpo", "a")] * 2 + [("cispo", "a")] * 2 + [("grpo", "b")] * 2 + [("cispo", "b")] * 2


def _run(i: int, alg: str, task: str, wall: float, start: float, sweep: str = "suite",
         status: str = "FINISHED") -> dict:
    tags = {"rlbench.sweep": sweep, "rlbench.algorithm": alg, "rlbench.task": task,
            "rlbench.git_commit": "c0ffee", "rlbench.kind": "train"}
    return {"run_id": f"r{i}", "status": status, "start_time": start * 1e3,
            "end_time": (start + wall) * 1e3, "tags": tags, "params": {},
            "metrics": {"final/wall_s": [[0, wall, 0]]}}


def _export(tmp_path, runs) -> str:
    path = tmp_path / "runs.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in runs)
    return str(path)


def test_unfinished_cells_are_projected_from_their_pair_else_task_mean_times_ratio(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(wall_time, "suite_cells", lambda: PAIRS)
    runs = [_run(0, "grpo", "a", 10, 0), _run(1, "grpo", "a", 20, 0),
            _run(2, "cispo", "a", 30, 10), _run(3, "grpo", "b", 100, 20),
            # not the suite's, or not finished: never counted
            _run(4, "grpo", "b", 1e6, 20, sweep="other"),
            _run(5, "grpo", "b", 1e6, 20, status="KILLED")]
    assert wall_time.main([_export(tmp_path, runs)]) == 0
    out = capsys.readouterr().out
    assert "4 of 8 suite cells FINISHED" in out
    # cispo x a: 1 left at its pair's mean 30; grpo x b: 1 left at 100; cispo x b: 2 left at
    # b's mean 100 x cispo's ratio to grpo on a (30 / 15 = 2) = 200 each
    assert "160 finished + 530 projected = 690" in out


def test_machine_runs_are_split_at_gaps_and_their_overhead_is_what_cells_did_not_use(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(wall_time, "suite_cells", lambda: PAIRS[:4])
    runs = [_run(0, "grpo", "a", 100, 0), _run(1, "grpo", "a", 100, 0),  # 100 s, 2 workers busy
            _run(2, "cispo", "a", 50, 3600), _run(3, "cispo", "a", 50, 3620)]  # 2nd idles 20 s
    assert wall_time.main([_export(tmp_path, runs), "--gap", "10"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1 |") or
            line.startswith("| 2 |")]
    assert len(rows) == 2
    assert rows[0].startswith("| 1 | 2 |") and rows[0].endswith("| 0.0% |")  # 200 in 2 x 100
    assert rows[1].startswith("| 2 | 2 |") and rows[1].endswith("| 28.6% |")  # 100 in 2 x 70
    assert "overhead share 11.8%" in out  # 300 cell-s in 2 x 100 + 2 x 70 worker-s


def test_a_machine_run_on_one_worker_is_not_counted_as_an_idle_second_worker(
        tmp_path, monkeypatch, capsys):
    """A sweep started with one worker (cells back to back) has one worker's time to fill: its
    overhead is what that worker did outside cells, and the projection's share is pooled over
    the machine runs at their own worker counts."""
    monkeypatch.setattr(wall_time, "suite_cells", lambda: PAIRS[:4])
    runs = [_run(0, "grpo", "a", 100, 0), _run(1, "grpo", "a", 100, 0),
            _run(2, "cispo", "a", 50, 3600), _run(3, "cispo", "a", 45, 3655)]  # 5 s between
    assert wall_time.main([_export(tmp_path, runs), "--gap", "10"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | 1 | 0.03 | 2 |" in out and "| 5.0% |" in out, out
    assert "overhead share 1.7%" in out  # 295 cell-s in 2 x 100 + 1 x 100 worker-s


def test_no_suite_runs_is_said_and_exit_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(wall_time, "suite_cells", lambda: PAIRS)
    assert wall_time.main([_export(tmp_path, [_run(0, "grpo", "a", 1, 0, sweep="x")])]) == 1
    assert "no FINISHED suite runs" in capsys.readouterr().out


def test_a_cell_resumed_in_a_later_machine_run_is_counted_in_the_run_that_finished_it(
        tmp_path, monkeypatch, capsys):
    """A cell killed as one machine run stops and resumed in the next keeps its MLflow run and
    start time; placed by its start it would join the two runs into one spanning the gap."""
    monkeypatch.setattr(wall_time, "suite_cells", lambda: PAIRS[:4])
    resumed = _run(2, "cispo", "a", 50, 0)
    resumed["end_time"] = 3700 * 1e3  # started at 0, killed, finished at 3,700 s after 50 s
    runs = [_run(0, "grpo", "a", 100, 0), _run(1, "grpo", "a", 100, 0), resumed,
            _run(3, "cispo", "a", 50, 3600)]
    assert wall_time.main([_export(tmp_path, runs), "--gap", "10"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 0.03 | 2 |" in out and "| 2 | 0.03 | 2 |" in out, out


def test_workers_are_cells_running_at_a_cells_midpoint_not_edges_that_touch():
    """A resumed cell placed by its last stretch may overlap its neighbour by seconds on a
    one-worker run: still one worker; two cells side by side for most of their time are two."""
    assert wall_time.workers([(0, 100, 100), (98, 200, 102)]) == 1
    assert wall_time.workers([(0, 100, 100), (10, 120, 110)]) == 2
    assert wall_time.workers([(0, 100, 100), (0, 100, 100), (100, 150, 50)]) == 2
