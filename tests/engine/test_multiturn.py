"""Multi-turn generation: stop at tool tags, run the tool, append its result masked out of the loss,
resume; token-in/token-out (trained ids = generated ids + tool ids, never a re-encoding)."""

from __future__ import annotations

import time

import pytest
import torch

from harness.engines import RolloutEngine
from harness.multiturn import TurnState, generate_multiturn, step_round, tool_metrics
from harness.tools import ToolEnv
from harness.types import Example, SamplingParams, Trajectory

# A toy vocabulary with multi-character pieces, so that decode -> encode is not the identity:
# the model emits "<sea" + "rch>" (two ids) where encode_text("<search>") is one id.
PIECES = ["<pad>", "<eos>", "<sea", "rch>", "<search>", "</search>", "<answer>", "</answer>",
          "<result>", "</result>", "paris", "capital of france", "ok", " "]
ID = {p: i for i, p in enumerate(PIECES)}


class ScriptedEngine(RolloutEngine):
    """Replays, per trajectory, a list of segments (lists of pieces); each generate call emits the
    next segment of every prompt it is given, recognising the prompt by its last token."""

    pad_token_id = 0

    def __init__(self, segments: dict[int, list[list[str]]]) -> None:
        self.segments = {k: [list(s) for s in v] for k, v in segments.items()}
        self.calls: list[list[list[int]]] = []

    def encode_prompt(self, example: Example) -> list[int]:
        return [100 + int(example.id)]

    def encode_text(self, text: str) -> list[int]:
        out, rest = [], text
        while rest:  # greedy longest match, as a BPE merge would prefer the long piece
            piece = max((p for p in PIECES if rest.startswith(p)), key=len, default=rest[0])
            out.append(ID[piece] if piece in ID else 1000 + ord(piece))  # other chars: one id
            rest = rest[len(piece):]
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i - 1000) if i >= 1000 else PIECES[i] for i in ids if i not in (0, 1))

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[Trajectory]:
        self.calls.append([list(p) for p in prompts])
        out = []
        for p in prompts:
            seg = self.segments[p[0] - 100].pop(0)
            ids = [ID[s] for s in seg][: params.max_new_tokens]
            text = self.decode(ids)
            stop = next((s for s in params.stop if text.endswith(s)), None)
            reason = "stop" if stop or ids[-1] == ID["<eos>"] else "length"
            out.append(Trajectory(p, ids, logprobs=-0.1 * torch.arange(1, len(ids) + 1),
                                  entropy=torch.full((len(ids),), 0.5), text=text,
                                  finish_reason=reason, stop_string=stop))
        return out


def capital(query: str) -> str:
    return "paris" if "france" in query else "no result"


def env(**kw) -> ToolEnv:
    return ToolEnv(tools={"search": capital}, **kw)


SEARCH_THEN_ANSWER = [["<sea", "rch>", "capital of france", "</search>"],
                      ["<answer>", "paris", "</answer>"]]


def test_trained_ids_are_the_generated_ids_plus_the_tool_ids_not_a_reencoding():
    engine = ScriptedEngine({0: SEARCH_THEN_ANSWER})
    [traj] = generate_multiturn(engine, [Example("0", "q")], SamplingParams(n=1), env())
    generated_1 = [ID[p] for p in SEARCH_THEN_ANSWER[0]]
    tool_ids = engine.encode_text("<result>paris</result>")
    generated_2 = [ID[p] for p in SEARCH_THEN_ANSWER[1]]
    assert traj.response_ids == generated_1 + tool_ids + generated_2
    reencoded = engine.encode_text(engine.decode(traj.response_ids))
    assert reencoded != traj.response_ids  # "<sea"+"rch>" would have become one "<search>" id
    assert traj.loss_mask == [1] * 4 + [0] * len(tool_ids) + [1] * 3
    # tool tokens carry no behaviour log-prob; model tokens keep the engine's
    assert traj.logprobs[4 : 4 + len(tool_ids)].abs().sum() == 0
    assert traj.logprobs[:4].tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert traj.turn_boundaries == [0, 4 + len(tool_ids)]
    assert traj.text.endswith("<answer>paris</answer>")
    assert [(c["name"], c["query"], c["ok"]) for c in traj.tool_calls] == [
        ("search", "capital of france", True)]
    # the second segment was generated from the prompt + everything so far
    assert engine.calls[1][0] == [100, *generated_1, *tool_ids]


def test_budget_of_tool_calls_returns_an_error_result_and_generation_continues():
    segs = [["<search>", "ok", "</search>"]] * 3 + [["<answer>", "ok", "</answer>"]]
    engine = ScriptedEngine({0: segs})
    [traj] = generate_multiturn(engine, [Example("0", "q")], SamplingParams(n=1),
                                env(max_calls=2))
    assert [c["ok"] for c in traj.tool_calls] == [True, True, False]
    assert "budget of 2 used up" in traj.text and traj.text.endswith("</answer>")


