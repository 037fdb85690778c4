"""Countdown verifier and solver: gold fixtures, hostile input, and solver correctness."""

from __future__ import annotations

import builtins
import json
import random
import time
from fractions import Fraction
from pathlib import Path

import pytest

from tasks.countdown.solver import enumerate_tiny_problems, reachable_values, solve
from tasks.countdown.verifier import check_expression

DATA = Path(__file__).resolve().parents[2] / "tasks" / "countdown" / "data"


def _rows(split: str) -> list[dict]:
    with (DATA / f"{split}.jsonl").open() as fh:
        return [json.loads(line) for line in fh]


# (expression, numbers, target, parsed, numbers_ok, correct)
GOLD = [
    ("44+19+35", [44, 19, 35], 98, True, True, True),  # train.jsonl row 0
    ("(35 - 19) * 44", [44, 19, 35], 98, True, True, False),  # wrong value
    ("44+44+10", [44, 19, 35], 98, True, False, False),  # a number reused, others missing
    ("44+54", [44, 19, 35], 98, True, False, False),  # missing numbers
    ("44+19+35+0", [44, 19, 35], 98, True, False, False),  # extra number
    ("44+19+35", [44, 19, 35, 35], 98, True, False, False),  # one copy of 35 unused
    ("(8/4)*3", [8, 4, 3], 6, True, True, True),  # exact division
    ("8/(4*3)*9", [8, 4, 3, 9], 6, True, True, True),  # fractional intermediate 2/3
    ("1/3*3", [1, 3, 3], 1, True, True, True),  # exact fractions, no float error
    ("3/(3-3)", [3, 3, 3], 1, True, True, False),  # division by zero
    ("  ( 2 +3 ) *  4 ", [2, 3, 4], 20, True, True, True),  # whitespace anywhere
    ("3*7-6", [3, 6, 7], 15, True, True, True),
    ("3*7-6 is the answer", [3, 6, 7], 15, False, False, False),  # extra text
    ("3*7-6=15", [3, 6, 7], 15, False, False, False),  # '=' is not allowed
    ("-3+7*6", [3, 6, 7], 39, False, False, False),  # unary minus
    ("+3+7+6", [3, 6, 7], 16, False, False, False),  # unary plus
    ("3.0*7-6", [3, 6, 7], 15, False, False, False),  # decimals
    ("(3*7-6", [3, 6, 7], 15, False, False, False),  # unbalanced
    ("3*7-6)", [3, 6, 7], 15, False, False, False),
    ("", [3, 6, 7], 15, False, False, False),
    ("()", [3, 6, 7], 15, False, False, False),
    ("٣*٧-٦", [3, 6, 7], 15, False, False, False),  # Arabic-Indic digits
    ("３*７-６", [3, 6, 7], 15, False, False, False),  # full-width digits
    ("3\t*7-6", [3, 6, 7], 15, False, False, False),  # only spaces are whitespace
    ("999999-999984", [999999, 999984], 15, True, True, True),  # 6-digit literals are fine
]


@pytest.mark.parametrize(("text", "numbers", "target", "parsed", "numbers_ok", "correct"), GOLD)
def test_gold_fixture_verdicts(text, numbers, target, parsed, numbers_ok, correct):
    result = check_expression(text, numbers, target)
    assert (result.parsed, result.numbers_ok, result.correct) == (parsed, numbers_ok, correct)


def test_value_is_the_exact_fraction():
    assert check_expression("8/(4*3)", [8, 4, 3], 1).value == Fraction(2, 3)
    assert check_expression("1/3*3", [1, 3, 3], 1).value == 1


def test_division_by_zero_is_parsed_but_wrong_with_reason():
    result = check_expression("3/(3-3)", [3, 3, 3], 1)
    assert result.parsed and not result.correct
    assert result.value is None
    assert result.reason == "division by zero"


def test_solver_finds_train_row_zero_and_verifier_accepts_it():
    row = _rows("train")[0]
    assert row == {"target": 98, "nums": [44, 19, 35]}
    expr = solve(row["nums"], row["target"])
    assert expr is not None
    assert check_expression(expr, row["nums"], row["target"]).correct


