"""HF <-> Megatron weight conversion (harness/backends/convert.py) on tiny random models: the
round trip is exact, the fused layouts put each head where Megatron reads it, and tensor-parallel
shards split and merge back (fc1's stride-2 layout included). Pure tensors, no megatron import."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.backends import convert as cv
from tests.helpers import tiny_hf

CASES = [(k, t) for k in ("qwen2", "qwen3", "llama") for t in (True, False)]


@pytest.mark.parametrize(("kind", "tied"), CASES)
def test_round_trip_hf_to_megatron_to_hf_is_exact(kind: str, tied: bool) -> None:
    model = tiny_hf(kind, tied)
    spec = cv.arch_from_hf_config(model.config)
    hf = {k: v.clone() for k, v in model.state_dict().items()}
    mc = cv.hf_to_mcore(hf, spec)
    assert ("output_layer.weight" in mc) == (not tied)
    assert any(k.endswith("linear_qkv.bias") for k in mc) == (kind == "qwen2")
    assert any("q_layernorm" in k for k in mc) == (kind == "qwen3")
    back = cv.mcore_to_hf(mc, spec)
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_megatron_shapes_match_the_fused_layout(kind: str) -> None:
    model = tiny_hf(kind, tied=False)
    spec = cv.arch_from_hf_config(model.config)
    mc = cv.hf_to_mcore(model.state_dict(), spec)
    n, g, d, H = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.hidden_size
    assert mc["decoder.layers.0.self_attention.linear_qkv.weight"].shape == ((n + 2 * g) * d, H)
    assert mc["decoder.layers.0.self_attention.linear_proj.weight"].shape == (H, n * d)
    assert mc["decoder.layers.1.mlp.linear_fc1.weight"].shape == (2 * 48, H)
    if kind == "qwen3":
        assert spec.head_dim == 16 != H // n
        assert mc["decoder.layers.0.self_attention.q_layernorm.weight"].shape == (d,)


def test_transformer_engine_names_fold_the_pre_norms() -> None:
    model = tiny_hf("qwen2", tied=True)
    spec = cv.arch_from_hf_config(model.config)
    mc = cv.hf_to_mcore(model.state_dict(), spec, te=True)
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in mc
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in mc
    assert "decoder.layers.0.input_layernorm.weight" not in mc
    back = cv.mcore_to_hf(mc, spec)
    assert torch.equal(back["model.layers.0.input_layernorm.weight"],
                       model.state_dict()["model.layers.0.input_layernorm.weight"])


def test_fused_qkv_puts_each_kv_group_in_its_own_block() -> None:
    """Block k of the fused tensor: query heads k*r..k*r+r-1, then key head k, then value head k."""
    spec = cv.ArchSpec(num_layers=1, hidden_size=8, num_heads=6, num_kv_heads=2, head_dim=3,
                       vocab_size=10, tie_embeddings=True)
    r, d = 3, 3
    q = torch.arange(6 * d).float()  # bias-shaped: row j*d.. belongs to head j
    k = 100 + torch.arange(2 * d).float()
    v = 200 + torch.arange(2 * d).float()
    fused = cv.fuse_qkv(q, k, v, spec)
    block1 = fused[(r + 2) * d:]
    assert torch.equal(block1[: r * d], q[r * d:])          # query heads 3, 4, 5
    assert torch.equal(block1[r * d: r * d + d], k[d:])     # key head 1
    assert torch.equal(block1[r * d + d:], v[d:])           # value head 1
    assert all(torch.equal(a, b) for a, b in zip(cv.split_qkv(fused, spec), (q, k, v)))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_split_then_merge_is_exact_for_every_parameter(tp: int) -> None:
    model = tiny_hf("qwen2", tied=False)
    spec = cv.arch_from_hf_config(model.config)
    mc = cv.hf_to_mcore(model.state_dict(), spec)
    for name, tensor in mc.items():
        shards = cv.split_tp(name, tensor, tp)
        assert len(shards) == tp
        assert torch.equal(cv.merge_tp(name, shards), tensor), name


def test_fc1_shard_computes_its_slice_of_the_swiglu_output() -> None:
    """Each rank's [gate_t; up_t] shard gives exactly its slice of silu(gate) * up; a naive
    concatenation of the shards would interleave gate and up and is rejected by merge_tp."""
    torch.manual_seed(0)
    F_, H, tp = 8, 5, 2
    gate, up = torch.randn(F_, H), torch.randn(F_, H)
    fc1 = cv.fuse_gate_up(gate, up)
    x = torch.randn(3, H)
    full = F.silu(x @ gate.T) * (x @ up.T)
    shards = cv.split_tp("decoder.layers.0.mlp.linear_fc1.weight", fc1, tp)
    for t, shard in enumerate(shards):
        g_t, u_t = shard.chunk(2, dim=0)
        torch.testing.assert_close(F.silu(x @ g_t.T) * (x @ u_t.T),
                                   full[:, t * F_ // tp:(t + 1) * F_ // tp])
    assert not torch.equal(torch.cat(shards), fc1)
    assert torch.equal(cv.merge_tp("decoder.layers.0.mlp.linear_fc1.weight", shards), fc1)


def test_row_parallel_shards_sum_to_the_full_product() -> None:
    torch.manual_seed(0)
    w, x = torch.randn(6, 8), torch.randn(2, 8)
    shards = cv.split_tp("decoder.layers.0.mlp.linear_fc2.weight", w, 2)
    partial = sum(x[:, i * 4:(i + 1) * 4] @ s.T for i, s in enumerate(shards))
    torch.testing.assert_close(partial, x @ w.T)


def test_qkv_shards_hold_whole_kv_groups_when_groups_divide_tp() -> None:
    spec = cv.ArchSpec(num_layers=1, hidden_size=4, num_heads=4, num_kv_heads=2, head_dim=2,
                       vocab_size=10, tie_embeddings=True)
    q, k, v = torch.randn(8, 4), torch.randn(4, 4), torch.randn(4, 4)
    shards = cv.split_tp("decoder.layers.0.self_attention.linear_qkv.weight",
                         cv.fuse_qkv(q, k, v, spec), 2)
    one_group = cv.ArchSpec(1, 4, 2, 1, 2, 10, True)
    q1, k1, v1 = cv.split_qkv(shards[1], one_group)
    assert torch.equal(q1, q[4:]) and torch.equal(k1, k[2:]) and torch.equal(v1, v[2:])


def test_vocab_padding_is_cut_on_export() -> None:
    model = tiny_hf("llama", tied=False)
    spec = cv.arch_from_hf_config(model.config)
    mc = cv.hf_to_mcore(model.state_dict(), spec)
    size = cv.padded_vocab_size(spec.vocab_size, tp=4, multiple=32)
    assert size % 128 == 0 and size >= spec.vocab_size
    for key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        mc[key] = cv.pad_vocab(mc[key], size)
    back = cv.mcore_to_hf(mc, spec)
    assert torch.equal(back["lm_head.weight"], model.state_dict()["lm_head.weight"])


def test_extra_state_is_skipped_and_unknown_names_fail() -> None:
    spec = cv.ArchSpec(1, 4, 2, 1, 2, 10, True)
    items = [("decoder.layers.0.self_attention.core_attention._extra_state", None)]
    assert list(cv.iter_mcore_to_hf(items, spec)) == []
    with pytest.raises(KeyError, match="unexpected Megatron parameter"):
        list(cv.iter_mcore_to_hf([("decoder.layers.0.mystery.weight", torch.zeros(1))], spec))


def test_unsupported_architecture_names_the_hf_backend() -> None:
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="backend=hf"):
        cv.arch_from_hf_config(GPT2Config())
