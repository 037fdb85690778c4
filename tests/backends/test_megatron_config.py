"""HF config -> megatron-core TransformerConfig / GPTModel arguments, and (with megatron-core
installed) component parity of a GPTModel built from them against the transformers model in
fp32 on CPU: the converted state dict loads strictly, and the embedding, RMSNorm, fused-QKV
split (with Qwen3's qk norm), SwiGLU MLP, output layer, RoPE frequencies and the vocab-parallel
log-prob agree with Hugging Face. The full GPTModel forward needs CUDA (gpu_check runs it)."""

from __future__ import annotations

import pytest
import torch

from harness.backends import convert as cv
from harness.backends import megatron_config as mc
from tests.helpers import tiny_hf


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_mapping_sets_every_field_whose_megatron_default_is_wrong(kind: str) -> None:
    config = tiny_hf(kind, tied=False).config
    kw = mc.transformer_config_kwargs(config, dtype=torch.bfloat16)
    assert kw["normalization"] == "RMSNorm" and kw["gated_linear_unit"]
    assert kw["add_bias_linear"] is False
    assert kw["add_qkv_bias"] is (kind == "qwen2")
    assert kw["qk_layernorm"] is (kind == "qwen3")
    assert kw["kv_channels"] == (16 if kind == "qwen3" else 8)
    assert kw["num_query_groups"] == 2 and kw["ffn_hidden_size"] == 48
    assert kw["hidden_dropout"] == kw["attention_dropout"] == 0.0
    assert kw["layernorm_epsilon"] == config.rms_norm_eps
    assert kw["bf16"] and kw["params_dtype"] == torch.bfloat16
    model_kw = mc.gpt_model_kwargs(config)
    assert model_kw["position_embedding_type"] == "rope"
    assert model_kw["rotary_base"] == int(config.rope_parameters["rope_theta"])
    assert model_kw["share_embeddings_and_output_weights"] is False


def test_parallel_sizes_must_divide_heads_and_layers() -> None:
    config = tiny_hf("qwen2", tied=True).config
    with pytest.raises(ValueError, match="not divisible by TP=3"):
        mc.transformer_config_kwargs(config, tp=3)
    with pytest.raises(ValueError, match="not divisible by PP=4"):
        mc.transformer_config_kwargs(config, pp=4)
    assert mc.gpt_model_kwargs(config, tp=4)["vocab_size"] % 4 == 0


def test_llama3_rope_scaling_maps_and_unknown_rope_types_refuse() -> None:
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
                         intermediate_size=48, vocab_size=64, rope_parameters=rope)
    kw = mc.gpt_model_kwargs(config)
    assert kw["rope_scaling"] is True and kw["rope_scaling_factor"] == 8.0
    assert kw["rotary_base"] == 500000
    config.rope_parameters = {**rope, "high_freq_factor": 2.0}
    with pytest.raises(ValueError, match="high_freq_factor"):
        mc.gpt_model_kwargs(config)
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
    with pytest.raises(ValueError, match="backend=hf"):
        mc.gpt_model_kwargs(config)


# -- with megatron-core: build the model on CPU and compare components ----------------------------
@pytest.fixture(scope="module")
def mcore_world(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install .[dev])")
    import torch.distributed as dist
    from megatron.core import parallel_state

    created = not dist.is_initialized()
    if created:  # a file rendezvous: no port to collide on under pytest -n 2
        path = tmp_path_factory.mktemp("dist") / "rendezvous"
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if created:
        dist.destroy_process_group()


