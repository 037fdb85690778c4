"""benchmarks/machine_drift.py: the same cells (config hash) from two exports are paired, their
finals printed side by side and the mean absolute difference set beside the seed SD; cells in
one export only, unfinished runs and runs that are not training runs are left out."""

from __future__ import annotations

import gzip
import json

from tests.helpers import load_benchmark

drift = load_benchmark("machine_drift")


def _run(h: str, seed: int, final: float, cpu: str, status: str = "FINISHED",
         kind: str = "train", key: str = "final/heldout/pass_at_1") -> dict:
    tags = {"rlbench.config_hash": h, "rlbench.algorithm": "grpo", "rlbench.task": "countdown",
            "rlbench.seed": str(seed), "rlbench.kind": kind, "rlbench.cpu": cpu,
            "rlbench.git_commit": "c0ffee"}
    return {"run_id": h + cpu, "status": status, "tags": tags, "params": {},
            "metrics": {key: [[60, final, 0]], "actor/pg_loss": [[1, 0.5, 0], [2, 0.25, 0]]}}


def _export(path, runs) -> str:
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in runs)
    return str(path)


def test_cells_are_paired_by_config_hash_and_their_finals_compared(tmp_path, capsys):
    a = _export(tmp_path / "a.jsonl.gz", [
        _run("h0", 0, 0.20, "AVX512"), _run("h1", 1, 0.30, "AVX512"),
        _run("h2", 2, 0.40, "AVX512"),  # not in b: left out of the pairs
        _run("h3", 3, 0.9, "AVX512", status="KILLED"),  # unfinished: left out
    ])
    b = _export(tmp_path / "b.jsonl.gz", [
        _run("h0", 0, 0.22, "AVX2"), _run("h1", 1, 0.26, "AVX2"),
        _run("h3", 3, 0.1, "AVX2"), _run("hx", 0, 0.5, "AVX2", kind="eval")])
    assert drift.main([a, b]) == 0
    out = capsys.readouterr().out
    cells = [ln for ln in out.splitlines() if ln.startswith("| countdown | grpo")]
    assert len(cells) == 2
    assert cells[0].endswith("| AVX512 | AVX2 | c0ffee | c0ffee | 0.5, 0.25 | 0.5, 0.25 | "
                             "0.2000 | 0.2200 |")
    # mean |a - b| = (0.02 + 0.04) / 2; seed SD of a's grpo finals (0.2, 0.3, 0.4) = 0.1
    assert "| countdown | 2 | 0.0300 | 0.1000 |" in out


def test_two_exports_without_a_shared_cell_exit_2(tmp_path, capsys):
    a = _export(tmp_path / "a.jsonl.gz", [_run("h0", 0, 0.2, "x")])
    b = _export(tmp_path / "b.jsonl.gz", [_run("h1", 0, 0.2, "y")])
    assert drift.main([a, b]) == 2
    assert "no cell of" in capsys.readouterr().err
