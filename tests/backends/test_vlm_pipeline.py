"""Images through the pipeline with the tiny VLM: prompt -> rollout -> training forward.

The pixel-identity guarantee: the pixel inputs every training forward receives for a row are
exactly (same values, same tensor objects) those the rollout engine prefilled that row with.
Pixels are observed where every path feeds them to the model, ``embed_inputs``; the row-for-row
check of training is of the whole-row forward, to which tests/backends/test_vlm_fast_path.py pins
the shared-prefix forward (one image set per distinct prompt).
"""

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from harness.backends.hf import HFEngine
from harness.batch import RolloutBatch
from harness.config import BackendConfig, OptimConfig, TinyArchConfig
from harness.models.tiny import load_tokenizer
from harness.models.tiny_vlm import (
    TinyVLMForCausalLM,
    build_tiny_vlm,
    build_vlm_tokenizer,
    pixels_of,
)
from harness.types import Example, MultimodalPrompt, SamplingParams
from tasks.geometry3k.generated import generate
from tests.helpers import save_tiny_vlm

ARCH = TinyArchConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                      intermediate_size=128)


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm"), ARCH)


def engine(path: str, seed: int = 0) -> HFEngine:
    backend = OmegaConf.structured(BackendConfig(threads=1, gen_batch_size=64))
    return HFEngine(path, backend, seed, OmegaConf.structured(OptimConfig))


