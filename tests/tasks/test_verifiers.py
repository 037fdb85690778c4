"""The built-in verifiers (harness/verifiers.py): what ``exact_match`` extracts, how it
normalises and scores, and how ``math`` turns extraction and grading into rewards, answer keys
and per-sample statistics (with a scripted grader, so only the verifier's own logic is tested)."""

from __future__ import annotations

import pytest

from harness.mathgrade.grading import GradeResult
from harness.typed_config import ConfigError
from harness.types import Example
from harness.verifiers import ExactMatchVerifier, MathVerifier


def ex(answer) -> Example:
    return Example(id="0", prompt="q", answer=answer)


def score(verifier, answer, response):
    return verifier([ex(answer)], [response])[0]


# ---- exact_match ---------------------------------------------------------------------------

def test_exact_match_defaults_to_the_full_response_case_and_punctuation_insensitive():
    v = ExactMatchVerifier()
    s = score(v, "Paris", '  "paris." ')
    assert (s.reward, s.correct, s.parsed) == (1.0, True, True)
    assert s.info == {"answer": '  "paris." ', "answer_key": "paris"}


def test_exact_match_an_empty_response_is_unparsed():
    s = score(ExactMatchVerifier(), "x", "   \n ")
    assert (s.reward, s.correct, s.parsed) == (0.0, False, False)
    assert s.info == {"answer": "", "answer_key": None}


def test_exact_match_a_wrong_answer_gets_the_format_score():
    v = ExactMatchVerifier({"format_score": 0.1, "correct_score": 2.0})
    wrong = score(v, "Paris", "Lyon")
    assert (wrong.reward, wrong.correct, wrong.parsed) == (0.1, False, True)
    right = score(v, "Paris", "PARIS")
    assert (right.reward, right.correct) == (2.0, True)
    assert isinstance(right.reward, float)
    assert score(v, "Paris", "").reward == 0.0


def test_exact_match_accepts_any_of_a_list_of_golds():
    v = ExactMatchVerifier()
    assert score(v, ["NYC", "New York"], "new  york").correct
    assert score(v, ("a", "b"), "B").correct
    assert not score(v, ["NYC", "New York"], "York").correct


def test_exact_match_compares_non_string_golds_by_their_text():
    assert score(ExactMatchVerifier(), 42, "42").correct


def test_exact_match_collapses_whitespace():
    v = ExactMatchVerifier({"strip_punctuation": False})
    assert v.normalise("  a \n\t b  ") == "a b"


def test_exact_match_case_sensitive_keeps_case():
    v = ExactMatchVerifier({"case_sensitive": True})
    assert not score(v, "Paris", "paris").correct
    assert score(v, "Paris", "Paris").correct
    assert v.normalise("AbC.") == "AbC"


def test_exact_match_strips_only_surrounding_punctuation_and_quotes():
    v = ExactMatchVerifier()
    assert v.normalise("'`\"Hello, world!\"`' ;,") == "hello, world"
    keep = ExactMatchVerifier({"strip_punctuation": False})
    assert keep.normalise("Hello.") == "hello."
    assert not score(keep, "Hello", "Hello.").correct


def test_exact_match_last_line_takes_the_last_non_blank_line():
    v = ExactMatchVerifier({"extract": "last_line"})
    assert v.extract("work\n  \nanswer: 5\n\n  \n") == "answer: 5"
    assert v.extract(" \n\n") is None
    assert score(v, "5", "thinking\n5\n").correct


def test_exact_match_boxed_takes_the_last_box():
    v = ExactMatchVerifier({"extract": "boxed"})
    assert v.extract(r"\boxed{1} then \boxed{2}") == "2"
    assert v.extract("no box") is None


def test_exact_match_answer_tag_takes_the_last_tag_across_lines():
    v = ExactMatchVerifier({"extract": "answer_tag"})
    assert v.extract("<answer>a</answer> <answer>b\nc</answer> <answer>d</answer>") == "d"
    assert v.extract("<answer>a</answer> <answer>b\nc</answer>") == "b\nc"
    assert v.extract("<answer>open") is None
    s = score(v, "x", "no tags")
    assert (s.parsed, s.reward) == (False, 0.0)


def test_exact_match_refuses_an_unknown_extraction_naming_the_key_and_choices():
    with pytest.raises(ConfigError, match=r"^task\.verifier\.extract='regex' is not one of: "
                                          r"full, last_line, boxed, answer_tag$"):
        ExactMatchVerifier({"extract": "regex"}, key="task.verifier")
    with pytest.raises(ConfigError, match=r"^verifier\.extract="):
        ExactMatchVerifier({"extract": "regex"})


def test_exact_match_strips_nothing_but_punctuation_quotes_and_spaces():
    v = ExactMatchVerifier()
    assert v.normalise("X") == "x"
    assert v.normalise("XX yes XX") == "xx yes xx"


