"""Weight dtypes: `auto` serves the checkpoint's quantization; mxfp4 quantizes the MoE experts only."""

import pytest

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, Parallelism, step_cost
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.memory import EngineMemoryConfig, layer_weight_bytes, plan_memory, weight_bytes_per_gpu
from servesim.hardware.model import checkpoint_dtype, get_model, model_from_config, resolve_weight_dtype

MXFP4_BYTES = 0.5 + 1 / 32  # a 4-bit E2M1 value plus one 8-bit scale shared by 32 values


def tiny_moe(**extra) -> dict:
    return {
        "model_type": "mixtral",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 32,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 100,
        "max_position_embeddings": 4096,
        **extra,
    }


@pytest.mark.parametrize(
    "quantization,expected",
    [
        (None, "bf16"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8"),
        ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}, "mxfp4"),
        ({"quant_method": "awq", "bits": 4}, "int4"),
        ({"quant_method": "gptq", "bits": 8}, "w8a16"),
        ({"quant_method": "bitsandbytes"}, "bitsandbytes"),
    ],
)
def test_checkpoint_dtype_reads_quantization_config(quantization, expected):
    raw = tiny_moe() if quantization is None else tiny_moe(quantization_config=quantization)
    assert checkpoint_dtype(raw) == expected


def test_auto_serves_the_checkpoint_dtype_and_an_explicit_dtype_overrides_it():
    v3 = get_model("deepseek-v3")
    assert v3.quantization == "fp8" and resolve_weight_dtype(v3, "auto") == "fp8"
    assert resolve_weight_dtype(v3, "bf16") == "bf16"
    assert resolve_weight_dtype(get_model("llama-3.1-8b"), "auto") == "bf16"
    h200, par = get_gpu("h200"), Parallelism(tp=8)
    auto = plan_memory(v3, h200, par, EngineMemoryConfig(max_model_len=32768))
    fp8 = plan_memory(v3, h200, par, EngineMemoryConfig(max_model_len=32768, weight_dtype="fp8"))
    assert auto.weight_dtype == "fp8" and auto.weight_bytes == fp8.weight_bytes


def test_an_unmodelled_checkpoint_quantization_is_refused_only_when_served_as_auto():
    model = model_from_config(tiny_moe(quantization_config={"quant_method": "bitsandbytes"}), "bnb")
    with pytest.raises(
        SpecError, match=r"'bitsandbytes'.*set engine.weight_dtype \(allowed: bf16, fp16, fp8"
    ):
        resolve_weight_dtype(model, "auto")
    assert resolve_weight_dtype(model, "int4") == "int4"


def test_mxfp4_on_a_dense_model_is_refused_naming_the_allowed_dtypes():
    with pytest.raises(
        SpecError,
        match=r"quantizes MoE experts only.*allowed for it: bf16, fp16, fp8, int8, w8a16, int4, nvfp4, mxfp8$",
    ):
        resolve_weight_dtype(get_model("llama-3.1-8b"), "mxfp4")


def test_mxfp4_stores_experts_at_4_25_bits_padded_and_everything_else_in_bf16():
    """vLLM's mxfp4 MoE kernels pad the experts' hidden size to a multiple of 256: 64 takes 256's room."""
    model = model_from_config(tiny_moe(), "tiny")
    layer = model.layers[0]
    experts = 4 * 3 * 64 * 32  # 4 gated experts of width 32
    assert model.layer_expert_params(layer) == experts
    rest = model.layer_params(layer) - experts  # attention, norms, router
    assert layer_weight_bytes(model, layer, "mxfp4") == pytest.approx(
        rest * 2 + experts * MXFP4_BYTES * 256 / 64
    )
    assert layer_weight_bytes(model, layer, "bf16") == 2 * model.layer_params(layer)
    # embeddings and the LM head stay bf16 whatever the layers use
    ends = 2 * (model.embedding_params + model.lm_head_params)
    assert weight_bytes_per_gpu(model, Parallelism(), "mxfp4") == pytest.approx(
        2 * layer_weight_bytes(model, layer, "mxfp4") + ends
    )


def test_mxfp4_moe_step_reads_padded_expert_bytes_at_4_25_bits_and_attention_at_bf16():
    """A step streams (and multiplies) the experts as the kernels store them: hidden size 64 padded to 256."""
    model = model_from_config(tiny_moe(), "tiny")
    h200, batch = get_gpu("h200"), StepBatch.uniform(1, 16)  # one decode token: top-2 of 4 experts
    bf16 = step_cost(batch, model, h200, options=CostOptions(weight_dtype="bf16"))
    mxfp4 = step_cost(batch, model, h200, options=CostOptions(weight_dtype="mxfp4"))
    # one token touches exactly its top-2 experts, in each of the 2 layers
    saved = 2 * 2 * (3 * 64 * 32) * (2 - MXFP4_BYTES * 256 / 64)
    assert bf16.by_name("moe").bytes - mxfp4.by_name("moe").bytes == pytest.approx(saved)
    assert mxfp4.by_name("moe").flops == pytest.approx(bf16.by_name("moe").flops * 256 / 64)
    assert bf16.by_name("qkv_proj").bytes == mxfp4.by_name("qkv_proj").bytes


