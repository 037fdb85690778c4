"""MATH grading: answer extraction, and math-verify in worker processes on gold answers drawn
from the real eval sets (each matches itself and a rewritten equivalent form, clear mismatches
fail), hostile input that must neither crash nor hang, and the task's scores."""

from __future__ import annotations

import os
import signal
import time

import pytest

from harness.mathgrade.extract import answer_line, extract_answer, last_boxed, last_number
from harness.mathgrade.grading import GraderConfig, MathGrader
from harness.types import Example
from tasks.math import datasets
from tasks.math.task import MathTask


@pytest.fixture(scope="module")
def grader():
    g = MathGrader(GraderConfig(workers=2, timeout_s=2.0, kill_grace_s=1.0))
    yield g
    g.close()


# -- extraction ----------------------------------------------------------------------------------
def test_last_boxed_takes_the_last_box_with_nested_braces():
    text = r"First \boxed{1}. So $x = \boxed{\frac{1}{2}}$ and \fbox{ignored} is earlier? no"
    assert last_boxed(text) == "ignored"
    assert last_boxed(r"so \boxed{\frac{\sqrt{3}}{2}}.") == r"\frac{\sqrt{3}}{2}"
    assert last_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"  # escaped braces are literal
    assert last_boxed(r"\boxed 5$") == "5"


def test_unterminated_last_box_falls_back_to_the_previous_one():
    assert last_boxed(r"\boxed{3} then \boxed{\frac{1}{2}") == "3"
    assert last_boxed(r"\boxed{") is None


def test_fallbacks_are_tried_in_order_and_named():
    assert extract_answer(r"so \boxed{7}. Answer: 8") == ("7", "boxed")
    assert extract_answer("The final answer is $\\frac{3}{4}$.") == (r"\frac{3}{4}", "answer_line")
    assert extract_answer("we get 12 apples, then 1,250 pears") == ("1250", "last_number")
    assert extract_answer("no digits here") == (None, "none")
    assert extract_answer("Answer: 8", ["boxed"]) == (None, "none")
    assert answer_line("answer is: x = 3\nmore") == "x = 3"
    assert last_number("-3.5 and 7/8") == "7/8"


def test_extraction_is_linear_on_adversarial_text():
    start = time.perf_counter()
    for text in ("\\boxed{" * 50_000, "{" * 200_000, "1" * 200_000, "Answer:" * 30_000,
                 "1," * 100_000):
        extract_answer(text)
    assert time.perf_counter() - start < 3.0


# -- gold fixtures from the real eval sets -------------------------------------------------------
# (dataset, index, gold as loaded, an equivalent rewrite, a clear mismatch)
GOLD = [
    ("math500", 0, r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})", r"(3,\pi)"),
    ("math500", 2, r"\frac{14}{3}", "14/3", r"\frac{3}{14}"),
    ("math500", 162, r"\dfrac{17}{50}", "0.34", "0.35"),          # \dfrac vs decimal
    ("math500", 44, "1.25", r"\frac{5}{4}", "1.52"),              # decimal vs fraction
    ("math500", 7, r"90^\circ", "90", "45"),                      # degrees
    ("math500", 166, r"\frac{270}7\text{ degrees}", r"\frac{270}{7}", r"\frac{7}{270}"),  # units
    ("math500", 103, "(3,4]", "(3, 4]", "[3,4]"),                 # interval
    ("math500", 307, r"(-\infty, 0]", r"(-\infty,0]", r"(-\infty, 0)"),
    ("math500", 435, r"(-\infty, 2) \cup (3, \infty)", r"(-\infty,2)\cup(3,\infty)",
     r"(-\infty, 2) \cup (4, \infty)"),
    ("math500", 422, r"\{1\pm\sqrt{5},-2\}", r"\{-2, 1+\sqrt{5}, 1-\sqrt{5}\}", r"\{1,-2\}"),  # set
    ("math500", 8, r"3\sqrt{13}", r"\sqrt{117}", r"3\sqrt{12}"),
    ("math500", 4, r"\text{Evelyn}", "Evelyn", r"\text{Bob}"),
    ("aime24", 0, "204", "204.0", "205"),
    ("amc23", 0, "27", "27.0", "72"),
    ("minerva", 0, "1.6", r"1.6 \mathrm{~cm}", "16"),             # unit removed
    ("olympiadbench", 1, r"\frac{1}{2 n+2}", r"\frac{1}{2(n+1)}", r"\frac{1}{2n+1}"),
    ("olympiadbench", 5, "(1,8,19), (2,7,13), (4,5,7)", "(4,5,7), (2,7,13), (1,8,19)",
     "(1,8,19), (2,7,13)"),
    ("gsm8k", 2, "70000", "70,000", "7000"),
]


