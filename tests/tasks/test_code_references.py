"""Every reference solution of the shipped benchmarks passes its tests through the real grader
(sandbox + judge): HumanEval 164/164, MBPP 974/974, sanitized MBPP 427/427, DeepCoder LeetCode
200/200 with the import preamble. Runs in CI (about 20 s on 2 cores)."""

from __future__ import annotations

import pytest

from tasks.code import datasets
from tasks.code.grading import CodeGrader, GraderConfig

EXPECTED = {"humaneval": 164, "mbpp": 974, "mbpp_sanitized": 427, "leetcode": 200}


@pytest.fixture(scope="module")
def grader():
    # The references are judged for correctness, not speed: the slowest (mbpp/123, amicable
    # numbers up to 9999, O(n^2)) needs ~5 s of one quiet core and ~15 s on a loaded machine,
    # over the task's 10 s call budget, so the budgets here are generous.
    g = CodeGrader(GraderConfig(workers=2, stop_on_first_failure=False, call_timeout_s=60.0,
                                cpu_s=60.0, timeout_per_test_s=20.0))
    yield g
    g.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_reference_solution_passes(grader, name):
    examples = datasets.load(name)
    assert len(examples) == EXPECTED[name]
    results = grader.grade_many([(ex.answer, ex.meta["reference"]) for ex in examples])
    failed = [(ex.id, r.status, r.error) for ex, r in zip(examples, results) if not r.all_passed]
    assert not failed, failed
    assert sum(r.total for r in results) >= len(examples)


@pytest.mark.slow
def test_a_wrong_program_fails_every_humaneval_problem(grader):
    # the same tests reject a program that returns None, so the pass above means something
    examples = datasets.load("humaneval")[:40]
    results = grader.grade_many(
        [(ex.answer, ex.answer["prompt_code"] + "    return None\n") for ex in examples])
    assert sum(r.all_passed for r in results) == 0


@pytest.mark.slow
def test_stdio_sets_load_with_tests_but_no_references():
    for name in ("codeforces", "code_contests", "leetcode_prime"):
        examples = datasets.load(name)
        assert examples and all(ex.answer["units"] for ex in examples)
        assert all("reference" not in ex.meta for ex in examples)
