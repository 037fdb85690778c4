"""The shared-prefix training forward (harness/backends/kv_decode.py) does not depend on the
model's saved generation settings: a checkpoint whose config says ``use_cache: false`` (as one
saved from a gradient-checkpointed run does) gives the whole-row logits all the same."""

from __future__ import annotations

import torch

from harness.backends.kv_decode import shared_prefix_logits


def test_shared_prefix_logits_ignore_a_config_that_disables_the_cache():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, use_cache=False)
    model = Qwen2ForCausalLM(config).eval()
    P, T = 3, 4
    prompts = torch.tensor([[5, 6, 7], [5, 6, 7], [8, 9, 10]])
    ids = torch.cat([prompts, torch.randint(11, 60, (3, T))], 1)
    attn = torch.ones_like(ids)
    pos = torch.arange(P + T).expand(3, -1)
    with torch.no_grad():
        shared = shared_prefix_logits(model, ids, attn, pos, T)
        whole = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:-1]
    assert shared is not None
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-4)
