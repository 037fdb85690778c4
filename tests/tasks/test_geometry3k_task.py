"""Geometry3kTask: configs, prompts, grading by choice letter or by value (math-verify through the
shared grader pool) on gold fixtures from the real test set, parse statistics, hostile input,
and the tiny variant's contract with tasks/geometry3k/generated.py (held-out seed, shuffled
control)."""

from __future__ import annotations

import sys
import types

import pytest
from PIL import Image

from harness.cli import compose_config
from harness.mathgrade.grading import GraderConfig
from harness.registry import TASKS
from harness.task import EvalProtocol
from harness.typed_config import ConfigError, build, validate
from harness.types import Example
from tasks.geometry3k import datasets
from tasks.geometry3k.task import (
    CHOICE_INSTRUCTION,
    VALUE_INSTRUCTION,
    FullConfig,
    Geometry3kTask,
    TinyConfig,
    choice_letter,
    derangement,
    prompt_text,
    render_prompt,
    shuffle_images,
)


@pytest.fixture(scope="module")
def task() -> Geometry3kTask:
    t = Geometry3kTask(Geometry3kTask.Config(grader=GraderConfig(workers=1, timeout_s=2.0),
                                             full=FullConfig(mode="text")))
    yield t
    t.grader.close()


@pytest.fixture(scope="module")
def gold(task) -> dict[str, Example]:
    return {ex.meta["problem_id"]: ex for ex in task.eval_sets()[0].examples}


def _choice_example() -> Example:
    (p,) = [p for p in datasets.load_intergps(datasets.DATA_DIR / "intergps_examples", "train")
            if p.id == "15"]  # choices 5, 5 sqrt 2, 5 sqrt 3, 10; answer C
    return Example(id="g-15", prompt=prompt_text(p.text, p.choices),
                   answer={"value": p.value, "choices": p.choices, "letter": p.letter})


def test_geometry3k_is_registered_and_geometry3k_tiny_selects_the_tiny_variant():
    assert TASKS.get("geometry3k") is Geometry3kTask
    cfg = compose_config(["task=geometry3k_tiny", "model.task_variant=full"])
    assert (cfg.task.name, cfg.task.variant) == ("geometry3k", "tiny")
    full = build(TASKS, compose_config(["task=geometry3k", "model.task_variant=full"]).task,
                 "task")
    assert (full.config.full.source, full.config.full.mode) == ("bundled", "image")
    proto = full.config.full.eval["test"]
    assert (proto.n, proto.k, proto.maj_k, proto.temperature) == (4, [1, 4], [4], 0.6)


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"task\.full\.render"):
        validate(Geometry3kTask.Config, {"full": {"render": 3}}, "task")
    with pytest.raises(ValueError, match="template"):
        Geometry3kTask(Geometry3kTask.Config(full=FullConfig(template="alpaca")))
    with pytest.raises(ValueError, match="extraction"):
        Geometry3kTask(Geometry3kTask.Config(extraction=["guess"]))
    with pytest.raises(ValueError, match="not an eval set"):
        Geometry3kTask(Geometry3kTask.Config(variant="tiny", tiny=TinyConfig(
            eval={"test": EvalProtocol()})))
    with pytest.raises(ValueError, match="eval_seed"):
        Geometry3kTask(Geometry3kTask.Config(variant="tiny", tiny=TinyConfig(seed=3, eval_seed=3)))


def test_choice_prompt_lists_letters_and_free_form_prompt_asks_for_a_boxed_value():
    text = prompt_text("Find y.", ["5", "5 \\sqrt { 2 }"])
    assert text == f"Find y.\nChoices:\nA. 5\nB. 5 \\sqrt {{ 2 }}\n{CHOICE_INSTRUCTION}"
    assert prompt_text("Find x.") == f"Find x.\n{VALUE_INSTRUCTION}"
    assert render_prompt("chat", "q") == [{"role": "user", "content": "q"}]
    assert render_prompt("plain", "q") == "q\n"


