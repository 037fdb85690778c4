"""CodeTask: registration and config, code extraction, reward modes, test splitting, stdout
comparison, the tiny generator, and grading through the sandbox."""

from __future__ import annotations

import dataclasses

import pytest

from harness.cli import compose_config
from harness.registry import TASKS
from harness.typed_config import ConfigError, build, validate
from harness.types import Example
from tasks.code import testbed
from tasks.code.grading import CodeGrader, GraderConfig, called_names, outputs_match, split_asserts
from tasks.code.task import CodeTask, FullConfig, TinyConfig, last_fenced_block

AFFINE = {"kind": "functional", "preamble": "",
          "units": ["assert f(2) == 5\n", "assert f(3) == 7\n", "assert f(10) == 21\n"]}


def _task(**kw) -> CodeTask:
    return CodeTask(CodeTask.Config(**kw))


@pytest.fixture(scope="module")
def tiny_task():
    task = _task(variant="tiny")
    yield task
    task.grader.close()


def test_code_is_registered_and_its_yaml_validates():
    assert TASKS.get("code") is CodeTask
    cfg = compose_config(["task=code"])  # the tiny model picks the tiny variant
    task = build(TASKS, cfg.task, "task")
    assert task.config.variant == "tiny" and task.config.grader.workers is None


def test_a_typo_in_the_code_config_names_the_key():
    with pytest.raises(ConfigError, match=r"task\.grader\.timeout_s"):
        validate(CodeTask.Config, {"grader": {"timeout_s": 1}}, "task")


def test_invalid_choices_are_rejected():
    with pytest.raises(ValueError, match="reward"):
        _task(reward="partial")
    with pytest.raises(ValueError, match="unknown dataset"):
        _task(full=FullConfig(train=["apps"]))


def test_last_fenced_block_wins_and_unclosed_blocks_do_not_count():
    text = "```python\nx = 1\n```\ntext\n```py\ny = 2\n```\n```python\nz = 3"
    assert last_fenced_block(text) == "y = 2\n"
    assert last_fenced_block("no code here") is None


def test_humaneval_body_completion_gets_the_prompt_prepended():
    task = _task(variant="full")
    ex = Example(id="h", prompt="",
                 answer={"entry_point": "add", "prompt_code": "def add(a, b):\n"})
    body = "```python\n    return a + b\n```"
    assert task.extract(ex, body) == "def add(a, b):\n    return a + b\n"
    full = "```python\ndef add(a, b):\n    return a + b\n```"
    assert task.extract(ex, full) == "def add(a, b):\n    return a + b\n"


def test_binary_fraction_and_format_rewards():
    ex = Example(id="p", prompt="", answer=AFFINE)
    half = "```python\ndef f(x):\n    return 5 if x == 2 else 0\n```"
    right = "```python\ndef f(x):\n    return 2 * x + 1\n```"
    binary = _task(variant="full", format_score=0.1)
    fraction = _task(variant="full", reward="fraction", format_score=0.1)
    try:
        b = binary.verify_batch([ex] * 3, [right, half, "no code"])
        assert [s.reward for s in b] == [1.0, 0.1, 0.0]
        assert [s.correct for s in b] == [True, False, False]
        assert [s.parsed for s in b] == [True, True, False]
        f = fraction.verify(ex, half)
        assert f.reward == pytest.approx(0.1 + 0.9 / 3) and f.info["passed"] == 1
    finally:
        binary.grader.close()
        fraction.grader.close()


def test_split_asserts_makes_one_unit_per_assert_of_check():
    src = ("def check(candidate):\n    x = 1\n    assert candidate(x) == 2\n"
           "    assert candidate(2) == 3\n")
    units = split_asserts(src)
    assert len(units) == 2
    assert "candidate(x) == 2" in units[0] and "candidate(2) == 3" not in units[0]
    assert all("x = 1" in u for u in units)
    module = "s = S()\nt = 1\nassert s.f(t) == 1\nt = 2\nassert s.f(t) == 4\n"
    assert len(split_asserts(module, func="nope")) == 2
    assert split_asserts("assert f(1) == 2\n") == ["assert f(1) == 2\n"]