def test_tool_exceptions_become_text_and_unknown_tools_are_not_called():
    def broken(query: str) -> str:
        raise ValueError("boom")

    engine = ScriptedEngine({0: [["<search>", "ok", "</search>"], ["<answer>", "ok",
                                                                   "</answer>"]]})
    [traj] = generate_multiturn(engine, [Example("0", "q")], SamplingParams(n=1),
                                ToolEnv(tools={"search": broken}))
    assert "error: ValueError: boom" in traj.text and traj.tool_calls[0]["ok"] is False
    assert ToolEnv(tools={}).call("python", "1")[1] is False


def test_total_token_budget_ends_the_trajectory_as_truncated():
    engine = ScriptedEngine({0: [["<search>", "ok", "</search>"], ["ok"] * 50]})
    [traj] = generate_multiturn(engine, [Example("0", "q")], SamplingParams(n=1),
                                env(max_total_tokens=8))
    assert len(traj.response_ids) == 8 and traj.finish_reason == "length"


def test_trajectories_finish_independently_within_a_batch():
    engine = ScriptedEngine({0: [["<answer>", "ok", "</answer>"]], 1: SEARCH_THEN_ANSWER})
    trajs = generate_multiturn(engine, [Example("0", "q"), Example("1", "q")],
                               SamplingParams(n=1), env())
    assert [len(t.tool_calls) for t in trajs] == [0, 1]
    assert [len(c) for c in engine.calls] == [2, 1]  # round 2 only for the unfinished one
    assert [t.group_id for t in trajs] == [0, 1]
    m = tool_metrics(trajs)
    assert m["tools/calls_per_traj"] == 0.5 and m["tools/search_per_traj"] == 0.5
    assert 0 < m["tools/masked_token_frac"] < 1


def test_tool_calls_of_one_round_run_concurrently():
    def slow(query: str) -> str:
        time.sleep(0.3)
        return "ok"

    segs = {i: [["<search>", "ok", "</search>"], ["<answer>", "ok", "</answer>"]]
            for i in range(4)}
    engine = ScriptedEngine(segs)
    t0 = time.perf_counter()
    generate_multiturn(engine, [Example(str(i), "q") for i in range(4)], SamplingParams(n=1),
                       ToolEnv(tools={"search": slow}))
    assert time.perf_counter() - t0 < 1.0  # 4 x 0.3 s sequentially would be 1.2 s


def test_a_fork_shares_the_prefix_up_to_the_fork_point():
    engine = ScriptedEngine({0: SEARCH_THEN_ANSWER})
    state = TurnState(prompt_ids=[100])
    step_round(engine, [state], SamplingParams(n=1), env())
    at = state.last_tool_end
    copy = state.fork(at)
    assert copy.response_ids == state.response_ids[:at] and copy.shared_len == at
    assert copy.loss_mask == state.loss_mask[:at] and copy.tool_calls == state.tool_calls
    assert not copy.done


def test_hf_engine_stops_at_stop_strings_and_computes_top_k_entropy(tiny_model_path):
    from omegaconf import OmegaConf

    from harness.backends.hf import HFEngine

    cfg = OmegaConf.create({"threads": 1, "device": "cpu", "dtype": "float32",
                            "gen_batch_size": 0})
    engine = HFEngine(tiny_model_path, cfg, seed=0)
    prompt = engine.encode_text("3 6 7=15:")
    full = engine.generate([prompt], SamplingParams(n=16, max_new_tokens=12, entropy=True))
    stops = engine.generate([prompt], SamplingParams(n=16, max_new_tokens=12, stop=("*", "+"),
                                                     entropy=True, entropy_topk=2))
    hit = [t for t in stops if t.stop_string]
    assert hit, "some sample should contain + or *"
    for t in hit:
        assert t.text.endswith(t.stop_string) and t.finish_reason == "stop"
        assert "*" not in t.text[:-1] and "+" not in t.text[:-1]
    # top-2 entropy never exceeds the full one (same seed, same first token distribution)
    assert float(stops[0].entropy[0]) <= float(full[0].entropy[0]) + 1e-6
    assert engine.decode(engine.encode_text("1+2")) == "1+2"


def test_examples_with_images_are_refused_rather_than_losing_their_pixels():
    ex = Example(id="img", prompt="q", answer={}, images=["a picture"])
    with pytest.raises(NotImplementedError, match="'img'"):
        generate_multiturn(None, [ex], SamplingParams(n=1), ToolEnv(tools={}))
