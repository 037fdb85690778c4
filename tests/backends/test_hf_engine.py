"""The HF backend: sampling records what training recomputes, and tokenization round-trips."""

import torch
from omegaconf import OmegaConf

from harness.backends.hf import HFEngine, filter_logits
from harness.batch import RolloutBatch
from harness.config import BackendConfig, OptimConfig
from harness.models.tiny import build_char_tokenizer, load_tokenizer, save_tokenizer
from harness.types import SamplingParams


def engine(path: str, seed: int = 0) -> HFEngine:
    backend = OmegaConf.structured(BackendConfig(threads=1, gen_batch_size=64))
    return HFEngine(path, backend, seed, OmegaConf.structured(OptimConfig))


def test_char_tokenizer_round_trips_through_save_and_load(tmp_path):
    tok = build_char_tokenizer()
    save_tokenizer(tok, tmp_path)
    loaded = load_tokenizer(tmp_path)
    text = "3 6 7=15:(3+6)*7 <answer> x </answer>\n"
    ids = loaded.encode(text, add_special_tokens=False)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character, spaces kept
    assert loaded.decode(ids) == text


def test_tiny_model_size_is_in_the_documented_range(tiny_model_path):
    eng = engine(tiny_model_path)
    n = sum(p.numel() for p in eng.model.parameters())
    assert 0.5e6 <= n <= 5e6


def test_behaviour_logprobs_equal_the_training_forward(tiny_model_path):
    eng = engine(tiny_model_path)
    prompts = [eng.tokenizer.encode(p, add_special_tokens=False) for p in ("3 6 7=15:", "1 2=3:")]
    params = SamplingParams(n=4, temperature=0.7, max_new_tokens=10, entropy=True)
    trajs = eng.generate(prompts, params)
    batch = RolloutBatch.from_trajectories(trajs, eng.pad_token_id)
    with torch.no_grad():
        logp, entropy = eng.forward(batch, temperature=0.7)
    mask = batch["response_mask"].bool()
    assert torch.allclose(logp[mask], batch["rollout_logprobs"][mask], atol=1e-4)
    assert torch.allclose(entropy[mask], batch["entropy"][mask], atol=1e-4)


def test_responses_stop_at_eos_and_text_excludes_it(tiny_model_path):
    eng = engine(tiny_model_path)
    trajs = eng.generate([eng.tokenizer.encode("2 3 4=24:", add_special_tokens=False)],
                         SamplingParams(n=16, max_new_tokens=12))
    eos = set(eng.eos_token_ids)
    for t in trajs:
        if t.finish_reason == "stop":
            assert t.response_ids[-1] in eos and not eos & set(t.response_ids[:-1])
        else:
            assert len(t.response_ids) == 12 and not eos & set(t.response_ids)
        assert "<eos>" not in t.text and "<pad>" not in t.text
        assert len(t.logprobs) == len(t.response_ids)


def test_sampling_is_reproducible_from_the_seed(tiny_model_path):
    prompt = [[21, 4, 26, 4, 28, 33, 24, 22, 30]]
    params = SamplingParams(n=8, max_new_tokens=8)
    a = [t.response_ids for t in engine(tiny_model_path, seed=3).generate(prompt, params)]
    b = [t.response_ids for t in engine(tiny_model_path, seed=3).generate(prompt, params)]
    c = [t.response_ids for t in engine(tiny_model_path, seed=4).generate(prompt, params)]
    assert a == b and a != c


def test_top_k_one_is_greedy(tiny_model_path):
    eng = engine(tiny_model_path)
    prompt = eng.tokenizer.encode("4 5 6=26:", add_special_tokens=False)
    traj = eng.generate([prompt], SamplingParams(n=3, top_k=1, max_new_tokens=8))
    assert len({tuple(t.response_ids) for t in traj}) == 1
    with torch.no_grad():
        first = eng.model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert traj[0].response_ids[0] == first


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(filter_logits(logits, top_p=0.7, top_k=0))
    assert kept.tolist() == [[True, True, False, False]]


def test_left_padding_does_not_change_a_prompt_logprobs(tiny_model_path):
    eng = engine(tiny_model_path)
    short = eng.tokenizer.encode("1 2=3:", add_special_tokens=False)
    long = eng.tokenizer.encode("9 9 9 9=36:", add_special_tokens=False)
    params = SamplingParams(n=1, max_new_tokens=6, top_k=1)
    alone = eng.generate([short], params)[0]
    padded = eng.generate([long, short], params)[1]
    assert alone.response_ids == padded.response_ids
    assert torch.allclose(alone.logprobs, padded.logprobs, atol=1e-4)


def test_shared_prefill_gives_each_sample_what_its_own_prefill_would(tiny_model_path):
    eng = engine(tiny_model_path)
    prompts = [eng.tokenizer.encode(p, add_special_tokens=False) for p in ("1 2=3:", "9 8 7=65:")]
    greedy = SamplingParams(n=3, top_k=1, max_new_tokens=8)
    shared = eng.generate(prompts, greedy)
    single = eng.generate([p for p in prompts for _ in range(3)],
                          SamplingParams(n=1, top_k=1, max_new_tokens=8))
    assert [t.response_ids for t in shared] == [t.response_ids for t in single]
    for a, b in zip(shared, single):
        assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert [t.prompt_ids for t in shared] == [p for p in prompts for _ in range(3)]
    assert [t.group_id for t in shared] == [0, 0, 0, 1, 1, 1]


def test_generation_batches_smaller_than_a_group_still_sample_every_row(tiny_model_path):
    backend = OmegaConf.structured(BackendConfig(threads=1, gen_batch_size=2))
    eng = HFEngine(tiny_model_path, backend, 0, attn_implementation="eager")
    prompts = [eng.tokenizer.encode(p, add_special_tokens=False) for p in ("1 2=3:", "4 5=9:")]
    trajs = eng.generate(prompts, SamplingParams(n=4, max_new_tokens=6))
    assert len(trajs) == 8 and [t.group_id for t in trajs] == [0] * 4 + [1] * 4
    assert eng.model.config._attn_implementation == "eager"


def test_fused_adamw_steps_like_the_per_tensor_adamw(tiny_model_path):
    """The engine's AdamW is the fused kernel; three steps from the same gradients land where
    torch's per-tensor AdamW does."""
    import copy

    eng = engine(tiny_model_path)
    assert eng.optimizer.param_groups[0]["fused"]
    plain = copy.deepcopy(eng.model)
    cfg = OptimConfig()
    opt = torch.optim.AdamW(plain.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                            weight_decay=cfg.weight_decay, foreach=False)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen) * 1e-2 for p in plain.parameters()]
        for p, q, g in zip(eng.model.parameters(), plain.parameters(), grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        eng.optimizer_step()
        torch.nn.utils.clip_grad_norm_(list(plain.parameters()), cfg.grad_clip)
        opt.step()
        opt.zero_grad()
    for p, q in zip(eng.model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), atol=1e-6, rtol=1e-5)
