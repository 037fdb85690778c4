"""Grading logic of the code task (issue 30): the prompt's helper functions that the tests call
are the judge's, never the candidate's (HumanEval/32 ``poly``, /38 ``encode_cyclic``, /50
``encode_shift``), and asserts that assert nothing (HumanEval's ``assert True``) are not units of
a fractional reward. Measured on the shipped data: 48 such asserts in 36 HumanEval problems; a
``return None`` stub earns fractional credit on 8 of 164 HumanEval problems (40 before)."""

from __future__ import annotations

import ast
import logging

import pytest

from harness.sandbox import SandboxUnavailableError
from harness.typed_config import ConfigError
from tasks.code import datasets
from tasks.code.grading import (
    CodeGrader,
    GraderConfig,
    asserts_nothing,
    split_asserts,
    split_asserts_counted,
)

HUMANEVAL_DROPPED_UNITS = 48     # `assert True` units dropped from HumanEval ...
HUMANEVAL_DROPPED_PROBLEMS = 36  # ... in this many problems
# Problems where `def <entry>(*a, **k): return None` still passes a unit, each legitimately:
# the expected value is None for some input (12, 90, 128, 137, 162), or the test is
# `assert not candidate(...)`, which any falsy value passes (52, 56, 61).
NONE_STUB_CREDITED = {"HumanEval/12", "HumanEval/52", "HumanEval/56", "HumanEval/61",
                      "HumanEval/90", "HumanEval/128", "HumanEval/137", "HumanEval/162"}


@pytest.fixture(scope="module")
def grader():
    try:
        g = CodeGrader(GraderConfig(workers=1, cache_size=0, stop_on_first_failure=False,
                                    allow_weaker_isolation=True))
    except (ConfigError, SandboxUnavailableError) as exc:
        pytest.skip(f"no sandbox on this machine: {exc}")
    yield g
    g.close()


@pytest.fixture(scope="module")
def humaneval():
    return {ex.id: ex for ex in datasets.load("humaneval")}


# -- the prompt's helpers are the judge's ---------------------------------------------------------
# Each exploit redefines the helper the tests call so that any answer passes, next to a trivial
# entry point; it would earn full credit if the judge took the helper from the candidate.
HELPER_EXPLOITS = {
    "HumanEval/32": ("poly", "def find_zero(xs):\n    return 0.0\n", "0"),
    "HumanEval/38": ("encode_cyclic", "def decode_cyclic(s):\n    return s\n", "a[0]"),
    "HumanEval/50": ("encode_shift", "def decode_shift(s):\n    return s\n", "a[0]"),
}
REDEFINITIONS = {
    "def": "def {h}(*a):\n    return {v}\n",
    "globals": "globals()['{h}'] = lambda *a: {v}\n",
    "lambda": "{h} = lambda *a: {v}\n",
    "callable_instance": ("class _Helper:\n    def __call__(self, *a):\n        return {v}\n"
                          "{h} = _Helper()\n"),
    "class": "class {h}:\n    def __new__(cls, *a):\n        return {v}\n",
}


@pytest.mark.parametrize("variant", list(REDEFINITIONS))
@pytest.mark.parametrize("problem", list(HELPER_EXPLOITS))
def test_redefining_the_prompts_helper_earns_nothing(grader, humaneval, problem, variant):
    helper, entry, value = HELPER_EXPLOITS[problem]
    program = REDEFINITIONS[variant].format(h=helper, v=value) + entry
    result = grader.grade(humaneval[problem].answer, program)
    assert result.status == "ok" and result.total > 0
    assert result.passed == 0, (problem, variant, result)


@pytest.mark.parametrize("problem", list(HELPER_EXPLOITS))
def test_the_reference_solution_still_earns_full_credit(grader, humaneval, problem):
    ex = humaneval[problem]
    result = grader.grade(ex.answer, ex.meta["reference"])
    assert result.all_passed and result.fraction == 1.0, result


def test_a_solution_without_the_helper_is_tested_with_the_judges_helper(grader, humaneval):
    # the tests call encode_shift; this candidate does not define it, the judge does
    program = ("def decode_shift(s):\n"
               "    return ''.join(chr((ord(c) - 5 - ord('a')) % 26 + ord('a')) for c in s)\n")
    assert grader.grade(humaneval["HumanEval/50"].answer, program).all_passed


def test_a_whole_function_answer_may_call_the_prompts_helper_it_did_not_repeat(grader, humaneval):
    # decode_cyclic calls encode_cyclic, defined in the prompt only: the task puts the prompt's
    # helpers before a whole-function answer (in the sandbox; the tests use the judge's copy)
    from tasks.code.task import CodeTask

    ex = humaneval["HumanEval/38"]
    response = ("```python\ndef decode_cyclic(s: str):\n"
                "    return encode_cyclic(encode_cyclic(s))\n```")
    task = CodeTask(CodeTask.Config(variant="full"))
    try:
        program = task.extract(ex, response)
    finally:
        task.grader.close()
    assert program.startswith(ex.answer["judge_helpers"])
    assert grader.grade(ex.answer, program).all_passed


