"""The vLLM engine's multimodal slot, against the fake ``vllm.LLM`` of test_vllm_engine (no
vllm import, no GPU): a prompt carrying images goes to vLLM with ``multi_modal_data`` and its
sampled trajectories carry the prompt's pixel inputs for the train engine; text prompts are
sent exactly as before."""

from __future__ import annotations

import torch

from harness.backends.vllm_engine import VLLMEngine, vllm_prompt
from harness.cli import compose_config
from harness.types import MultimodalPrompt, SamplingParams
from tasks.geometry3k.generated import generate
from tests.test_vllm_engine import FakeLLM, FakeTrainEngine


def test_text_prompts_are_sent_as_token_ids_only() -> None:
    assert vllm_prompt([5, 6, 7]) == {"prompt_token_ids": [5, 6, 7]}


def test_image_prompts_go_to_vllm_with_their_images_and_trajectories_keep_the_pixels(
        tiny_model_path: str) -> None:
    cfg = compose_config(["backend=vllm_megatron"])
    engine = VLLMEngine(tiny_model_path, cfg.backend, seed=3, llm_factory=FakeLLM,
                        sampling_factory=lambda **kw: kw)
    engine.update_weights(FakeTrainEngine())
    images = generate(1, 0, 32)[0].images
    pixels = {"pixel_values": torch.randn(4, 12), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    prompt = MultimodalPrompt([5, 6, 7], mm_inputs=pixels, images=images)
    trajs = engine.generate([prompt, [9]], SamplingParams(n=2, max_new_tokens=3))
    assert engine.llm.prompts == [
        {"prompt_token_ids": [5, 6, 7], "multi_modal_data": {"image": images}},
        {"prompt_token_ids": [9]},
    ]
    assert [t.mm_inputs is pixels for t in trajs] == [True, True, False, False]
    assert trajs[2].mm_inputs is None
