"""The LANTERN track end to end through the CLI: a Hydra sweep logging to MLflow, the skip of
finished cells, the leaderboard built from those runs, and bad input named clearly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from harness.cli import main as cli_main
from harness.tracking import open_client
from lantern.track import compose, run_cell

RLBENCH = [sys.executable, "-m", "harness.cli"]
SMALL = ["train.episodes=20", "train.max_steps=60", "eval.every=10", "eval.episodes=1",
         "source.episodes=100"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "MLFLOW_TRACKING_URI": ""}


def _rlbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*RLBENCH, *args], env=_env(), cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_sweep_logs_runs_skips_finished_cells_and_builds_the_leaderboard(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    sweep = ["sweep", "track=lantern", "agent=qlearning,lantern", "task=office_cmo",
             "seed=0", f"tracking.uri={uri}", *SMALL]
    out = _rlbench(*sweep, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    client = open_client(uri)
    exp = client.get_experiment_by_name("lantern")
    runs = client.search_runs([exp.experiment_id], "tags.`rlbench.kind` = 'lantern'")
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["rlbench.agent"] for r in runs} == {"qlearning", "lantern"}
    metrics = runs[0].data.metrics
    for key in ("final/episodes_to_threshold", "final/auc", "final/success", "eval/success"):
        assert key in metrics
    assert len(client.get_metric_history(runs[0].info.run_id, "eval/success")) == 2

    again = _rlbench(*sweep, cwd=tmp_path)  # every cell FINISHED: all skipped
    assert again.returncode == 0 and again.stdout.count("[lantern] skip") == 2
    assert len(client.search_runs([exp.experiment_id], "tags.`rlbench.kind` = 'lantern'")) == 2

    cli_main(["board", "--track", "lantern", "--tracking-uri", uri, "--out", str(tmp_path / "lb"),
              "--allow-dirty"])
    page = (tmp_path / "lb" / "office_cmo" / "leaderboard.md").read_text()
    assert "| qlearning | 1 |" in page and "| lantern | 1 |" in page
    csv_text = (tmp_path / "lb" / "office_cmo" / "leaderboard.csv").read_text()
    assert "episodes to threshold" in csv_text
    assert (tmp_path / "lb" / "office_cmo" / "success.png").stat().st_size > 1000
    index = (tmp_path / "lb" / "README.md").read_text()
    assert "office_cmo" in index and "Runs from commit `" in index
    boards = client.search_runs([exp.experiment_id], "tags.`rlbench.kind` = 'leaderboard'")
    assert len(boards) == 1


def test_source_training_records_the_experience_its_automaton_values_average_over():
    from lantern.agent import automaton_values
    from lantern.track import train_source

    cfg = compose(["tracking.enabled=false", *SMALL])
    src, _ = train_source(cfg, cfg.task.sources[0])
    assert src.visits is not None and src.visits.shape == src.q.shape
    assert src.visits.sum() >= cfg.source.episodes  # one count per step taken
    values = automaton_values(src)
    w = int(np.argmax(src.visits.sum(axis=(0, 2))))
    assert values[w] == pytest.approx((src.q[:, w] * src.visits[:, w]).sum()
                                      / src.visits[:, w].sum())


@pytest.mark.slow
def test_unknown_agent_exits_2_listing_the_valid_agents(tmp_path):
    out = _rlbench("train", "track=lantern", "agent=lanter", cwd=tmp_path)
    assert out.returncode == 2
    assert "lanter" in out.stderr and "lantern" in out.stderr and "qlearning" in out.stderr


def test_bad_keys_and_values_name_the_key():
    with pytest.raises(Exception, match=r"unknown config key agent\.gates.*valid keys"):
        run_cell(compose(["agent=lantern", "+agent.gates=and", "tracking.enabled=false"]))
    with pytest.raises(Exception, match=r"agent\.gate='or' is not one of"):
        run_cell(compose(["agent=lantern", "agent.gate=or", "tracking.enabled=false"]))
    with pytest.raises(Exception, match=r"descriptoin"):
        compose(["task.descriptoin=get coffee"])
    with pytest.raises(Exception, match=r"unknown subgoal 'get tea'.*get coffee"):
        run_cell(compose(["task.description='get tea, then go to the office'",
                          "tracking.enabled=false", *SMALL]))
    with pytest.raises(Exception, match=r"unknown DFA generator 'gpt'.*llm, template"):
        run_cell(compose(["dfa.generator=gpt", "tracking.enabled=false", *SMALL]))


@pytest.mark.slow
def test_an_aa_cell_is_paired_on_its_block_seed_and_a_plain_cell_hashes_as_before(tmp_path):
    # conf/lantern/sweep/targets_aa.yaml: seed 12 trains on its own seed and is paired with the
    # baseline's seed 2; a run without block_seed keeps the config hash it had before the key
    # existed, so the committed boards' cells still skip
    from harness.cell_plan import config_hash

    aa = compose(["sweep=targets_aa", "agent=qlearning_opt", "seed=12", "tracking.enabled=false"])
    assert aa.block_seed == 2 and aa.agent.label == "qlearning_opt_aa"
    plain = compose(["agent=qlearning_opt", "seed=2"])
    assert plain.block_seed is None
    without_key = OmegaConf.to_container(plain, resolve=True)
    del without_key["block_seed"]
    assert config_hash(plain) == config_hash(without_key)
    assert config_hash(OmegaConf.merge(plain, {"block_seed": 2})) != config_hash(plain)

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    run_cell(compose(["sweep=targets_aa", "agent=qlearning_opt", "seed=12",
                      f"tracking.uri={uri}", *SMALL]))
    (run,) = MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("lantern").experiment_id])
    assert run.data.tags["rlbench.seed"] == "2" and run.data.tags["rlbench.train_seed"] == "12"
    assert run.data.tags["rlbench.agent"] == "qlearning_opt_aa"
    with pytest.raises(Exception, match=r"block_seed must be a seed label >= 0"):
        run_cell(compose(["agent=qlearning_opt", "block_seed=-1", "tracking.enabled=false",
                          *SMALL]))
