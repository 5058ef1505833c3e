"""Model presets: parameter counts against published totals, KV bytes per token, layer kinds, bad input."""

import json
import math

import pytest

from servesim.hardware.errors import SpecError
from servesim.hardware.model import (
    PRESET_DIR,
    get_model,
    kv_heads_per_rank,
    load_model_file,
    model_from_config,
    preset_names,
)

GIB = 1 << 30

# (preset, published total params, published active params or None), in billions
PUBLISHED = [
    ("llama-3.1-8b", 8.03, None),
    ("llama-3.1-70b", 70.6, None),
    ("llama-3.1-405b", 405.9, None),
    ("llama-2-7b", 6.74, None),
    ("mistral-7b", 7.24, None),
    ("mixtral-8x7b", 46.7, 12.9),
    ("qwen2.5-7b", 7.61, None),
    ("qwen2.5-72b", 72.7, None),
    ("gemma-2-9b", 9.24, None),
    ("deepseek-v2", 236, 21),
    ("deepseek-v3", 671, 37),
    ("qwen3-8b", 8.2, None),
    ("qwen3-32b", 32.8, None),
    ("qwen3-30b-a3b", 30.5, 3.3),
    ("qwen3-235b-a22b", 235, 22),
    ("qwen3-coder-480b-a35b", 480, 35),
]

# Presets whose cards round to one or two figures: (preset, total, active without embedding and LM head, rel).
ROUNDED = [
    ("kimi-k2", 1000, 32, 0.05),  # "1T total, 32B activated"
    ("minimax-m2.5", 230, 10, 0.03),  # "230B total, 10B active"
    ("glm-4.7", 355, 32, 0.01),  # GLM-4.5's "355B total, 32B activated" (the MTP layer is not served)
    ("glm-4.5-air", 106, 12, 0.02),  # "106B total, 12B activated"
]


@pytest.mark.parametrize("name,total_b,active_b", PUBLISHED)
def test_parameter_counts_match_published_totals(name, total_b, active_b):
    model = get_model(name)
    assert model.total_params() / 1e9 == pytest.approx(total_b, rel=0.015)
    if active_b is not None:
        assert model.active_params() / 1e9 == pytest.approx(active_b, rel=0.03)


@pytest.mark.parametrize("name,total_b,active_b,rel", ROUNDED)
def test_rounded_published_counts_hold_to_their_rounding(name, total_b, active_b, rel):
    model = get_model(name)
    assert model.total_params() / 1e9 == pytest.approx(total_b, rel=rel)
    body = model.active_params() - model.embedding_params - model.lm_head_params
    assert body / 1e9 == pytest.approx(active_b, rel=rel)


def test_kimi_k2_is_deepseek_v3_with_384_experts_and_the_same_mla_cache():
    kimi, v3 = get_model("kimi-k2"), get_model("deepseek-v3")
    assert (kimi.moe.num_experts, kimi.moe.experts_per_token, kimi.num_heads) == (384, 8, 64)
    assert kimi.kv_bytes_per_token("bf16") == v3.kv_bytes_per_token("bf16") == 61 * 576 * 2
    assert kimi.quantization == "fp8"


@pytest.mark.parametrize(
    "name,hidden,dense_layers,moe_layers,experts,expert_width,dense_width,qk_norm",
    [("glm-4.7", 5120, 3, 89, 160, 1536, 12288, True), ("glm-4.5-air", 4096, 1, 45, 128, 1408, 10944, False)],
)
def test_glm_4_moe_counts_its_weights_by_hand(
    name, hidden, dense_layers, moe_layers, experts, expert_width, dense_width, qk_norm
):
    """GLM-4 MoE: biases on q/k/v but not o_proj, per-head QK norms only with use_qk_norm, a router and one
    shared expert per MoE layer, untied LM head."""
    heads, kv_heads, head_dim, vocab = 96, 8, 128, 151552
    q, kv = heads * head_dim, kv_heads * head_dim
    attention = hidden * q + q + 2 * (hidden * kv + kv) + q * hidden
    norms = 2 * hidden + (2 * head_dim if qk_norm else 0)
    moe = experts * 3 * hidden * expert_width + 3 * hidden * expert_width + experts * hidden
    expected = (
        2 * vocab * hidden
        + dense_layers * (attention + norms + 3 * hidden * dense_width)
        + moe_layers * (attention + norms + moe)
        + hidden
    )
    model = get_model(name)
    assert model.total_params() == expected
    assert (model.o_bias, model.qkv_bias, model.num_layers) == (False, True, dense_layers + moe_layers)
    assert model.kv_bytes_per_token("bf16") == 2 * kv * 2 * (dense_layers + moe_layers)


