"""Two savings of the HF engine that must change no number (issue 19):

* the training forward runs each distinct prompt of a micro-batch once and the responses over
  its keys/values (``kv_decode.shared_prefix_logits``): the same log-probs and entropies as the
  whole-row forward, the same gradients up to float summation order;
* the rollout drops finished rows from the decode batch: every live row samples the same ids
  (the generator still draws over all rows) with the same log-probs, as the DynamicCache path.
"""

import torch
from omegaconf import OmegaConf

from harness.backends import kv_decode
from harness.backends.hf import HFEngine
from harness.backends.kv_decode import CachedDecoder, shared_prefix_logits
from harness.batch import RolloutBatch
from harness.config import BackendConfig, OptimConfig
from harness.types import SamplingParams
from tests.helpers import loss_and_grads

TEXTS = ("3 6 7=15:", "1 2=3:", "10 2 5 9=27:")


def engine(path: str, need_reference: bool = False, **backend) -> HFEngine:
    cfg = OmegaConf.structured(BackendConfig(threads=1, gen_batch_size=64, **backend))
    return HFEngine(path, cfg, 0, OmegaConf.structured(OptimConfig),
                    need_reference=need_reference)


def whole_row_logprobs(model, batch: RolloutBatch) -> torch.Tensor:
    T = batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"], logits_to_keep=T + 1).logits[:, :T]
    return torch.log_softmax(logits.float(), -1).gather(-1, batch["responses"][..., None])[..., 0]


def group_batch(eng: HFEngine, n: int = 4) -> RolloutBatch:
    """A GRPO-shaped batch (3 prompts x n samples) with its rows shuffled, so that a prompt's
    samples are not adjacent (a gather that assumed prompt-major order would be caught)."""
    prompts = [eng.tokenizer.encode(p, add_special_tokens=False) for p in TEXTS]
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=12)
    trajs = eng.generate(prompts, params, torch.Generator().manual_seed(11))
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    assert len({len(t.response_ids) for t in trajs}) > 1  # right padding is exercised
    return batch.select(torch.randperm(len(batch), generator=torch.Generator().manual_seed(2)))


def test_shared_prefix_forward_gives_the_whole_row_logprobs_and_gradients(tiny_model_path,
                                                                          monkeypatch):
    shared, whole = engine(tiny_model_path), engine(tiny_model_path, shared_prefix=False)
    batch = group_batch(shared)
    calls = []
    real = kv_decode.shared_prefix_logits
    monkeypatch.setattr("harness.backends.hf.shared_prefix_logits",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    a_lp, a_ent, a_g = loss_and_grads(shared, batch)
    b_lp, b_ent, b_g = loss_and_grads(whole, batch)
    assert calls == [1]  # the shared path ran once (the whole-row engine never calls it)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(a_lp[mask], b_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(a_ent[mask], b_ent[mask], atol=1e-5, rtol=0)
    assert max(float(g.abs().max()) for g in b_g) > 1e-3  # something trains
    for x, y in zip(a_g, b_g, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_the_prompt_runs_once_per_distinct_prompt(tiny_model_path, monkeypatch):
    eng = engine(tiny_model_path)
    batch = group_batch(eng)
    widths = []
    real_forward = eng.model.forward

    def spy(*args, **kwargs):
        widths.append(tuple(kwargs["input_ids"].shape))
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(eng.model, "forward", spy)
    T = batch["responses"].shape[1]
    with torch.no_grad():
        shared_prefix_logits(eng.model, batch["input_ids"], batch["attention_mask"],
                             batch["position_ids"], T)
    P = batch["input_ids"].shape[1] - T
    assert widths == [(len(TEXTS), P), (len(batch), T - 1)]


def test_rows_with_distinct_prompts_take_the_whole_row_forward(tiny_model_path):
    eng = engine(tiny_model_path)
    batch = group_batch(eng, n=1)
    T = batch["responses"].shape[1]
    assert shared_prefix_logits(eng.model, batch["input_ids"], batch["attention_mask"],
                                batch["position_ids"], T) is None


def test_finished_rows_leave_the_decode_batch_and_no_sample_changes(tiny_model_path,
                                                                    monkeypatch):
    static, dynamic = engine(tiny_model_path), engine(tiny_model_path, kv_cache="dynamic")
    sizes = []
    real_step = CachedDecoder.step

    def spy(self, cache, ids, *args, **kwargs):
        sizes.append(ids.shape[0])
        return real_step(self, cache, ids, *args, **kwargs)

    monkeypatch.setattr(CachedDecoder, "step", spy)
    prompts = [static.tokenizer.encode(p, add_special_tokens=False) for p in TEXTS]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=40, entropy=True)
    a = static.generate(prompts, params, torch.Generator().manual_seed(5))
    b = dynamic.generate(prompts, params, torch.Generator().manual_seed(5))
    N = len(TEXTS) * params.n
    assert sizes[0] == len(TEXTS) and sizes[1] == N  # the prefill, then the first decode step
    assert min(sizes[1:]) < N  # finished rows were dropped
    assert len({len(t.response_ids) for t in a}) > 1
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids and x.finish_reason == y.finish_reason
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(x.entropy, y.entropy, atol=1e-5, rtol=0)


def test_shared_prefix_is_on_by_default_and_keeps_the_config_hash():
    from harness.cell_plan import config_hash
    from harness.cli import compose_config

    assert BackendConfig().shared_prefix is True
    assert compose_config([]).backend.shared_prefix is True
    assert config_hash(compose_config(["backend.shared_prefix=false"])) == config_hash(
        compose_config([]))


def test_same_ids_with_different_padding_are_different_prompts(tiny_model_path):
    """A prompt may contain the pad id as a real token: ids alone would merge it with the
    left-padded prompt of the same ids, and give it that prompt's keys."""
    eng = engine(tiny_model_path)
    pad, T = eng.pad_token_id, 3
    rows = [([pad, 5, 6], [0, 1, 1]), ([pad, 5, 6], [1, 1, 1])] * 2
    ids = torch.tensor([[*p, 7, 8, 9] for p, _ in rows])
    attn = torch.tensor([[*m, 1, 1, 1] for _, m in rows])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        shared = shared_prefix_logits(eng.model, ids, attn, pos, T)
        whole = eng.model(input_ids=ids, attention_mask=attn, position_ids=pos,
                          logits_to_keep=T + 1).logits[:, :T]
    assert shared is not None
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=0)


