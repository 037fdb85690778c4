"""The tiny VLM on the text models' fast paths (harness/backends/kv_decode.py), changing no number:

* rollout: the preallocated-cache decoder prefills from the model's own image-carrying prompt
  embeddings (``embed_inputs``) and pins the ``<image>`` logit (``constrain_logits``); for the
  same seed it samples what the DynamicCache path samples, with the same log-probs and
  entropies (within 1e-5);
* training: the shared-prefix forward runs each distinct prompt once, where a prompt is its ids,
  attention mask *and pictures* (the same question about two diagrams is two prompts), and gives
  the whole-row forward's log-probs and gradients (within 1e-5).

Qwen2.5-VL (``image_grid_thw``, 3-D positions) keeps the DynamicCache and whole-row forward.
"""

import pytest
import torch
from omegaconf import OmegaConf

from harness.backends import kv_decode
from harness.backends.hf import HFEngine
from harness.backends.kv_decode import (
    CachedDecoder,
    ImagePromptLM,
    covers_inputs,
    shared_prefix_logits,
    supports,
)
from harness.batch import RolloutBatch
from harness.config import BackendConfig, OptimConfig, TinyArchConfig
from harness.models.tiny_vlm import NEVER_LOGIT
from harness.types import Example, SamplingParams
from tasks.geometry3k.generated import generate
from tests.helpers import assert_engines_sample_alike, loss_and_grads, save_tiny_vlm

# grouped-query attention (2 key/value heads for 4 query heads), as the decoder must handle
ARCH = TinyArchConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128)


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm_fast"), ARCH)


def engine(path: str, **backend) -> HFEngine:
    cfg = OmegaConf.structured(BackendConfig(threads=1, gen_batch_size=64, **backend))
    return HFEngine(path, cfg, 0, OmegaConf.structured(OptimConfig))


def group_batch(eng: HFEngine, n: int = 4) -> RolloutBatch:
    """3 image prompts x n samples, rows shuffled. Prompts 0 and 2 of ``generate(3, 7, 32)``
    are the same question about two different diagrams: equal ids, other pixels."""
    examples = generate(3, 7, 32)
    assert examples[0].prompt == examples[2].prompt
    prompts = [eng.encode_prompt(ex) for ex in examples]
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=12)
    trajs = eng.generate(prompts, params, torch.Generator().manual_seed(11))
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    assert len({len(t.response_ids) for t in trajs}) > 1  # right padding is exercised
    return batch.select(torch.randperm(len(batch), generator=torch.Generator().manual_seed(2)))


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, ...]:
    """ids, attention mask and positions [B, L] of ``rows``, left-padded."""
    L = max(map(len, rows))
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r):], attn[i, L - len(r):] = torch.tensor(r), 1
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)


def test_the_tiny_vlm_takes_both_fast_paths(vlm_path, monkeypatch):
    eng = engine(vlm_path)
    assert isinstance(eng.model, ImagePromptLM) and supports(eng.model)
    assert eng._decoder is not None
    pixels = {"pixel_values": torch.zeros(1, 3, 32, 32)}
    assert covers_inputs(eng.model, pixels)
    assert not covers_inputs(eng.model, {**pixels, "image_grid_thw": torch.ones(1, 3)})
    steps = []
    real_step = CachedDecoder.step
    monkeypatch.setattr(CachedDecoder, "step",
                        lambda self, *a, **k: steps.append(1) or real_step(self, *a, **k))
    batch = group_batch(eng)  # the rollout with images went through the preallocated cache
    assert len(steps) > 1
    T = batch["responses"].shape[1]
    with torch.no_grad():
        logits = shared_prefix_logits(eng.model, batch["input_ids"], batch["attention_mask"],
                                      batch["position_ids"], T, batch.mm_inputs())
    assert logits is not None


def test_qwen2p5_vl_keeps_the_dynamic_cache_and_whole_row_forward(qwen_vl_path):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(qwen_vl_path)
    assert not isinstance(model, ImagePromptLM) and not supports(model)
    assert not covers_inputs(model, {"pixel_values": torch.zeros(4, 8)})


@pytest.mark.parametrize("n,top_p,top_k,text_only", [(4, 1.0, 0, False), (1, 0.9, 0, False),
                                                     (3, 1.0, 20, True)])
def test_static_cache_samples_what_the_dynamic_cache_samples_with_images(vlm_path, n, top_p,
                                                                         top_k, text_only):
    """Four diagrams (two of them under the same question), n samples each; one case adds a
    text-only prompt to the batch (its row has no placeholder and no pixels)."""
    static, dynamic = engine(vlm_path), engine(vlm_path, kv_cache="dynamic")
    assert static._decoder is not None and dynamic._decoder is None
    examples = generate(4, 3, 32)
    if text_only:
        examples.append(Example(id="t", prompt="Find the angle x."))
    prompts = [static.encode_prompt(ex) for ex in examples]
    params = SamplingParams(n=n, temperature=0.9, top_p=top_p, top_k=top_k, max_new_tokens=12,
                            entropy=True)
    assert_engines_sample_alike(static, dynamic, prompts, params)


