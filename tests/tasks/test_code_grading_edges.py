"""The code task's grading rules that need no sandbox (tasks/code/grading.py): a result's credit,
how a test source is split into one unit per assert, which asserts assert nothing, which called
names are the entry points, and when two program outputs match."""

from __future__ import annotations

import ast

import pytest

from tasks.code.grading import (
    GradeResult,
    asserts_nothing,
    called_names,
    outputs_match,
    split_asserts,
    split_asserts_counted,
)


def test_all_passed_needs_at_least_one_test_and_every_test_passing():
    assert GradeResult(3, 3).all_passed
    assert not GradeResult(2, 3).all_passed
    assert not GradeResult(0, 0).all_passed


def test_fraction_is_passed_over_total_and_zero_without_tests():
    assert GradeResult(1, 4).fraction == 0.25
    assert GradeResult(0, 0).fraction == 0.0
    assert GradeResult(3, 3).fraction == 1.0


def test_a_result_defaults_to_status_ok_with_nothing_recorded():
    r = GradeResult(1, 2)
    assert (r.status, r.error, r.seconds, r.per_test, r.oversized) == ("ok", "", 0.0, [], 0)


CHECK = """
def check(candidate):
    x = 1
    assert candidate(1) == 2
    assert True
    assert candidate(2) == x + 2
"""


def test_each_real_assert_of_check_becomes_one_unit_keeping_the_other_statements():
    units, dropped = split_asserts_counted(CHECK)
    assert dropped == 1
    assert len(units) == 2
    for unit, kept in zip(units, ["candidate(1) == 2", "candidate(2) == x + 2"]):
        body = ast.parse(unit).body[0].body
        assert [type(s).__name__ for s in body] == ["Assign", "Assert"]
        assert ast.unparse(body[1].test) == kept
    assert split_asserts(CHECK) == units


def test_splitting_leaves_the_source_tree_intact_for_the_next_unit():
    src = "assert f(1) == 1\nassert f(2) == 2\nassert f(3) == 3\n"
    units = split_asserts(src)
    assert units == ["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"]


def test_module_level_asserts_are_split_when_there_is_no_check_function():
    units, dropped = split_asserts_counted("import math\nassert f(1)\nassert f(2)\n")
    assert units == ["import math\nassert f(1)", "import math\nassert f(2)"]
    assert dropped == 0


def test_the_function_holding_the_asserts_can_be_named():
    src = "def test():\n    assert f(1)\n    assert f(2)\n"
    assert len(split_asserts(src, "test")) == 2
    assert split_asserts(src) == [src]  # no check(): the module has no top-level asserts


def test_one_real_assert_stays_one_unit_as_written():
    src = "assert f(1) == 1\n"
    assert split_asserts_counted(src) == ([src], 0)


def test_one_real_assert_beside_a_trivial_one_is_rewritten_without_it():
    units, dropped = split_asserts_counted("assert True\nassert f(1) == 1\n")
    assert (units, dropped) == (["assert f(1) == 1"], 1)


def test_only_trivial_asserts_keep_the_source_and_count_nothing_dropped():
    src = "assert True\nassert 1 == 1\n"
    assert split_asserts_counted(src) == ([src], 0)


def test_a_source_that_does_not_parse_is_one_unit():
    assert split_asserts_counted("assert f(1\nassert f(2)") == (["assert f(1\nassert f(2)"], 0)


def _stmt(src: str) -> ast.stmt:
    return ast.parse(src).body[0]


@pytest.mark.parametrize("src,nothing", [
    ("assert True", True),
    ("assert 1 == 1", True),
    ("assert (2, 3)", True),
    ("assert False", False),           # fails: part of what the tests say
    ("assert 1 == 2", False),
    ("assert x == 1", False),          # names a variable
    ("assert f()", False),             # names a function
    ("assert 1 / 0", False),           # raises: kept
    ("x = 1", False),                  # not an assert
])
def test_asserts_nothing_only_for_asserts_without_names_that_hold(src, nothing):
    assert asserts_nothing(_stmt(src)) is nothing


def test_asserts_nothing_evaluates_without_builtins():
    assert asserts_nothing(_stmt("assert (1).__class__")) is True
    assert asserts_nothing(_stmt("assert [].__len__() == 0")) is True


def test_called_names_are_the_non_builtin_calls_in_order_without_repeats():
    assert called_names(["assert f(len(x)) == g(1)", "assert f(2) == h()"]) == ["f", "g", "h"]


def test_called_names_fall_back_to_builtins_when_nothing_else_is_called():
    assert called_names(["assert sum([1, 2]) == 3", "assert len('a') == 1"]) == ["sum", "len"]


def test_called_names_skip_sources_that_do_not_parse_and_method_calls():
    assert called_names(["assert f(", "assert obj.m(1) == g(2)"]) == ["g"]
    assert called_names([]) == []


@pytest.mark.parametrize("got,expected,match", [
    ("1 2 3\n", "1  2\n3", True),          # whitespace-tolerant
    ("a b", "a b c", False),               # different token count
    ("0.1000000", "0.1", True),            # numbers within 1e-6
    ("1.0000001", "1", True),
    ("1.00001", "1", False),
    ("1e-7", "0", True),                   # absolute tolerance near 0
    ("1000000.5", "1000000", True),        # relative tolerance for large values
    ("1000002", "1000000", False),
    ("abc", "abd", False),                 # words must be equal
    ("x 1.0", "x 1", True),
    ("1 x", "1.0 y", False),               # a mismatching word after a matching number
    ("a 1", "a 2", False),                 # a mismatching number after an equal token
    ("inf", "inf", True),                  # equal tokens
    ("inf", "Infinity", False),            # non-finite numbers only match as equal text
    ("nan", "NaN", False),
    ("", "", True),
])
def test_outputs_match_compares_tokens_and_numbers(got, expected, match):
    assert outputs_match(got, expected) is match


def test_each_unit_is_the_tree_unparsed_with_only_its_own_assert():
    # split_asserts unparses once and splices (linear in the asserts); each unit must be what
    # unparsing the tree without the other asserts gives, whatever surrounds them
    src = ('def check(candidate):\n    """doc"""\n    assert candidate(0) == 1\n'
           '    data = {"a": [1, 2],\n            "b": "x\\ny"}\n'
           '    def helper(v):\n        assert v\n        return v\n'
           '    assert candidate(data["a"]) == f"""{data}\n"""\n'
           '    for k in data:\n        pass\n    assert helper(candidate(2)) == 3, "msg"\n')
    tree = ast.parse(src)
    body = tree.body[0].body
    asserts = [i for i, s in enumerate(body) if isinstance(s, ast.Assert)]
    expected = []
    for keep in asserts:
        tree.body[0].body = [s for i, s in enumerate(body) if i not in asserts or i == keep]
        expected.append(ast.unparse(tree))
    tree.body[0].body = body
    assert split_asserts(src) == expected and len(expected) == 3
