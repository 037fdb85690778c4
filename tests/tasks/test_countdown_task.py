"""CountdownTask: tiny split and warm start, full data, TinyZero-style grading, config."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.registry import TASKS
from harness.task import EvalProtocol
from harness.typed_config import validate
from harness.types import Example
from tasks.countdown.task import CountdownTask, FullConfig, TinyConfig, last_answer

ROOT = Path(__file__).resolve().parents[2]
GOLD_PROMPTS = ROOT / "tests" / "fixtures" / "countdown_tinyzero_prompts.json"


def _tiny(**kw) -> CountdownTask:
    return CountdownTask(CountdownTask.Config(variant="tiny", tiny=TinyConfig(**kw)))


def _full(**kw) -> CountdownTask:
    return CountdownTask(CountdownTask.Config(variant="full", full=FullConfig(**kw)))


@pytest.fixture(scope="module")
def tiny() -> CountdownTask:
    return _tiny()


@pytest.fixture(scope="module")
def full() -> CountdownTask:
    return _full()


def _key(ex: Example) -> tuple:
    return tuple(ex.answer["numbers"]), ex.answer["target"]


def _example(numbers: list[int], target: int) -> Example:
    return Example(id="x", prompt="", answer={"target": target, "numbers": numbers})


# -- registration --------------------------------------------------------------------------------
def test_countdown_is_registered_through_the_entry_point():
    assert TASKS.get("countdown") is CountdownTask
    assert CountdownTask.name == "countdown"


# -- tiny variant --------------------------------------------------------------------------------
def test_tiny_split_sizes(tiny):
    (heldout,) = tiny.eval_sets()
    assert heldout.name == "heldout"
    assert len(heldout.examples) == 500
    assert len(tiny.train_examples()) == 8867


def test_tiny_split_is_deterministic_across_instances(tiny):
    other = _tiny()
    assert [e.id for e in other.train_examples()] == [e.id for e in tiny.train_examples()]
    assert [e.id for e in other.eval_sets()[0].examples] == [
        e.id for e in tiny.eval_sets()[0].examples
    ]


def test_tiny_split_seed_changes_the_split(tiny):
    other = _tiny(split_seed=1)
    assert [e.id for e in other.train_examples()] != [e.id for e in tiny.train_examples()]


def test_tiny_heldout_and_train_do_not_overlap(tiny):
    train = {_key(e) for e in tiny.train_examples()}
    heldout = {_key(e) for e in tiny.eval_sets()[0].examples}
    assert len(train) == 8867 and len(heldout) == 500
    assert not train & heldout
    assert not {e.id for e in tiny.train_examples()} & {e.id for e in tiny.eval_sets()[0].examples}


def test_tiny_prompt_format(tiny):
    ex = tiny.train_examples()[0]
    nums, target = ex.answer["numbers"], ex.answer["target"]
    assert ex.prompt == " ".join(map(str, sorted(nums))) + f"={target}:"
    assert ex.id.startswith("tiny-") and len(ex.id) == len("tiny-00042")


def test_tiny_warmstart_subset_size_and_completions_are_correct(tiny):
    pairs = tiny.warmstart_examples()
    assert len(pairs) == round(0.3 * 8867) == 2660
    assert [ex.id for ex, _ in pairs] == [ex.id for ex in tiny.train_examples()[:2660]]
    for ex, completion in pairs:
        score = tiny.verify(ex, completion)
        assert score.correct and score.reward == 1.0, (ex, completion)
        assert len(completion) <= tiny.default_max_new_tokens


def test_tiny_verify_rewards(tiny):
    ex = _example([3, 6, 7], 15)
    right = tiny.verify(ex, " 3*7-6 \n")
    assert (right.reward, right.correct, right.parsed) == (1.0, True, True)
    wrong = tiny.verify(ex, "3+6+7")
    assert (wrong.reward, wrong.correct, wrong.parsed) == (0.0, False, True)
    garbage = tiny.verify(ex, "3*7-6=15")
    assert (garbage.reward, garbage.correct, garbage.parsed) == (0.0, False, False)
    assert set(right.info) >= {"numbers_ok", "value", "reason"}
    assert right.info["value"] == "15" and wrong.info["value"] == "16"


def test_tiny_format_score_is_configurable():
    task = _tiny(format_score=0.25)
    assert task.verify(_example([3, 6, 7], 15), "3+6+7").reward == 0.25
    assert task.verify(_example([3, 6, 7], 15), "nonsense").reward == 0.0


def test_tiny_default_max_new_tokens(tiny):
    assert tiny.default_max_new_tokens == 12


def test_eval_limit_is_applied():
    tiny = CountdownTask(
        CountdownTask.Config(
            variant="tiny", tiny=TinyConfig(eval={"heldout": EvalProtocol(limit=7)})
        )
    )
    assert len(tiny.eval_sets()[0].examples) == 7


def test_tiny_heldout_larger_than_the_problem_set_raises():
    with pytest.raises(ValueError, match=r"task\.tiny\.heldout"):
        _tiny(heldout=50000).train_examples()


# -- full variant --------------------------------------------------------------------------------
def test_full_loads_train_and_eval_sets(full):
    assert len(full.train_examples()) == 8001
    sets = {s.name: s.examples for s in full.eval_sets()}
    assert len(sets["countdown34"]) == 2001
    assert len(sets["countdown4"]) == 1000
    assert all(len(e.answer["numbers"]) == 4 for e in sets["countdown4"])
    assert full.train_examples()[0].answer == {"target": 98, "numbers": [44, 19, 35]}
    assert full.default_max_new_tokens == 1024


def test_full_train_limit_is_respected():
    assert len(_full(train_limit=100).train_examples()) == 100


def test_full_base_prompt_matches_tinyzero_parquet(full):
    """Gold rows copied from TinyZero's test.parquet (prompt[0].content): the full variant must
    produce the very same text, so scores are comparable with TinyZero/verl runs."""
    gold = json.loads(GOLD_PROMPTS.read_text(encoding="utf-8"))["rows"]
    examples = full.eval_sets()[0].examples
    assert len(examples) == 2001
    for row in gold:
        ex = examples[row["index"]]
        assert (ex.answer["target"], list(ex.answer["numbers"])) == (row["target"], row["nums"])
        assert ex.prompt == row["prompt"]


def test_full_reads_parquet_data_dir(tmp_path, full):
    """The TinyZero/verl parquet layout (columns target, nums) reads into the same examples as the
    shipped jsonl; the parquet files are written here from that jsonl."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    data = ROOT / "tasks" / "countdown" / "data"
    for split in ("train", "test"):
        lines = (data / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        table = pa.table({"target": [r["target"] for r in rows], "nums": [r["nums"] for r in rows]})
        pq.write_table(table, tmp_path / f"{split}.parquet")
    task = _full(data_dir=str(tmp_path))
    assert [e.answer for e in task.train_examples()] == [e.answer for e in full.train_examples()]
    assert len(task.eval_sets()[1].examples) == 1000


def test_missing_data_dir_raises_naming_the_key_and_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        _full(data_dir=str(missing)).train_examples()
    message = str(info.value)
    assert "task.full.data_dir" in message and str(missing) in message
    assert "train.jsonl" in message and "train.parquet" in message


def test_data_dir_without_test_split_raises(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"target": 6, "nums": [1, 2, 3]}\n')
    with pytest.raises(FileNotFoundError, match=r"task\.full\.data_dir.*test"):
        _full(data_dir=str(tmp_path)).eval_sets()


TINYZERO_CASES = [
    (" 44 plus 19 is 63, plus 35 is 98.</think>\n<answer> 44 + 19 + 35 </answer>", 1.0, True),
    ("</think>\n<answer>(44 + 19) + 35</answer>", 1.0, True),
    ("</think>\n<answer>44 + 19 - 35</answer>", 0.1, True),  # wrong value
    ("</think>\n<answer>44 + 44 + 10</answer>", 0.1, True),  # numbers misused
    ("</think>\n<answer>44 + 19 + 35 = 98</answer>", 0.1, True),  # unparsable
    ("<answer>1+2</answer> no wait </think><answer>44+19+35</answer>", 1.0, True),  # last wins
    ("<answer>44+19+35</answer> no wait <answer>1+2</answer>", 0.1, True),
    ("</think> the answer is 44 + 19 + 35", 0.0, False),  # no answer tag
    ("<answer>44 + 19 + 35", 0.0, False),  # unclosed
    ("", 0.0, False),
]


@pytest.mark.parametrize(("response", "reward", "parsed"), TINYZERO_CASES)
def test_full_grades_tinyzero_format_answers(full, response, reward, parsed):
    score = full.verify(_example([44, 19, 35], 98), response)
    assert score.reward == pytest.approx(reward)
    assert score.parsed is parsed
    assert score.correct is (reward == 1.0)
    assert set(score.info) >= {"numbers_ok", "value", "reason"}


def test_full_misused_numbers_reports_numbers_not_ok(full):
    score = full.verify(_example([44, 19, 35], 98), "<answer>44+44+10</answer>")
    assert score.info["numbers_ok"] is False and score.info["value"] == "98"


def test_last_answer_matches_regex_semantics():
    assert last_answer("<answer>a</answer> </answer>") == "a"
    assert last_answer("<answer>a</answer><answer>b") == "a"
    assert last_answer("<answer>\n1+2\n</answer>") == "\n1+2\n"
    assert last_answer("no tags") is None


def test_full_verify_is_fast_on_hostile_responses(full):
    ex = _example([44, 19, 35], 98)
    for response in ["<answer>" * 20_000, "<answer>" + "(" * 100_000 + "</answer>",
                     "</answer>" * 20_000 + "<answer>"]:
        start = time.perf_counter()
        score = full.verify(ex, response)
        assert time.perf_counter() - start < 0.1
        assert not score.correct


def test_full_warmstart_completions_verify_correct():
    task = _full(train_limit=40)
    pairs = task.warmstart_examples()
    assert len(pairs) == 40
    for ex, completion in pairs:
        assert completion.startswith(" ") and "</think>\n<answer>" in completion
        assert task.verify(ex, completion).reward == 1.0


def test_full_warmstart_is_capped():
    assert len(_full(train_limit=60, warmstart_limit=25).warmstart_examples()) == 25


def test_qwen_instruct_template_is_system_and_user_messages():
    task = _full(template="qwen-instruct", train_limit=3)
    prompt = task.train_examples()[0].prompt
    assert [m["role"] for m in prompt] == ["system", "user"]
    wanted = "Using the numbers [44, 19, 35], create an equation that equals 98"
    assert wanted in prompt[1]["content"]
    ex, completion = task.warmstart_examples()[0]
    assert completion.startswith("Let me solve this step by step.\n<think>")
    assert task.verify(ex, completion).correct


# -- config --------------------------------------------------------------------------------------
def test_bad_variant_raises_listing_valid_variants():
    with pytest.raises(ValueError, match=r"task\.variant") as info:
        CountdownTask(CountdownTask.Config(variant="medium"))
    assert "tiny" in str(info.value) and "full" in str(info.value)


def test_bad_template_raises():
    with pytest.raises(ValueError, match=r"task\.full\.template"):
        _full(template="chatml")


def test_unknown_eval_set_raises():
    with pytest.raises(ValueError, match=r"task\.tiny\.eval\.test"):
        CountdownTask(
            CountdownTask.Config(variant="tiny", tiny=TinyConfig(eval={"test": EvalProtocol()}))
        )


@pytest.mark.parametrize("variant", ["tiny", "full"])
def test_yaml_validates_against_config_and_lists_every_default(variant):
    yaml = OmegaConf.load(ROOT / "conf" / "task" / "countdown.yaml")
    node = OmegaConf.merge({"model": {"task_variant": variant}}, {"task": yaml}).task
    assert node.name == "countdown"
    cfg = validate(CountdownTask.Config, node, "task")
    assert cfg.variant == variant
    # every knob is spelled out in the yaml, with the dataclass default
    assert cfg == dataclasses.replace(CountdownTask.Config(), variant=variant)
    as_dict = OmegaConf.to_container(OmegaConf.structured(CountdownTask.Config), resolve=True)
    plain = OmegaConf.to_container(node, resolve=True)
    plain.pop("name")
    assert _keys(plain) == _keys(as_dict)
    CountdownTask(cfg)


def test_yaml_variant_defaults_to_full_without_a_model():
    yaml = OmegaConf.load(ROOT / "conf" / "task" / "countdown.yaml")
    assert OmegaConf.merge({"task": yaml}).task.variant == "full"


def _keys(node: object, prefix: str = "") -> set[str]:
    if not isinstance(node, dict):
        return {prefix}
    out = set()
    for key, value in node.items():
        out |= _keys(value, f"{prefix}.{key}")
    return out