HOSTILE = [
    "__import__('os').system('touch {sentinel}')",
    "eval(\"open('{sentinel}','w')\")",
    "9**9**9",
    "2*" * 60,
    "2*" * 5000 + "2",
    "1" * 10_000,  # a 10,000-digit literal
    "1234567+1",  # a 7-digit literal under the length cap
    "x" * 100_000,  # a 100,000-char string
    "1+" * 50_000 + "1",
    "(" * 1000 + "1" + ")" * 1000,  # 1,000 nested parentheses
    "(" * 25 + "1" + ")" * 25,  # too deep, under the length cap
    "999999*" * 24 + "999999",  # largest products the caps allow
    "1/" * 90 + "7",  # long division chain
]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_input_is_rejected_fast_and_executes_nothing(template, tmp_path, monkeypatch):
    sentinel = tmp_path / "pwned"
    text = template.replace("{sentinel}", str(sentinel))

    def forbidden(*args, **kwargs):
        raise AssertionError("the verifier tried to import/eval/exec/compile")

    names = ("__import__", "eval", "exec", "compile")
    originals = {name: getattr(builtins, name) for name in names}
    start = time.perf_counter()
    try:
        for name in originals:
            setattr(builtins, name, forbidden)
        result = check_expression(text, [1, 2, 3], 6)
    finally:
        for name, fn in originals.items():
            setattr(builtins, name, fn)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.1, f"check_expression took {elapsed * 1000:.1f} ms"
    assert not result.correct
    assert not sentinel.exists()
    if template.startswith(("1/", "999999*")):
        assert result.parsed  # long but legal: evaluated exactly, just wrong
    else:
        assert not result.parsed


def test_nesting_at_the_depth_limit_still_parses():
    text = "(" * 20 + "1+2+3" + ")" * 20
    assert check_expression(text, [1, 2, 3], 6).correct
    deeper = "(" * 21 + "1+2+3" + ")" * 21
    assert not check_expression(deeper, [1, 2, 3], 6).parsed


# -- solver ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_numbers", [3, 4])
def test_solver_solutions_verify_on_random_real_rows(n_numbers):
    rows = [r for r in _rows("train") if len(r["nums"]) == n_numbers]
    for row in random.Random(n_numbers).sample(rows, 25):
        expr = solve(row["nums"], row["target"])
        assert expr is not None, row
        assert check_expression(expr, row["nums"], row["target"]).correct, (row, expr)


def test_solver_is_fast_on_four_numbers():
    rows = [r for r in _rows("test") if len(r["nums"]) == 4][:40]
    start = time.perf_counter()
    for row in rows:
        solve(row["nums"], row["target"])
    assert (time.perf_counter() - start) / len(rows) < 0.05


def test_solver_returns_none_when_unsolvable():
    assert solve([1, 1, 1], 100) is None
    assert solve([2, 3], 7) is None


def test_solver_respects_ops():
    assert solve([8, 4, 3], 6, ops="+-*") is None  # needs division
    assert solve([8, 4, 3], 6) is not None


def test_solver_is_canonical_and_uses_minimal_parentheses():
    assert solve([7, 3, 6], 15) == solve([3, 6, 7], 15) == solve([6, 7, 3], 15)
    assert solve([3, 6, 7], 15) == "3*7-6"  # no parentheses needed
    assert solve([2, 6, 8], 64) == "(2+6)*8"  # one pair is unavoidable


def test_tiny_enumeration_has_1973_problems():
    problems = enumerate_tiny_problems(count=3, max_number=9, ops="+-*")
    assert len(problems) == 1973
    assert len(set(problems)) == 1973
    assert all(nums == tuple(sorted(nums)) and target > 0 for nums, target in problems)


def test_every_tiny_problem_is_solvable_and_verifies():
    for nums, target in enumerate_tiny_problems():
        expr = solve(nums, target, ops="+-*")
        assert expr is not None and "/" not in expr
        assert check_expression(expr, list(nums), target).correct


def test_solutions_with_division_verify_for_every_small_problem():
    # with "/" the parenthesisation of denominators matters: 8/(2*2) is not 8/2*2
    for nums, target in enumerate_tiny_problems(count=3, max_number=9, ops="+-*/"):
        expr = solve(nums, target)
        assert expr is not None
        assert check_expression(expr, list(nums), target).correct, (nums, target, expr)


def test_reachable_values_are_exact():
    assert reachable_values([1, 2]) == {Fraction(3), Fraction(-1), Fraction(1), Fraction(2),
                                        Fraction(1, 2)}


def test_without_division_integer_arithmetic_gives_the_fraction_solvers_answers(monkeypatch):
    # Without "/" the solver computes in ints; forced back to Fractions it must list the same
    # problems, in the same order, and write the same expression for each (a sample of the
    # default tiny pool: every multiset of 1..15, their targets, and unreachable targets).
    from tasks.countdown import solver

    problems = enumerate_tiny_problems(count=3, max_number=15, ops="+-*")
    sample = [*problems[::7], ((2, 3, 5), 1000), ((4, 6, 9), 7)]
    fast = [solve(nums, target, ops="+-*") for nums, target in sample]
    assert all(isinstance(v, int) for v in reachable_values([3, 5, 7], ops="+-*"))
    solver._table.cache_clear()
    monkeypatch.setattr(solver, "_number", lambda n, ops: Fraction(n))
    try:
        assert enumerate_tiny_problems(count=3, max_number=15, ops="+-*") == problems
        assert [solve(nums, target, ops="+-*") for nums, target in sample] == fast
        assert all(isinstance(v, Fraction) for v in reachable_values([3, 5, 7], ops="+-*"))
    finally:
        solver._table.cache_clear()  # the Fraction tables must not outlive the patch
