"""The agentic_qa task: SQuAD EM/F1 against gold values, answer extraction, the Tool-Star
hierarchical reward, dataset sizes (SOURCE.md), user-supplied GAIA / WebWalkerQA files, and the
tiny two-hop variant (needs two searches; warm-start traces carry the tool's own results)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter

import pytest

from harness.cli import compose_config
from harness.registry import TASKS
from harness.typed_config import ConfigError, build, validate
from tasks.agentic_qa import datasets
from tasks.agentic_qa.grading import (
    exact_match,
    extract_answer,
    f1_score,
    format_ok,
    normalize_answer,
    toolstar_reward,
)
from tasks.agentic_qa.task import AgenticQATask, FullConfig, TinyConfig
from tasks.agentic_qa.tools import BM25Search


def _task(**kwargs) -> AgenticQATask:
    return AgenticQATask(AgenticQATask.Config(**kwargs))


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory):
    """BM25 indexes built here go to a temporary cache, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLBENCH_CACHE", str(tmp_path_factory.mktemp("rlbench_cache")))
        yield


@pytest.fixture(scope="module")
def tiny_task() -> AgenticQATask:
    return _task(variant="tiny")


# -- registration and config ----------------------------------------------------------------

def test_agentic_qa_is_registered_and_its_yaml_validates():
    assert TASKS.get("agentic_qa") is AgenticQATask
    cfg = compose_config(["task=agentic_qa"])  # the tiny model picks the tiny variant
    task = build(TASKS, cfg.task, "task")
    assert task.config.variant == "tiny" and task.config.full.paths["gaia"] is None


def test_config_dataclasses_are_the_yaml_defaults():
    cfg = compose_config(["task=agentic_qa"])
    assert [f.name for f in dataclasses.fields(TinyConfig)] == list(cfg.task.tiny.keys())
    assert [f.name for f in dataclasses.fields(FullConfig)] == list(cfg.task.full.keys())
    for f in dataclasses.fields(TinyConfig):
        if f.name != "eval":
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            assert cfg.task.tiny[f.name] == default, f.name
    assert cfg.task.full.search.k == FullConfig().search.k
    assert cfg.task.full.eval.hotpotqa_distractor_100.temperature == 0.6


def test_a_typo_in_the_config_names_the_key():
    with pytest.raises(ConfigError, match=r"task\.full\.search\.top_k"):
        validate(AgenticQATask.Config, {"full": {"search": {"top_k": 1}}}, "task")


def test_invalid_choices_are_rejected():
    with pytest.raises(ValueError, match="reward"):
        _task(full=FullConfig(reward="bleu"))
    with pytest.raises(ValueError, match="unknown dataset"):
        _task(full=FullConfig(train=["triviaqa"]))
    with pytest.raises(ValueError, match="unknown tool"):
        _task(full=FullConfig(tools=["browser"]))


# -- SQuAD EM / F1 ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, normal", [
    ("The Eiffel Tower!", "eiffel tower"),          # article, punctuation, case
    ("  New   York\tCity \n", "new york city"),      # whitespace
    ("U.S.A.", "usa"),                              # punctuation inside a word is deleted
    ("an apple a day", "apple day"),                # every article, not only the first
    ("Theatre of the Absurd", "theatre of absurd"),  # 'the' only as a whole word
    ("rock-'n'-roll", "rocknroll"),
    ("", ""),
])
def test_squad_normalisation(text, normal):
    assert normalize_answer(text) == normal


