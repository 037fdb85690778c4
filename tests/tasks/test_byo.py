"""docs/bring-your-own.md, run as written: the page's files and
commands are this test's input, on a local Hugging Face model directory built here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

README = Path(__file__).resolve().parents[2] / "docs" / "bring-your-own.md"
BLOCK = re.compile(r"<!-- byo-example: (\S+) -->\n```[a-z]*\n(.*?)```", re.DOTALL)


def readme_example() -> dict[str, str]:
    blocks = dict(BLOCK.findall(README.read_text()))
    assert {"train.jsonl", "test.jsonl", "my_reward.py", "commands"} <= set(blocks)
    return blocks


def build_model_dir(path: Path) -> None:
    """A ~30k-parameter Llama with a character-level tokenizer, saved as any HF model is (loaded
    by AutoTokenizer / AutoModelForCausalLM, nothing rlbench-specific in the directory)."""
    from omegaconf import OmegaConf

    from harness.config import TinyArchConfig
    from harness.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    arch = OmegaConf.structured(TinyArchConfig(architecture="llama", hidden_size=32,
                                               num_layers=1, num_heads=2, num_kv_heads=2,
                                               intermediate_size=64))
    build_tiny_model(arch, tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.mark.slow
def test_readme_byo_example_trains_two_grpo_steps_with_a_user_reward_fn_and_evaluates(
        tmp_path: Path, cli_env: dict[str, str]):
    blocks = readme_example()
    for name in ("train.jsonl", "test.jsonl", "my_reward.py"):
        (tmp_path / name).write_text(blocks[name])
    build_model_dir(tmp_path / "my_model")
    commands = [line for line in blocks["commands"].splitlines() if line.strip()]
    assert commands[0].startswith("rlbench train") and commands[1].startswith("rlbench eval")

    train = subprocess.run([sys.executable, "-m", "harness.cli", *shlex.split(commands[0])[1:]],
                           env=cli_env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    run_id = re.search(r"run id:\s+([0-9a-f]{32})", train.stderr).group(1)
    assert "Loading weights" not in train.stderr and "Writing model shards" not in train.stderr

    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    assert metrics["final/steps"] == 2.0
    # the eval set named in the config, scored by the user's function (its stats are there,
    # and it never failed or timed out)
    assert "eval/test/pass_at_1" in metrics and "final/test/pass_at_1" in metrics
    assert metrics["eval/test/reward_error"] == 0.0 and metrics["eval/test/reward_timeout"] == 0.0
    assert run.data.params["task.reward.fn"] == "my_reward:reward"
    assert run.data.tags["rlbench.task"] == "custom"
    assert (tmp_path / "outputs").is_dir() and list((tmp_path / "outputs").glob("*/cli.log"))

    command = commands[1].replace("<run id>", run_id)
    ev = subprocess.run([sys.executable, "-m", "harness.cli", *shlex.split(command)[1:]],
                        env=cli_env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert '"eval/test/pass_at_1"' in ev.stdout  # the run's task and eval set, not the default
    evals = client.search_runs([run.info.experiment_id], "tags.`rlbench.kind` = 'eval'")
    assert len(evals) == 1 and evals[0].data.tags["rlbench.source_run_id"] == run_id
    assert evals[0].data.tags["rlbench.task"] == "custom"