def test_gold_fixtures_are_the_loaded_gold_answers():
    loaded = {name: datasets.load(name) for name in {g[0] for g in GOLD}}
    for name, index, gold, _, _ in GOLD:
        assert loaded[name][index]["gold"] == gold, (name, index)


@pytest.mark.slow
def test_gold_matches_itself_and_its_rewrite_and_rejects_mismatches(grader):
    items = [(gold, pred) for _, _, gold, same, other in GOLD for pred in (gold, same, other)]
    results = grader.grade(items)
    for (name, index, _gold, same, other), i in zip(GOLD, range(0, len(items), 3)):
        itself, rewrite, mismatch = results[i : i + 3]
        assert itself.status == "ok" and itself.correct, (name, index, "itself")
        assert rewrite.correct, (name, index, same)
        assert not mismatch.correct, (name, index, other)


# -- hostile input -------------------------------------------------------------------------------
HOSTILE = [
    r"\frac{", r"\left(\right", "}}}{{{", r"\sqrt[", r"\begin{matrix}", "$$$$", "\\", "",
    r"\frac{1}{0}", "1/0", r"\boxed{\boxed{\boxed{", "\x00\x01\x02", r"\int_0^\infty e^{-x^{2}}",
    r"9^{9^{9^{9^{9}}}}", r"10^{10^{10^{10}}}!", r"\underbrace{", "x" * 900, "(" * 500,
]


@pytest.mark.slow
def test_malformed_latex_neither_crashes_nor_hangs(grader):
    start = time.perf_counter()
    results = grader.grade([("2", h) for h in HOSTILE])
    elapsed = time.perf_counter() - start
    assert len(results) == len(HOSTILE)
    assert not any(r.correct for r in results)
    assert {r.status for r in results} <= {"ok", "error", "timeout"}
    # at most a couple of items hit the per-item timeout (2 s + 1 s grace), on 2 workers
    assert elapsed < 20, elapsed
    assert grader.grade([("2", "2")])[0].correct  # the pool still works afterwards


@pytest.mark.slow
def test_a_stuck_worker_is_killed_and_its_other_items_still_graded():
    g = MathGrader(GraderConfig(workers=1, timeout_s=0.5, kill_grace_s=0.5, chunk_size=8))
    try:
        assert g.grade([("1", "1")])[0].correct  # the worker is up
        # a worker stuck where no signal gets through (C code): SIGSTOP freezes it the same way
        os.kill(g._procs[0].proc.pid, signal.SIGSTOP)
        results = g.grade([("2", "2"), ("3", "3"), ("4", "5")])
        assert [(r.correct, r.status) for r in results] == [
            (False, "timeout"), (True, "ok"), (False, "ok")]
        assert g.counts["killed"] == 1
        # a worker that died while idle is replaced on the next call
        os.kill(g._procs[0].proc.pid, signal.SIGKILL)
        g._procs[0].proc.wait()
        assert [r.correct for r in g.grade([("6", "6"), ("7", "7")])] == [True, True]
    finally:
        g.close()


def test_too_long_answers_are_not_graded(grader):
    (r,) = grader.grade([("1", "1" * 5000)])
    assert (r.correct, r.status) == (False, "too_long")


# -- the task's scores ---------------------------------------------------------------------------
def test_task_scores_count_extraction_methods_and_use_rewards():
    task = MathTask(MathTask.Config(variant="tiny", format_score=0.1,
                                    grader=GraderConfig(workers=1)))
    ex = Example(id="e", prompt="Solve 4x+7=10\n", answer={"gold": r"\frac{3}{4}"})
    responses = [r"4x=3, x=\boxed{\frac{3}{4}}", "x = 0.75", r"\boxed{\frac{6}{8}}",
                 r"\boxed{1}", "no answer"]
    scores = task.verify_batch([ex] * len(responses), responses)
    assert [s.correct for s in scores] == [True, True, True, False, False]
    assert [s.reward for s in scores] == [1.0, 1.0, 1.0, 0.1, 0.0]
    assert [s.parsed for s in scores] == [True, True, True, True, False]
    assert [s.info["extract"] for s in scores] == ["boxed", "last_number", "boxed", "boxed",
                                                   "none"]
    assert scores[0].info["stats"]["extract_boxed"] == 1.0
    assert scores[4].info["stats"]["extract_none"] == 1.0
    # equivalent answers vote together in maj@k
    assert scores[0].info["answer_key"] == scores[1].info["answer_key"] == "3/4"
    task.grader.close()