@pytest.mark.parametrize("pred, golds, em, f1", [
    ("the Eiffel Tower", ["Eiffel Tower"], 1.0, 1.0),
    ("Eiffel", ["Eiffel Tower"], 0.0, 2 / 3),             # P 1, R 1/2
    ("the cat sat", ["cat sat on mat"], 0.0, 2 / 3),     # P 2/2, R 2/4 ("on" stays)
    ("cat cat", ["cat"], 0.0, 2 / 3),                    # multiset overlap 1: P 1/2, R 1
    ("Paris", ["London", "paris."], 1.0, 1.0),            # best alias
    ("yes", ["no"], 0.0, 0.0),
    ("", ["x"], 0.0, 0.0),                              # empty prediction
    ("the", ["a"], 1.0, 1.0),                           # both normalise to empty
    ("Stanley Hall", ["G. Stanley Hall", "Stanley Hall"], 1.0, 1.0),
])
def test_exact_match_and_f1_gold_values(pred, golds, em, f1):
    assert exact_match(pred, golds) == em
    assert f1_score(pred, golds) == pytest.approx(f1)


def test_f1_of_a_partial_multitoken_answer():
    # pred tokens: 2010 world cup final ; gold: world cup ; common 2 -> P 2/4, R 1, F1 2/3
    assert f1_score("the 2010 World Cup final", ["World Cup"]) == pytest.approx(2 / 3)


# -- answer extraction ------------------------------------------------------------------------

@pytest.mark.parametrize("response, answer, method", [
    ("<answer>x</answer> then <answer> Bo </answer>", "Bo", "answer_tag"),
    ("<answer>\\boxed{Paris}</answer>", "Paris", "answer_tag"),
    ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}", "boxed"),
    ("\\boxed{ok} and \\boxed{unclosed", "ok", "boxed"),
    ("<answer>unclosed", None, "none"),
    ("no answer at all", None, "none"),
])
def test_answer_extraction(response, answer, method):
    assert extract_answer(response) == (answer, method)


def test_a_missing_answer_is_a_parse_failure_not_a_wrong_answer():
    task = _task(variant="full")
    ex = datasets.load("bamboogle")[0]
    example = task._example(ex)
    missing = task.verify(example, "<search>Citibank</search><result>...</result>")
    assert not missing.parsed and missing.reward == 0.0 and missing.info["em"] == 0.0
    right = task.verify(example, "<answer>James Madison</answer>")
    assert right.parsed and right.correct and right.reward == 1.0
    assert right.info["em"] == 1.0 and right.info["f1"] == 1.0
    assert right.info["stats"]["em"] == 1.0


def test_reward_is_f1_or_em_as_configured():
    golds = ["Gesellschaft mit beschränkter Haftung"]
    response = "<answer>Gesellschaft mit Haftung</answer>"
    for reward, expected in (("f1", f1_score("Gesellschaft mit Haftung", golds)), ("em", 0.0)):
        task = _task(variant="full", full=FullConfig(reward=reward))
        ex = task._example(datasets.load("hotpotqa_distractor_100")[0])
        assert ex.answer["answers"] == golds
        score = task.verify(ex, response)
        assert score.reward == pytest.approx(expected) and not score.correct
        assert score.info["f1"] == pytest.approx(6 / 7)  # P 3/3, R 3/4


# -- Tool-Star hierarchical reward (spec §6.3) ------------------------------------------------

TOOLS = ("search", "python")
GOOD_SEARCH = "<search>q</search><result>r</result><answer>Bo</answer>"
GOOD_BOTH = ("<search>q</search><result>r</result><python>print(1)</python><result>1</result>"
             "<answer>Bo</answer>")


@pytest.mark.parametrize("response, ok", [
    (GOOD_SEARCH, True),
    (GOOD_BOTH, True),
    ("<answer>Bo</answer>", True),                                  # no tool needed
    ("think first... \\boxed{Bo}", True),                            # boxed without tags
    ("<search>q</search><result><answer>x</answer> <search></result><answer>Bo</answer>",
     True),                                                         # tags inside a result
    ("<search>q</search><answer>Bo</answer>", False),                # call without its result
    ("<result>r</result><answer>Bo</answer>", False),                # result without a call
    ("<search>q<python>1</python></search><result>r</result><answer>Bo</answer>", False),
    ("<search>q</search><result>r</result><answer>Bo</answer> more", False),  # after the answer
    ("<search>q</search><result>r</result>", False),                 # no answer
    ("</search><answer>Bo</answer>", False),                         # stray closing tag
])
def test_format_check(response, ok):
    assert format_ok(response, TOOLS) is ok