def test_called_names_finds_entry_points_even_when_they_shadow_a_builtin():
    assert called_names(["assert set(similar(a, b)) == set((4, 5))"]) == ["similar"]
    assert called_names(["assert sum(10, 15) == 6"]) == ["sum"]  # MBPP 126


@pytest.mark.parametrize(("got", "expected", "same"), [
    ("1 2\n3\n", "1 2 3", True), ("1.0000001\n", "1.0", True), ("YES", "NO", False),
    ("1 2", "1 2 3", False), ("nan", "nan", True), ("inf", "1e308", False),
])
def test_stdout_comparison_is_whitespace_and_float_tolerant(got, expected, same):
    assert outputs_match(got, expected) is same


def test_stdio_problems_are_graded_by_the_judge():
    grader = CodeGrader(GraderConfig(workers=1, stop_on_first_failure=False))
    answer = {"kind": "stdio", "preamble": "", "units": [
        {"input": "2 3\n", "output": "5\n"}, {"input": "10 -4\n", "output": "6"}]}
    try:
        good = grader.grade(answer, "a, b = map(int, input().split())\nprint(a + b)\n")
        crash = grader.grade(answer, "a, b = map(int, input().split())\nprint(a + b)\n1/0\n")
        wrong = grader.grade(answer, "print(5)\n")
    finally:
        grader.close()
    assert good.all_passed and good.passed == 2
    assert crash.passed == 0  # right output, but a crash is a failed run
    assert wrong.passed == 1 and not wrong.all_passed


def test_tiny_problems_are_solved_by_their_references(tiny_task):
    (heldout,) = tiny_task.eval_sets()
    examples = heldout.examples[:40]
    scores = tiny_task.verify_batch(examples, [ex.meta["reference"] for ex in examples])
    assert all(s.correct for s in scores)
    wrong = tiny_task.verify_batch(examples, ["def f(x): return x*0+1"] * len(examples))
    assert sum(s.correct for s in wrong) <= 2  # only problems that happen to be f = 1


def test_tiny_split_and_warm_start(tiny_task):
    train, heldout = tiny_task.train_examples(), tiny_task.eval_sets()[0].examples
    assert len(heldout) == 500 and len(train) == len(testbed.problems(2, 0)) - 500
    assert not {e.id for e in train} & {e.id for e in heldout}
    pairs = tiny_task.warmstart_examples()
    assert len(pairs) == round(0.1 * len(train))
    assert all(c.startswith(testbed.HEADER) for _, c in pairs)
    assert all(set(c) <= set("def f(x):return0123456789+-*%() ") for _, c in pairs)


def test_tiny_hidden_tests_reject_a_lookup_table(tiny_task):
    ex = tiny_task.eval_sets()[0].examples[0]
    table = dict(p.split("=") for p in ex.prompt.split())
    lookup = ("def f(x): return {" + ",".join(f"{k[2:-1]}:{v}" for k, v in table.items())
              + "}.get(x, 0)")
    score = tiny_task.verify(ex, lookup)
    assert score.parsed and not score.correct and score.info["passed"] == 3


def test_unparsable_tiny_response_is_a_parse_failure(tiny_task):
    ex = tiny_task.eval_sets()[0].examples[0]
    score = tiny_task.verify(ex, "def f(x): return (((")
    assert not score.parsed and score.reward == 0.0 and score.info["status"] == "no_code"


def test_config_dataclasses_are_the_yaml_defaults():
    cfg = compose_config(["task=code"])
    assert cfg.task.tiny.heldout == TinyConfig().heldout
    assert cfg.task.grader.cpu_s == GraderConfig().cpu_s
    assert [f.name for f in dataclasses.fields(GraderConfig)] == list(cfg.task.grader.keys())


def test_the_code_grader_and_every_task_load_without_torch(tmp_path):
    # a grading process (a judge of its own, a verifier's worker, each process the hostile suite
    # starts) imports the grader and with it every task: ~1.6 s of CPU more each if a value type
    # pulled torch in (harness/types.py names it in annotations only)
    import subprocess
    import sys

    code = "import sys, tasks, tasks.code.grading; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]
