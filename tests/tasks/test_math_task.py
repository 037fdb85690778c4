"""MathTask: configs (math, math_tiny), prompt templates, the tiny variant's split and warm start,
and ``rlbench eval`` of a tiny model logged to MLflow and shown by ``rlbench board`` with one
column per eval set."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from harness.cli import compose_config
from harness.mathgrade.grading import GraderConfig
from harness.registry import TASKS
from harness.report.board import build_leaderboards as _build
from harness.task import EvalProtocol
from harness.typed_config import ConfigError, build, validate
from tasks.math import testbed
from tasks.math.task import INSTRUCTION, FullConfig, MathTask, TinyConfig, render_prompt

# built from whatever checkout runs the tests; the dirty-tree refusal has its own test
build_leaderboards = functools.partial(_build, allow_dirty=True)


def _tiny_task() -> MathTask:
    return MathTask(MathTask.Config(variant="tiny", grader=GraderConfig(workers=1)))


def test_math_is_registered_and_math_tiny_selects_the_tiny_variant():
    assert TASKS.get("math") is MathTask
    cfg = compose_config(["task=math_tiny", "model.task_variant=full"])
    assert (cfg.task.name, cfg.task.variant) == ("math", "tiny")
    assert compose_config(["task=math", "model=tiny"]).task.variant == "tiny"


def test_full_protocols_follow_the_yaml():
    cfg = compose_config(["task=math", "model.task_variant=full"])
    task = build(TASKS, cfg.task, "task")
    evals = task.config.full.eval
    assert set(evals) == {"aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench",
                          "gsm8k"}
    assert (evals["aime24"].n, evals["aime24"].k, evals["aime24"].maj_k) == (32, [1, 8, 32],
                                                                             [8, 32])
    assert (evals["math500"].n, evals["math500"].temperature, evals["math500"].top_p) == (
        4, 0.6, 0.95)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"task\.grader\.timeout"):
        validate(MathTask.Config, {"grader": {"timeout": 3}}, "task")
    with pytest.raises(ValueError, match="extraction"):
        MathTask(MathTask.Config(extraction=["boxed", "guess"]))
    with pytest.raises(ValueError, match="template"):
        MathTask(MathTask.Config(full=FullConfig(template="alpaca")))
    with pytest.raises(ValueError, match="not an eval set"):
        MathTask(MathTask.Config(variant="tiny", tiny=TinyConfig(eval={"aime24": EvalProtocol()})))


def test_templates_render_the_qwen_math_instruction():
    problem = "What is $1+1$?"
    text = render_prompt("qwen-math", problem)
    assert text.startswith("<|im_start|>system\n" + INSTRUCTION)
    assert text.endswith(f"<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n")
    assert render_prompt("base", problem) == f"{problem}\n{INSTRUCTION}\n"
    assert render_prompt("chat", problem) == [
        {"role": "user", "content": f"{problem}\n{INSTRUCTION}"}]
    assert render_prompt("chat-system", problem)[0] == {"role": "system", "content": INSTRUCTION}
    task = MathTask(MathTask.Config(full=FullConfig(template="chat", train_limit=3)))
    assert isinstance(task.train_examples()[0].prompt, list)


def test_tiny_split_is_disjoint_and_fixed():
    task = _tiny_task()
    evals = {es.name: es.examples for es in task.eval_sets()}
    assert {k: len(v) for k, v in evals.items()} == {"linear": 100, "arith": 100}
    train_ids = {e.id for e in task.train_examples()}
    held = {e.id for v in evals.values() for e in v}
    assert len(train_ids) == 936 + 1080 - 200 and not train_ids & held
    assert [e.id for e in _tiny_task().eval_sets()[0].examples] == [e.id for e in evals["linear"]]


def test_tiny_references_are_graded_correct_through_the_same_path():
    task = _tiny_task()
    pairs = task.warmstart_examples()
    assert len(pairs) == round(0.3 * len(task.train_examples()))
    sample = pairs[:: max(1, len(pairs) // 60)]
    scores = task.verify_batch([e for e, _ in sample], [c for _, c in sample])
    assert all(s.correct and s.info["extract"] == "boxed" for s in scores)
    # fractions are in the answer format, and a decimal answer is accepted too
    ex = next(e for e in testbed.linear_problems() if e.answer["gold"] == "\\frac{9}{4}")
    assert task.verify(ex, "x=2.25").correct
    task.grader.close()


@pytest.mark.slow
def test_eval_logs_to_mlflow_and_board_shows_one_column_per_eval_set(tmp_path: Path):
    from harness.cli.eval import evaluate_checkpoint

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    cfg = compose_config([
        "task=math_tiny", "model=tiny", "model.pretrain.steps=3", "model.pretrain.batch_size=16",
        f"model.cache_dir={tmp_path / 'cache'}", f"tracking.uri={uri}",
        "tracking.experiment=math-eval", "backend.threads=1", "task.grader.workers=1",
        "task.tiny.eval.linear.limit=4", "task.tiny.eval.arith.limit=4",
        "task.tiny.eval.linear.n=2", "task.tiny.eval.linear.k=[1,2]",
        "task.tiny.eval.linear.maj_k=[2]", "task.tiny.eval.arith.n=2",
        "task.tiny.eval.arith.k=[1,2]", "task.tiny.eval.arith.maj_k=[2]"])
    out = evaluate_checkpoint("model", "", cfg)
    assert out["eval/linear/samples"] == 8 and "eval/arith/pass_at_2" in out
    assert "eval/linear/extract_boxed" in out and "eval/linear/grade_timeout" in out
    written = build_leaderboards(uri, "math-eval", tmp_path / "boards", log_to_mlflow=False)
    md = next(p for p in written if p.name == "leaderboard.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| # | row"))
    for column in ("arith pass@1", "arith pass@2", "arith maj@2", "linear pass@1",
                   "linear pass@2", "linear maj@2"):
        assert column in header
    assert "| base@eval |" in md


def test_training_rollouts_log_extraction_method_rates():
    """``score_groups`` averages the verifier's per-sample stats into ``rollout/<stat>``, over
    every trajectory scored in the step (here two calls, as dynamic sampling makes)."""
    from types import SimpleNamespace

    from harness.rollout import RolloutContext, score_groups
    from harness.types import Trajectory

    task = _tiny_task()
    ex = testbed.linear_problems()[0]
    gold = ex.answer["gold"]
    engine = SimpleNamespace(pad_token_id=0)
    ctx = RolloutContext(engine=engine, task=task, draw_prompts=lambda k: [], prompts_per_step=1,
                         sampling=None)
    texts = [f"x=\\boxed{{{gold}}}", f"Answer: {gold}", "x is 99", "no idea"]
    trajs = [Trajectory(prompt_ids=[1], response_ids=[2, 3], text=t) for t in texts]
    score_groups(ctx, trajs[:2], [ex, ex], [0, 0])
    assert ctx.metrics["rollout/extract_boxed"] == 0.5
    score_groups(ctx, trajs[2:], [ex, ex], [1, 1])
    assert ctx.metrics["rollout/extract_boxed"] == 0.25
    assert ctx.metrics["rollout/extract_answer_line"] == 0.25
    assert ctx.metrics["rollout/extract_last_number"] == 0.25
    assert ctx.metrics["rollout/extract_none"] == 0.25
    assert ctx.metrics["rollout/grade_timeout"] == 0.0