def test_toolstar_reward_cases():
    assert toolstar_reward(0.8, False, Counter(search=1)) == -1.0   # bad format
    assert toolstar_reward(0.0, True, Counter(search=1, python=1)) == 0.0  # wrong
    assert toolstar_reward(0.5, True, Counter(search=2)) == 0.5     # one tool
    assert toolstar_reward(0.5, True, Counter(search=1, python=1)) == pytest.approx(0.6)
    assert toolstar_reward(1.0, True, {"python": 3}) == 1.0


def test_hierarchical_reward_through_verify():
    task = _task(variant="full", full=FullConfig(hierarchical=True, reward="em"))
    ex = task._example(datasets.QA("x/1", "q?", ["Bo"]))
    assert task.verify(ex, GOOD_BOTH).reward == pytest.approx(1.1)
    assert task.verify(ex, GOOD_SEARCH).reward == 1.0
    assert task.verify(ex, GOOD_SEARCH.replace("Bo", "Al")).reward == 0.0
    assert task.verify(ex, "<search>q</search><answer>Bo</answer>").reward == -1.0
    assert task.verify(ex, "nothing").reward == -1.0
    assert task.verify(ex, GOOD_BOTH).info["tool_calls"] == {"search": 1, "python": 1}


# -- datasets -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, count", [   # counts from tasks/agentic_qa/data/SOURCE.md
    ("hotpotqa_distractor_100", 100), ("hotpotqa_train_100", 100), ("musique_train_100", 100),
    ("bamboogle", 125), ("2wiki_dev_500", 500), ("hotpotqa_dev_500", 500),
    ("musique_dev_500", 500),
])
def test_each_shipped_set_loads_with_its_documented_count(name, count):
    records = datasets.load(name)
    assert len(records) == count
    assert len({r.id for r in records}) == count
    assert all(r.question.strip() and r.answers and r.answers[0] for r in records)


def test_musique_keeps_answer_aliases():
    first = datasets.load("musique_train_100")[0]
    assert first.answers == ["G. Stanley Hall", "Stanley Hall"]


def test_full_variant_sets_and_prompt_name_the_tools():
    task = _task(variant="full", full=FullConfig(
        eval={"hotpotqa_distractor_100": FullConfig().eval["hotpotqa_distractor_100"],
              "bamboogle": FullConfig().eval["hotpotqa_distractor_100"]}))
    assert len(task.train_examples()) == 200
    assert {s.name: len(s.examples) for s in task.eval_sets()} == {
        "hotpotqa_distractor_100": 100, "bamboogle": 125}
    prompt = task.train_examples()[0].prompt
    for tag in ("<search>query</search>", "<python>code</python>", "<result></result>",
                "<answer></answer>", "Question: If Gallu is a demon Lilu is what?"):
        assert tag in prompt
    closed = _task(variant="full", full=FullConfig(tools=[]))
    assert closed.tool_env() is None and "<search>" not in closed.train_examples()[0].prompt
    chat = _task(variant="full", full=FullConfig(template="chat"))
    assert chat.train_examples()[0].prompt[0]["role"] == "user"


GAIA_FIXTURE = [  # made up by the project in GAIA's layout (no real GAIA question)
    {"task_id": "00000000-fixture-0001", "Question": "How many legs do three spiders have?",
     "Level": 1, "Final answer": "24", "file_name": "", "Annotator Metadata": {"Steps": "..."}},
    {"task_id": "00000000-fixture-0002", "Question": "What is the capital of the fixture land?",
     "Level": 2, "Final answer": "Testville", "file_name": "map.png",
     "Annotator Metadata": {"Steps": "..."}},
]