def test_image_prefill_and_steps_equal_the_models_forward_with_the_placeholder_pinned(vlm_path):
    """Two image prompts of different lengths (left padding), then two decoded tokens: each
    step's logits equal a no-cache forward over the padded sequence with the pixels, and the
    ``<image>`` logit is NEVER_LOGIT at every step."""
    eng = engine(vlm_path)
    model, image = eng.model, eng.model.config.image_token_id
    prompts = [eng.encode_prompt(ex) for ex in generate(2, 0, 32)]
    assert len(prompts[0]) != len(prompts[1])
    pixels = torch.cat([p.mm_inputs["pixel_values"] for p in prompts])
    ids, attn, pos = left_padded([list(p) for p in prompts], eng.pad_token_id)
    P = ids.shape[1]
    dec = CachedDecoder(model)
    cache = dec.new_cache(2, P + 2)
    with torch.no_grad():
        logits = [dec.step(cache, ids, pos, attn, model.embed_inputs(ids, pixels))]
        for tok in ([20, 21], [30, 31]):
            nxt = torch.tensor(tok)[:, None]
            ids, attn = torch.cat([ids, nxt], 1), torch.cat([attn, torch.ones_like(nxt)], 1)
            logits.append(dec.step(cache, nxt, pos[:, -1:] + len(logits)))
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        full = model(input_ids=ids, attention_mask=attn, position_ids=pos,
                     pixel_values=pixels).logits
    for j, lg in enumerate(logits):
        assert bool((lg[:, image] == NEVER_LOGIT).all())
        torch.testing.assert_close(lg, full[:, P - 1 + j], atol=1e-5, rtol=0)


def test_the_static_cache_never_samples_an_image_placeholder(vlm_path):
    eng = engine(vlm_path)
    prompts = [eng.encode_prompt(ex) for ex in generate(3, 1, 32)]
    params = SamplingParams(n=8, temperature=3.0, max_new_tokens=12)
    trajs = eng.generate(prompts, params, torch.Generator().manual_seed(0))
    image = eng.model.config.image_token_id
    assert sum(len(t.response_ids) for t in trajs) > 100
    assert all(image not in t.response_ids for t in trajs)


def test_shared_prefix_forward_with_images_gives_the_whole_row_logprobs_and_gradients(
        vlm_path, monkeypatch):
    shared, whole = engine(vlm_path), engine(vlm_path, shared_prefix=False)
    batch = group_batch(shared)
    results = []
    real = kv_decode.shared_prefix_logits
    monkeypatch.setattr("harness.backends.hf.shared_prefix_logits",
                        lambda *a, **k: results.append(real(*a, **k)) or results[-1])
    a_lp, a_ent, a_g = loss_and_grads(shared, batch)
    b_lp, b_ent, b_g = loss_and_grads(whole, batch)
    assert len(results) == 1 and results[0] is not None  # the shared path did run
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(a_lp[mask], b_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(a_ent[mask], b_ent[mask], atol=1e-5, rtol=0)
    names = [name for name, _ in shared.model.named_parameters()]
    vision = [g for name, g in zip(names, b_g, strict=True) if name.startswith("vision.")]
    assert max(float(g.abs().max()) for g in vision) > 1e-4  # the image path trains too
    for name, x, y in zip(names, a_g, b_g, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4, msg=name)


def test_same_prompt_ids_with_other_images_are_another_prompt(vlm_path, monkeypatch):
    """Rows A, B, A, B: one question, two diagrams, one response. The prompt runs twice (once
    per diagram, not once per question) and every row's logits are its own whole-row
    forward's."""
    eng = engine(vlm_path)
    pa, pb = (eng.encode_prompt(ex) for ex in (generate(1, 0, 32)[0], generate(1, 1, 32)[0]))
    assert list(pa) == list(pb)
    a, b = pa.mm_inputs["pixel_values"], pb.mm_inputs["pixel_values"]
    assert not torch.equal(a, b)
    response = eng.tokenizer.encode("B:60", add_special_tokens=False)
    ids, attn, pos = left_padded([list(pa) + response] * 4, eng.pad_token_id)
    mm = {"pixel_values": torch.cat([a, b, a, b])}
    embedded = []
    real_embed = eng.model.embed_inputs
    monkeypatch.setattr(eng.model, "embed_inputs",
                        lambda i, p=None: embedded.append(p) or real_embed(i, p))
    T = len(response)
    with torch.no_grad():
        shared = shared_prefix_logits(eng.model, ids, attn, pos, T, mm)
        prompt_images = embedded[0]
        whole = eng.model(input_ids=ids, attention_mask=attn, position_ids=pos,
                          logits_to_keep=T + 1, **mm).logits[:, :T]
    assert shared is not None and prompt_images.shape[0] == 2
    assert not torch.allclose(whole[0], whole[1], atol=1e-3)  # the diagram matters
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=0)


def test_rows_with_unequal_image_counts_take_the_whole_row_forward(vlm_path):
    """Rows [P, Q], text, [P, R], text with the two-image rows sharing their ids: four pixel
    rows for four rows, yet no row holds exactly one image, so pixel_values has no row-wise
    view (read as one image per row, rows 0 and 2 would both be "P" and be merged)."""
    eng = engine(vlm_path)
    p, q, r = (ex.images[0] for ex in generate(3, 4, 32))
    two = [eng.encode_prompt(Example(id=i, prompt="Which is larger?", images=images))
           for i, images in (("pq", [p, q]), ("pr", [p, r]))]
    text = eng.encode_prompt(Example(id="t", prompt="Find the angle x."))
    response = eng.tokenizer.encode("B:60", add_special_tokens=False)
    ids, attn, pos = left_padded([list(x) + response for x in (two[0], text, two[1], text)],
                                 eng.pad_token_id)
    mm = {"pixel_values": torch.cat([x.mm_inputs["pixel_values"] for x in two])}
    assert mm["pixel_values"].shape[0] == ids.shape[0]
    with torch.no_grad():
        shared = shared_prefix_logits(eng.model, ids, attn, pos, len(response), mm)
    assert shared is None
