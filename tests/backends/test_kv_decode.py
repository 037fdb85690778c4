"""The preallocated KV cache (harness/backends/kv_decode.py) changes no number: for the same seed
it samples the same ids as transformers' DynamicCache path, with the same log-probs and entropies
(within 1e-5), single-turn with shared prefill and multi-turn with tools."""

import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from harness import multiturn
from harness.backends.hf import HFEngine
from harness.backends.kv_decode import CachedDecoder, supports
from harness.config import BackendConfig, OptimConfig
from harness.multiturn import generate_multiturn
from harness.tools import ToolEnv
from harness.types import Example, SamplingParams
from tests.helpers import assert_engines_sample_alike
from tests.helpers import assert_same_trajectories as assert_same


def engine(path: str, kv_cache: str, seed: int = 0) -> HFEngine:
    backend = OmegaConf.structured(BackendConfig(threads=1, gen_batch_size=64,
                                                 kv_cache=kv_cache))
    return HFEngine(path, backend, seed, OmegaConf.structured(OptimConfig))


def pair(path: str) -> tuple[HFEngine, HFEngine]:
    static, dynamic = engine(path, "static"), engine(path, "dynamic")
    assert static._decoder is not None and dynamic._decoder is None
    return static, dynamic


def test_tiny_model_takes_the_preallocated_path(tiny_model_path):
    eng = engine(tiny_model_path, "static")
    assert supports(eng.model)


def test_prefill_and_step_logits_equal_the_models_forward(tiny_model_path):
    """Left-padded prompts of different lengths, then two decoded tokens: the last-position
    logits equal a full no-cache forward over the same padded sequence."""
    eng = engine(tiny_model_path, "static")
    dec = CachedDecoder(eng.model)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    P = max(map(len, prompts))
    ids = torch.zeros((3, P), dtype=torch.long)
    attn = torch.zeros((3, P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], attn[i, P - len(p):] = torch.tensor(p), 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = dec.new_cache(3, P + 2)
    with torch.no_grad():
        logits = [dec.step(cache, ids, pos, attn)]
        for tok in ([20, 21, 22], [30, 31, 32]):
            nxt = torch.tensor(tok)[:, None]
            ids, attn = torch.cat([ids, nxt], 1), torch.cat([attn, torch.ones_like(nxt)], 1)
            logits.append(dec.step(cache, nxt, pos[:, -1:] + len(logits)))
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        full = eng.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    for j, lg in enumerate(logits):
        torch.testing.assert_close(lg, full[:, P - 1 + j], atol=1e-5, rtol=0)


@pytest.mark.parametrize("n,top_p,top_k", [(4, 1.0, 0), (1, 0.9, 0), (3, 1.0, 20)])
def test_static_cache_samples_what_the_dynamic_cache_samples(tiny_model_path, n, top_p, top_k):
    static, dynamic = pair(tiny_model_path)
    texts = ("3 6 7=15:", "1 2=3:", "10 2 5 9=27:")
    prompts = [static.tokenizer.encode(p, add_special_tokens=False) for p in texts]
    params = SamplingParams(n=n, temperature=0.9, top_p=top_p, top_k=top_k, max_new_tokens=16,
                            entropy=True)
    assert_engines_sample_alike(static, dynamic, prompts, params)


def test_stop_strings_and_topk_entropy_match(tiny_model_path):
    static, dynamic = pair(tiny_model_path)
    prompts = [static.tokenizer.encode("3 6 7=15:", add_special_tokens=False)]
    params = SamplingParams(n=6, temperature=1.2, max_new_tokens=24, entropy=True,
                            entropy_topk=5, stop=(")", "="))
    a = static.generate(prompts, params, torch.Generator().manual_seed(3))
    b = dynamic.generate(prompts, params, torch.Generator().manual_seed(3))
    assert_same(a, b)


def test_multiturn_rollout_matches(tiny_model_path, monkeypatch):
    """Several rounds (prefixes of different lengths, tool results appended): the tiny Countdown
    model never writes a closing tag, so a '+' stands for one here."""
    static, dynamic = pair(tiny_model_path)
    env = ToolEnv(tools={"search": lambda q: f"found {q[:8]}"}, max_calls=2,
                  max_total_tokens=60)
    monkeypatch.setattr(ToolEnv, "stop_strings", lambda self: ["+", "</answer>"])
    monkeypatch.setattr(multiturn, "_tool_request",
                        lambda text, stop, env: ("search", text[-4:]) if stop == "+" else None)
    examples = [Example(id="a", prompt="1 2=3:", answer="x"),
                Example(id="b", prompt="10 2 5 9=27:", answer="y")]
    params = SamplingParams(n=3, temperature=1.3, max_new_tokens=20)
    a = generate_multiturn(static, examples, params, env, torch.Generator().manual_seed(5))
    b = generate_multiturn(dynamic, examples, params, env, torch.Generator().manual_seed(5))
    assert_same(a, b)
    for x, y in zip(a, b, strict=True):
        assert x.loss_mask == y.loss_mask and x.turn_boundaries == y.turn_boundaries
    assert sum(len(t.tool_calls) for t in a) >= 2  # the rounds did happen


def test_static_cache_is_the_default(tiny_model_path):
    assert BackendConfig().kv_cache == "static"
    eng = engine(tiny_model_path, BackendConfig().kv_cache)
    params = dataclasses.replace(SamplingParams(n=2, max_new_tokens=4))
    assert len(eng.generate([[5, 6, 7]], params)) == 2


def test_cache_and_bucketing_choices_keep_the_config_hash():
    """They change float summation order only, like backend.threads: a finished cell is not
    rerun and a board row keeps its runs when they are switched."""
    from harness.cell_plan import config_hash
    from harness.cli import compose_config

    base = config_hash(compose_config([]))
    assert config_hash(compose_config(["backend.kv_cache=dynamic"])) == base
    assert config_hash(compose_config(["trainer.length_bucketing=true"])) == base
    assert config_hash(compose_config(["trainer.micro_batch_size=8"])) != base