def test_qk_norms_are_per_head_or_over_all_heads_as_the_config_says():
    # Qwen3 and GLM-4.7: one weight per head dimension for q and one for k; MiniMax-M2 (qk_norm_type per_layer):
    # one over all 48 query heads, one over all 8 KV heads; GLM-4.5-Air: none (use_qk_norm false)
    assert (
        get_model("qwen3-8b").vector_params_per_layer
        == get_model("glm-4.7").vector_params_per_layer
        == 2 * 128
    )
    assert get_model("minimax-m2.5").vector_params_per_layer == (48 + 8) * 128
    assert get_model("glm-4.5-air").vector_params_per_layer == 0


def test_llama_8b_kv_bytes_per_token_and_sequence_sizes():
    model = get_model("llama-3.1-8b")
    assert model.kv_bytes_per_token("bf16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert model.kv_bytes_per_token("bf16") * 4096 == 0.5 * GIB
    assert model.kv_bytes_per_token("bf16") * 128 * 1024 == 16 * GIB
    assert model.kv_bytes_per_token("fp8") == 65536


def test_deepseek_v2_mla_caches_576_values_per_token_per_layer():
    model = get_model("deepseek-v2")
    assert model.kv_values_per_token_per_layer() == 512 + 64
    mha_equivalent = 2 * model.num_heads * 128
    assert mha_equivalent == 32768
    assert model.kv_bytes_per_token("bf16") == 576 * 2 * model.num_layers


def test_gemma_3n_e2b_has_20_kv_owning_layers_of_30():
    model = get_model("gemma-3n-e2b")
    assert model.num_layers == 30 and model.num_kv_layers == 20
    shared = model.layers[20:]
    assert all(not layer.owns_kv for layer in shared)
    # the last 10 layers read the KV of layer 19 (full attention) or 18 (sliding), by their own kind
    for layer in shared:
        assert layer.kv_source == (19 if layer.attention == "full" else 18)
        assert model.layers[layer.kv_source].attention == layer.attention


def test_gemma_3n_e4b_shares_15_of_35_layers():
    model = get_model("gemma-3n-e4b")
    assert (model.num_layers, model.num_kv_layers) == (35, 20)


def test_gemma_2_alternates_sliding_and_full_layers():
    model = get_model("gemma-2-9b")
    kinds = [(layer.attention, layer.window) for layer in model.layers[:4]]
    assert kinds == [("sliding", 4096), ("full", None), ("sliding", 4096), ("full", None)]


def test_moe_layers_follow_first_k_dense_replace():
    v3 = get_model("deepseek-v3")
    assert [layer.is_moe for layer in v3.layers[:4]] == [False, False, False, True]
    assert all(layer.is_moe for layer in get_model("mixtral-8x7b").layers)


@pytest.mark.parametrize("kv_heads,tp,expected", [(8, 1, 8), (8, 2, 4), (8, 8, 1), (8, 16, 1), (1, 4, 1)])
def test_kv_heads_split_then_duplicated_under_tp(kv_heads, tp, expected):
    assert kv_heads_per_rank(kv_heads, tp) == expected


def test_kv_heads_indivisible_tp_is_an_error():
    with pytest.raises(SpecError, match="must divide"):
        kv_heads_per_rank(8, 3)


def test_tp_must_divide_the_attention_heads_unless_attention_is_data_parallel():
    """Qwen2.5-7B has 28 query heads (4 KV heads): vLLM refuses TP8, takes TP4; SGLang's DP attention splits no head."""
    from servesim.hardware.cost import Parallelism
    from servesim.hardware.gpu import get_gpu
    from servesim.hardware.memory import plan_memory

    model, h100 = get_model("qwen2.5-7b"), get_gpu("h100-sxm")
    with pytest.raises(SpecError, match="tensor parallel size 8 must divide qwen2.5-7b's 28 attention heads"):
        plan_memory(model, h100, Parallelism(tp=8))
    assert plan_memory(model, h100, Parallelism(tp=4)).num_blocks > 0
    assert plan_memory(model, h100, Parallelism(tp=8, dp_attention=True)).num_blocks > 0


def test_tp_duplicates_kv_heads_beyond_their_count():
    model = get_model("llama-3.1-8b")  # 8 KV heads
    assert model.kv_bytes_per_token(tp=2) == 131072 / 2
    assert model.kv_bytes_per_token(tp=16) == model.kv_bytes_per_token(tp=8) == 131072 / 8


def test_unknown_model_names_the_nearest_presets_and_where_to_see_all():
    with pytest.raises(SpecError) as err:
        get_model("LLAMA-3.1-8B")
    message = str(err.value)
    assert message.startswith("unknown model 'LLAMA-3.1-8B'; presets: llama-3.1-8b, ")
    assert f"({len(preset_names()) - 3} more: servesim models list)" in message
    assert message.endswith("(or a config.json, folder or HF id)") and len(message) <= 200
    with pytest.raises(SpecError) as err:  # nothing near: how many there are and where they are listed
        get_model("zzzz")
    assert f"presets: {len(preset_names())}, see servesim models list (or" in str(err.value)


def test_malformed_config_names_the_missing_field(tmp_path):
    raw = json.loads(
        json.dumps(
            {
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 100,
                "max_position_embeddings": 128,
            }
        )
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SpecError) as err:
        load_model_file(path)
    assert str(path) in str(err.value) and "intermediate_size" in str(err.value)


def test_mistyped_field_and_bad_json_are_clear(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_model_file(path)
    with pytest.raises(SpecError, match="'hidden_size' must be int"):
        model_from_config({"hidden_size": "4096"}, "x")


@pytest.mark.parametrize(
    "key,value",
    [
        ("head_dim", 0),
        ("vocab_size", 0),
        ("intermediate_size", 0),
        ("max_position_embeddings", 0),
        ("num_key_value_heads", -8),
        ("num_hidden_layers", 0),
    ],
)
def test_a_zero_or_negative_dimension_is_refused_by_name(key, value):
    """A zero head_dim divided by zero (a traceback); a zero vocabulary or MLP priced a model with nothing in it."""
    raw = _LLAMA | {key: value}
    with pytest.raises(SpecError, match=f"cfg.json: {key} must be a positive integer, not {value}$"):
        model_from_config(raw, "x", "cfg.json")


_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "head_dim": 128,
}


@pytest.mark.parametrize(
    "name,total,active", [("gpt-oss-20b", 20.91e9, 3.61e9), ("gpt-oss-120b", 116.83e9, 5.13e9)]
)
def test_gpt_oss_counts_match_the_model_card_to_its_last_digit(name, total, active):
    """The gpt-oss model card (arXiv 2508.10925, Table 1) counts biases and attention sinks, and leaves the input
    embedding out of the active count (the unembedding in)."""
    model = get_model(name)
    assert round(model.total_params() / 1e7) * 1e7 == total
    assert round((model.active_params() - model.embedding_params) / 1e7) * 1e7 == active


def test_gpt_oss_alternates_128_token_windows_with_full_layers_over_routed_experts():
    model = get_model("gpt-oss-120b")
    assert [(layer.attention, layer.window) for layer in model.layers[:2]] == [
        ("sliding", 128),
        ("full", None),
    ]
    assert sum(layer.attention == "sliding" for layer in model.layers) == 18 and all(
        layer.is_moe for layer in model.layers
    )
    assert (model.moe.num_experts, model.moe.experts_per_token, model.moe.expert_intermediate) == (
        128,
        4,
        2880,
    )
    assert model.kv_bytes_per_token("bf16") == 36 * 2 * 8 * 64 * 2  # 72 KiB: every layer owns its KV
    assert model.quantization == "mxfp4"


def test_qwen3_moe_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    raw = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 6,
        "intermediate_size": 96,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "vocab_size": 100,
        "max_position_embeddings": 1024,
    }
    model = model_from_config(raw, "tiny")
    assert [layer.is_moe for layer in model.layers] == [False, True, False, False, False, True]
    assert [layer.mlp_intermediate for layer in model.layers] == [96, 0, 96, 96, 96, 0]
    assert model.vector_params_per_layer == 2 * 32  # q_norm and k_norm over head_dim


