"""The agentic algorithms in the real trainer on the tiny two-hop task: multi-turn rollouts with
the BM25 tool, ARPO/AEPO branching, GRPO+AEM per turn; a one-step run of each finishes and logs
its tool and branching metrics."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from harness.trainer import Trainer
from tests.helpers import make_config

# slow: the first of these builds the tiny model warm-started on the agentic task (~35 s on a
# loaded 2-core machine; once per session, tests/conftest.py model_cache), the others ~1.5 s
pytestmark = pytest.mark.slow

SMALL = ["task=agentic_qa", "trainer.steps=1", "trainer.eval_every=0",
         "trainer.checkpoint_every=0", "data.prompts_per_step=2", "rollout.n=4",
         "rollout.max_new_tokens=60", "task.tiny.max_total_tokens=120"]
CASES = {
    "grpo": [],
    "arpo": ["algorithm.rollout.initial_rollouts=2"],
    "aepo": ["algorithm.rollout.initial_rollouts=2"],
    "grpo_aem": [],
}
LOGGED = {"grpo": ["tools/calls_per_traj", "tools/masked_token_frac"],
          "arpo": ["branch/forks", "branch/topups", "branch/budget_used", "tools/calls_per_traj",
                   "rollout/entropy", "rollout/entropy_topk"],
          "aepo": ["branch/forks", "aepo/sign_flip_frac", "rollout/entropy",
                   "rollout/entropy_topk"],
          "grpo_aem": ["aem/alpha_mean", "tools/turns_per_traj"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_agentic_run_finishes_and_logs_tool_metrics(tmp_path, model_cache, name):
    cfg = make_config(tmp_path, model_cache, f"algorithm={name}", *SMALL, *CASES[name])
    Trainer(cfg).fit()
    client = MlflowClient(cfg.tracking.uri)
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    for key in LOGGED[name]:
        if key == "aepo/sign_flip_frac" and metrics.get("actor/trained_frac", 1.0) == 0:
            continue  # every group constant: nothing entered the loss
        assert key in metrics, key
    assert metrics["rollout/samples"] == 8.0  # M trajectories per prompt, whatever branched
    if "rollout/entropy_topk" in metrics:  # the full-vocabulary entropy bounds the top-k one
        assert metrics["rollout/entropy"] >= metrics["rollout/entropy_topk"] - 1e-4
