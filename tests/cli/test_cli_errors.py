"""Bad input, as a user types it: each case exits 2 with one line on stderr naming the key, path
or value at fault and what would work (issue 22's list), and leaves no run directory behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import FAST_PRETRAIN

RLBENCH = [sys.executable, "-m", "harness.cli"]

# (name, arguments, substrings the one-line message must contain)
CASES = [
    ("wrong type in train", ["train", "trainer.steps=abc"], ["trainer.steps='abc'", "Integer"]),
    ("typo in sweep", ["sweep", "trainer.stepz=3", "seed=0,1"],
     ["unknown config key trainer.stepz", "Did you mean 'steps'?"]),
    ("unknown option in sweep", ["sweep", "algorithm=grpoo", "seed=0,1"],
     ["algorithm=grpoo", "Did you mean 'grpo'?"]),
    ("model.path with model=tiny", ["train", "model.path=/models/mine"],
     ["model.path='/models/mine'", "model=tiny", "add model=hf"]),
    ("model=hf without a path", ["train", "model=hf"], ["model.path is not set"]),
    ("model=hf, path missing", ["train", "model=hf", "model.path=/no/such/model"],
     ["model.path='/no/such/model' does not exist"]),
    ("model=hf, uncached hub id", ["train", "model=hf", "model.path=SomeOrg/not-cached-model"],
     ["model.path='SomeOrg/not-cached-model'",
      "rlbench downloads nothing: give a local path or pre-fetch it"]),
    ("task.full.* ignored by the tiny variant", ["train", "task=math",
                                                  "task.full.data_dir=/data/math"],
     ["task.full.data_dir is set but task.variant=tiny", "task.variant=full"]),
    ("an eval set of one's own name in task=math",
     ["train", "task=math", "task.variant=full", "+task.full.eval.mine.n=4"],
     ["task.full.eval.mine is not an eval set", "task=custom"]),
    ("images without a vision model", ["train", "task=geometry3k_tiny", *FAST_PRETRAIN],
     ["has images", "model=tiny_vlm"]),
    ("task=custom without data", ["train", "task=custom", "task.reward.verifier=math"],
     ["task.train is not set"]),
    ("an empty eval set", ["train", "task.tiny.eval.heldout.limit=0", *FAST_PRETRAIN],
     ["eval set 'heldout'", "has no problems"]),
    ("eval of a run that does not exist", ["eval", "run_id=0123456789abcdef"],
     ["run_id=0123456789abcdef: no such run"]),
    ("eval of a missing checkpoint", ["eval", "checkpoint=/nope"],
     ["checkpoint='/nope': no checkpoint there"]),
    ("an unknown flag", ["train", "--cfg", "everything"], ["--cfg everything", "--cfg job"]),
    ("board --runs where there is no export", ["board", "--experiment", "e", "--runs", "/nope"],
     ["--runs /nope: no runs.jsonl.gz there", "or a folder holding some"]),
    ("board --runs on a file that is no export",
     ["board", "--experiment", "e", "--runs", sys.executable],
     [f"--runs {sys.executable}: not a runs export written by rlbench board"]),
    ("board --runs with a tracking URI", ["board", "--runs", "x", "--tracking-uri",
                                          "sqlite:///a.db"], ["--runs", "drop --tracking-uri"]),
    ("board --runs without the experiment", ["board", "--runs", "x"],
     ["--runs needs --experiment", "Experiment:"]),
    ("board --runs for a track", ["board", "--track", "lantern", "--runs", "x"],
     ["--runs builds an rlbench board", "'lantern'", "drop --runs"]),
]


# in a subprocess: refused inside the Hydra app (which would set up Hydra's logging in this
# process). The others are refused by the preflight, before Hydra's main
# (harness.config.validate_config)
SUBPROCESS_CASES = {"an empty eval set"}
# slow: each of them starts a Python with torch and MLflow (over ~5 s on 2 cores)
SLOW_CASES = SUBPROCESS_CASES


@pytest.mark.parametrize("name,args,needles", [
    pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW_CASES else [])
    for c in CASES])
def test_bad_input_exits_2_with_one_line_naming_it(name, args, needles, tmp_path, cli_env,
                                                   rlbench_in_process, monkeypatch):
    from huggingface_hub import constants

    env = {**cli_env, "HF_HOME": str(tmp_path / "hf")}  # an empty Hugging Face cache
    # ... in this process too, where huggingface_hub read HF_HOME when first imported
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    if name in SUBPROCESS_CASES:
        out = subprocess.run([*RLBENCH, *args], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
    else:  # refused before any run: in this process (tests/conftest.py)
        out = rlbench_in_process(*args, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("rlbench: error:")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (tmp_path / "outputs").exists()  # no run directory for a run that never was
    if "checkpoint=" in " ".join(args):
        assert "trainer.resume" not in lines[0]


@pytest.mark.slow
def test_cfg_job_prints_the_config_of_train_and_of_every_sweep_cell(tmp_path, cli_env,
                                                                    rlbench_in_process):
    # --cfg prints before Hydra's main runs: in this process (tests/conftest.py)
    out = rlbench_in_process("train", "trainer.steps=7", "--cfg", "job", env=cli_env,
                             cwd=tmp_path)
    assert out.returncode == 0 and "steps: 7" in out.stdout and "hydra:" not in out.stdout
    out = rlbench_in_process("sweep", "seed=3,4", "--cfg", "job", "--package", "seed",
                             env=cli_env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["#", "cell", "1/2:", "seed=3", "3", "#", "cell", "2/2:",
                                  "seed=4", "4"]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()
    out = rlbench_in_process("train", "--cfg", "all", "--resolve", env=cli_env, cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "\nhydra:\n" in out.stdout and "seed: 0" in out.stdout


@pytest.mark.slow
def test_help_is_plain_text_and_train_help_lists_the_config_groups(tmp_path, cli_env):
    out = subprocess.run([*RLBENCH, "--help"], env=cli_env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "``" not in out.stdout and "rlbench train" in out.stdout
    out = subprocess.run([*RLBENCH, "train", "--help"], env=cli_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    groups = {ln.split(":")[0]: ln for ln in out.stdout.splitlines() if ": " in ln}
    assert "grpo" in groups["algorithm"] and "custom" in groups["task"]
    assert "hf" in groups["model"] and "--cfg job" in out.stdout


def test_list_verifiers_names_the_built_in_rules(tmp_path, cli_env, rlbench_in_process):
    out = rlbench_in_process("list", "verifiers", env=cli_env, cwd=tmp_path)
    names = {ln.split()[0] for ln in out.stdout.splitlines()[1:]}
    assert out.returncode == 0 and {"math", "exact_match", "countdown", "code_tests"} <= names


@pytest.mark.slow
def test_board_runs_on_a_damaged_export_exits_2_naming_it(tmp_path, cli_env,
                                                          rlbench_in_process):
    import gzip

    from tests.helpers import ROOT

    whole = (ROOT / "leaderboards" / "code-tiny" / "code-tiny" / "tiny" / "runs.jsonl.gz")
    cases = {"truncated.jsonl.gz": whole.read_bytes()[:2000],
             "not-a-record.jsonl.gz": gzip.compress(b'[]\n'),
             "bad-status.jsonl.gz": gzip.compress(json.dumps(
                 {"run_id": "a", "start_time": 0, "end_time": 1, "status": "DONE",
                  "tags": {}, "params": {}, "metrics": {}}).encode())}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        out = rlbench_in_process("board", "--experiment", "e", "--runs", name, "--out", "out",
                                 "--allow-dirty", env=cli_env, cwd=tmp_path)
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("rlbench: error:")]
        assert out.returncode == 2 and len(lines) == 1, (name, out.stderr[-2000:])
        assert f"--runs {name}: not a runs export" in lines[0], lines[0]
        assert "Traceback" not in out.stderr