class Recorder:
    """Wraps ``model.embed_inputs`` (the prefill, decode and training paths all embed images
    through it) and records the ``pixel_values`` of every call that has them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[torch.Tensor] = []
        self.inner = model.embed_inputs
        model.embed_inputs = self

    def __call__(self, input_ids, pixel_values=None):
        if pixel_values is not None:
            self.calls.append(pixel_values)
        return self.inner(input_ids, pixel_values)


def test_tiny_vlm_round_trips_through_save_and_from_pretrained(vlm_path):
    eng = engine(vlm_path)
    assert isinstance(eng.model, TinyVLMForCausalLM)
    ex = generate(1, 0, 32)[0]
    prompt = eng.encode_prompt(ex)
    ids = torch.tensor([list(prompt)])
    tok = load_tokenizer(vlm_path)
    fresh = build_tiny_vlm(ARCH, build_vlm_tokenizer(), 32, seed=0).eval()
    saved = eng.model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in fresh.state_dict().items())
    with torch.no_grad():
        a = eng.model(input_ids=ids, **prompt.mm_inputs).logits
        b = fresh(input_ids=ids, **prompt.mm_inputs).logits
    assert torch.allclose(a, b, atol=1e-6)
    assert tok.convert_tokens_to_ids("<image>") == eng.model.config.image_token_id


def test_image_prompt_is_placeholders_then_text_and_carries_pixels(vlm_path):
    eng = engine(vlm_path)
    ex = generate(1, 0, 32)[0]
    prompt = eng.encode_prompt(ex)
    n = eng.model.config.num_image_tokens
    assert isinstance(prompt, MultimodalPrompt)
    assert list(prompt[:n]) == [eng.model.config.image_token_id] * n
    assert eng.tokenizer.decode(list(prompt[n:])) == ex.prompt
    assert torch.equal(prompt.mm_inputs["pixel_values"], pixels_of(ex.images, 32))
    text_only = eng.encode_prompt(dataclasses.replace(ex, images=None))
    assert type(text_only) is list and text_only == list(prompt[n:])


def test_the_pixels_change_the_models_output(vlm_path):
    eng = engine(vlm_path)
    a, b = generate(1, 0, 32)[0], generate(1, 1, 32)[0]
    pa, pb = eng.encode_prompt(a), eng.encode_prompt(b)
    assert list(pa) == list(pb)  # same text: only the picture differs
    with torch.no_grad():
        la = eng.model(input_ids=torch.tensor([list(pa)]), **pa.mm_inputs).logits[0, -1]
        lb = eng.model(input_ids=torch.tensor([list(pb)]), **pb.mm_inputs).logits[0, -1]
    assert not torch.allclose(la, lb)


def test_training_forwards_receive_exactly_the_rollout_pixels(vlm_path):
    eng = engine(vlm_path)
    examples = generate(3, 7, 32)
    prompts = [eng.encode_prompt(ex) for ex in examples]
    rec = Recorder(eng.model)
    n = 4
    trajs = eng.generate(prompts, SamplingParams(n=n, max_new_tokens=6))
    (rollout_pixels,) = rec.calls  # one prefill for all three prompts (decode steps take none)
    per_prompt = rollout_pixels.cpu().split(1)
    for i, t in enumerate(trajs):  # the trajectory carries the very tensor it was sampled with
        assert t.mm_inputs is prompts[i // n].mm_inputs
        assert torch.equal(t.mm_inputs["pixel_values"], per_prompt[i // n])
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    # old log-probs (Trainer.old_logprobs' recompute) and a shuffled, split loss pass, through
    # the whole-row forward (one image per row)
    eng.shared_prefix = False
    rec.calls.clear()
    eng.logprobs(batch, temperature=1.0, micro_batch_size=5)
    order = torch.randperm(len(batch), generator=torch.Generator().manual_seed(0))
    shuffled = batch.select(order)
    micro = list(shuffled.split(3))
    for mb in micro:
        eng.forward(mb.trim_padding(), temperature=1.0)
    old_calls, loss_calls = rec.calls[:3], rec.calls[3:]
    rows = [i for mb in batch.split(5) for i in range(len(mb))]
    assert sum(c.shape[0] for c in old_calls) == len(rows) == len(trajs)
    old_pixels = torch.cat([c.cpu() for c in old_calls])
    loss_pixels = torch.cat([c.cpu() for c in loss_calls])
    for row in range(len(trajs)):
        expected = per_prompt[row // n][0]
        assert torch.equal(old_pixels[row], expected)
    for pos, row in enumerate(order.tolist()):
        assert torch.equal(loss_pixels[pos], per_prompt[row // n][0])


def test_behaviour_logprobs_equal_the_training_forward_with_images(vlm_path):
    eng = engine(vlm_path)
    prompts = [eng.encode_prompt(ex) for ex in generate(2, 3, 32)]
    trajs = eng.generate(prompts, SamplingParams(n=3, temperature=0.8, max_new_tokens=8,
                                                 entropy=True))
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    with torch.no_grad():
        logp, entropy = eng.forward(batch, temperature=0.8)
    mask = batch["response_mask"].bool()
    assert torch.allclose(logp[mask], batch["rollout_logprobs"][mask], atol=1e-4)
    assert torch.allclose(entropy[mask], batch["entropy"][mask], atol=1e-4)


def test_text_only_batches_carry_no_pixel_inputs(vlm_path):
    eng = engine(vlm_path)
    ex = Example(id="t", prompt="Find the angle x.")
    trajs = eng.generate([eng.encode_prompt(ex)], SamplingParams(n=2, max_new_tokens=4))
    assert all(t.mm_inputs is None for t in trajs)
    assert RolloutBatch.from_trajectories(trajs, eng.pad_token_id).mm_inputs() is None


def test_a_training_step_with_images_changes_the_vision_encoder(vlm_path):
    eng = engine(vlm_path)
    prompts = [eng.encode_prompt(ex) for ex in generate(2, 5, 32)]
    batch = RolloutBatch.from_trajectories(
        eng.generate(prompts, SamplingParams(n=2, max_new_tokens=4)), eng.pad_token_id)
    before = eng.model.vision.patch_embed.weight.detach().clone()
    eng.train_mode(True)
    logp, _ = eng.forward(batch, temperature=1.0)
    eng.backward(-(logp * batch["response_mask"]).sum())
    eng.optimizer_step()
    assert not torch.equal(before, eng.model.vision.patch_embed.weight)


def test_the_warm_start_cache_key_covers_the_images():
    from types import SimpleNamespace

    from harness.config import ModelConfig
    from harness.models.tiny_vlm import tiny_vlm_key

    model_cfg = OmegaConf.structured(ModelConfig(name="tiny_vlm", source="tiny_vlm"))
    task = SimpleNamespace(name="geometry3k", config=SimpleNamespace(variant="tiny"))
    pairs = [(ex, ex.meta["reference"]) for ex in generate(4, 0, 32)]
    other = generate(4, 1, 32)
    swapped = [(dataclasses.replace(ex, images=o.images), ref)  # same text, other pictures
               for (ex, ref), o in zip(pairs, other)]
    assert tiny_vlm_key(model_cfg, task, pairs) == tiny_vlm_key(model_cfg, task, list(pairs))
    assert tiny_vlm_key(model_cfg, task, pairs) != tiny_vlm_key(model_cfg, task, swapped)