def test_judge_helpers_hold_the_prompts_code_but_never_the_entry_point(humaneval):
    for ex in humaneval.values():
        helpers = ex.answer["judge_helpers"]
        names = {n.name for n in ast.parse(helpers).body if hasattr(n, "name")}
        assert ex.answer["entry_point"] not in names
    assert "def poly(" in humaneval["HumanEval/32"].answer["judge_helpers"]
    assert "import math" in humaneval["HumanEval/32"].answer["judge_helpers"]
    assert "def encode_cyclic(" in humaneval["HumanEval/38"].answer["judge_helpers"]
    assert "def encode_shift(" in humaneval["HumanEval/50"].answer["judge_helpers"]


def test_the_entry_point_is_the_candidates_even_if_the_helpers_define_it(grader):
    answer = {"kind": "functional", "preamble": "", "entry_point": "f",
              "judge_helpers": "def f(x):\n    return x + 1\n",
              "units": ["assert f(1) == 2\n", "assert f(2) == 3\n"]}
    assert grader.grade(answer, "def f(x):\n    return 0\n").passed == 0
    assert grader.grade(answer, "def f(x):\n    return x + 1\n").all_passed


# -- asserts that assert nothing are not units ----------------------------------------------------
def test_split_asserts_drops_assert_true_and_constant_asserts_but_keeps_real_ones():
    source = ("def check(candidate):\n"
              "    assert True\n"
              "    assert candidate(1) == 2\n"
              "    assert True, 'This prints if this assert fails 1 (good for debugging!)'\n"
              "    assert 1\n"
              "    assert 1 == 1\n"
              "    assert (1, 2) and not None\n"
              "    assert candidate(2) == 3\n"
              "    x = 3\n"
              "    assert x == 3\n")
    units, dropped = split_asserts_counted(source)
    assert dropped == 5
    assert units == split_asserts(source)
    kept = [[ast.unparse(s.test) for s in ast.parse(u).body[0].body if isinstance(s, ast.Assert)]
            for u in units]
    assert kept == [["candidate(1) == 2"], ["candidate(2) == 3"], ["x == 3"]]
    assert all("x = 3" in u for u in units)


def test_a_constant_assert_that_fails_is_kept():
    assert not asserts_nothing(ast.parse("assert False").body[0])
    assert not asserts_nothing(ast.parse("assert 1 == 2").body[0])
    assert not asserts_nothing(ast.parse("assert f()").body[0])
    assert asserts_nothing(ast.parse("assert 'abc'.upper() == 'ABC'").body[0])
    units, dropped = split_asserts_counted("assert f(1) == 1\nassert False\nassert True\n")
    assert (len(units), dropped) == (2, 1)


def test_a_source_with_only_trivial_asserts_stays_one_unit():
    source = "def check(candidate):\n    assert True\n    assert 1 == 1\n"
    assert split_asserts_counted(source) == ([source], 0)
    one_real = "def check(candidate):\n    assert True\n    assert candidate(1) == 1\n"
    units, dropped = split_asserts_counted(one_real)
    assert dropped == 1 and len(units) == 1 and "assert True" not in units[0]


def test_the_humaneval_loader_counts_and_logs_the_dropped_units(caplog):
    with caplog.at_level(logging.INFO, logger="rlbench"):
        examples = datasets.load("humaneval")
    dropped = [ex.meta["dropped_units"] for ex in examples]
    assert sum(dropped) == HUMANEVAL_DROPPED_UNITS
    assert sum(d > 0 for d in dropped) == HUMANEVAL_DROPPED_PROBLEMS
    assert (f"humaneval: dropped {HUMANEVAL_DROPPED_UNITS} test units that assert nothing "
            f"(assert True) from {HUMANEVAL_DROPPED_PROBLEMS} problems") in caplog.text
    for ex in examples:  # no unit left that every program passes
        for unit in ex.answer["units"]:
            check = next(n for n in ast.parse(unit).body if isinstance(n, ast.FunctionDef))
            asserts = [s for s in check.body if isinstance(s, ast.Assert)]
            assert not asserts or not all(asserts_nothing(s) for s in asserts), ex.id


def test_other_loaders_record_their_dropped_count():
    for name in ("mbpp_test", "mbpp_sanitized", "leetcode"):  # leetcode_prime: 1 min to load
        examples = datasets.load(name)
        assert all(ex.meta["dropped_units"] == 0 for ex in examples), name


def test_a_none_stub_earns_credit_only_where_none_is_a_right_answer(grader, humaneval):
    examples = list(humaneval.values())
    results = grader.grade_many([
        (ex.answer, f"def {ex.answer['entry_point']}(*a, **k):\n    return None\n")
        for ex in examples])
    assert all(r.status == "ok" for r in results)
    credited = {ex.id for ex, r in zip(examples, results) if r.passed > 0}
    assert len(credited) <= len(NONE_STUB_CREDITED)
    assert credited <= NONE_STUB_CREDITED
