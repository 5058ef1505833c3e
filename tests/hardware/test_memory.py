"""Memory planner: the seed's H200 budget, TP, fp8 KV, sliding windows and fail-fast errors."""

import pytest

from servesim.hardware.cost import Parallelism
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.memory import EngineMemoryConfig, plan_memory, request_kv_bytes
from servesim.hardware.model import get_model
from servesim.policies.config import EngineConfig

LLAMA_8B = get_model("llama-3.1-8b")
GIB = 1 << 30


def test_8b_on_h200_at_0_9_follows_the_seed_on_the_capacity_the_driver_reports():
    """The seed: 141 GB x 0.9 = 127 GB - 16 GB weights - ~6 GB activations ~= 105 GB of KV ~= 800K tokens ~= 200
    sequences of 4K. vLLM multiplies what the driver reports, 139.81 GiB (150.1e9 B) on an H200, not the
    datasheet's 141 GB, and profiles Llama-3-8B's activation peak at ~1.2 GiB (8192 batched tokens), so the same
    arithmetic gives ~10% more than the seed's rounded figures: ~117 GB, ~890K tokens, ~217 sequences."""
    plan = plan_memory(LLAMA_8B, get_gpu("h200"))
    assert plan.usable_bytes == pytest.approx(0.9 * 143156 * (1 << 20))
    assert plan.weight_bytes == pytest.approx(16.06e9, rel=0.01)
    assert plan.activation_bytes == pytest.approx(1.2 * GIB, rel=0.15)
    assert plan.kv_cache_bytes == pytest.approx(0.9 * 150.11e9 - 16.06e9 - 1.2 * GIB - 1 * GIB, rel=0.01)
    assert plan.kv_cache_tokens == pytest.approx(891_000, rel=0.01)
    assert plan.kv_cache_tokens / 4096 == pytest.approx(217, rel=0.01)
    assert plan.kv_cache_tokens == plan.num_blocks * 16
    assert plan.num_blocks * 16 * plan.kv_bytes_per_token <= plan.kv_cache_bytes


def test_budget_adds_up_to_the_usable_memory():
    plan = plan_memory(LLAMA_8B, get_gpu("h100-sxm"))
    # what an H100 SXM reports (81,090 MiB)
    assert (
        plan.weight_bytes + plan.activation_bytes + plan.reserve_bytes + plan.kv_cache_bytes
        == pytest.approx(0.9 * 85_028_896_768)
    )


def test_max_concurrency_is_kv_tokens_over_max_model_len():
    plan = plan_memory(LLAMA_8B, get_gpu("h200"), cfg=EngineMemoryConfig(max_model_len=4096))
    assert plan.max_concurrency == pytest.approx(plan.kv_cache_tokens / 4096)


def test_tp2_halves_weights_and_roughly_doubles_kv_tokens():
    gpu = get_gpu("h100-sxm")
    tp1 = plan_memory(LLAMA_8B, gpu)
    tp2 = plan_memory(LLAMA_8B, gpu, Parallelism(tp=2))
    assert tp2.weight_bytes == pytest.approx(tp1.weight_bytes / 2)
    assert tp2.kv_bytes_per_token == tp1.kv_bytes_per_token / 2
    assert tp2.kv_cache_tokens > 2 * tp1.kv_cache_tokens  # twice the heads' room plus the freed weight memory


def test_fp8_kv_doubles_tokens():
    gpu = get_gpu("h200")
    bf16 = plan_memory(LLAMA_8B, gpu)
    fp8 = plan_memory(LLAMA_8B, gpu, cfg=EngineMemoryConfig(kv_dtype="fp8"))
    assert fp8.kv_cache_tokens == pytest.approx(2 * bf16.kv_cache_tokens, rel=1e-4)


def test_sliding_layers_keep_only_their_window():
    gemma = get_model("gemma-2-9b")
    per_layer = gemma.kv_values_per_token_per_layer() * 2
    at_32k = request_kv_bytes(gemma, 32768, "bf16", tp=1, block_size=16)
    assert at_32k == 21 * 32768 * per_layer + 21 * (4096 + 16) * per_layer
    assert request_kv_bytes(gemma, 1000, "bf16", 1, 16) == 42 * 1008 * per_layer