def test_a_shared_expert_of_its_own_width_is_refused():
    raw = {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 96,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 64,
        "vocab_size": 100,
        "max_position_embeddings": 1024,
    }
    with pytest.raises(SpecError, match="shared_expert_intermediate_size"):
        model_from_config(raw, "tiny", "q2moe.json")


SIGLIP_PARAMS = 416_866_032  # Gemma 3's vision tower (27 layers of width 1152): stored, images not modelled


@pytest.mark.parametrize(
    "name,published",
    [("gemma-3-27b", 27_432_406_640), ("gemma-3-12b", 12_187_325_040), ("gemma-3-4b", 4_300_079_472)],
)
def test_gemma_3_text_model_plus_vision_tower_is_the_published_count(name, published):
    """Google's config.json leaves vocab, head_dim (12b, 4b), heads (4b) and the 5:1 layout to Gemma3TextConfig's
    defaults; with them, text model + SigLIP (its weights counted, not run) + projector is exact."""
    model = get_model(name)
    assert model.vision_params == SIGLIP_PARAMS + 1152 * (model.hidden_size + 1)
    assert model.total_params() == published
    kinds = [layer.attention for layer in model.layers]
    assert kinds[:6] == ["sliding"] * 5 + ["full"] and kinds.count("full") == model.num_layers // 6
    assert {layer.window for layer in model.layers if layer.attention == "sliding"} == {1024}


