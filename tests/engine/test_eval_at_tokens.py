"""Equal-compute evaluations (``trainer.eval_at_tokens``, issue 31 B4): the policy is evaluated
where tokens generated is nearest each declared mark, before or after a step's update, without
changing training; ``final/*`` is the last evaluation alone; per-problem counts are logged."""

from __future__ import annotations

import json

import pytest

from harness.config import validate_config
from harness.summary import eval_summary
from harness.tracking import open_client
from harness.trainer import Trainer
from harness.typed_config import ConfigError
from tests.helpers import make_config

RUN = ["trainer.steps=4", "trainer.eval_every=100", "trainer.checkpoint_every=0",
       "data.prompts_per_step=4", "rollout.n=4", "task.tiny.eval.heldout.limit=12",
       "task.tiny.eval.heldout.n=4", "task.tiny.eval.heldout.k=[1,4]"]


def _history(uri: str, metric: str) -> dict[int, float]:
    client = open_client(uri)
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, metric)}


def _fit(tmp_path, model_cache, name: str, *extra: str) -> str:
    cfg = make_config(tmp_path / name, model_cache, *RUN, *extra)
    Trainer(cfg).fit()
    return cfg.tracking.uri


@pytest.mark.slow
def test_marks_are_evaluated_at_the_nearest_token_count_and_training_is_unchanged(
        tmp_path, model_cache):
    plain = _fit(tmp_path, model_cache, "plain")
    tokens = {0: 0.0, **_history(plain, "rollout/tokens_total")}
    assert sorted(_history(plain, "eval/heldout/pass_at_1")) == [0, 4]
    # one mark just past T_1 (nearer T_1: the policy before step 2's update, logged at step 1)
    # and one just short of T_3 (nearer T_3: evaluated after step 3's update)
    near_before = int(tokens[1] + 0.3 * (tokens[2] - tokens[1]))
    near_after = int(tokens[2] + 0.8 * (tokens[3] - tokens[2]))
    marked = _fit(tmp_path, model_cache, "marked",
                  f"trainer.eval_at_tokens=[{near_before},{near_after}]")
    evals = _history(marked, "eval/heldout/pass_at_1")
    assert sorted(evals) == [0, 1, 3, 4]
    for mark, step in ((near_before, 1), (near_after, 3)):
        nearest = min(tokens, key=lambda s: abs(tokens[s] - mark))
        assert step == nearest
        assert abs(tokens[step] - mark) <= 0.5 * max(tokens[s + 1] - tokens[s] for s in range(4))
    # evaluation draws from its own generator: every training metric is bit-identical
    for metric in ("rollout/reward_mean", "rollout/tokens_total", "actor/grad_norm",
                   "actor/pg_loss"):
        assert _history(marked, metric) == _history(plain, metric), metric
    # the regular evaluations are the same too (their seed depends on (seed, step) only)
    assert evals[4] == _history(plain, "eval/heldout/pass_at_1")[4]


def test_final_is_the_last_evaluation_not_a_mean_with_mid_training():
    evals = [{"step": 0, "eval/h/pass_at_1": 0.1}, {"step": 30, "eval/h/pass_at_1": 0.2},
             {"step": 60, "eval/h/pass_at_1": 0.4}]
    summary = eval_summary(evals)
    assert summary["final/h/pass_at_1"] == 0.4
    assert summary["start/h/pass_at_1"] == 0.1
    # evaluations logged out of order (a mark's evaluation before an update) still end at the
    # highest step
    assert eval_summary([evals[0], evals[2], evals[1]])["final/h/pass_at_1"] == 0.4


@pytest.mark.slow
def test_per_problem_counts_and_standard_errors_are_logged(tmp_path, model_cache):
    uri = _fit(tmp_path, model_cache, "counts")
    client = open_client(uri)
    [run] = client.search_runs([client.get_experiment_by_name("rlbench").experiment_id])
    rid = client.get_run(run.info.run_id).info.run_id
    path = client.download_artifacts(rid, "evals/step_000004.jsonl", str(tmp_path))
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 12 and {r["n"] for r in rows} == {4}
    assert len({r["example_id"] for r in rows}) == 12
    metrics = client.get_run(rid).data.metrics
    p = [r["correct"] / r["n"] for r in rows]
    assert metrics["eval/heldout/pass_at_1"] == pytest.approx(sum(p) / 12)
    sampling = (sum(x * (1 - x) / 3 for x in p)) ** 0.5 / 12
    assert metrics["eval/heldout/pass_at_1_sampling_se"] == pytest.approx(sampling)
    mean = sum(p) / 12
    stderr = (sum((x - mean) ** 2 for x in p) / 11) ** 0.5 / 12 ** 0.5
    assert metrics["eval/heldout/pass_at_1_stderr"] == pytest.approx(stderr)


@pytest.mark.parametrize("marks", ["[100,50]", "[0]", "[-5]", "[100,100]"])
def test_bad_token_marks_are_refused_by_name(tmp_path, model_cache, marks):
    cfg = make_config(tmp_path, model_cache, *RUN, f"trainer.eval_at_tokens={marks}")
    with pytest.raises(ConfigError, match=r"trainer\.eval_at_tokens"):
        validate_config(cfg)