def test_verifier_options_are_checked_under_the_given_key():
    with pytest.raises(ConfigError, match=r"unknown config key task\.verifier\.bogus"):
        ExactMatchVerifier({"bogus": 1}, key="task.verifier")
    with pytest.raises(ConfigError, match=r"unknown config key verifier\.bogus"):
        ExactMatchVerifier({"bogus": 1})
    with pytest.raises(ConfigError, match=r"unknown config key task\.verifier\.bogus"):
        MathVerifier({"bogus": 1}, key="task.verifier")
    with pytest.raises(ConfigError, match=r"unknown config key verifier\.bogus"):
        MathVerifier({"bogus": 1})


def test_math_grader_settings_reach_the_grader():
    v = MathVerifier({"grader": {"workers": 3, "timeout_s": 1.5}})
    assert (v.grader.n_workers, v.grader.config.timeout_s) == (3, 1.5)


def test_exact_match_keeps_the_first_200_characters_of_the_answer():
    s = score(ExactMatchVerifier(), "x", "y" * 300)
    assert s.info["answer"] == "y" * 200


def test_exact_match_scores_each_response_against_its_own_example():
    v = ExactMatchVerifier()
    scores = v([ex("a"), ex("b")], ["a", "a"])
    assert [s.correct for s in scores] == [True, False]


# ---- math ----------------------------------------------------------------------------------

class ScriptedGrader:
    def __init__(self, results: dict[str, GradeResult]):
        self.results = results
        self.calls: list[list[tuple[str, str]]] = []

    def grade(self, items):
        self.calls.append(list(items))
        return [self.results[answer] for _, answer in items]


def math_verifier(results, **options) -> tuple[MathVerifier, ScriptedGrader]:
    v = MathVerifier(options or None)
    grader = ScriptedGrader(results)
    v.grader = grader
    return v, grader


def test_math_grades_only_extracted_answers_against_the_gold_as_text():
    v, grader = math_verifier({"4": GradeResult(True, "ok", "4")})
    scores = v([ex(4), ex(5)], [r"so \boxed{4}", "no answer here"])
    assert grader.calls == [[("4", "4")]]
    assert [(s.reward, s.correct, s.parsed) for s in scores] == [(1.0, True, True),
                                                                   (0.0, False, False)]


def test_math_answer_key_is_the_graders_canonical_form_else_the_raw_answer():
    v, _ = math_verifier({"0.5": GradeResult(True, "ok", "1/2"),
                          "x": GradeResult(False, "error", None)})
    a, b, c = v([ex("1/2")] * 3, [r"\boxed{0.5}", r"\boxed{x}", "nothing"])
    assert a.info["answer_key"] == "1/2"
    assert b.info["answer_key"] == "x"
    assert c.info["answer_key"] is None
    assert (a.info["answer"], b.info["answer"], c.info["answer"]) == ("0.5", "x", "")


def test_math_rewards_follow_correct_and_format_scores():
    v, _ = math_verifier({"1": GradeResult(True, "ok", "1"), "2": GradeResult(False, "ok", "2")},
                         correct_score=3.0, format_score=0.5)
    right, wrong, none = v([ex("1")] * 3, [r"\boxed{1}", r"\boxed{2}", "no"])
    assert (right.reward, wrong.reward, none.reward) == (3.0, 0.5, 0.0)
    assert (right.correct, wrong.correct, none.correct) == (True, False, False)
    assert (wrong.parsed, none.parsed) == (True, False)


def test_math_stats_name_the_extraction_method_and_the_grading_status():
    v, _ = math_verifier({"7": GradeResult(False, "timeout", None),
                          "8": GradeResult(False, "ok", "8")})
    boxed, line, none = v([ex("9")] * 3, [r"\boxed{7}", "The answer is 8", "words"])
    assert boxed.info["stats"]["extract_boxed"] == 1.0
    assert boxed.info["stats"]["grade_timeout"] == 1.0
    assert line.info["stats"]["extract_answer_line"] == 1.0
    assert line.info["stats"]["grade_timeout"] == 0.0
    assert none.info["stats"]["extract_none"] == 1.0
    assert none.info["stats"]["grade_error"] == 0.0 and none.info["stats"]["grade_timeout"] == 0.0


def test_math_extraction_methods_are_configurable_in_order():
    v, _ = math_verifier({"3": GradeResult(True, "ok", "3")}, extraction=["last_number"])
    s = v([ex("3")], [r"\boxed{2} and finally 3"])[0]
    assert s.correct and s.info["stats"]["extract_last_number"] == 1.0


def test_math_keeps_the_first_200_characters_of_the_answer():
    long = "1" * 300
    v, _ = math_verifier({long: GradeResult(False, "too_long", None)})
    s = v([ex("1")], [rf"\boxed{{{long}}}"])[0]
    assert s.info["answer"] == "1" * 200
    assert s.info["stats"]["grade_error"] == 1.0