def build_pair(kind: str, tied: bool):
    """(HF model, GPTModel with the converted weights), both fp32 on CPU."""
    from megatron.core.models.gpt import GPTModel

    hf = tiny_hf(kind, tied).eval()
    config = mc.build_transformer_config(hf.config, dtype=torch.float32, cpu_init=True)
    model = GPTModel(config=config, transformer_layer_spec=mc.layer_spec(hf.config),
                     **mc.gpt_model_kwargs(hf.config)).eval()
    spec = cv.arch_from_hf_config(hf.config)
    converted = cv.hf_to_mcore(hf.state_dict(), spec)
    own = {k for k in model.state_dict() if not k.endswith("_extra_state")}
    assert own == set(converted), own ^ set(converted)
    missing, unexpected = model.load_state_dict(converted, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    return hf, model


@pytest.mark.parametrize(("kind", "tied"), [("qwen2", True), ("qwen3", False), ("llama", False)])
def test_megatron_components_match_hf_in_fp32(mcore_world, kind: str, tied: bool) -> None:
    hf, model = build_pair(kind, tied)
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (2, 5))
    with torch.no_grad():
        emb_hf = hf.model.embed_tokens(ids)
        torch.testing.assert_close(model.embedding.word_embeddings(ids), emb_hf)
        x = torch.randn(5, 2, 32)  # megatron's [s, b, h]
        layer, hl = model.decoder.layers[0], hf.model.layers[0]
        normed = layer.input_layernorm(x)
        torch.testing.assert_close(normed, hl.input_layernorm(x))
        q, k, v = layer.self_attention.get_query_key_value_tensors(normed)[:3]
        attn, d = hl.self_attn, hf.config.head_dim if kind == "qwen3" else 8
        q_hf = attn.q_proj(normed).view(5, 2, 4, d)
        k_hf = attn.k_proj(normed).view(5, 2, 2, d)
        if kind == "qwen3":  # per-head RMSNorm before RoPE, in both
            q_hf, k_hf = attn.q_norm(q_hf), attn.k_norm(k_hf)
        torch.testing.assert_close(q, q_hf)
        torch.testing.assert_close(k, k_hf)
        torch.testing.assert_close(v, attn.v_proj(normed).view(5, 2, 2, d))
        out, bias = layer.mlp(x)
        assert bias is None
        torch.testing.assert_close(out, hl.mlp(x))
        torch.testing.assert_close(model.decoder.final_layernorm(x), hf.model.norm(x))
        weight = model.shared_embedding_or_output_weight() if tied else None
        logits = model.output_layer(x, weight=weight)[0]
        torch.testing.assert_close(logits, hf.lm_head(x))


def test_rope_frequencies_match_hf_including_llama3_scaling(mcore_world) -> None:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, num_hidden_layers=1,
                         intermediate_size=48, vocab_size=64, rope_parameters=rope)
    kw = mc.gpt_model_kwargs(config)
    emb = RotaryEmbedding(kv_channels=32, rotary_percent=1.0, rotary_base=kw["rotary_base"],
                          rope_scaling=kw["rope_scaling"],
                          rope_scaling_factor=kw["rope_scaling_factor"],
                          use_cpu_initialization=True)
    hf_inv = LlamaForCausalLM(config).model.rotary_emb.inv_freq
    torch.testing.assert_close(emb.inv_freq.float(), hf_inv.float())


def test_vocab_parallel_logprobs_equal_log_softmax_at_tp1(mcore_world) -> None:
    from harness.backends.megatron_engine import vocab_parallel_logprobs

    torch.manual_seed(0)
    logits = torch.randn(3, 4, 10)
    labels = torch.randint(0, 8, (3, 4))
    keep = logits.clone()
    got = vocab_parallel_logprobs(logits, labels, temperature=0.7, vocab_size=8)
    want = torch.log_softmax(keep[..., :8] / 0.7, -1).gather(-1, labels[..., None])[..., 0]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(logits, keep)  # the caller's logits are left intact


def test_vocab_parallel_entropy_equals_the_softmax_entropy_at_tp1(mcore_world) -> None:
    from megatron.core import parallel_state

    from harness.backends.megatron_engine import vocab_parallel_entropy

    torch.manual_seed(0)
    logits = torch.randn(2, 3, 10)
    got = vocab_parallel_entropy(logits, 1.3, vocab_size=7, vocab_start=0,
                                 group=parallel_state.get_tensor_model_parallel_group())
    lp = torch.log_softmax(logits[..., :7] / 1.3, -1)
    torch.testing.assert_close(got, -(lp.exp() * lp).sum(-1))
