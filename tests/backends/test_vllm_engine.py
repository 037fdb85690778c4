"""The vLLM rollout engine against a fake ``vllm.LLM`` (no vllm import): the colocation call
order (wake weights -> load_weights -> reset prefix cache -> wake KV cache -> generate ->
sleep), the sampling-parameter mapping, token-in prompts, the parsing of per-token log-probs
and finish reasons, seeds, and the refusals (no GPU, dropped weights, too hot a temperature)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from harness.backends.vllm_engine import (
    VLLMEngine,
    llm_kwargs,
    parse_outputs,
    sampling_kwargs,
)
from harness.cli import compose_config
from harness.types import SamplingParams
from tests.helpers import FakeLLM, FakeTrainEngine


@pytest.fixture
def engine(tiny_model_path: str) -> VLLMEngine:
    cfg = compose_config(["backend=vllm_megatron"])
    return VLLMEngine(tiny_model_path, cfg.backend, seed=3, llm_factory=FakeLLM,
                      sampling_factory=lambda **kw: kw)


def test_llm_is_built_for_colocated_rl(engine: VLLMEngine, tiny_model_path: str) -> None:
    kw = engine.llm.kwargs
    assert kw["model"] == tiny_model_path
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert kw["enable_sleep_mode"] is True and kw["load_format"] == "dummy"
    assert kw["dtype"] == "bfloat16" and kw["seed"] == 3
    assert kw["skip_tokenizer_init"] is True  # token ids in and out
    assert "max_model_len" not in kw


def test_colocation_call_order(engine: VLLMEngine) -> None:
    llm = engine.llm
    with pytest.raises(RuntimeError, match="update_weights"):  # dummy weights: refuse
        engine.generate([[1, 2]], SamplingParams(n=1, max_new_tokens=4))
    engine.update_weights(FakeTrainEngine())  # first sync: awake, nothing to wake
    engine.generate([[1, 2]], SamplingParams(n=2, max_new_tokens=4))
    engine.sleep()
    with pytest.raises(RuntimeError, match="update_weights"):  # level 2 dropped the weights
        engine.generate([[1, 2]], SamplingParams(n=1, max_new_tokens=4))
    engine.update_weights(FakeTrainEngine())
    engine.generate([[1, 2]], SamplingParams(n=1, max_new_tokens=4))
    assert llm.calls == [
        "load_weights", "reset_prefix_cache", "generate", "sleep(2)",
        "wake_up(weights)", "load_weights", "reset_prefix_cache", "wake_up(kv_cache)",
        "generate",
    ]
    assert llm.loaded[0] == ["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]


def test_hf_train_engine_weights_are_its_parameters(engine: VLLMEngine) -> None:
    train = SimpleNamespace(model=torch.nn.Linear(3, 2))  # no export_hf_weights
    engine.update_weights(train)
    assert engine.llm.loaded[-1] == ["weight", "bias"]


def test_generate_is_token_in_token_out_with_sampled_logprobs(engine: VLLMEngine) -> None:
    engine.update_weights(FakeTrainEngine())
    prompts = [[5, 6, 7], [9]]
    trajs = engine.generate(prompts, SamplingParams(n=2, temperature=0.9, max_new_tokens=3))
    assert engine.llm.prompts == [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9]}]
    assert len(trajs) == 4
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]
    assert trajs[0].prompt_ids == [5, 6, 7] and trajs[2].prompt_ids == [9]
    assert trajs[0].response_ids == [8, 9] and trajs[1].response_ids == [8, 9, 10]
    stops = engine.llm.params[0]["stop_token_ids"]
    assert engine.tokenizer.eos_token_id in stops  # vLLM has no tokenizer: EOS passed as ids
    engine.tool_stop_ids = [42]
    engine.generate([[1]], SamplingParams(n=1, max_new_tokens=3))
    assert engine.llm.params[0]["stop_token_ids"] == [*stops, 42]
    # the sampled token's entry, not the other one in the dict
    torch.testing.assert_close(trajs[1].logprobs, torch.tensor([-0.1, -0.2, -0.3]))
    assert [t.finish_reason for t in trajs] == ["stop", "length", "stop", "length"]
    assert all(t.entropy is None for t in trajs)  # vLLM reports no entropy: the trainer's pass
    assert isinstance(trajs[0].text, str)


def test_stop_strings_cut_the_response_after_the_tag(engine: VLLMEngine) -> None:
    engine.update_weights(FakeTrainEngine())
    prompt = engine.encode_text("0")  # the fake continues with the next ids: "1", "2", ...
    trajs = engine.generate([prompt], SamplingParams(n=3, max_new_tokens=9, stop=("3",)))
    texts = [engine.decode(t.response_ids) for t in trajs]
    assert texts == ["12", "123", "123"]  # the 4-token sample "1234" was cut after the tag
    assert [t.stop_string for t in trajs] == [None, "3", "3"]
    assert trajs[2].finish_reason == "stop" and len(trajs[2].logprobs) == 3


def test_seeds_differ_per_prompt_and_follow_the_generator(engine: VLLMEngine) -> None:
    engine.update_weights(FakeTrainEngine())
    params = SamplingParams(n=4, max_new_tokens=3)
    engine.generate([[1], [2], [3]], params, generator=torch.Generator().manual_seed(0))
    seeds = [p["seed"] for p in engine.llm.params]
    assert seeds[1] - seeds[0] == 4 and seeds[2] - seeds[1] == 4  # n children: seed + j
    engine.generate([[1], [2], [3]], params, generator=torch.Generator().manual_seed(0))
    assert [p["seed"] for p in engine.llm.params] == seeds


def test_sampling_parameter_mapping() -> None:
    kw = sampling_kwargs(SamplingParams(n=8, temperature=0.7, top_p=0.95, top_k=0,
                                        max_new_tokens=1024), seed=11)
    assert kw == {"n": 8, "temperature": 0.7, "top_p": 0.95, "top_k": 0, "max_tokens": 1024,
                  "logprobs": 0, "seed": 11, "detokenize": False, "stop_token_ids": []}
    assert sampling_kwargs(SamplingParams(top_k=20), seed=None)["top_k"] == 20
    tool = sampling_kwargs(SamplingParams(), seed=0, stop_token_ids=[2, 151658])
    assert tool["stop_token_ids"] == [2, 151658]
    with pytest.raises(ValueError, match="backend=hf"):
        sampling_kwargs(SamplingParams(temperature=2.5), seed=0)


def test_llm_kwargs_pass_max_model_len_only_when_set() -> None:
    vcfg = compose_config(["backend=vllm_megatron", "backend.vllm.max_model_len=4096",
                           "backend.vllm.sleep_level=0"]).backend.vllm
    kw = llm_kwargs("m", vcfg, seed=0, dtype="bfloat16", max_model_len=vcfg.max_model_len)
    assert kw["max_model_len"] == 4096 and kw["enable_sleep_mode"] is False


def test_parse_rejects_missing_logprobs_and_wrong_counts() -> None:
    comp = SimpleNamespace(token_ids=[1, 2], logprobs=None, finish_reason="stop")
    with pytest.raises(RuntimeError, match="log-probs"):
        parse_outputs([SimpleNamespace(outputs=[comp])], [[0]], n=1)
    with pytest.raises(RuntimeError, match="expected n=2"):
        parse_outputs([SimpleNamespace(outputs=[comp])], [[0]], n=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_without_cuda_the_engine_says_use_backend_hf(tiny_model_path: str) -> None:
    cfg = compose_config(["backend=vllm_megatron"])
    with pytest.raises(RuntimeError, match="backend=hf"):
        VLLMEngine(tiny_model_path, cfg.backend, seed=0)
    assert "vllm" not in sys.modules