def test_model_too_big_fails_fast_with_advice():
    with pytest.raises(SpecError, match="does not fit on h100-sxm.*raise tp"):
        plan_memory(get_model("llama-3.1-70b"), get_gpu("h100-sxm"))
    assert plan_memory(get_model("llama-3.1-70b"), get_gpu("h100-sxm"), Parallelism(tp=4)).kv_cache_tokens > 0


def test_max_model_len_request_that_cannot_fit_fails_fast():
    with pytest.raises(SpecError, match="max_model_len=131072"):
        plan_memory(LLAMA_8B, get_gpu("l4"))
    assert (
        plan_memory(LLAMA_8B, get_gpu("l4"), cfg=EngineMemoryConfig(max_model_len=8192)).max_concurrency > 1
    )


def test_sglang_starts_with_a_context_longer_than_its_pool_and_caps_requests_at_the_pool():
    """vLLM refuses to start; SGLang sets max_req_len = min(context_len, max_total_num_tokens) - 1."""
    sglang = EngineMemoryConfig(gpu_memory_utilization=0.9, activations_outside=True, max_len_short_of_pool=1)
    plan = plan_memory(LLAMA_8B, get_gpu("l4"), cfg=sglang)
    assert plan.max_model_len == plan.kv_cache_tokens - 1 < 131072
    assert plan.max_concurrency == pytest.approx(1.0)  # the one request of the pool's length fills it
    assert (
        plan_memory(
            LLAMA_8B,
            get_gpu("l4"),
            cfg=EngineMemoryConfig(
                gpu_memory_utilization=0.9,
                activations_outside=True,
                max_len_short_of_pool=1,
                max_model_len=8192,
            ),
        ).max_model_len
        == 8192
    )


def test_tensorrt_llm_starts_with_its_max_seq_len_cut_to_the_pool():
    """Llama-3.1-70B at TP 2 on H100s leaves TensorRT-LLM 1,772 blocks of 32 tokens, short of one 131,072-token
    sequence: it warns and cuts its attention window and max_seq_len to the pool's 56,704 tokens, where vLLM's
    defaults refuse to start."""
    model, h100, par = get_model("llama-3.1-70b"), get_gpu("h100-sxm"), Parallelism(tp=2)
    trtllm = EngineConfig(scheduler="trtllm").with_defaults(h100, 131072, tp=2).memory_config()
    plan = plan_memory(model, h100, par, trtllm)
    assert plan.max_model_len == plan.kv_cache_tokens == 1772 * 32
    vllm = EngineConfig().with_defaults(h100, 131072, tp=2).memory_config()
    with pytest.raises(SpecError, match="max_model_len=131072"):
        plan_memory(model, h100, par, vllm)