def test_gemma_1_is_geglu_and_starcoder2_a_plain_mlp_whatever_their_activation():
    """google/gemma-7b's config.json: hidden_act "gelu" but GeGLU (8.54B parameters: 28 layers of 4 x 3072 x 4096
    attention and 3 x 3072 x 24576 MLP, a tied 256000 x 3072 embedding, two norms per layer and a final one);
    StarCoder2's gelu_pytorch_tanh MLP is c_fc -> act -> c_proj."""
    gemma = model_from_config(
        {
            "model_type": "gemma",
            "hidden_size": 3072,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "intermediate_size": 24576,
            "num_hidden_layers": 28,
            "vocab_size": 256000,
            "max_position_embeddings": 8192,
            "hidden_act": "gelu",
        },
        "gemma-7b",
    )
    assert gemma.gated_mlp
    assert gemma.total_params() == 28 * (4 * 3072 * 4096 + 3 * 3072 * 24576 + 2 * 3072) + 256000 * 3072 + 3072
    starcoder2 = model_from_config(
        {
            "model_type": "starcoder2",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "vocab_size": 100,
            "max_position_embeddings": 1024,
            "hidden_act": "gelu_pytorch_tanh",
        },
        "sc2",
    )
    assert not starcoder2.gated_mlp


def test_a_multimodal_checkpoints_quantization_at_the_top_is_the_text_models():
    raw = {
        "model_type": "gemma3",
        "quantization_config": {"quant_method": "fp8"},
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 1024,
        },
    }
    assert model_from_config(raw, "g3-fp8").quantization == "fp8"
    assert model_from_config({**raw, "quantization_config": None}, "g3").quantization == "bf16"


def test_a_model_config_with_infinity_or_nan_is_refused(tmp_path):
    """Found by the fuzzer: Python's json reads Infinity, so `bos_token_id: -Infinity` ran silently."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(json.loads((PRESET_DIR / "llama-3.1-8b.json").read_text()) | {"bos_token_id": -math.inf})
    )
    with pytest.raises(SpecError, match="config.json: -Infinity is no JSON number; give a finite one"):
        load_model_file(path)


@pytest.mark.parametrize(
    "key,value",
    [
        ("hybrid_override_pattern", "M*M*"),  # Nemotron-H
        ("hybrid_layer_pattern", [0, 1, 1, 0]),  # MiMo-V2-Flash
        ("attention_chunk_size", 8192),  # Llama 4
        ("interleave_moe_layer_step", 2),  # Llama 4 Maverick
        ("index_topk", 2048),  # DeepSeek-V3.2, GLM-5
        ("sparse_attention_config", {"sparse_topk_blocks": 16}),  # MiniMax-M3
        ("global_head_dim", 512),  # Gemma 4
        ("dense_intermediate_size", 12288),
        ("share_expert_dim", 1280),  # Step-3
        ("shared_intermediate_size", 3072),
        ("moe_shared_expert_intermediate_size", 3712),  # Nemotron 3
    ],
)
def test_a_layer_kind_servesim_does_not_model_is_refused_by_its_key(key, value):
    """Read as if absent, these would price Mamba layers as attention or dense layers as MoE: refused, by name."""
    raw = {**_LLAMA, key: value}
    model_from_config({**_LLAMA, key: None}, "tiny")  # null means unset
    with pytest.raises(SpecError, match=rf"^tiny.json: {key} \(.*\) is not modelled"):
        model_from_config(raw, "tiny", "tiny.json")


def test_llama_4_scouts_moe_step_of_one_is_not_the_marker():
    model_from_config({**_LLAMA, "interleave_moe_layer_step": 1}, "tiny")