def test_choice_letter_reads_common_letter_forms_and_nothing_else():
    choices = ["1", "2", "3", "4"]
    for text in ("B", "(B)", "B.", "B) 2", "B: 2", "\\text{B}", "$B$", " \\textbf{B} "):
        assert choice_letter(text, choices) == "B", text
    for text in ("E", "b", "AB", "A B", "2", "Bx", ""):
        assert choice_letter(text, choices) is None, text
    assert choice_letter("B", None) is None  # no choices: graded as a value


def test_gold_values_match_themselves_and_equivalent_forms(task, gold):
    cases = [("2409", "21\\sqrt{3}"), ("2433", "8.5\\sqrt{3}"), ("2419", "10\\pi"),
             ("2401", "60.0"), ("2427", "\\sqrt{7}")]
    exs, responses = [], []
    for pid, equivalent in cases:
        value = gold[pid].answer["value"]
        exs += [gold[pid], gold[pid]]
        responses += [f"so the answer is \\boxed{{{value}}}", f"Answer: {equivalent}"]
    scores = task.verify_batch(exs, responses)
    assert [s.correct for s in scores] == [True] * len(scores)
    assert all(s.reward == 1.0 and s.parsed and s.info["letter"] is None for s in scores)


def test_wrong_values_and_unparsable_responses_fail(task, gold):
    ex = gold["2409"]  # 21 sqrt 3
    responses = ["\\boxed{21}", "\\boxed{21\\sqrt{2}}", "\\boxed{B}", "I do not know.", ""]
    scores = task.verify_batch([ex] * len(responses), responses)
    assert [s.correct for s in scores] == [False] * 5
    assert [s.parsed for s in scores] == [True, True, True, False, False]
    assert all(s.reward == 0.0 for s in scores)


def test_choice_problems_grade_by_letter_or_by_the_choice_value(task):
    ex = _choice_example()
    responses = ["\\boxed{C}", "Answer: (C)", "\\boxed{5\\sqrt{3}}", "\\boxed{A}",
                 "\\boxed{5\\sqrt{2}}", "the answer is D."]
    scores = task.verify_batch([ex] * len(responses), responses)
    assert [s.correct for s in scores] == [True, True, True, False, False, False]
    assert [s.info["letter"] for s in scores] == ["C", "C", None, "A", None, "D"]
    assert scores[0].info["answer_key"] == "5 \\sqrt { 3 }"


def test_parse_statistics_count_extraction_methods_and_letter_vs_value(task):
    ex = _choice_example()
    responses = ["\\boxed{C}", "Answer: 10", "it is 7", "no idea"]
    stats = [s.info["stats"] for s in task.verify_batch([ex] * 4, responses)]
    assert [s["extract_boxed"] for s in stats] == [1, 0, 0, 0]
    assert [s["extract_answer_line"] for s in stats] == [0, 1, 0, 0]
    assert [s["extract_last_number"] for s in stats] == [0, 0, 1, 0]
    assert [s["extract_none"] for s in stats] == [0, 0, 0, 1]
    assert [s["parse_letter"] for s in stats] == [1, 0, 0, 0]
    assert [s["parse_value"] for s in stats] == [0, 1, 1, 0]
    assert all(s["grade_timeout"] == 0 and s["grade_error"] == 0 for s in stats)


def test_malformed_and_hostile_responses_never_crash(task, gold):
    ex = gold["2401"]
    hostile = ["\\boxed{", "}}}{{{\\boxed{\\boxed{", "\\boxed{" * 500, "(" * 10_000,
               "\\boxed{9^{9^{9^{9^{9}}}}}", "\x00\\boxed{\ud800}", "Answer: " + "1" * 5000,
               "\\boxed{__import__('os').system('echo pwned')}"]
    scores = task.verify_batch([ex] * len(hostile), hostile)
    assert len(scores) == len(hostile) and not any(s.correct for s in scores)
    ch = _choice_example()
    assert not task.verify(ch, "\\boxed{(((((}").correct


def test_verify_batch_sends_every_value_answer_to_one_grader_call(task, gold, monkeypatch):
    calls = []
    real = task.grader.grade

    def spy(items):
        calls.append(len(items))
        return real(items)

    monkeypatch.setattr(task.grader, "grade", spy)
    exs = [gold[str(2401 + i)] for i in range(40)]
    responses = [f"\\boxed{{{ex.answer['value']}}}" if i % 2 else "\\boxed{-1}"
                 for i, ex in enumerate(exs)]
    scores = task.verify_batch(exs, responses)
    assert calls == [40]
    assert [s.correct for s in scores] == [bool(i % 2) for i in range(40)]


