"""task=custom: data formats and column mapping, named eval sets, verifiers by name, and user
reward functions in worker processes with a timeout."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from harness.config import compose_config
from harness.registry import TASKS, VERIFIERS
from harness.typed_config import ConfigError, build
from harness.types import Example

ROWS = [{"question": f"{a}+{b}=", "sol": {"value": a + b}, "level": a % 2}
        for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def custom_task(tmp_path: Path, *overrides: str, fn: str | None = None):
    if fn is not None:
        (tmp_path / "rewards.py").write_text(textwrap.dedent(fn))
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    cfg = compose_config(["task=custom", f"task.train={train}", "task.columns.prompt=question",
                          "task.columns.answer=sol.value",
                          *([f"task.reward.fn={tmp_path / 'rewards.py'}:score"] if fn else []),
                          *overrides])
    return build(TASKS, cfg.task, "task")


def test_columns_are_mapped_and_dotted_names_reach_into_records(tmp_path):
    task = custom_task(tmp_path, "task.reward.verifier=exact_match",
                       "task.template='Q: {prompt} (level {level})'")
    ex = task.train_examples()[1]
    assert ex.prompt == "Q: 3+4= (level 1)" and ex.answer == 7 and ex.id == "train-1"
    chat = custom_task(tmp_path, "task.reward.verifier=exact_match", "task.chat=true",
                       "task.system_prompt=Be brief.")
    assert chat.train_examples()[0].prompt == [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "1+2="}]


def test_a_missing_column_names_the_key_and_the_columns_there(tmp_path):
    task = custom_task(tmp_path, "task.reward.verifier=exact_match", "task.columns.answer=gold")
    with pytest.raises(ConfigError, match=r"task.columns.answer='gold'.*columns: question, sol"):
        task.train_examples()


def test_parquet_and_a_datasets_directory_load_like_jsonl(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "train.parquet")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                          "test": datasets.Dataset.from_list(ROWS[:2])}).save_to_disk(
        str(tmp_path / "hfdir"))
    base = ["task=custom", "task.columns.prompt=question", "task.columns.answer=sol.value",
            "task.reward.verifier=exact_match"]
    for train, extra in ((tmp_path / "train.parquet", []),
                         (tmp_path / "hfdir", ["task.train_split=train"])):
        task = build(TASKS, compose_config([*base, f"task.train={train}", *extra]).task, "task")
        assert [e.answer for e in task.train_examples()] == [3, 7, 4, 6]
    task = build(TASKS, compose_config([*base, f"task.train={tmp_path / 'hfdir'}"]).task,
                 "task")
    with pytest.raises(ConfigError, match=r"several splits: choose one of train, test with "
                                          r"task.train_split"):
        task.train_examples()


def test_eval_sets_are_named_added_and_dropped_by_config(tmp_path):
    test = write_jsonl(tmp_path / "test.jsonl", ROWS[:2])
    base = ["task.reward.verifier=exact_match", f"+task.eval.mine.path={test}",
            "+task.eval.mine.n=2", "+task.eval.mine.k=[1,2]", f"+task.eval.other.path={test}"]
    sets = custom_task(tmp_path, *base).eval_sets()
    assert [s.name for s in sets] == ["mine", "other"]
    assert sets[0].protocol.n == 2 and len(sets[0].examples) == 2
    dropped = custom_task(tmp_path, *base, "~task.eval.other").eval_sets()
    assert [s.name for s in dropped] == ["mine"]
    with pytest.raises(ConfigError, match=r"task.eval.bad.path is not set"):
        custom_task(tmp_path, "task.reward.verifier=exact_match", "+task.eval.bad.n=2")


def test_exactly_one_of_verifier_and_fn(tmp_path):
    with pytest.raises(ConfigError, match=r"exactly one of task\.reward\.verifier"):
        custom_task(tmp_path)
    with pytest.raises(ConfigError, match="exactly one of"):
        custom_task(tmp_path, "task.reward.verifier=exact_match",
                    fn="def score(completions):\n    return [1.0] * len(completions)\n")


def test_a_user_function_gets_the_batch_and_its_scores_become_rewards(tmp_path):
    fn = """
        def score(prompts, completions, answer, level):
            # a dict, a number and None are all valid scores
            out = []
            for c, a, lv in zip(completions, answer, level):
                if not c.strip():
                    out.append(None)
                elif lv == 0:
                    out.append({"reward": 0.5, "correct": c.strip() == str(a)})
                else:
                    out.append(float(c.strip() == str(a)))
            return out
    """
    task = custom_task(tmp_path, "task.reward.workers=1", fn=fn)
    exs = task.train_examples()
    scores = task.verify_batch(exs, ["3", "7", "4", " "])
    assert [s.reward for s in scores] == [1.0, 1.0, 0.5, 0.0]
    assert [s.correct for s in scores] == [True, True, True, False]  # the dict's own verdict
    assert [s.parsed for s in scores] == [True, True, True, False]
    task.reward.pool.close()


def test_a_hanging_reward_function_times_out_scores_zero_and_is_counted(tmp_path):
    fn = """
        import time

        def score(completions, **columns):
            if any("slow" in c for c in completions):
                time.sleep(60)
            return [1.0] * len(completions)
    """
    task = custom_task(tmp_path, "task.reward.workers=1", "task.reward.timeout_s=1",
                       "task.reward.chunk_size=2", fn=fn)
    exs = task.train_examples()
    start = time.monotonic()
    scores = task.verify_batch(exs, ["a", "slow", "b", "c"])
    assert time.monotonic() - start < 30
    assert [s.reward for s in scores] == [0.0, 0.0, 1.0, 1.0]
    assert scores[0].info["stats"]["reward_timeout"] == 1.0
    assert scores[2].info["stats"]["reward_timeout"] == 0.0
    # the worker was replaced: the next batch is graded
    assert [s.reward for s in task.verify_batch(exs[:2], ["a", "b"])] == [1.0, 1.0]
    task.reward.pool.close()


def test_a_raising_or_miscounting_reward_function_scores_zero_and_is_counted(tmp_path):
    fn = """
        def score(completions, **columns):
            if "boom" in completions:
                raise RuntimeError("boom")
            return [1.0]
    """
    task = custom_task(tmp_path, "task.reward.workers=1", "task.reward.chunk_size=1", fn=fn)
    exs = task.train_examples()
    scores = task.verify_batch(exs[:2], ["boom", "ok"])
    assert [s.reward for s in scores] == [0.0, 1.0]
    assert scores[0].info["stats"]["reward_error"] == 1.0
    bad = custom_task(tmp_path, "task.reward.workers=0", "task.reward.chunk_size=2", fn=fn)
    assert bad.verify_batch(exs[:2], ["x", "y"])[0].info["status"] == "error"


def test_an_unimportable_or_unfit_reward_function_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"task.reward.fn='no_such_module:score': cannot "
                                          r"import"):
        custom_task(tmp_path, "task.reward.fn=no_such_module:score")
    task = custom_task(tmp_path, fn="def score(completions, difficulty):\n    return []\n")
    with pytest.raises(ConfigError, match=r"requires difficulty"):
        task.train_examples()


def test_verifiers_are_found_by_name_in_the_registry():
    assert {"math", "exact_match", "countdown", "code_tests"} <= set(VERIFIERS.names())
    ex = Example(id="1", prompt="", answer={"target": 10, "numbers": [2, 3, 4]})
    cd = VERIFIERS.get("countdown")({})
    got = cd([ex, ex, ex], ["<answer>2*3+4</answer>", "<answer>2+3+4</answer>", "no tag"])
    assert [s.correct for s in got] == [True, False, False]
    assert [s.reward for s in got] == [1.0, 0.1, 0.0]
    em = VERIFIERS.get("exact_match")({"extract": "last_line"})
    got = em([Example("1", "", "Paris")] * 2, ["thinking...\nparis.", "Lyon"])
    assert [s.correct for s in got] == [True, False]


def test_math_verifier_grades_equivalent_answers():
    math = VERIFIERS.get("math")({"grader": {"workers": 1}})
    got = math([Example("1", "", "\\frac{1}{2}")] * 3,
               ["so \\boxed{0.5}", "\\boxed{1/3}", "no answer here"])
    assert [s.correct for s in got] == [True, False, False]
    assert [s.parsed for s in got] == [True, True, False]
    math.grader.close()