def test_gaia_loads_from_a_user_supplied_path(tmp_path):
    (tmp_path / "metadata.jsonl").write_text("\n".join(json.dumps(r) for r in GAIA_FIXTURE))
    for path in (tmp_path, tmp_path / "metadata.jsonl"):
        records = datasets.load("gaia", paths={"gaia": str(path)})
        assert [r.answers for r in records] == [["24"], ["Testville"]]
        assert records[1].meta == {"dataset": "gaia", "level": 2, "file_name": "map.png"}
    task = _task(variant="full", full=FullConfig(
        paths={"gaia": str(tmp_path), "webwalkerqa": None},
        eval={"gaia": FullConfig().eval["hotpotqa_distractor_100"]}))
    (gaia,) = task.eval_sets()
    assert gaia.name == "gaia" and len(gaia.examples) == 2
    assert task.verify(gaia.examples[0], "<answer>24</answer>").correct
    listed = tmp_path / "dev.json"  # WebThinker's layout of the same data
    listed.write_text(json.dumps([{"id": "1", "Question": "q", "answer": "a", "Level": 1}]))
    assert datasets.load("gaia", paths={"gaia": str(listed)})[0].answers == ["a"]


def test_user_supplied_sets_say_how_to_supply_them():
    with pytest.raises(ValueError, match=r"task\.full\.paths\.gaia"):
        datasets.load("gaia")


def test_webwalkerqa_loads_both_layouts(tmp_path):
    thinker = [{"Question": "Who chairs it?", "answer": "Ann", "root_url": "https://x.org/",
                "type": "single_source", "difficulty_level": "easy", "lang": "en"}]
    hf = [{"question": "Who chairs it?", "answer": "Ann", "root_url": "https://x.org/",
           "info": {"type": "multi_source", "difficulty_level": "hard", "lang": "zh"}}]
    (tmp_path / "a.json").write_text(json.dumps(thinker))
    (tmp_path / "b.jsonl").write_text(json.dumps(hf[0]))
    a = datasets.load("webwalkerqa", paths={"webwalkerqa": str(tmp_path / "a.json")})[0]
    b = datasets.load("webwalkerqa", paths={"webwalkerqa": str(tmp_path / "b.jsonl")})[0]
    assert a.answers == b.answers == ["Ann"]
    assert (a.meta["difficulty"], b.meta["difficulty"]) == ("easy", "hard")


# -- tiny variant -------------------------------------------------------------------------------

def test_tiny_split_sizes_and_determinism(tiny_task):
    train, (heldout,) = tiny_task.train_examples(), tiny_task.eval_sets()
    assert (len(train), heldout.name, len(heldout.examples)) == (1000, "heldout", 200)
    assert not {e.id for e in train} & {e.id for e in heldout.examples}
    again = _task(variant="tiny")
    assert [e.id for e in again.eval_sets()[0].examples] == [e.id for e in heldout.examples]
    assert tiny_task.dataset_hash() == again.dataset_hash()


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


@pytest.mark.slow
def test_tiny_questions_need_two_searches(tiny_task):
    env = tiny_task.tool_env()
    assert env is not None and set(env.tools) == {"search"}
    for ex in [*tiny_task.train_examples(), *tiny_task.eval_sets()[0].examples]:
        answer = ex.answer["answers"][0].lower()
        first, second = ex.meta["queries"]
        hop1, _ = env.call("search", first)
        assert ex.meta["bridge"].lower() in _words(hop1)      # hop 1 finds the bridge ...
        assert answer not in _words(hop1)                     # ... but not the answer
        assert answer not in _words(ex.prompt)
        assert answer not in _words(env.call("search", ex.prompt)[0])  # asking it outright fails
        assert answer in _words(env.call("search", second)[0])