def test_gpt_oss_weights_are_what_its_checkpoint_stores_padded_as_vllm_loads_them():
    """gpt-oss-20b's safetensors index: total_size 13,761,264,768 bytes (experts MXFP4, the rest bf16). vLLM pads the
    experts' hidden size from 2880 to 3072: 24 layers x 32 experts x 3 x 2880 x 2880 weights at 4.25 bits take
    3072 / 2880 - 1 = 6.7% more."""
    model = get_model("gpt-oss-20b")
    experts = 24 * 32 * 3 * 2880 * 2880 * MXFP4_BYTES
    assert weight_bytes_per_gpu(model, Parallelism(), "auto") == pytest.approx(
        13_761_264_768 + experts * (3072 / 2880 - 1), rel=1e-6
    )


def test_gpt_oss_120b_serves_32k_contexts_on_one_80_gb_gpu_but_not_its_full_context():
    """vLLM loads gpt-oss-120b's weights in 64.4 GiB (its log in issue #33155): 0.9 x 79.2 GiB - weights -
    activations and reserve leaves 4.7 GiB of KV, and one 131,072-token request needs 4.8 GiB (its 18 full layers
    whole, its 18 sliding layers 128 tokens plus a chunk). So vLLM refuses to start at the full context on one H100
    (issue #27508: 'decrease the context'), and gpustack served it with --max-model-len 32768."""
    model, h100 = get_model("gpt-oss-120b"), get_gpu("h100-sxm")
    with pytest.raises(SpecError, match="needs 4.79 GiB of KV cache per GPU, more than .*'s 4.72 GiB"):
        plan_memory(model, h100, Parallelism(), EngineMemoryConfig())
    plan = plan_memory(model, h100, Parallelism(), EngineMemoryConfig(max_model_len=32768))
    assert plan.weight_dtype == "mxfp4" and plan.weight_bytes / (1 << 30) == pytest.approx(64.5, abs=0.05)
    assert plan.kv_windows == (None, 128) and 3.2 < plan.max_concurrency < 3.5
    with pytest.raises(SpecError, match="does not fit on h100-sxm"):
        plan_memory(model, h100, Parallelism(), EngineMemoryConfig(weight_dtype="bf16", max_model_len=32768))


def test_weight_only_8_bit_runs_bf16_gemms_and_w8a8_runs_int8_ones():
    model, h100 = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    prefill = StepBatch.uniform(1, 0, 4096)  # compute-bound: the GEMMs' peak decides
    w8a16, w8a8, bf16 = (
        step_cost(prefill, model, h100, options=CostOptions(weight_dtype=d)).by_name("mlp")
        for d in ("w8a16", "int8", "bf16")
    )
    assert w8a16.bound == w8a8.bound == bf16.bound == "compute"
    assert w8a16.time_s == pytest.approx(bf16.time_s)  # AWQ/GPTQ 8-bit: dequantized into bf16 tensor cores
    assert w8a8.time_s == pytest.approx(bf16.time_s / 2)  # H100: int8 at twice the bf16 rate
    assert checkpoint_dtype(tiny_moe(quantization_config={"quant_method": "gptq", "bits": 8})) == "w8a16"


def test_an_mxfp4_target_keeps_a_dense_draft_in_its_own_checkpoint_dtype():
    from servesim.policies.spec_cost import draft_weight_dtype
    from tests.simulator.conftest import run, scenario

    assert draft_weight_dtype(get_model("llama-3.2-1b"), "mxfp4") == "auto"
    assert draft_weight_dtype(get_model("llama-3.2-1b"), "fp8") == "fp8"
    s = scenario(
        model="gpt-oss-120b",
        engine={
            "max_model_len": 8192,
            "weight_dtype": "mxfp4",
            "speculative": {"method": "draft", "k": 3, "acceptance": 0.7, "draft_model": "llama-3.2-1b"},
        },
        workload={"num_requests": 30},
    )
    assert run(s).summary["completed"] == 30


def test_nvfp4_weights_stream_at_4_5_bits_and_run_on_fp4_tensor_cores_where_there_are_some():
    """NVFP4: a 4-bit value and one FP8 scale per 16 (0.5625 bytes a weight); its GEMMs on a B200's FP4 tensor cores
    (9 PFLOP/s), on an H100 dequantized to bf16; ModelOpt and llm-compressor checkpoints are recognised."""
    from servesim.hardware.batch import StepBatch
    from servesim.hardware.cost import CostOptions, Parallelism, step_cost
    from servesim.hardware.model import checkpoint_dtype, weight_bytes

    model = get_model("llama-3.1-8b")
    assert weight_bytes(model, "nvfp4") == (0.5625, 0.5625)
    assert (
        checkpoint_dtype({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
        == "nvfp4"
    )
    assert (
        checkpoint_dtype(
            {"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}}
        )
        == "nvfp4"
    )
    assert (
        checkpoint_dtype({"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}) == "fp8"
    )
    prefill = StepBatch.of([8192], [0])
    mlp = {
        gpu: step_cost(prefill, model, get_gpu(gpu), Parallelism(), options=CostOptions("nvfp4")).by_name(
            "mlp"
        )
        for gpu in ("b200", "h100-sxm")
    }
    flops = 2 * 8192 * 3 * 4096 * 14336 * 32
    assert mlp["b200"].time_s == pytest.approx(flops / (9e15 * 0.70))  # compute-bound at the GEMM efficiency
    assert mlp["h100-sxm"].time_s == pytest.approx(flops / (get_gpu("h100-sxm").peak_for("bf16") * 0.70))
