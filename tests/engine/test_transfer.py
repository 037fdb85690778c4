"""Sweeps carried between machines (harness/cli/transfer.py): ``rlbench export`` writes a store's
finished runs, ``rlbench import`` loads them into another store once, and a sweep there skips
their cells; stores that never meet merge at the board (``--runs`` twice) into the board one
store gives. The sweeps are real ``rlbench sweep`` processes; export, import and board run in
this process (argparse commands)."""

from __future__ import annotations

import csv
import gzip
import re
from pathlib import Path

import pytest

from harness.tracking import open_client
from tests.helpers import QUIET_RUN, rlbench

SWEEP = ["sweep", "algorithm=grpo", *QUIET_RUN, "trainer.steps=2", "trainer.eval_every=2",
         "trainer.status_every=0"]
MACHINE = ("time/", "final/wall_s", "final/warm_start_s", "final/time_", "final/peak_mem_mb")


def _uri(tmp: Path, name: str) -> str:
    return f"sqlite:///{tmp / f'{name}.db'}"


def _sweep(tmp: Path, env: dict[str, str], store: str, seeds: str):
    proc = rlbench(*SWEEP, f"seed={seeds}", env={**env, "MLFLOW_TRACKING_URI": _uri(tmp, store)},
                   cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _runs(uri: str) -> dict[str, object]:
    """seed -> the FINISHED training run of that seed (one each)."""
    client = open_client(uri)
    runs = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    out: dict[str, object] = {}
    for run in runs:
        assert run.info.status == "FINISHED"
        seed = run.data.tags["rlbench.seed"]
        assert seed not in out, f"seed {seed} twice in {uri}"
        out[seed] = run
    return out


def _numbers(run) -> dict[str, float]:
    return {k: v for k, v in run.data.metrics.items() if not k.startswith(MACHINE)}


def _table(board: Path) -> list[list[str]]:
    """The leaderboard's rows, less the columns that measure the machine (wall seconds, peak
    memory) or name the runs: what two stores that trained the same cells must agree on."""
    [path] = board.glob("**/leaderboard.csv")
    with path.open() as fh:
        rows = list(csv.reader(fh))
    keep = [i for i, name in enumerate(rows[0])
            if not name.startswith(("wall_s", "peak_mem", "peak_gpu_mem")) and name != "run_ids"]
    assert len(keep) > 20  # the metric columns are all still compared
    return [[row[i] for i in keep] for row in rows]


@pytest.mark.slow
def test_a_sweep_split_over_two_stores_continues_and_merges_into_one_stores_board(
        tmp_path, cli_env, rlbench_in_process):
    _sweep(tmp_path, cli_env, "a", "0")
    _sweep(tmp_path, cli_env, "b", "1")
    _sweep(tmp_path, cli_env, "one", "0,1")
    for store in ("a", "b"):
        done = rlbench_in_process("export", "--out", str(tmp_path / f"{store}.jsonl.gz"),
                                  cwd=tmp_path, env={"MLFLOW_TRACKING_URI": _uri(tmp_path, store)})
        assert done.returncode == 0 and "exported 1 FINISHED" in done.stdout, done.stderr
    with gzip.open(tmp_path / "a.jsonl.gz", "rt") as fh:
        assert len(fh.readlines()) == 1

    # continue anywhere: a fresh store loads a's export (twice: once), and the sweep of both
    # seeds there trains seed 1 only
    fresh = {"MLFLOW_TRACKING_URI": _uri(tmp_path, "fresh")}
    for loaded in ("1 run(s) loaded, 0 already", "0 run(s) loaded, 1 already"):
        done = rlbench_in_process("import", "--runs", str(tmp_path / "a.jsonl.gz"),
                                  cwd=tmp_path, env=fresh)
        assert done.returncode == 0 and loaded in done.stdout, done.stdout + done.stderr
    swept = _sweep(tmp_path, cli_env, "fresh", "0,1")
    assert swept.stderr.count("skipped: run") == 1
    continued, one, b = (_runs(_uri(tmp_path, s)) for s in ("fresh", "one", "b"))
    assert sorted(continued) == ["0", "1"]
    assert continued["0"].data.tags["rlbench.exported_run_id"] == _runs(_uri(tmp_path, "a"))[
        "0"].info.run_id
    # the cell trained after the import is the cell any store trains, number for number
    assert _numbers(continued["1"]) == _numbers(b["1"]) == _numbers(one["1"])

    # stores that never met: their exports merge into the board of the one store
    merged = rlbench_in_process("board", "--runs", str(tmp_path / "a.jsonl.gz"), "--runs",
                                str(tmp_path / "b.jsonl.gz"), "--experiment", "rlbench",
                                "--out", str(tmp_path / "merged"), "--allow-dirty",
                                cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr[-3000:]
    whole = rlbench_in_process("board", "--experiment", "rlbench", "--out",
                               str(tmp_path / "whole"), "--allow-dirty", "--no-mlflow",
                               cwd=tmp_path, env={"MLFLOW_TRACKING_URI": _uri(tmp_path, "one")})
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert _table(tmp_path / "merged") == _table(tmp_path / "whole")
    # the same run in two exports is one run; the same cell trained in two stores is two runs
    # of one cell, reported on the page as a store's duplicates are
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "runs.jsonl.gz").write_bytes((tmp_path / "a.jsonl.gz").read_bytes())
    done = rlbench_in_process("export", "--out", str(tmp_path / "one.jsonl.gz"), cwd=tmp_path,
                              env={"MLFLOW_TRACKING_URI": _uri(tmp_path, "one")})
    assert done.returncode == 0, done.stderr
    for name, extra, duplicates in (("same", "copy", 0), ("cell", "one.jsonl.gz", 2)):
        board = rlbench_in_process(
            "board", "--runs", str(tmp_path / "a.jsonl.gz"), "--runs", str(tmp_path / "b.jsonl.gz"),
            "--runs", str(tmp_path / extra), "--experiment", "rlbench", "--out",
            str(tmp_path / name), "--allow-dirty", cwd=tmp_path)
        assert board.returncode == 0, board.stderr[-3000:]
        page = next((tmp_path / name).glob("**/leaderboard.md")).read_text()
        found = re.search(r"\((\d+) duplicates\)", page)  # printed only where there are some
        assert (int(found.group(1)) if found else 0) == duplicates, page[:3000]
        if not duplicates:
            assert _table(tmp_path / name) == _table(tmp_path / "whole")

def test_export_names_a_missing_store_or_experiment_in_one_line(tmp_path, rlbench_in_process):
    done = rlbench_in_process("export", "--out", str(tmp_path / "x.jsonl.gz"), cwd=tmp_path,
                              env={"MLFLOW_TRACKING_URI": _uri(tmp_path, "none")})
    assert done.returncode == 2 and "no MLflow store at" in done.stderr
    assert not (tmp_path / "none.db").exists()  # nothing created where nothing was
    open_client(_uri(tmp_path, "empty")).create_experiment("other")
    done = rlbench_in_process("export", "--experiment", "rlbench", "--out",
                              str(tmp_path / "x.jsonl.gz"), cwd=tmp_path,
                              env={"MLFLOW_TRACKING_URI": _uri(tmp_path, "empty")})
    assert done.returncode == 2 and "'rlbench': no such experiment" in done.stderr
    assert "'other'" in done.stderr


def test_import_refuses_a_file_that_is_not_an_export_naming_it(tmp_path, rlbench_in_process):
    bad = tmp_path / "runs.jsonl.gz"
    bad.write_bytes(b"not gzip")
    done = rlbench_in_process("import", "--runs", str(bad), cwd=tmp_path,
                              env={"MLFLOW_TRACKING_URI": _uri(tmp_path, "s")})
    assert done.returncode == 2 and f"--runs {bad}: not a runs export" in done.stderr
