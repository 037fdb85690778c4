"""What an evaluation reports: every metric of ``evaluate_set`` checked against numbers worked by
hand on a scripted engine and task, how the prompts are batched, the sampling settings passed to
the engine, the evaluation seed, and the equal-compute marks (``at_marks``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from harness import evaluation
from harness.evaluation import at_marks, check_eval_sets, evaluate, evaluate_set, pass_at_k
from harness.task import EvalProtocol, EvalSet
from harness.typed_config import ConfigError
from harness.types import Example, SamplingParams, Score, Trajectory


class ScriptedEngine:
    """Answers prompt ``i`` with the texts ``script[i]`` (n per prompt); records every call."""

    device = "cpu"
    gen_batch_size = 0  # no batching of its own

    def __init__(self, script: dict[int, list[str]], gen_batch_size: int | None = None):
        self.script = script
        self.calls: list[tuple[list[list[int]], SamplingParams, torch.Generator]] = []
        if gen_batch_size is not None:
            self.gen_batch_size = gen_batch_size

    def encode_prompt(self, ex: Example) -> list[int]:
        return [int(ex.id)]

    def generate(self, prompt_ids, params, generator=None):
        self.calls.append((list(prompt_ids), params, generator))
        out = []
        for ids in prompt_ids:
            for text in self.script[ids[0]][: params.n]:
                out.append(Trajectory(prompt_ids=ids, response_ids=[7] * len(text), text=text,
                                      finish_reason="length" if text.endswith("~") else "stop"))
        return out


class ScriptedTask:
    """A response ``"<key>:<reward>"`` is correct when key == "R"; ``"?"`` is unparsed."""

    name = "scripted"

    def __init__(self, sets: list[EvalSet], keys: bool = True, stats: bool = False):
        self._sets = sets
        self.keys = keys
        self.stats = stats

    def tool_env(self):
        return None

    def eval_sets(self):
        return self._sets

    def verify_batch(self, owners, texts):
        self.owners = list(owners)
        scores = []
        for text in texts:
            if text.startswith("?"):
                info = {"stats": {"no_answer": 1.0}} if self.stats else {}
                scores.append(Score(reward=0.0, correct=False, parsed=False, info=info))
                continue
            key, reward = text.rstrip("~").split(":")
            info = {"answer_key": key} if self.keys else {}
            if self.stats:
                info["stats"] = {"fast_path": 1.0 if key == "R" else 0.0}
            scores.append(Score(reward=float(reward), correct=key == "R", parsed=True, info=info))
        return scores


class CountingProgress:
    def __init__(self):
        self.updates: list[int] = []

    def update(self, n: int = 1, **_):
        self.updates.append(n)


def examples(count: int) -> list[Example]:
    return [Example(id=str(i), prompt=f"problem {i}") for i in range(count)]


# three problems, n = 4: 4, 2 and 0 correct
SCRIPT = {
    0: ["R:1", "R:1", "R:1", "R:1~"],
    1: ["W:0.5", "R:1", "W:0.5", "R:1"],
    2: ["W:0.25", "?", "W:0.25", "X:0"],
}


def run_set(protocol: EvalProtocol, *, script=SCRIPT, keep: int = 0, gen_batch_size=None,
            keys: bool = True, stats: bool = False, progress=None):
    es = EvalSet("val", examples(len(script)), protocol)
    engine = ScriptedEngine(script, gen_batch_size)
    task = ScriptedTask([es], keys=keys, stats=stats)
    gen = torch.Generator().manual_seed(0)
    return engine, evaluate_set(engine, task, es, gen, keep, progress)


def test_evaluate_set_reports_pass_at_k_mean_and_their_standard_errors():
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1, 2]))
    per1 = np.array([1.0, 0.5, 0.0])
    per2 = np.array([1.0, 1 - 1 / 6, 0.0])
    assert m["eval/val/pass_at_1"] == pytest.approx(per1.mean())
    assert m["eval/val/pass_at_2"] == pytest.approx(per2.mean())
    assert m["eval/val/pass_at_1_stderr"] == pytest.approx(per1.std(ddof=1) / math.sqrt(3))
    assert m["eval/val/pass_at_2_stderr"] == pytest.approx(per2.std(ddof=1) / math.sqrt(3))


def test_evaluate_set_reports_the_sampling_standard_error_of_pass_at_1():
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1]))
    p = np.array([1.0, 0.5, 0.0])
    assert m["eval/val/pass_at_1_sampling_se"] == pytest.approx(
        math.sqrt(np.sum(p * (1 - p) / 3)) / 3)


def test_one_sample_per_problem_has_no_sampling_standard_error():
    script = {0: ["R:1"], 1: ["W:0"]}
    _, (m, _, _) = run_set(EvalProtocol(n=1, k=[1]), script=script)
    assert "eval/val/pass_at_1_sampling_se" not in m
    assert m["eval/val/pass_at_1"] == 0.5


def test_one_problem_has_an_undefined_problem_level_standard_error():
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1]), script={0: SCRIPT[1]})
    assert math.isnan(m["eval/val/pass_at_1_stderr"])
    assert m["eval/val/pass_at_1"] == 0.5


def test_evaluate_set_reports_mean_reward_parse_failures_length_and_sample_count():
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1]))
    rewards = [1, 1, 1, 1, 0.5, 1, 0.5, 1, 0.25, 0, 0.25, 0]
    assert m["eval/val/mean_at_4"] == pytest.approx(np.mean(rewards))
    assert m["eval/val/parse_fail_rate"] == pytest.approx(1 / 12)
    lengths = [len(t) for texts in SCRIPT.values() for t in texts]
    assert m["eval/val/response_len"] == pytest.approx(np.mean(lengths))
    assert m["eval/val/samples"] == 12.0
    assert m["time/eval_val"] >= 0.0
    assert "eval/val/tool_calls_per_traj" not in m


def test_majority_vote_is_reported_for_each_k_when_scores_carry_answer_keys():
    script = {
        0: ["W:0", "R:1", "R:1", "W:0"],   # first 1: W; first 4: R/W tie -> W came first
        1: ["R:1", "W:0", "W:0", "W:0"],   # first 1: R; first 4: W
        2: ["R:1", "X:0", "R:1", "X:0"],   # first 1: R; first 4: R/X tie -> R first
    }
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1, 4]), script=script)
    assert m["eval/val/maj_at_1"] == pytest.approx(2 / 3)
    assert m["eval/val/maj_at_4"] == pytest.approx(1 / 3)


def test_maj_k_overrides_the_pass_at_k_list_for_majority_vote():
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1, 4], maj_k=[2]))
    assert "eval/val/maj_at_2" in m
    assert "eval/val/maj_at_1" not in m and "eval/val/maj_at_4" not in m
    # problem 0: R,R -> right; 1: W,R tie -> W; 2: W,? -> W
    assert m["eval/val/maj_at_2"] == pytest.approx(1 / 3)


def test_no_majority_vote_without_answer_keys():
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1]), keys=False)
    assert not [k for k in m if "maj_at" in k]


def test_per_sample_stats_are_logged_as_their_mean_over_the_set():
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1]), stats=True)
    # fast_path: 1 on the six R samples, absent (0) on the unparsed one
    assert m["eval/val/fast_path"] == pytest.approx(6 / 12)
    assert m["eval/val/no_answer"] == pytest.approx(1 / 12)


def test_kept_samples_are_the_first_sample_of_the_first_problems():
    _, (_, kept, _) = run_set(EvalProtocol(n=4, k=[1]), keep=2)
    assert kept == [
        {"eval_set": "val", "example_id": "0", "prompt": "problem 0", "response": "R:1",
         "reward": 1.0, "correct": True, "parsed": True, "finish_reason": "stop"},
        {"eval_set": "val", "example_id": "1", "prompt": "problem 1", "response": "W:0.5",
         "reward": 0.5, "correct": False, "parsed": True, "finish_reason": "stop"},
    ]
    _, (_, none_kept, _) = run_set(EvalProtocol(n=4, k=[1]))
    assert none_kept == []


def test_per_problem_counts_give_n_and_the_number_correct():
    _, (_, _, problems) = run_set(EvalProtocol(n=4, k=[1]))
    assert problems == [
        {"eval_set": "val", "example_id": "0", "n": 4, "correct": 4},
        {"eval_set": "val", "example_id": "1", "n": 4, "correct": 2},
        {"eval_set": "val", "example_id": "2", "n": 4, "correct": 0},
    ]


def test_the_protocol_sampling_settings_reach_the_engine():
    engine, _ = run_set(EvalProtocol(n=4, k=[1], temperature=0.6, top_p=0.9, max_new_tokens=33))
    params = engine.calls[0][1]
    assert (params.n, params.temperature, params.top_p, params.max_new_tokens) == (4, 0.6, 0.9, 33)


def test_prompts_go_to_the_engine_in_its_generation_batches():
    script = {i: ["R:1"] * 2 for i in range(5)}
    progress = CountingProgress()
    engine, _ = run_set(EvalProtocol(n=2, k=[1]), script=script, gen_batch_size=4,
                        progress=progress)
    assert [len(c[0]) for c in engine.calls] == [2, 2, 1]
    assert [c[0] for c in engine.calls] == [[[0], [1]], [[2], [3]], [[4]]]
    assert progress.updates == [2, 2, 1]


def test_a_generation_batch_smaller_than_n_sends_one_prompt_per_call():
    script = {i: ["R:1"] * 4 for i in range(3)}
    engine, _ = run_set(EvalProtocol(n=4, k=[1]), script=script, gen_batch_size=3)
    assert [len(c[0]) for c in engine.calls] == [1, 1, 1]


@pytest.mark.parametrize("size", [0, -1])
def test_without_a_generation_batch_every_prompt_goes_in_one_call(size):
    script = {i: ["R:1"] * 2 for i in range(5)}
    progress = CountingProgress()
    engine, _ = run_set(EvalProtocol(n=2, k=[1]), script=script, gen_batch_size=size,
                        progress=progress)
    assert [len(c[0]) for c in engine.calls] == [5]
    assert progress.updates == [5]


def test_evaluate_set_passes_its_generator_to_the_engine():
    es = EvalSet("val", examples(1), EvalProtocol(n=1, k=[1]))
    engine = ScriptedEngine({0: ["R:1"]})
    gen = torch.Generator().manual_seed(5)
    evaluate_set(engine, ScriptedTask([es]), es, gen)
    assert engine.calls[0][2] is gen


def test_multi_turn_tasks_evaluate_through_the_tool_loop(monkeypatch):
    es = EvalSet("val", examples(2), EvalProtocol(n=2, k=[1]))
    seen = {}

    def fake_multiturn(engine, exs, params, env, generator=None):
        seen.update(engine=engine, exs=exs, n=params.n, env=env, generator=generator)
        calls = [[{"tool": "a"}], [], [{"tool": "a"}, {"tool": "b"}], [{"tool": "c"}]]
        return [Trajectory(prompt_ids=[0], response_ids=[1], text="R:1", tool_calls=c)
                for c in calls]

    class ToolTask(ScriptedTask):
        def tool_env(self):
            return "env"

    monkeypatch.setattr(evaluation, "generate_multiturn", fake_multiturn)
    engine = ScriptedEngine({})
    gen = torch.Generator()
    progress = CountingProgress()
    m, _, _ = evaluate_set(engine, ToolTask([es]), es, gen, 0, progress)
    assert seen == {"engine": engine, "exs": es.examples, "n": 2, "env": "env", "generator": gen}
    assert engine.calls == []
    assert progress.updates == [2]
    assert m["eval/val/tool_calls_per_traj"] == pytest.approx(1.0)
    assert m["eval/val/pass_at_1"] == 1.0


def test_evaluate_seeds_its_generator_from_seed_and_step_only():
    es = EvalSet("val", examples(1), EvalProtocol(n=1, k=[1]))
    engine = ScriptedEngine({0: ["R:1"]})
    evaluate(engine, ScriptedTask([es]), seed=3, step=7)
    assert engine.calls[0][2].initial_seed() == 1_000_003 * 4 + 7


def test_evaluate_covers_every_eval_set_and_concatenates_their_outputs():
    a = EvalSet("a", examples(2), EvalProtocol(n=1, k=[1]))
    b = EvalSet("b", examples(1), EvalProtocol(n=1, k=[1]))
    engine = ScriptedEngine({0: ["R:1"], 1: ["W:0"]})
    m, kept, problems = evaluate(engine, ScriptedTask([a, b]), seed=0, step=0, samples_to_keep=1)
    assert m["eval/a/pass_at_1"] == 0.5 and m["eval/b/pass_at_1"] == 1.0
    assert m["time/eval"] >= 0.0
    assert [k["eval_set"] for k in kept] == ["a", "b"]
    assert [(p["eval_set"], p["example_id"]) for p in problems] == [("a", "0"), ("a", "1"),
                                                                   ("b", "0")]


def test_evaluate_uses_the_given_sets_instead_of_the_tasks():
    a = EvalSet("a", examples(1), EvalProtocol(n=1, k=[1]))
    b = EvalSet("b", examples(1), EvalProtocol(n=1, k=[1]))
    engine = ScriptedEngine({0: ["R:1"]})
    m, _, _ = evaluate(engine, ScriptedTask([a]), seed=0, step=0, sets=[b])
    assert "eval/b/pass_at_1" in m and "eval/a/pass_at_1" not in m


def test_check_eval_sets_refuses_a_set_without_problems():
    task = ScriptedTask([EvalSet("full", examples(1), EvalProtocol()),
                         EvalSet("empty", [], EvalProtocol())])
    with pytest.raises(ConfigError, match="eval set 'empty' of task=scripted has no problems"):
        check_eval_sets(task)
    check_eval_sets(ScriptedTask([EvalSet("full", examples(1), EvalProtocol())]))


def test_pass_at_k_error_names_k_and_n():
    with pytest.raises(ValueError, match=r"^pass@9 needs at least 9 samples per problem, got n=8$"):
        pass_at_k(8, 1, 9)


def test_pass_at_k_is_one_when_fewer_wrong_samples_than_k():
    assert pass_at_k(4, 2, 3) == 1.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 3) == pytest.approx(0.75)  # n - c == k: 1 - C(3,3)/C(4,3)


@pytest.mark.parametrize("before,after,expected", [
    (0, 100, (True, False)),     # mark 40: 40 - 0 <= 100 - 40 -> evaluate before the update
    (30, 100, (True, False)),    # 40 - 30 = 10 <= 60: nearer the start of the step
    (0, 80, (True, False)),      # 40 - 0 == 80 - 40: a tie evaluates before the update
    (0, 70, (False, True)),      # 40 > 30: after the update
    (40, 100, (False, False)),   # the mark was reached at the previous step
    (0, 39, (False, False)),     # not reached yet
    (0, 40, (False, True)),      # reached exactly at the end of the step
])
def test_at_marks_evaluates_where_the_token_count_is_nearest_the_mark(before, after, expected):
    assert at_marks([40.0], before, after) == expected


def test_at_marks_with_two_marks_in_one_step_can_evaluate_both_before_and_after():
    assert at_marks([10.0, 90.0], 0, 100) == (True, True)
    assert at_marks([], 0, 100) == (False, False)


def test_each_response_is_verified_against_its_own_problem():
    es = EvalSet("val", examples(2), EvalProtocol(n=2, k=[1]))
    task = ScriptedTask([es])
    evaluate_set(ScriptedEngine({0: ["R:1", "W:0"], 1: ["W:0", "W:0"]}), task, es,
                 torch.Generator())
    assert [ex.id for ex in task.owners] == ["0", "0", "1", "1"]


def test_nothing_is_kept_by_default():
    es = EvalSet("val", examples(1), EvalProtocol(n=1, k=[1]))
    engine = ScriptedEngine({0: ["R:1"]})
    assert evaluate_set(engine, ScriptedTask([es]), es, torch.Generator())[1] == []
    assert evaluate(engine, ScriptedTask([es]), seed=0, step=0)[1] == []


def test_two_problems_have_a_problem_level_standard_error():
    _, (m, _, _) = run_set(EvalProtocol(n=2, k=[1]), script={0: ["R:1", "R:1"], 1: ["W:0", "R:1"]})
    expected = np.std([1.0, 0.5], ddof=1) / math.sqrt(2)
    assert m["eval/val/pass_at_1_stderr"] == pytest.approx(expected)
    # n = 2 already has a sampling error: sqrt(0.25 / 1) / 2
    assert m["eval/val/pass_at_1_sampling_se"] == pytest.approx(0.25)


def test_a_stat_missing_from_some_scores_counts_as_zero_there():
    class SomeStats(ScriptedTask):
        def verify_batch(self, owners, texts):
            scores = super().verify_batch(owners, texts)
            scores[0].info["stats"] = {"retries": 3.0}
            return scores

    es = EvalSet("val", examples(2), EvalProtocol(n=2, k=[1]))
    m, _, _ = evaluate_set(ScriptedEngine({0: ["R:1", "W:0"], 1: ["W:0", "W:0"]}),
                           SomeStats([es]), es, torch.Generator())
    assert m["eval/val/retries"] == pytest.approx(3.0 / 4)


def test_evaluation_times_are_durations():
    _, (m, _, _) = run_set(EvalProtocol(n=4, k=[1]))
    assert 0.0 <= m["time/eval_val"] < 60.0
    es = EvalSet("val", examples(1), EvalProtocol(n=1, k=[1]))
    m, _, _ = evaluate(ScriptedEngine({0: ["R:1"]}), ScriptedTask([es]), seed=0, step=0)
    assert 0.0 <= m["time/eval"] < 60.0


def test_a_generation_batch_of_one_sends_one_prompt_per_call():
    script = {i: ["R:1"] for i in range(3)}
    engine, _ = run_set(EvalProtocol(n=1, k=[1]), script=script, gen_batch_size=1)
    assert [len(c[0]) for c in engine.calls] == [1, 1, 1]


def test_evaluate_shows_progress_over_the_problems_of_every_set(monkeypatch):
    made = []

    class RecordingProgress(CountingProgress):
        def __init__(self, total, desc, unit="it", every_s=15.0, final_line=True):
            super().__init__()
            made.append(self)
            self.args = (total, desc, unit, final_line)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(evaluation, "Progress", RecordingProgress)
    a = EvalSet("a", examples(2), EvalProtocol(n=1, k=[1]))
    b = EvalSet("b", examples(1), EvalProtocol(n=1, k=[1]))
    engine = ScriptedEngine({0: ["R:1"], 1: ["R:1"]})
    evaluate(engine, ScriptedTask([a, b]), seed=0, step=0)
    evaluate(engine, ScriptedTask([a, b]), seed=0, step=0, desc="eval@100")
    assert [p.args for p in made] == [(3, "eval", "problems", False),
                                      (3, "eval@100", "problems", False)]
    assert made[0].updates == [2, 1]