def test_full_warmstart_pairs_are_format_only_and_graded_correct(task):
    pairs = task.warmstart_examples()[:5]
    assert pairs[0][1] == "\\boxed{60}"
    assert all(task.verify(ex, ref).correct for ex, ref in pairs)


def test_derangement_moves_every_image_to_another_problem():
    for n in (2, 3, 10, 200):
        perm = derangement(n, seed=7)
        assert sorted(perm) == list(range(n)) and all(p != i for i, p in enumerate(perm))
        assert perm == derangement(n, seed=7)
    assert derangement(50, 1) != derangement(50, 2)
    exs = [Example(id=str(i), prompt="q", images=[i], answer={"value": str(i)})
           for i in range(5)]
    shuffled = shuffle_images(exs, 0)
    assert [s.answer for s in shuffled] == [e.answer for e in exs]
    assert all(s.images != e.images for s, e in zip(shuffled, exs))
    assert [s.id for s in shuffled] == [f"{i}/shuffled" for i in range(5)]


def _fake_generated(count: int, seed: int, image_size: int) -> list[Example]:
    out = []
    for i in range(count):
        letter = "ABCD"[(i + seed) % 4]
        out.append(Example(id=f"g{seed}-{i}", prompt=f"Find x ({seed}, {i}).\nAnswer:",
                           images=[Image.new("RGB", (image_size, image_size), (i % 256, seed, 0))],
                           answer={"value": str(i), "choices": ["0", "1", "2", "3"],
                                   "letter": letter},
                           meta={"reference": f"\\boxed{{{letter}}}", "family": "fake"}))
    return out


def test_tiny_variant_follows_the_generated_module_contract(monkeypatch):
    fake = types.ModuleType("tasks.geometry3k.generated")
    fake.generate, fake.CHANCE = _fake_generated, 0.25
    monkeypatch.setitem(sys.modules, "tasks.geometry3k.generated", fake)
    task = Geometry3kTask(Geometry3kTask.Config(
        variant="tiny", grader=GraderConfig(workers=1),
        tiny=TinyConfig(train_size=12, eval_size=6, seed=0, eval_seed=5, image_size=8)))
    evals = {es.name: es.examples for es in task.eval_sets()}
    assert set(evals) == {"generated", "generated_shuffled"}
    held, shuffled = evals["generated"], evals["generated_shuffled"]
    train = task.train_examples()
    assert len(train) == 12 and len(held) == 6
    assert all("(0," in ex.prompt for ex in train) and all("(5," in ex.prompt for ex in held)
    assert not {e.id for e in train} & {e.id for e in held}
    assert [e.answer for e in shuffled] == [e.answer for e in held]
    assert all(s.images[0] is not h.images[0] for s, h in zip(shuffled, held))
    assert sorted(id(s.images[0]) for s in shuffled) == sorted(id(h.images[0]) for h in held)
    pairs = task.warmstart_examples()
    assert len(pairs) == 12 and all(task.verify(ex, ref).correct for ex, ref in pairs)
    assert task.default_max_new_tokens == 24
    task.grader.close()


def test_tiny_variant_on_the_real_generator_grades_its_references():
    pytest.importorskip("tasks.geometry3k.generated")
    task = Geometry3kTask(Geometry3kTask.Config(
        variant="tiny", grader=GraderConfig(workers=1),
        tiny=TinyConfig(train_size=16, eval_size=8)))
    evals = {es.name: es.examples for es in task.eval_sets()}
    for ex in task.train_examples() + evals["generated"]:
        assert ex.images[0].mode == "RGB" and ex.images[0].size == (32, 32)
        assert set(ex.answer) == {"value", "choices", "letter"}
    assert all(task.verify(ex, ref).correct for ex, ref in task.warmstart_examples())
    assert task.dataset_hash() == Geometry3kTask(task.config).dataset_hash()
    task.grader.close()