@pytest.mark.slow
def test_tiny_warmstart_results_equal_an_independent_tools_outputs(tiny_task, tmp_path):
    fresh = BM25Search(tiny_task.world.passages(), k=1, show_title=False,
                       snippet_chars=tiny_task.config.tiny.max_result_chars,
                       cache_dir=tmp_path, memo=False)
    assert fresh.built  # its own index, not the task's
    pairs = tiny_task.warmstart_examples()
    assert len(pairs) == 300  # 30% of the 1,000 train problems
    for ex, completion in pairs:
        calls = re.findall(r"<search>(.*?)</search><result>(.*?)</result>", completion)
        assert len(calls) == 2
        for query, result in calls:
            assert result == fresh(query)
        assert completion.endswith(f"<answer>{ex.answer['answers'][0]}</answer>")


def test_tiny_traces_are_short_ascii_and_graded_correct(tiny_task):
    env = tiny_task.tool_env()
    assert env.stop_strings() == ["</search>", "</answer>"]
    for ex, completion in tiny_task.warmstart_examples():
        text = ex.prompt + completion
        assert len(text) <= 200 and text.isascii()
        score = tiny_task.verify(ex, completion)
        assert score.correct and score.reward == 1.0 and score.info["format_ok"]
    ex, completion = tiny_task.warmstart_examples()[0]
    wrong = completion.replace(f"<answer>{ex.answer['answers'][0]}</answer>", "<answer>Xy</answer>")
    assert tiny_task.verify(ex, wrong).reward == 0.0
    cut = completion[: completion.index("<answer>")]
    assert not tiny_task.verify(ex, cut).parsed


# -- tiny variant, deciding how many searches (task.tiny.searches) ---------------------------------

@pytest.fixture(scope="module")
def mixed_task() -> AgenticQATask:
    return _task(variant="tiny", tiny=TinyConfig(searches=[0, 1, 2]))


def test_default_tiny_questions_carry_no_facts_and_need_two_searches(tiny_task):
    examples = [*tiny_task.train_examples(), *tiny_task.eval_sets()[0].examples]
    assert {ex.meta["searches_needed"] for ex in examples} == {2}
    assert all(re.fullmatch(r"Q: (manager|city) of founder of \w+\?\n", ex.prompt)
               for ex in examples)


def test_mixed_needs_are_balanced_and_each_is_in_the_heldout_split(mixed_task):
    train, heldout = mixed_task.train_examples(), mixed_task.eval_sets()[0].examples
    counts = Counter(ex.meta["searches_needed"] for ex in [*train, *heldout])
    assert counts == {0: 400, 1: 400, 2: 400}
    assert {ex.meta["searches_needed"] for ex in heldout} == {0, 1, 2}


@pytest.mark.parametrize("searches", [[0, 1, 2], [1, 2], [0, 2]])
def test_a_need_is_never_tied_to_the_relation_asked(searches):
    task = _task(variant="tiny", tiny=TinyConfig(searches=searches))
    pairs = Counter((ex.meta["relation"], ex.meta["searches_needed"])
                    for ex in task.train_examples())
    assert set(pairs) == {(rel, need) for rel in ("manager", "city") for need in searches}
    per = 1200 // (2 * len(searches))
    assert all(abs(c - per * 1000 / 1200) < 60 for c in pairs.values())  # train pool: ~even


def test_given_facts_are_one_line_before_the_question_in_chain_order(mixed_task):
    by_need = {}
    for ex in mixed_task.train_examples():
        by_need.setdefault(ex.meta["searches_needed"], ex)
    for need, ex in by_need.items():
        company, person, rel = ex.meta["company"], ex.meta["bridge"], ex.meta["relation"]
        facts = [f"{company}'s founder is {person}.",
                 f"{person}'s {rel} is {ex.answer['answers'][0]}."][: 2 - need]
        question = f"Q: {rel} of founder of {company}?\n"
        assert ex.prompt == (" ".join(facts) + "\n" if facts else "") + question


