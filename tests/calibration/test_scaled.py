"""Scaled models keep the layer pattern, KV sharing and MoE routing, and round-trip through config.json."""

from __future__ import annotations

import pytest

from servesim.calibration.scaled import parse_scale, scale_model, spec_to_config
from servesim.hardware.errors import SpecError
from servesim.hardware.model import get_model, model_from_config


def kinds(spec) -> list[tuple[str, int]]:
    return [(layer.attention[0], layer.kv_source) for layer in spec.layers]


def test_gemma3n_keeps_both_kinds_and_trailing_sharing():
    spec = scale_model(get_model("gemma-3n-e2b"), layers=6, hidden=64, heads=4)
    # the last 4 of the 20 KV-owning layers are S S S F, the last 2 of the 10 sharing ones S F
    assert kinds(spec) == [("s", 0), ("s", 1), ("s", 2), ("f", 3), ("s", 2), ("f", 3)]
    assert spec.layers[0].window == 512 and spec.num_kv_layers == 4
    assert spec.extra_linear_params == 0 and spec.lookup_params == 0  # AltUp/LAuReL are not executed


def test_gemma2_alternates_and_window_can_shrink():
    spec = scale_model(get_model("gemma-2-9b"), layers=4, hidden=64, heads=4, window=8)
    assert [(layer.attention, layer.window) for layer in spec.layers] == [("sliding", 8), ("full", None)] * 2


def test_widths_heads_and_gqa_ratio():
    spec = scale_model(get_model("llama-3.1-8b"), layers=2, hidden=64, heads=8, intermediate=96, vocab=300)
    assert (spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (64, 8, 2, 8)  # 32:8 kept
    assert [layer.mlp_intermediate for layer in spec.layers] == [96, 96] and spec.vocab_size == 300


def test_mixtral_keeps_top2_routing_over_fewer_experts():
    spec = scale_model(get_model("mixtral-8x7b"), layers=2, hidden=64, heads=4, intermediate=32, experts=4)
    assert (
        spec.moe.num_experts == 4 and spec.moe.experts_per_token == 2 and spec.moe.expert_intermediate == 32
    )
    assert all(layer.is_moe for layer in spec.layers)


@pytest.mark.parametrize(
    "preset,scale",
    [
        ("gemma-3n-e2b", dict(layers=6, hidden=64, heads=4)),
        ("mixtral-8x7b", dict(layers=2, hidden=64, heads=4, experts=4)),
        ("qwen2.5-7b", dict(layers=3, hidden=64, heads=4)),
    ],
)
def test_config_round_trip_gives_the_same_spec(preset, scale):
    spec = scale_model(get_model(preset), **scale)
    assert model_from_config(spec_to_config(spec), spec.name) == spec


def test_errors_name_the_problem():
    with pytest.raises(SpecError, match="MLA"):
        scale_model(get_model("deepseek-v2"), layers=2)
    with pytest.raises(SpecError, match="kv_shared"):
        scale_model(get_model("llama-3.1-8b"), layers=2, kv_shared=1)
    with pytest.raises(SpecError, match="key one of"):
        parse_scale("layers=4,depth=3")
    assert parse_scale(" layers=4, hidden=256 ") == {"layers": 4, "hidden": 256}
