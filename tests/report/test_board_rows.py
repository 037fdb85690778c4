"""A leaderboard row is one configuration (issue 20): runs that differ in any resolved key but
the seed are never pooled or superseded. The issue's scenario runs for real: a 1-step smoke run
of grpo seed 0 with other keys changed, in the demo's experiment, next to the demo's grpo runs,
must make ``rlbench board`` refuse (exit 2, one line naming the keys) or, split on the key, give
two rows; never a changed grpo row. The rest uses synthetic runs with params."""

from __future__ import annotations

import csv
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from harness.cli import compose_config
from harness.manifest import cpu_label
from harness.report.board import build_leaderboards as _build
from harness.report.collect import identity
from harness.report.config import BoardError
from harness.tracking import open_client
from tests.helpers import make_config

build_leaderboards = functools.partial(_build, allow_dirty=True, log_to_mlflow=False)
SMALL = ["data.prompts_per_step=4", "rollout.n=4", "task.tiny.eval.heldout.limit=16",
         "task.tiny.eval.heldout.n=4", "task.tiny.eval.heldout.k=[1,4]", "tracking.log_samples=0"]


def _csv(out):
    with open(out / "countdown-tiny" / "tiny" / "leaderboard.csv", newline="") as f:
        return {r["row"]: r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def smoke_store(tmp_path_factory, model_cache):
    """The demo's experiment with two short grpo runs (seeds 0, 1) of the demo's sweep, then a
    1-step smoke run of grpo seed 0 with another group size."""
    from harness.trainer import Trainer

    root = tmp_path_factory.mktemp("smoke")
    experiment = compose_config(["sweep=countdown_baselines"]).tracking.experiment
    common = ["sweep=countdown_baselines", "algorithm=grpo", *SMALL,
              f"tracking.experiment={experiment}"]
    ids = {}
    for name, extra in (("s0", ["seed=0", "trainer.steps=2"]),
                        ("s1", ["seed=1", "trainer.steps=2"]),
                        ("smoke", ["seed=0", "trainer.steps=1", "rollout.n=2"])):
        cfg = make_config(root / name, model_cache, *common, *extra,
                          f"tracking.uri=sqlite:///{root / 'mlruns.db'}")
        trainer = Trainer(cfg)
        trainer.fit()
        ids[name] = trainer.tracker.run_id
    return {"root": root, "uri": f"sqlite:///{root / 'mlruns.db'}", "experiment": experiment,
            "ids": ids}


@pytest.mark.slow
def test_smoke_run_in_the_demo_experiment_is_refused_naming_the_keys(smoke_store):
    out = smoke_store["root"] / "boards"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "board", "--tracking-uri",
                           smoke_store["uri"], "--experiment", smoke_store["experiment"],
                           "--out", str(out), "--no-mlflow", "--allow-dirty"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and len(err.splitlines()) == 1
    assert "row 'grpo' would mix configurations" in err
    assert "trainer.steps (2:" in err and "rollout.n (4:" in err
    assert smoke_store["ids"]["smoke"][:8] in err
    assert not (out / "countdown-tiny").exists()  # nothing written


@pytest.mark.slow
def test_training_runs_name_their_sweep_commit_and_cpu(smoke_store):
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    run = MlflowClient(smoke_store["uri"]).get_run(smoke_store["ids"]["s0"])
    assert run.data.tags["rlbench.sweep"] == "countdown_baselines"
    commit = run.data.tags["rlbench.git_commit"]
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", commit)
    if head:
        assert commit.startswith(head) or commit == "unknown"
    # the CPU and its kernels' instruction set: the same cell differs across them
    assert run.data.tags["rlbench.cpu"] == cpu_label()
    assert run.data.tags["rlbench.cpu"].rsplit(" / ", 1)[1] in {"DEFAULT", "AVX2", "AVX512",
                                                                 "NO AVX", "VSX", "ZVECTOR",
                                                                 "SVE256", "SVE"}


@pytest.mark.slow
def test_smoke_run_split_on_the_key_is_its_own_row(smoke_store):
    out = smoke_store["root"] / "split"
    build_leaderboards(smoke_store["uri"], smoke_store["experiment"], out,
                       variant=("params.trainer.steps",))
    rows = _csv(out)
    assert set(rows) == {"grpo@2", "grpo@1"}
    ids = smoke_store["ids"]
    assert rows["grpo@2"]["run_ids"] == f"{ids['s0']};{ids['s1']}"  # the demo's row, unchanged
    assert rows["grpo@1"]["run_ids"] == ids["smoke"]
    md = (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    assert "Rows differ in: `rollout.n`, `trainer.steps`" in md


def test_identity_drops_the_seed_and_what_cannot_change_a_result():
    params = {"seed": "3", "trainer.steps": "60", "tracking.experiment": "x",
              "tracking.tags.rlbench.sweep": "s", "trainer.output_dir": "/tmp/a",
              "backend.threads": "1", "model.cache_dir": "/c", "trainer.optim.lr": "0.0001"}
    assert identity(params) == {"trainer.steps": "60", "trainer.optim.lr": "0.0001"}


# -- synthetic runs -----------------------------------------------------------------------------
def _store(tmp_path, cells):
    """cells: (algorithm, seed, params, final pass@1, extra tags); one run each, in order."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    ids = []
    for i, (alg, seed, params, value, tags) in enumerate(cells):
        rid = client.create_run(exp, start_time=1000 + i, tags={
            "rlbench.algorithm": alg, "rlbench.task": "countdown", "rlbench.task_variant": "tiny",
            "rlbench.model": "tiny", "rlbench.seed": str(seed), "rlbench.temperature": "1.0",
            **tags}).info.run_id
        client.log_batch(rid, metrics=[Metric("final/heldout/pass_at_1", value, 0, 2),
                                       Metric("eval/heldout/pass_at_1", value, 0, 2)],
                         params=[Param(k, v) for k, v in {"seed": str(seed), **params}.items()])
        client.set_terminated(rid, "FINISHED")
        ids.append(rid)
    return uri, ids


def test_a_row_never_mixes_configurations_even_on_other_seeds(tmp_path):
    """Not only a clash on one seed: a run on a new seed with another config is refused too."""
    base = {"trainer.steps": "60", "algorithm.name": "grpo"}
    uri, ids = _store(tmp_path, [("grpo", 0, base, 0.2, {}), ("grpo", 1, base, 0.21, {}),
                                 ("grpo", 2, {**base, "trainer.steps": "5"}, 0.1, {})])
    with pytest.raises(BoardError, match=r"row 'grpo' would mix configurations: its runs differ "
                                         r"in trainer\.steps \(60: seed 0 run .*; 5: seed 2 run "
                                         + ids[2][:8]):
        build_leaderboards(uri, "e", tmp_path / "out")


def test_rows_differ_in_names_the_keys_and_the_configuration_table(tmp_path):
    cells = [("lpo_fwd", s, {"algorithm.name": "lpo_fwd", "algorithm.advantage.tau": tau,
                             "algorithm.agg": "seq-mean-token-sum"}, 0.2 + s / 100, {})
             for tau in ("sigma_g", "one") for s in (0, 1)]
    cells += [("grpo", s, {"algorithm.name": "grpo", "algorithm.agg": "token-mean"}, 0.2, {})
              for s in (0, 1)]
    uri, _ = _store(tmp_path, cells)
    out = tmp_path / "out"
    build_leaderboards(uri, "e", out)
    md = (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    assert ("- Rows differ in: `algorithm`, `algorithm.advantage.tau` (and each algorithm's own "
            "`algorithm.*` knobs)") in md
    config = md.split("## Configuration\n", 1)[1].split("\n## ", 1)[0]
    assert "| lpo_fwd@one | one |" in config
    assert "| grpo | (not set) |" in config


def test_duplicates_of_a_cell_are_listed_not_pooled(tmp_path):
    same = {"trainer.steps": "60"}
    uri, ids = _store(tmp_path, [("grpo", 0, same, 0.9, {}), ("grpo", 0, same, 0.2, {}),
                                 ("grpo", 1, same, 0.3, {})])
    out = tmp_path / "out"
    build_leaderboards(uri, "e", out)
    row = _csv(out)["grpo"]
    assert row["run_ids"] == f"{ids[1]};{ids[2]}" and row["n_seeds"] == "2"
    assert float(row["heldout/pass_at_1/final_mean"]) == pytest.approx(0.25)  # 0.9 not pooled
    md = (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    assert f"- **grpo** seed 0: `{ids[0]}`, `{ids[1]}` (used)" in md
