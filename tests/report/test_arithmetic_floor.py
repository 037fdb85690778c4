"""The multiply-add count behind benchmarks/arithmetic_floor.py: every linear layer a token goes
through, with grouped-query attention's narrower k/v projections, counted from the config."""

from __future__ import annotations

from types import SimpleNamespace

from tests.helpers import load_benchmark


def test_linear_layers_of_the_tiny_model_and_of_a_gqa_model_are_counted_per_token():
    shapes = load_benchmark("arithmetic_floor").linear_shapes
    tiny = SimpleNamespace(hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
                           intermediate_size=512, num_hidden_layers=3, vocab_size=100)
    per_layer = 128 * 128 * 4 + 128 * 512 * 3  # q, k, v, o; gate, up, down
    assert sum(k * n for k, n in shapes(tiny)) == 3 * per_layer + 128 * 100
    gqa = SimpleNamespace(hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=32, intermediate_size=512, num_hidden_layers=1,
                          vocab_size=10)
    assert shapes(gqa) == [(256, 256), (256, 64), (256, 64), (256, 256), (256, 512),
                           (256, 512), (512, 256), (256, 10)]