def test_one_token_responses_keep_their_rows(tiny_model_path):
    eng = engine(tiny_model_path)
    prompts = [eng.tokenizer.encode(p, add_special_tokens=False) for p in TEXTS]
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=1)
    trajs = eng.generate(prompts, params, torch.Generator().manual_seed(4))
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    batch = batch.select(torch.randperm(len(batch), generator=torch.Generator().manual_seed(1)))
    assert batch["responses"].shape[1] == 1
    logp, _ = eng.forward(batch, 1.0, with_entropy=False)
    torch.testing.assert_close(logp.detach(), whole_row_logprobs(eng.model, batch),
                               atol=1e-5, rtol=0)


def test_reference_logprobs_come_from_the_reference_model(tiny_model_path):
    """With a KL term the reference log-probs go through the same forward: they must be the
    frozen reference's, not the policy's, after the policy has moved."""
    eng = engine(tiny_model_path, need_reference=True)
    batch = group_batch(eng)
    with torch.no_grad():
        for p in eng.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ref = eng.logprobs(batch, 1.0, 0, reference=True)
    mask = batch["response_mask"].bool()
    expected, policy = whole_row_logprobs(eng.ref_model, batch), whole_row_logprobs(eng.model,
                                                                                     batch)
    assert float((expected - policy)[mask].abs().max()) > 1e-3  # the two models differ
    torch.testing.assert_close(ref[mask], expected[mask], atol=1e-5, rtol=0)


def test_models_the_decoder_does_not_cover_and_bf16_take_the_whole_row_forward(
        tiny_model_path, monkeypatch):
    eng = engine(tiny_model_path)
    batch = group_batch(eng)
    T = batch["responses"].shape[1]
    calls = []
    real = kv_decode.shared_prefix_logits
    monkeypatch.setattr("harness.backends.hf.shared_prefix_logits",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr("harness.backends.hf.kv_supports", lambda model: False)
    eng.forward(batch, 1.0)
    assert calls == []  # e.g. a dynamic-RoPE Llama: the shared path is never tried
    half = engine(tiny_model_path).model.to(torch.bfloat16)
    with torch.no_grad():
        assert shared_prefix_logits(half, batch["input_ids"], batch["attention_mask"],
                                    batch["position_ids"], T) is None