@pytest.mark.parametrize("pp,layers", [(2, 9), (4, 5)])
def test_a_hybrid_models_pipeline_stage_sizes_its_block_by_its_largest_group(pp, layers):
    """gpt-oss-120b's 36 layers alternate sliding and full attention: two KV cache groups of 18 (2,048 bytes a
    token a layer at bf16). vLLM sizes each stage's block by the most layers one group has on it: at pp 2 a stage's
    18 layers hold 9 of each; at pp 4 a stage's 9 hold 5 of one kind and 4 of the other, so a block of 16 tokens
    spans 5 layers, not the 4.5 an average gives."""
    plan = plan_memory(get_model("gpt-oss-120b"), get_gpu("h100-sxm"), Parallelism(pp=pp))
    assert plan.block_bytes == 16 * 2048 * layers
    assert plan.num_blocks == int(plan.kv_cache_bytes // (16 * 2048 * layers))


def test_bad_utilization_is_rejected():
    with pytest.raises(SpecError, match="gpu_memory_utilization"):
        plan_memory(LLAMA_8B, get_gpu("h200"), cfg=EngineMemoryConfig(gpu_memory_utilization=1.5))


def test_max_model_len_beyond_the_model_needs_an_explicit_override():
    with pytest.raises(
        SpecError, match="exceeds llama-3.1-8b's 131072 positions: lower it or set engine.allow_long"
    ):
        plan_memory(LLAMA_8B, get_gpu("h200"), cfg=EngineMemoryConfig(max_model_len=200_000))
    plan = plan_memory(
        LLAMA_8B,
        get_gpu("h200"),
        cfg=EngineMemoryConfig(max_model_len=200_000, allow_long_max_model_len=True),
    )
    assert plan.max_model_len == 200_000


def test_the_fullest_pipeline_stage_sets_the_weights_per_gpu():
    """DeepSeek-V2 PP2: the first stage holds the one dense layer and the embedding, the second 30 MoE layers and the
    LM head (bf16), the heavier one."""
    from servesim.hardware.memory import layer_weight_bytes, weight_bytes_per_gpu

    model = get_model("deepseek-v2")
    second = sum(layer_weight_bytes(model, layer, "auto") for layer in model.layers[30:])
    assert not model.tie_embeddings and not model.layers[0].is_moe
    assert weight_bytes_per_gpu(model, Parallelism(pp=2), "auto") == pytest.approx(
        second + model.lm_head_params * 2
    )


def test_mla_down_projections_are_whole_on_every_tp_rank():
    """DeepSeek-V3 TP8: q_a_proj (7168 x 1536) and kv_a_proj_with_mqa (7168 x 576), fp8 as the checkpoint, are
    ReplicatedLinear in vLLM: each rank holds them whole, 7/8 of them beyond an even split, in all 61 layers."""
    from servesim.hardware.memory import weight_bytes_per_gpu

    model = get_model("deepseek-v3")
    kept = 61 * 7168 * (1536 + 576) * 1  # fp8: one byte per weight
    split = weight_bytes_per_gpu(model, Parallelism(tp=1), "auto") / 8
    assert weight_bytes_per_gpu(model, Parallelism(tp=8), "auto") == pytest.approx(split + kept * 7 / 8)


def test_kv_heads_duplicated_beyond_their_count_are_held_whole_by_every_rank():
    """Llama 3.1 70B has 8 KV heads: at TP16 each rank keeps one whole head's K and V projections (8192 x 128 each,
    bf16) where an even split would give it half a head, in all 80 layers: 168 MB more than half of TP8's share."""
    from servesim.hardware.memory import weight_bytes_per_gpu

    model = get_model("llama-3.1-70b")
    extra = 80 * 2 * 8192 * 128 * (1 - 8 / 16) * 2
    assert weight_bytes_per_gpu(model, Parallelism(tp=16), "bf16") == pytest.approx(
        weight_bytes_per_gpu(model, Parallelism(tp=8), "bf16") / 2 + extra
    )


def test_fused_moe_buffers_set_the_activation_peak_of_a_wide_moe():
    """DeepSeek-V3 TP8, 8192 batched tokens: vLLM's fused MoE holds, per token and each of its 8 experts, the
    gate/up output (2 x 2048 / 8) sharing a buffer with the down output (7168, unsplit), beside the activation
    (2048 / 8); with the residual and normed input (2 x 7168) that is the widest point, in bf16."""
    from servesim.hardware.memory import LOGIT_BYTES, activation_bytes

    cfg = EngineMemoryConfig(max_num_batched_tokens=8192, max_num_seqs=256)
    model = get_model("deepseek-v3")
    sampler = 2 * 256 * model.vocab_size * LOGIT_BYTES
    per_token = (2 * 7168 + 8 * (7168 + 256)) * 2
    assert activation_bytes(model, Parallelism(tp=8), cfg) == pytest.approx(8192 * per_token + sampler)


def test_uneven_pipeline_stages_split_as_vllm_does_and_the_fullest_sets_the_kv_per_gpu():
    """vLLM's get_pp_indices: equal shares, the remainder one each to the stages before the last. DeepSeek-V3's 61
    layers at PP2: 31 then 30, so a GPU of the first stage holds 31 layers' latents (576 values, bf16)."""
    from servesim.hardware.memory import kv_bytes_per_replica_token
    from servesim.hardware.model import pipeline_stages

    assert pipeline_stages(61, 2) == (31, 30) and pipeline_stages(61, 4) == (15, 15, 16, 15)
    assert pipeline_stages(62, 4) == (15, 16, 16, 15) and pipeline_stages(32, 4) == (8, 8, 8, 8)
    model = get_model("deepseek-v3")
    assert kv_bytes_per_replica_token(model, "bf16", Parallelism(tp=8, pp=2)) == 31 * 576 * 2
    plan = plan_memory(model, get_gpu("h200"), Parallelism(tp=8, pp=2))
    assert plan.num_blocks > 0
    with pytest.raises(SpecError, match="exceeds the 61 layers"):
        plan_memory(model, get_gpu("h200"), Parallelism(tp=1, pp=62))


@pytest.mark.parametrize("in_flight, blocks", [(1, 2569), (2, 3081)])
def test_a_sliding_window_keeps_blocks_for_every_step_in_flight(in_flight, blocks):
    """gpt-oss-120b at 32K: its full group holds 2048 blocks of 16 tokens; its 128-token sliding group holds
    cdiv(127 + in-flight tokens, 16) + 1: 521 with one 8192-token step in flight, 1033 with two (vLLM's
    max_in_flight_tokens under async scheduling)."""
    cfg = EngineMemoryConfig(max_model_len=32768, max_num_batched_tokens=8192, in_flight_batches=in_flight)
    plan = plan_memory(get_model("gpt-oss-120b"), get_gpu("h100-sxm"), cfg=cfg)
    assert plan.request_bytes_at_max_len / plan.block_bytes == blocks


def test_mla_decode_copies_are_counted_in_a_quantized_checkpoint_only():
    """DeepSeek-V3's fp8 kv_b_proj stays for prefill and its decode up-projections are dequantized bf16 copies
    beside it (512 x 128 x 256 values per layer); a bf16 checkpoint's are views of the same weights."""
    from servesim.hardware.memory import layer_weight_bytes

    model = get_model("deepseek-v3")
    dense = model.layers[0]  # one of the first dense layers: fp8 throughout
    assert not dense.is_moe
    assert layer_weight_bytes(model, dense, "fp8") == model.layer_params(dense) + 512 * 128 * 256 * 2
    assert layer_weight_bytes(model, dense, "bf16") == model.layer_params(dense) * 2


def test_deep_ep_keeps_the_shared_experts_whole_on_every_gpu():
    """Under expert parallel over DP attention (SGLang's DeepEP) each GPU holds DeepSeek-V3's shared expert whole in
    each of its 58 MoE layers: 7/8 of 3 x 7168 x 2048 fp8 weights more than at DP attention alone."""
    from servesim.hardware.memory import weight_bytes_per_gpu

    model = get_model("deepseek-v3")
    dp = weight_bytes_per_gpu(model, Parallelism(tp=8, dp_attention=True), "auto")
    deep_ep = weight_bytes_per_gpu(model, Parallelism(tp=8, ep=True, dp_attention=True), "auto")
    assert deep_ep - dp == pytest.approx(58 * 3 * 7168 * 2048 * (1 - 1 / 8))


def test_sglang_splits_a_sliding_model_s_kv_into_two_pools_by_its_swa_full_tokens_ratio():
    """gpt-oss-120b on an H200 under SGLang (hybrid SWA memory): 18 full and 18 sliding layers, 8 KV heads of 64 in
    bf16, 2048 bytes per layer per token. Each token takes a slot in both pools, the sliding one holding 0.8 of
    the full one's: full tokens = KV memory / (18 x 2048 + 0.8 x 18 x 2048), in whole blocks. A 32K request then
    needs its 32K tokens of the full pool only. vLLM's hybrid manager shares one pool of 16-token blocks of 18
    layers between both groups, where a 32K request holds 2048 full blocks and 521 sliding ones (a window and an
    8192-token step in flight): 32.4 x 32768 / (18 x 16 x 2569) = 1.43x the requests SGLang's pools hold."""
    sglang = EngineMemoryConfig(max_model_len=32768, activations_outside=True, swa_full_tokens_ratio=0.8)
    plan = plan_memory(get_model("gpt-oss-120b"), get_gpu("h200"), cfg=sglang)
    full = int(plan.kv_cache_bytes // (18 * 2048 + 0.8 * 18 * 2048)) // 16 * 16
    assert plan.kv_cache_tokens == full and plan.num_blocks == full // 16 and plan.kv_windows == (None,)
    assert plan.swa_tokens == int(full * 0.8) // 16 * 16 and plan.swa_window == 128
    assert plan.block_bytes == 16 * 18 * 2048 and plan.max_concurrency == pytest.approx(full / 32768)
    vllm = plan_memory(
        get_model("gpt-oss-120b"),
        get_gpu("h200"),
        cfg=EngineMemoryConfig(max_model_len=32768, activations_outside=True),
    )
    assert vllm.swa_window is None and vllm.kv_windows == (None, 128)
    assert vllm.kv_cache_bytes == plan.kv_cache_bytes
    assert vllm.max_concurrency / plan.max_concurrency == pytest.approx(
        32.4 * 32768 / (18 * 16 * 2569), rel=1e-4
    )
    # SGLang's --disable-hybrid-swa-memory: one pool, every layer
    whole = plan_memory(
        get_model("gpt-oss-120b"),
        get_gpu("h200"),
        cfg=EngineMemoryConfig(
            max_model_len=32768,
            activations_outside=True,
            swa_full_tokens_ratio=0.8,
            disable_hybrid_kv_cache_manager=True,
        ),
    )
    assert (
        whole.swa_window is None
        and whole.kv_cache_tokens == int(whole.kv_cache_bytes // (36 * 2048)) // 16 * 16
    )


def test_sglang_refuses_a_sliding_pool_too_small_for_one_request():
    """A sliding pool that cannot hold two chunks (whole prompts when unchunked), three windows and two pages would
    stall a lone request. gpt-oss-20b on an H100 at 32K: the 0.8 pool holds ~1.7M tokens, 0.02 of the full pool
    (~43K) holds two 8192-token chunks but not two 32K prompts."""

    def plan(ratio: float, chunked: bool = True):
        return plan_memory(
            get_model("gpt-oss-20b"),
            get_gpu("h100-sxm"),
            cfg=EngineMemoryConfig(
                max_model_len=32768,
                activations_outside=True,
                swa_full_tokens_ratio=ratio,
                max_num_batched_tokens=8192,
                chunked_prefill=chunked,
            ),
        )

    assert plan(0.02).swa_tokens >= 2 * 8192 + 3 * 128 + 32
    with pytest.raises(SpecError, match="is under 2 chunks of 32768 \\+ 3 windows of 128"):
        plan(0.02, chunked=False)
    with pytest.raises(SpecError, match="swa_full_tokens_ratio"):
        plan(0.005)


def test_sglang_sizes_its_pools_by_the_pipeline_stage_whose_token_costs_most():
    """gpt-oss-120b over 4 stages of 9 layers alternating sliding and full: stages of 5 sliding + 4 full and of 4
    sliding + 5 full. At a 0.8 ratio a token costs 4 + 0.8 x 5 = 8 layers on the first, 5 + 0.8 x 4 = 8.2 on the
    second: the second sets the pools."""
    plan = plan_memory(
        get_model("gpt-oss-120b"),
        get_gpu("h200"),
        Parallelism(pp=4),
        cfg=EngineMemoryConfig(max_model_len=32768, activations_outside=True, swa_full_tokens_ratio=0.8),
    )
    assert plan.kv_cache_tokens == int(plan.kv_cache_bytes // (8.2 * 2048)) // 16 * 16
    assert plan.block_bytes == 16 * 5 * 2048 and plan.swa_token_bytes == 4 * 2048


def test_an_overridden_full_pool_takes_its_sliding_pool_at_the_ratio():
    plan = plan_memory(
        get_model("gpt-oss-20b"),
        get_gpu("h200"),
        cfg=EngineMemoryConfig(max_model_len=32768, activations_outside=True, swa_full_tokens_ratio=0.8),
    )
    assert plan.swa_pool(1) == (128, plan.swa_tokens)
    assert plan.swa_pool(1, ranks=2, num_blocks=1000) == (128, 16000 * 8 // 10 // 2)
