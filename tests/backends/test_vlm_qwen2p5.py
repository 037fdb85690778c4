"""The Qwen2.5-VL code path of the HF engine on a tiny, randomly initialised Qwen2.5-VL.

Nothing is downloaded: the model is built from a small ``Qwen2_5_VLConfig`` (2 text layers of
width 64, a 1-block vision tower) over the character tokenizer plus Qwen's vision special tokens.
``Qwen2_5_VLProcessor`` itself needs torchvision (its video processor), absent on the CPU
image, so a stand-in with the same two calls the engine makes (``apply_chat_template`` and
``__call__`` -> ``input_ids``, ``pixel_values``, ``image_grid_thw``) wraps the real PIL
``Qwen2VLImageProcessorPil`` and expands ``<|image_pad|>`` the way the real processor does.
What this exercises: ``AutoModelForImageTextToText`` loading, placeholder expansion, the
processor's patch-major ``pixel_values`` + ``image_grid_thw`` concatenated over rows, and the
3-D multimodal RoPE positions in prefill, cached decode and the training forward (the rollout's
behaviour log-probs must equal the training forward's).
"""

import pytest
import torch
from omegaconf import OmegaConf

from harness.backends.hf import HFEngine
from harness.batch import RolloutBatch
from harness.config import BackendConfig, OptimConfig
from harness.types import MultimodalPrompt, SamplingParams
from tasks.geometry3k.generated import generate
from tests.helpers import QWEN_VL_IMAGE_PROCESSOR, StandInProcessor

transformers = pytest.importorskip("transformers")
pytest.importorskip(QWEN_VL_IMAGE_PROCESSOR)

@pytest.fixture
def eng(qwen_vl_path, monkeypatch):
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained",
                        classmethod(lambda cls, path, **kw: StandInProcessor(
                            __import__("harness.models.tiny", fromlist=["x"])
                            .load_tokenizer(path))))
    backend = OmegaConf.structured(BackendConfig(threads=1, gen_batch_size=64))
    return HFEngine(qwen_vl_path, backend, 0, OmegaConf.structured(OptimConfig))


def test_a_qwen2p5_vl_loads_as_image_text_to_text_with_its_processor(eng):
    assert type(eng.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert isinstance(eng.processor, StandInProcessor)


def test_the_prompt_holds_one_pad_per_merged_patch_and_carries_grid_and_pixels(eng):
    ex = generate(1, 0, 32)[0]
    prompt = eng.encode_prompt(ex)
    assert isinstance(prompt, MultimodalPrompt)
    thw = prompt.mm_inputs["image_grid_thw"]
    pads = sum(1 for t in prompt if t == eng.model.config.image_token_id)
    assert pads == int(thw.prod()) // 4 == 4  # 56x56 -> 4x4 patches of 14 -> 2x2 merged
    assert prompt.mm_inputs["pixel_values"].shape[0] == int(thw.prod())
    assert eng.tokenizer.decode(list(prompt), skip_special_tokens=True).endswith(
        ex.prompt + "\nassistant\n")


def test_qwen2p5_vl_rollout_logprobs_equal_the_training_forward_on_the_same_pixels(eng):
    prompts = [eng.encode_prompt(ex) for ex in generate(3, 2, 32)]
    recorded = []
    inner = eng.model.forward

    def spy(*args, **kwargs):
        if kwargs.get("pixel_values") is not None:
            recorded.append((kwargs["pixel_values"], kwargs["image_grid_thw"]))
        return inner(*args, **kwargs)

    eng.model.forward = spy
    params = SamplingParams(n=2, temperature=0.9, max_new_tokens=6, entropy=True)
    trajs = eng.generate(prompts, params)
    (rollout_pixels, rollout_grid), = recorded
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    recorded.clear()
    with torch.no_grad():
        logp, entropy = eng.forward(batch, temperature=0.9)
    (train_pixels, train_grid), = recorded
    # the batch repeats each prompt's pixels once per sample, in row order
    expected = torch.cat([trajs[i].mm_inputs["pixel_values"] for i in range(len(trajs))])
    assert torch.equal(train_pixels.cpu(), expected)
    assert torch.equal(rollout_pixels.cpu(), torch.cat([p.mm_inputs["pixel_values"]
                                                        for p in prompts]))
    assert torch.equal(train_grid.cpu(), rollout_grid.cpu().repeat_interleave(2, 0))
    mask = batch["response_mask"].bool()
    assert torch.allclose(logp[mask], batch["rollout_logprobs"][mask], atol=1e-4)
    assert torch.allclose(entropy[mask], batch["entropy"][mask], atol=1e-4)