def test_each_question_gives_exactly_the_facts_it_does_not_need_to_look_up(mixed_task):
    env = mixed_task.tool_env()
    for ex in [*mixed_task.train_examples(), *mixed_task.eval_sets()[0].examples]:
        need, answer, bridge = (ex.meta["searches_needed"], ex.answer["answers"][0].lower(),
                                ex.meta["bridge"].lower())
        words = _words(ex.prompt)
        assert (bridge in words) == (need < 2), ex.prompt  # 1st fact given unless 2 are needed
        assert (answer in words) == (need == 0), ex.prompt  # the answer only with both facts
        assert len(ex.meta["queries"]) == need
        for query in ex.meta["queries"][-1:]:  # the last planned search finds the answer
            assert answer in _words(env.call("search", query)[0])


def test_mixed_warmstart_traces_search_exactly_the_need_and_are_graded_correct(mixed_task):
    pairs = mixed_task.warmstart_examples()
    assert {ex.meta["searches_needed"] for ex, _ in pairs} == {0, 1, 2}
    for ex, completion in pairs:
        assert completion.count("<search>") == ex.meta["searches_needed"]
        assert len(ex.prompt + completion) <= 200 and (ex.prompt + completion).isascii()
        score = mixed_task.verify(ex, completion)
        assert score.correct and score.info["stats"]["calls_over_needed"] == 0.0


def test_calls_beyond_and_short_of_the_need_are_counted_apart(mixed_task, tiny_task):
    two = tiny_task.warmstart_examples()[0][1]  # a two-search trace, then the right answer
    searches = two[: two.index("<answer>")]
    one = searches[: searches.index("<search>", 1)]  # its first search only

    def stats(need: int, calls: str) -> tuple[float, float]:
        ex = next(e for e in mixed_task.train_examples() if e.meta["searches_needed"] == need)
        st = mixed_task.verify(ex, calls + f"<answer>{ex.answer['answers'][0]}</answer>").info[
            "stats"]
        return st["calls_over_needed"], st["calls_under_needed"]

    assert stats(0, searches) == (2.0, 0.0)
    assert stats(0, "") == (0.0, 0.0)
    assert stats(1, searches) == (1.0, 0.0)
    assert stats(1, "") == (0.0, 1.0)
    assert stats(2, one) == (0.0, 1.0)
    assert stats(2, searches) == (0.0, 0.0)


@pytest.mark.parametrize("searches", [[], [3], [0, -1]])
def test_bad_searches_name_the_key(searches):
    with pytest.raises(ValueError, match=r"task\.tiny\.searches"):
        _task(variant="tiny", tiny=TinyConfig(searches=searches)).train_examples()


def test_both_hops_warmstart_traces_search_twice_whatever_the_question_gives():
    """The tool-call testbed's positive control: the same prompts, traces that search both hops
    (extra calls where facts are given), still graded correct; and only the traces change."""
    both = _task(variant="tiny", tiny=TinyConfig(searches=[0, 1, 2], warmstart_trace="both_hops"))
    needed = _task(variant="tiny", tiny=TinyConfig(searches=[0, 1, 2]))
    pairs, plain = both.warmstart_examples(), needed.warmstart_examples()
    assert [ex.prompt for ex, _ in pairs] == [ex.prompt for ex, _ in plain]
    assert {ex.meta["searches_needed"] for ex, _ in pairs} == {0, 1, 2}
    for (ex, completion), (_, reference) in zip(pairs, plain):
        assert completion.count("<search>") == 2
        assert completion.endswith(reference[reference.index("<answer>"):])
        score = both.verify(ex, completion)
        assert score.correct
        assert score.info["stats"]["calls_over_needed"] == 2 - ex.meta["searches_needed"]


def test_a_bad_warmstart_trace_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"task\.tiny\.warmstart_trace='all'.*needed, both_hops"):
        _task(variant="tiny", tiny=TinyConfig(warmstart_trace="all"))
