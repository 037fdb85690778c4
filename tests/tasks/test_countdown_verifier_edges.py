"""The Countdown checker's verdicts and reasons (tasks/countdown/verifier.py): every parse error
names what went wrong, a division by zero anywhere in a sum or product poisons the whole value,
parentheses count depth only while open, and the bounds on length and digits."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tasks.countdown.verifier import MAX_CHARS, MAX_DEPTH, MAX_DIGITS, check_expression


def reason(text: str, numbers=(1, 2), target=3) -> str:
    return check_expression(text, list(numbers), target).reason


@pytest.mark.parametrize("text,expected", [
    ("", "empty expression"),
    ("   ", "empty expression"),
    ("1 2", "unexpected token 2"),
    ("(1+2))", "unexpected token ')'"),
    ("(1+2", "unbalanced parentheses"),
    ("1+", "expected an operand at end of expression"),
    ("1+*2", "expected an operand, got '*' (unary operators are not allowed)"),
    ("-1+2", "expected an operand, got '-' (unary operators are not allowed)"),
    ("1+x", "unexpected character 'x' at position 2"),
    ("1X2", "unexpected character 'X' at position 1"),
    ("1234567+1", f"integer literal longer than {MAX_DIGITS} digits"),
])
def test_each_parse_error_names_what_went_wrong(text, expected):
    result = check_expression(text, [1, 2], 3)
    assert (result.parsed, result.numbers_ok, result.correct, result.value) == (
        False, False, False, None)
    assert result.reason == expected


def test_nesting_deeper_than_the_limit_is_refused_with_its_reason():
    deep = "(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1)
    assert reason(deep, [1], 1) == f"parentheses nested deeper than {MAX_DEPTH}"


def test_depth_counts_only_open_parentheses():
    many = "+".join(["(1)"] * (MAX_DEPTH + 5))
    result = check_expression(many, [1] * (MAX_DEPTH + 5), MAX_DEPTH + 5)
    assert result.correct, result.reason
    nested_then_flat = "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH + "+(1)"
    assert check_expression(nested_then_flat, [1, 1], 2).correct


def test_a_text_longer_than_the_limit_is_refused_before_parsing():
    too_long = check_expression("1+" * (MAX_CHARS // 2) + "1", [1], 1)
    assert (too_long.parsed, too_long.numbers_ok, too_long.correct, too_long.value,
            too_long.reason) == (False, False, False, None, f"longer than {MAX_CHARS} characters")
    ones = (MAX_CHARS - 1) // 2 + 1          # "1+1+...+1" with one space: exactly the limit
    at_limit = " " + "+".join(["1"] * ones)
    assert len(at_limit) == MAX_CHARS
    assert check_expression(at_limit, [1] * ones, ones).correct


def test_a_non_string_is_refused():
    result = check_expression(12, [1], 12)
    assert (result.parsed, result.numbers_ok, result.correct, result.value, result.reason) == (
        False, False, False, None, "not a string")


@pytest.mark.parametrize("text", ["(1/0)+1", "1+(1/0)", "1/0+1+1", "1+1/0+1", "(1/0)*2",
                                  "2*(1/0)", "1/0*2*3", "2*3/0*4", "(1/0)/2", "1/(2-2)*3"])
def test_a_division_by_zero_anywhere_makes_the_value_undefined(text):
    result = check_expression(text, [], 0)
    assert result.parsed and not result.correct
    assert result.value is None and result.reason == "division by zero"


def test_wrong_numbers_and_wrong_values_say_which():
    wrong_numbers = check_expression("1+1+1", [1, 2], 3)
    assert (wrong_numbers.parsed, wrong_numbers.numbers_ok, wrong_numbers.value) == (
        True, False, Fraction(3))
    assert wrong_numbers.reason == "numbers used [1, 1, 1] are not exactly the given [1, 2]"
    wrong_value = check_expression("2-1", [1, 2], 3)
    assert (wrong_value.numbers_ok, wrong_value.correct) == (True, False)
    assert wrong_value.reason == "value 1 != target 3"
    right = check_expression(" ( 2 + 1 ) ", [1, 2], 3)
    assert (right.correct, right.reason, right.value) == (True, "ok", Fraction(3))


def test_closing_a_parenthesis_lowers_the_depth_by_exactly_one():
    # depth 3, back to 2, then 19 more: 21 open at once, one too many
    deep = "((" + "(1)" + "+" + "(" * (MAX_DEPTH - 1) + "1" + ")" * (MAX_DEPTH - 1) + "))"
    assert reason(deep, [1, 1], 2) == f"parentheses nested deeper than {MAX_DEPTH}"
    ok = "(" + "(1)" + "+" + "(" * (MAX_DEPTH - 1) + "1" + ")" * (MAX_DEPTH - 1) + ")"
    assert check_expression(ok, [1, 1], 2).correct
