"""The vLLM engine's multimodal slot, against fakes of ``vllm.LLM`` (no vllm import, no GPU): a
prompt carrying images goes to vLLM with ``multi_modal_data`` and its sampled trajectories carry
the prompt's pixel inputs for the train engine; text prompts are sent exactly as before. For
Qwen2.5-VL, a fake that expands image placeholders in token prompts the way vLLM 0.32's
processor does checks that vLLM ends up with exactly the ids the trainer trains on (each run of
``<|image_pad|>`` is collapsed to one before sending)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.backends.vllm_engine import VLLMEngine, collapse_runs, vllm_prompt
from harness.cli import compose_config
from harness.types import MultimodalPrompt, SamplingParams
from tasks.geometry3k.generated import generate
from tests.helpers import FakeLLM, FakeTrainEngine, StandInProcessor


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


# -- Qwen2.5-VL: what vLLM 0.32's processor does to a token prompt with images ------------------
class Qwen2p5VLFakeLLM(FakeLLM):
    """``vllm.LLM`` (0.32) serving a Qwen2.5-VL checkpoint, as far as the prompt is concerned.

    ``generate`` has vLLM's signature (prompts, sampling_params, then keyword-only options) and
    processes each ``{"prompt_token_ids", "multi_modal_data"}`` prompt the way vLLM 0.32's
    multimodal processor does (``BaseMultiModalProcessor.apply`` with the Qwen2-VL prompt
    replacement, target ``[image_token_id]``): the images go through the model's image
    processor, giving N = prod(grid_thw) / merge_size^2 embeddings each; then, for image k in
    order, the first single ``<|image_pad|>`` at or after the end of the previous match is
    replaced by N pads -- on token prompts, whether or not the prompt was expanded already.
    When an image finds no pad left, vLLM falls back to text matching (which finds no special
    token either) and its placeholder validation raises; so does this fake. ``contexts`` holds
    the ids each prompt became: what vLLM would sample from."""

    def __init__(self, *, image_processor, image_token_id: int, **kwargs):
        super().__init__(**kwargs)
        self.image_processor, self.pad = image_processor, image_token_id
        self.contexts: list[list[int]] = []

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None,
                 priority=None, tokenization_kwargs=None, mm_processor_kwargs=None):
        self.contexts = [self._process(p) for p in prompts]
        return super().generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _process(self, prompt) -> list[int]:
        ids = list(prompt["prompt_token_ids"])
        images = (prompt.get("multi_modal_data") or {}).get("image", [])
        images = images if isinstance(images, list) else [images]
        if not images:
            return ids
        grids = self.image_processor(images=images, return_tensors="pt")["image_grid_thw"]
        merge = self.image_processor.merge_size ** 2
        out, start = [], 0
        for k, thw in enumerate(grids):
            try:
                at = ids.index(self.pad, start)
            except ValueError:
                raise RuntimeError(
                    f"Expected there to be {len(grids)} prompt placeholders corresponding to "
                    f"{len(grids)} image items, but instead found {k} prompt placeholders!"
                ) from None
            out += ids[start:at] + [self.pad] * (int(thw.prod()) // merge)
            start = at + 1
        return out + ids[start:]


def _vl_engine(request, monkeypatch) -> tuple[VLLMEngine, Qwen2p5VLFakeLLM]:
    """A vLLM engine over the tiny random Qwen2.5-VL of test_vlm_qwen2p5, with the fake."""
    import transformers

    from harness.models.tiny import load_tokenizer

    path = request.getfixturevalue("qwen_vl_path")
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained",
                        classmethod(lambda cls, path, **kw: StandInProcessor(
                            load_tokenizer(path))))
    config = transformers.AutoConfig.from_pretrained(path)
    made: list[Qwen2p5VLFakeLLM] = []

    def factory(**kwargs):
        made.append(Qwen2p5VLFakeLLM(
            image_processor=StandInProcessor(load_tokenizer(path)).image_processor,
            image_token_id=config.image_token_id, **kwargs))
        return made[0]

    cfg = compose_config(["backend=vllm_hf"])
    engine = VLLMEngine(path, cfg.backend, seed=0, llm_factory=factory,
                        sampling_factory=lambda **kw: kw)
    engine.update_weights(FakeTrainEngine())
    return engine, made[0]


def test_qwen2p5_vl_prompts_reach_vllm_collapsed_and_expand_to_exactly_the_trainers_ids(
        request, monkeypatch) -> None:
    engine, llm = _vl_engine(request, monkeypatch)
    pad = llm.pad
    one, other = generate(2, 0, 32)
    two_images = dataclasses.replace(one, id="two", images=[*one.images, *other.images])
    prompts = [engine.encode_prompt(ex) for ex in (one, two_images)]
    assert [sum(t == pad for t in p) for p in prompts] == [4, 8]  # the trainer's: N = 4 each
    trajs = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=3))
    # vLLM's own expansion gives back exactly the context the trainer trains on
    assert llm.contexts == [list(p) for p in prompts]
    sent = [p["prompt_token_ids"] for p in llm.prompts]
    assert [sum(t == pad for t in s) for s in sent] == [1, 2]  # one pad per image
    assert [t.prompt_ids for t in trajs] == [list(p) for p in prompts for _ in range(2)]


def test_fake_vllm_refuses_an_image_without_a_placeholder_like_vllm(
        request, monkeypatch) -> None:
    _, llm = _vl_engine(request, monkeypatch)
    image = generate(1, 0, 32)[0].images[0]
    with pytest.raises(RuntimeError, match="Expected there to be 2 prompt placeholders"):
        llm.generate([{"prompt_token_ids": [5, llm.pad, 6],
                       "multi_modal_data": {"image": [image, image]}}],
                     [dict(n=1, max_tokens=2)], use_tqdm=False)


def test_placeholder_runs_that_do_not_match_the_images_are_refused_before_vllm() -> None:
    images = generate(1, 0, 32)[0].images
    prompt = MultimodalPrompt([5, 9, 9, 6, 9, 7], mm_inputs={}, images=images)
    assert vllm_prompt(MultimodalPrompt([5, 9, 9, 9, 7], {}, images), [9])[
        "prompt_token_ids"] == [5, 9, 7]
    with pytest.raises(ValueError, match=r"1 image\(s\) holds 2 run\(s\)"):
        vllm_prompt(prompt, [9])
    assert collapse_runs([1, 9, 9, 2, 9, 8, 8], [9, 8]) == [1, 9, 2, 9, 8]
