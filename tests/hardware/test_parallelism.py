"""Parallelism beyond plain TP: expert parallel MoE, DP attention for MLA, multi-node TP, pipeline stages."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, Parallelism, fast_prefill_layers, stage_seconds, step_cost
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu, get_interconnect
from servesim.hardware.memory import EngineMemoryConfig, plan_memory, weight_bytes_per_gpu
from servesim.hardware.model import get_model, stage_layer_specs
from servesim.hardware.profile import EfficiencyCurve, Profile
from servesim.hardware.step_timer import StepTimer

H100, H200 = get_gpu("h100-sxm"), get_gpu("h200")


def test_expert_parallel_sends_tokens_all_to_all_only_under_dp_attention():
    """vLLM's EP at DP size 1 has every token on every GPU: each runs its own experts and the all-reduce sums
    them, as TP does. Under DP attention each GPU keeps its 1/8 of the tokens and, in a decode step, sends each
    to its top-2 experts (DeepEP's low-latency dispatch, fp8 with a 4-byte scale per 128 values) and back
    (combine, bf16) instead of both all-reduces."""
    mixtral, batch = get_model("mixtral-8x7b"), StepBatch.uniform(64, 1000)
    tp = step_cost(batch, mixtral, H100, Parallelism(tp=8))
    ep = step_cost(batch, mixtral, H100, Parallelism(tp=8, ep=True))
    assert "all_to_all" not in [op.name for op in tp.operators + ep.operators]
    assert ep.by_name("all_reduce").bytes == tp.by_name("all_reduce").bytes == 32 * 2 * 64 * 4096 * 2
    assert ep.by_name("moe").flops == tp.by_name("moe").flops  # the same work, spread by expert
    dp_ep = step_cost(batch, mixtral, H100, Parallelism(tp=8, ep=True, dp_attention=True))
    tokens = 64 / 8 * 4096 * 2  # each GPU's 8 tokens x hidden x top-2
    assert dp_ep.by_name("all_to_all").bytes == pytest.approx(32 * (tokens * (1 + 4 / 128) + tokens * 2))
    assert "all_reduce" not in [op.name for op in dp_ep.operators]  # every mixtral layer is MoE
    assert dp_ep.by_name("moe").flops == tp.by_name("moe").flops


def _routed_ranks(moe, ranks: int, tokens: int = 20000, seed: int = 0) -> float:
    """Monte Carlo of DeepSeek-V3's router (noaux_tc) on random scores: groups ranked by their two best experts'
    sum, the best `groups_per_token` kept, the top k experts among them; distinct ranks reached per token."""
    scores = np.random.default_rng(seed).random((tokens, moe.num_experts))
    grouped = scores.reshape(tokens, moe.num_groups, -1)
    group_score = np.sort(grouped, axis=2)[:, :, -2:].sum(axis=2)
    dropped = np.argsort(group_score, axis=1)[:, : moe.num_groups - moe.groups_per_token]
    np.put_along_axis(grouped, dropped[:, :, None], -1.0, axis=1)
    experts = np.argsort(grouped.reshape(tokens, -1), axis=1)[:, -moe.experts_per_token :]
    rank = np.sort(experts // (moe.num_experts // ranks), axis=1)
    return float((1 + (np.diff(rank, axis=1) > 0).sum(axis=1)).mean())


def test_a_prefill_sends_each_token_once_to_each_rank_holding_its_experts():
    """DeepSeek-V3 under DP attention: a token's 8 experts come from its best 4 of 8 groups of 32. At EP8 a rank
    holds one group, so DeepEP's normal dispatch (a prefill step) sends a token to exactly the 4 chosen ranks,
    not 8 copies; at EP4 a rank holds two groups and is reached unless both are left out: 4 x (1 - C(6,4)/C(8,4)).
    At EP16 and for DeepSeek-V2 (6 experts from 3 groups) the count is checked against the router itself on
    random scores. The experts are FP8, so the dispatch is too (DeepGEMM); the combine comes back in bf16."""
    v3, v2 = get_model("deepseek-v3").moe, get_model("deepseek-v2").moe
    assert v3.ranks_per_token(8) == pytest.approx(4.0)
    assert v3.ranks_per_token(4) == pytest.approx(4 * (1 - math.comb(6, 4) / math.comb(8, 4)))
    for moe, ranks in ((v3, 4), (v3, 8), (v3, 16), (v3, 32), (v2, 8), (v2, 16)):
        assert moe.ranks_per_token(ranks) == pytest.approx(_routed_ranks(moe, ranks), rel=0.03), (moe, ranks)
    ungrouped = dataclasses.replace(v3, num_groups=1, groups_per_token=1)
    assert ungrouped.ranks_per_token(8) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    prefill = StepBatch.uniform(8, 0, new_tokens=1024)  # one prompt per rank
    cost = step_cost(prefill, get_model("deepseek-v3"), H200, Parallelism(tp=8, ep=True, dp_attention=True))
    local = 8192 / 8 * 7168  # each GPU's tokens x hidden
    # 58 MoE layers
    assert cost.by_name("all_to_all").bytes == pytest.approx(58 * local * 4 * (1 + 4 / 128 + 2))


def test_decode_and_verify_steps_send_a_token_to_each_of_its_experts():
    """DeepEP's low-latency kernels (SGLang's auto mode outside prefill, speculative verify included) send each
    token to each of its 8 experts in fp8 and take the results back in bf16: 256 verify queries of 1 + 3 tokens
    move 8 copies of each token, where a prefill of as many tokens moves 4."""
    v3, par = get_model("deepseek-v3"), Parallelism(tp=8, ep=True, dp_attention=True)
    verify = StepBatch.uniform(256, 2000, new_tokens=4)
    cost = step_cost(verify, v3, H200, par, options=CostOptions(decode_query_len=4))
    local = 1024 / 8 * 7168
    assert cost.by_name("all_to_all").bytes == pytest.approx(58 * local * 8 * (1 + 4 / 128 + 2))
    as_prefill = step_cost(verify, v3, H200, par).by_name("all_to_all")  # the same queries as prefill chunks
    assert as_prefill.bytes == pytest.approx(cost.by_name("all_to_all").bytes / 2)


def test_deepep_refuses_experts_that_do_not_divide_over_the_ranks():
    v3 = get_model("deepseek-v3")
    with pytest.raises(SpecError, match="256 experts to divide over the 6 ranks"):
        step_cost(StepBatch.uniform(6, 100), v3, H200, Parallelism(tp=6, ep=True, dp_attention=True))


def test_dp_attention_projects_each_gpus_share_of_the_tokens_with_whole_weights():
    """Each GPU holds the whole attention weights but projects only its 1/8 of the requests' tokens: the same
    FLOPs per GPU as TP, and in a decode 8x the O projection's weight bytes (FP8: 16384 x 7168 per layer)."""
    v3, decode = get_model("deepseek-v3"), StepBatch.uniform(64, 1000)
    tp = step_cost(decode, v3, H200, Parallelism(tp=8)).by_name("o_proj")
    dp = step_cost(decode, v3, H200, Parallelism(tp=8, dp_attention=True)).by_name("o_proj")
    assert dp.flops == pytest.approx(tp.flops)  # 1/8 of the rows x 8 times the weights
    weights = 61 * 16384 * 7168  # bytes at one byte per FP8 weight
    assert tp.bytes == pytest.approx(weights / 8 + 61 * 64 * 2 * 7168 * 2)
    assert dp.bytes == pytest.approx(weights + 61 * 8 * 2 * 7168 * 2)


def test_dp_attention_stores_each_mla_latent_once_per_group():
    v3 = get_model("deepseek-v3")
    cfg = EngineMemoryConfig(max_model_len=32768, weight_dtype="fp8")  # DeepSeek-V3 ships in FP8
    duplicated = plan_memory(v3, H200, Parallelism(tp=8), cfg)
    dp = plan_memory(v3, H200, Parallelism(tp=8, dp_attention=True), cfg)
    # TP keeps the whole 576-value latent on all 8 GPUs; DP attention keeps each token's latent on one GPU
    assert duplicated.kv_bytes_per_token == 576 * 2 * 61
    assert dp.kv_bytes_per_token == pytest.approx(576 * 2 * 61 / 8)
    assert dp.weight_bytes > duplicated.weight_bytes  # attention weights replicated
    assert dp.kv_cache_tokens > 7 * duplicated.kv_cache_tokens * dp.kv_cache_bytes / duplicated.kv_cache_bytes
    decode = StepBatch.uniform(64, 4000)
    tp_attn = step_cost(decode, v3, H200, Parallelism(tp=8)).by_name("attention_decode")
    dp_attn = step_cost(decode, v3, H200, Parallelism(tp=8, dp_attention=True)).by_name("attention_decode")
    assert 7 < tp_attn.bytes / dp_attn.bytes < 8  # each GPU reads only its requests' KV (activations stay)


VLLM_DP = Parallelism(tp=8, ep=True, dp_attention=True, dense_replicated=True)  # vLLM: --data-parallel-size 8


def test_vllm_dp_ranks_hold_every_weight_but_the_routed_experts_whole():
    """vLLM's data-parallel ranks are engines at TP 1: a GPU holds the whole model but 7/8 of the routed experts.
    SGLang's DP attention slices over the group the embeddings and LM head (bf16, 129280 x 7168 each), the three
    dense MLP layers (3 x 7168 x 18432 each), the 58 routers (7168 x 256) and every layer's two norms (stored at
    one byte here, like the rest of a fp8 layer)."""
    v3 = get_model("deepseek-v3")
    routed = 58 * 256 * 3 * 7168 * 2048  # fp8: one byte each
    whole = weight_bytes_per_gpu(v3, Parallelism(), "fp8")
    assert weight_bytes_per_gpu(v3, VLLM_DP, "fp8") == pytest.approx(whole - routed * 7 / 8)
    sglang = weight_bytes_per_gpu(v3, Parallelism(tp=8, ep=True, dp_attention=True), "fp8")
    sliced = 2 * 129280 * 7168 * 2 + 3 * 3 * 7168 * 18432 + 58 * 7168 * 256 + 61 * 2 * 7168
    assert weight_bytes_per_gpu(v3, VLLM_DP, "fp8") - sglang == pytest.approx(sliced * 7 / 8)
    llama = get_model("llama-3.1-8b")  # a dense model's DP ranks are whole replicas
    assert weight_bytes_per_gpu(
        llama, Parallelism(tp=4, dp_attention=True, dense_replicated=True), "auto"
    ) == weight_bytes_per_gpu(llama, Parallelism(), "auto")
    with pytest.raises(SpecError, match="needs dp_attention"):
        Parallelism(tp=8, dense_replicated=True)


def test_a_dense_models_vllm_dp_ranks_each_run_a_tp1_step_on_their_share():
    """Four DP ranks of Llama-3.1-8B stepping 4 x 16 requests: every GPU runs what a TP-1 engine runs on 16 of them
    (same FLOPs and bytes per operator, the same host work per request, its kernels as efficient as at their own
    sizes), and nothing crosses between GPUs."""
    llama = get_model("llama-3.1-8b")
    # efficiencies that depend on the rows
    rising = EfficiencyCurve(points=((1, 0.2), (64, 0.5), (4096, 0.9)))
    profile = Profile(
        request_overhead_s=1e-4,
        token_overhead_s=1e-5,
        host_request_s=2e-5,
        gemm_compute=rising,
        gemm_memory=rising,
        attn_compute=rising,
        attn_memory=rising,
    )
    group = step_cost(
        StepBatch.uniform(64, 3000),
        llama,
        H100,
        Parallelism(tp=4, dp_attention=True, dense_replicated=True),
        profile,
    )
    alone = step_cost(StepBatch.uniform(16, 3000), llama, H100, Parallelism(), profile)
    assert [op.name for op in group.operators] == [op.name for op in alone.operators]
    for ours, theirs in zip(group.operators, alone.operators):
        assert (ours.flops, ours.bytes) == pytest.approx((theirs.flops, theirs.bytes)), ours.name
    assert group.total_s == pytest.approx(alone.total_s)
    stages = stage_seconds(
        StepBatch.uniform(64, 3000),
        llama,
        H100,
        Parallelism(tp=4, pp=2, dp_attention=True, dense_replicated=True),
        profile,
    )
    assert stages == pytest.approx(
        stage_seconds(StepBatch.uniform(16, 3000), llama, H100, Parallelism(pp=2), profile)
    )


def test_vllm_dp_ranks_talk_only_in_the_moe_layers():
    """On vLLM's DP ranks the dense MLP and the LM head run whole on each GPU's 1/8 of the tokens (the same FLOPs
    as sliced, 8x the weight bytes); no all-reduce, embedding sum or logits gather is left. The MoE layers send
    DeepEP's dispatch/combine with ep, and without it gather the group's tokens and reduce-scatter the outputs
    (vLLM's allgather_reducescatter backend): one all-reduce's bytes of the group's tokens per MoE layer."""
    v3, decode = get_model("deepseek-v3"), StepBatch.uniform(64, 1000)
    options = CostOptions(weight_dtype="fp8")
    sglang = step_cost(decode, v3, H200, Parallelism(tp=8, ep=True, dp_attention=True), options=options)
    vllm = step_cost(decode, v3, H200, VLLM_DP, options=options)
    assert vllm.by_name("mlp").flops == pytest.approx(sglang.by_name("mlp").flops)
    assert vllm.by_name("mlp").bytes == pytest.approx(3 * (3 * 7168 * 18432 + 8 * (2 * 7168 + 3 * 18432) * 2))
    assert vllm.by_name("lm_head").bytes == pytest.approx(129280 * 7168 * 2 + 8 * 129280 * 4)
    assert vllm.by_name("all_to_all").bytes == sglang.by_name("all_to_all").bytes
    names = {op.name for op in vllm.operators}
    assert not names & {"all_reduce", "embedding_all_reduce", "logits_gather"}
    no_ep = step_cost(decode, v3, H200, dataclasses.replace(VLLM_DP, ep=False), options=options)
    gathered, scattered = 64 * (7168 + 256) * 2, 64 * 7168 * 2  # hidden states and router logits; outputs
    assert no_ep.by_name("all_gather_reduce_scatter").bytes == 58 * (gathered + scattered)
    assert no_ep.by_name("all_gather_reduce_scatter").layers == 58


def test_tp_across_nodes_uses_the_inter_node_link():
    llama = get_model("llama-3.1-405b")
    # big prefill messages: bandwidth, not latency, dominates
    batch = StepBatch.uniform(8, 0, new_tokens=2000)
    in_node = step_cost(batch, llama, H100, Parallelism(tp=8)).by_name("all_reduce")
    across = step_cost(batch, llama, H100, Parallelism(tp=16)).by_name("all_reduce")
    nvlink, ib = get_interconnect("nvlink4"), get_interconnect("ib-ndr-400")
    assert across.time_s / in_node.time_s > 0.8 * nvlink.bytes_per_s / ib.bytes_per_s


def test_pipeline_stages_add_up_with_their_sends():
    llama = get_model("llama-3.1-70b")
    batch = StepBatch.uniform(16, 1000)
    one = step_cost(batch, llama, H100, Parallelism(tp=4))
    two = step_cost(batch, llama, H100, Parallelism(tp=4, pp=2))
    assert two.by_name("pp_send").time_s > 0
    assert two.total_s == pytest.approx(one.total_s + two.by_name("pp_send").time_s, rel=1e-9)
    # 16 tokens x 8192 x 2 bytes of hidden states and as much residual, a quarter from each TP rank
    assert two.by_name("pp_send").bytes == 2 * 16 * 8192 * 2 / 4


def test_a_step_splits_over_uneven_pipeline_stages_by_their_layers_with_the_embedding_first_and_lm_head_last():
    """Llama 3.1 70B's 80 layers at PP3 are 27, 27, 26 (vLLM's get_pp_indices), all alike. Each stage runs its
    layers; the first also embeds and pays the engine core's host time, the last computes the logits, each of
    the two boundaries' sends is paid by the stage before it. Every stage's worker prepares its own inputs, so
    the per-step, per-request and per-token overheads repeat on each stage, and the layer overhead is per layer."""
    llama, batch = get_model("llama-3.1-70b"), StepBatch.of([1] * 31 + [512], [900] * 31 + [0])
    profile = Profile(
        step_overhead_s=3e-4,
        layer_overhead_s=2e-5,
        request_overhead_s=2e-6,
        token_overhead_s=1e-7,
        host_step_s=1e-3,
        host_request_s=5e-6,
    )
    par = Parallelism(tp=4, pp=3)
    cost, timer = step_cost(batch, llama, H100, par, profile), StepTimer(llama, H100, par, profile)
    first, second, third = timer.stage_s(batch)
    embed = cost.by_name("embedding").time_s + cost.by_name("embedding_all_reduce").time_s
    head = cost.by_name("lm_head").time_s + cost.by_name("logits_gather").time_s
    send = cost.by_name("pp_send").time_s
    model_level = {"embedding", "embedding_all_reduce", "lm_head", "logits_gather", "pp_send", "overhead"}
    per_layer = sum(op.time_s for op in cost.operators if op.name not in model_level) / 80 + 2e-5
    every_stage = 3e-4 + 32 * 2e-6 + 543 * 1e-7
    host = 1e-3 + 32 * 5e-6
    assert first == pytest.approx(27 * per_layer + every_stage + send / 2 + embed + host, rel=1e-12)
    assert second == pytest.approx(27 * per_layer + every_stage + send / 2, rel=1e-12)
    assert third == pytest.approx(26 * per_layer + every_stage + head, rel=1e-12)
    assert first + second + third == pytest.approx(cost.total_s + 2 * every_stage, rel=1e-12)
    extra = 0.003  # a swap's PCIe time, say: each stage moves its layers' share of the blocks
    assert [b - a for a, b in zip((first, second, third), timer.stage_s(batch, extra))] == pytest.approx(
        [27 / 80 * extra, 27 / 80 * extra, 26 / 80 * extra], rel=1e-9
    )


def test_each_stage_runs_its_own_kinds_of_layers():
    """DeepSeek-V3's first 3 layers are dense, the other 58 MoE: at PP4 (15, 15, 16, 15 layers) the first stage
    holds the 3 dense ones, the others only MoE layers. Gemma 3n E4B's last 15 of 35 layers share KV: at PP2
    (18, 17) they all sit in the second stage, so YOCO fast prefill lightens that stage alone."""
    v3, par = get_model("deepseek-v3"), Parallelism(tp=8, pp=4)
    decode = StepBatch.uniform(64, 2000)
    stages, cost = stage_seconds(decode, v3, H200, par), step_cost(decode, v3, H200, par)
    # stages 1 and 3 both run 15 MoE layers: they differ by the send stage 1 pays and the logits stage 3 computes
    assert stages[1] - stages[3] == pytest.approx(
        cost.by_name("pp_send").time_s / 3
        - cost.by_name("lm_head").time_s
        - cost.by_name("logits_gather").time_s,
        rel=1e-9,
    )
    # 12 MoE + 3 dense layers are lighter than 15 MoE layers, the embedding aside
    assert stages[0] < stages[1]
    gemma, prefill = get_model("gemma-3n-e4b"), StepBatch.uniform(1, 0, new_tokens=8192)
    plain = stage_seconds(prefill, gemma, H100, Parallelism(pp=2))
    fast = stage_seconds(
        prefill, gemma, H100, Parallelism(pp=2), options=CostOptions(kv_sharing_fast_prefill=True)
    )
    assert fast[0] == pytest.approx(plain[0], rel=1e-12) and fast[1] < 0.5 * plain[1]
    # the cross-decoder's fixed cost falls on the stage that holds the KV-sharing layers
    paid = stage_seconds(
        prefill,
        gemma,
        H100,
        Parallelism(pp=2),
        Profile(fast_prefill_layer_s=1e-3),
        options=CostOptions(kv_sharing_fast_prefill=True),
    )
    assert paid[0] == fast[0] and paid[1] == pytest.approx(fast[1] + fast_prefill_layers(gemma) * 1e-3)
    # each stage writes the KV of the layers it holds that own theirs
    written = stage_seconds(prefill, gemma, H100, Parallelism(pp=2), Profile(kv_write_token_s=1e-9))
    owning = [sum(layer.owns_kv for layer in stage) for stage in stage_layer_specs(gemma, 2)]
    assert owning == [18, 2]  # the KV-sharing layers are the last 15
    assert written == pytest.approx([p + n * 8192 * 1e-9 for p, n in zip(plain, owning)])


#: vLLM's custom all-reduce on 8x H100 SXM, microseconds per call (sgl-project/sglang PR #2904, "custom
#: allreduce" table): message bytes -> (TP 2, TP 4, TP 8).
MEASURED_ALL_REDUCE_US = {
    32768: (4.5, 4.8, 7.8),
    262144: (7.9, 13.9, 16.7),
    524288: (12.5, 20.2, 22.1),
    1048576: (19.9, 31.1, 33.8),
}


@pytest.mark.parametrize("nbytes", sorted(MEASURED_ALL_REDUCE_US))
def test_all_reduce_time_matches_measured_small_collectives_on_h100(nbytes):
    """Decode-sized all-reduces cost a few microseconds plus bus bytes at ~13% of NVLink's rate; the old ring
    model (2(TP-1) latencies) put a 32 KB all-reduce at 70 us on TP 8."""
    llama = get_model("llama-3.1-70b")  # hidden 8192: one token's activations are 16 KB
    tokens = nbytes // (llama.hidden_size * 2)
    for tp, measured_us in zip((2, 4, 8), MEASURED_ALL_REDUCE_US[nbytes]):
        cost = step_cost(StepBatch.uniform(tokens, 100), llama, H100, Parallelism(tp=tp))
        per_call_us = cost.by_name("all_reduce").time_s / (2 * llama.num_layers) * 1e6
        assert per_call_us == pytest.approx(measured_us, rel=0.3), (tp, nbytes)


def test_llama_70b_on_four_h200_decodes_in_the_seeds_10_ms():
    """The seed's speculative-decoding table: a 70B target on 4 GPUs takes ~10 ms per step at batch 1."""
    cost = step_cost(
        StepBatch.uniform(1, 1024), get_model("llama-3.1-70b"), get_gpu("h200"), Parallelism(tp=4)
    )
    assert 9e-3 <= cost.total_s <= 11e-3
    assert cost.by_name("all_reduce").time_s < 0.1 * cost.total_s  # 160 small all-reduces of ~5 us


def test_small_collectives_pay_one_latency_in_a_node_and_one_per_ring_step_across_nodes():
    llama = get_model("llama-3.1-405b")
    decode = StepBatch.uniform(1, 100)
    nvlink, ib = get_interconnect("nvlink4"), get_interconnect("ib-ndr-400")
    for tp, link, steps in ((8, nvlink, 1), (16, ib, 2 * 15)):
        per_call = step_cost(decode, llama, H100, Parallelism(tp=tp)).by_name("all_reduce").time_s / (2 * 126)
        bus_bytes = 2 * (tp - 1) / tp * llama.hidden_size * 2  # one token's activations, ring bus bytes
        # default comm efficiency x small-collective factor
        wire = bus_bytes / (link.bytes_per_s * 0.70 * 0.19)
        assert per_call == pytest.approx(steps * link.latency_s + wire, rel=1e-9)


def test_a_lone_prompt_under_dp_attention_runs_whole_on_one_gpu():
    """A DP-attention rank attends for its own requests whole: an 8,192-token prompt alone in the step runs its
    attention and projections on one GPU, as a TP-1 engine would (the same FLOPs), not an eighth of it on each;
    eight 1,024-token prompts, one per rank, cost each GPU what one of them costs a TP-1 engine."""
    v3, tp1, dp8 = get_model("deepseek-v3"), Parallelism(), Parallelism(tp=8, ep=True, dp_attention=True)
    lone = StepBatch.uniform(1, 0, new_tokens=8192)
    for name in ("attention_prefill", "qkv_proj", "o_proj", "mla_kv_up"):
        assert step_cost(lone, v3, H200, dp8).by_name(name).flops == pytest.approx(
            step_cost(lone, v3, H200, tp1).by_name(name).flops
        ), name
    spread, one = StepBatch.uniform(8, 0, new_tokens=1024), StepBatch.uniform(1, 0, new_tokens=1024)
    assert step_cost(spread, v3, H200, dp8).by_name("attention_prefill").flops == pytest.approx(
        step_cost(one, v3, H200, tp1).by_name("attention_prefill").flops
    )
    assert step_cost(lone, v3, H200, dp8).total_s > 1.5 * step_cost(spread, v3, H200, dp8).total_s


def test_the_busiest_rank_holds_the_largest_request_and_its_share_of_the_rest():
    """Dealt round-robin largest first: nine decodes on eight ranks put the longest context and the shortest on
    one rank; a prefill chunk goes before every decode, whatever their contexts."""
    decodes = StepBatch.of([1] * 9, [900, 100, 500, 800, 300, 700, 200, 600, 400])
    rank = decodes.busiest_rank(8)
    assert sorted(rank.num_context.tolist()) == [100, 900]
    mixed = StepBatch.of([1, 1, 512, 1], [5000, 4000, 0, 3000], [True, True, False, True])
    rank = mixed.busiest_rank(2)
    assert (rank.num_new.tolist(), rank.num_context.tolist(), rank.needs_logits.tolist()) == (
        [512, 1],
        [0, 4000],
        [False, True],
    )
    assert mixed.busiest_rank(1) is mixed


@given(
    st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), min_size=1, max_size=40),
    st.integers(1, 16),
)
def test_the_busiest_rank_is_at_least_as_loaded_as_a_balanced_share_and_the_largest_request(requests, ranks):
    batch = StepBatch.of([n for n, _ in requests], [c for _, c in requests])
    rank = batch.busiest_rank(ranks)
    assert rank.num_requests == -(-batch.num_requests // ranks)
    assert rank.num_tokens >= max(batch.num_tokens / ranks, batch.max_query_len)
    assert set(zip(rank.num_new.tolist(), rank.num_context.tolist())) <= set(requests)


def _labelled(num_new: list[int], num_context: list[int], rank: list[int]) -> StepBatch:
    return StepBatch(np.array(num_new), np.array(num_context), np.ones(len(num_new), bool), np.array(rank))


@pytest.mark.parametrize(
    "par",
    [
        Parallelism(tp=8, ep=True, dp_attention=True),
        Parallelism(tp=4, pp=2, ep=True, dp_attention=True, dense_replicated=True),
    ],
)
def test_a_step_of_labelled_ranks_lasts_as_long_as_its_slowest_rank(par):
    """The simulator's ranks label each request with the rank it lives on: the step is priced with each rank's
    requests on the attention side and lasts as long as the slowest of them, wherever that one is. The timer,
    step_cost and the stage split agree on it."""
    v3 = get_model("deepseek-v3")
    batch = _labelled([1] * 4 + [2048] + [1], [8000] * 4 + [0] + [100], [0] * 4 + [1] + [2])
    per_rank = [step_cost(batch, v3, H200, par, rank=rank).total_s for rank in batch.by_rank()]
    assert len(set(per_rank)) == 3
    assert step_cost(batch, v3, H200, par).total_s == max(per_rank)
    timer = StepTimer(v3, H200, par)
    assert timer(batch) == max(per_rank)
    assert timer.stage_s(batch) == stage_seconds(batch, v3, H200, par)
    relabelled = _labelled(batch.num_new.tolist(), batch.num_context.tolist(), [3] * 4 + [0] + [5])
    assert timer(relabelled) == timer(batch)  # which GPU it is does not matter


@pytest.mark.parametrize(
    "par,name",
    [
        (Parallelism(tp=8, ep=True, dp_attention=True), "all_to_all"),
        (Parallelism(tp=4, pp=2, ep=True, dp_attention=True, dense_replicated=True), "pp_send"),
    ],
)
def test_the_fullest_rank_bounds_the_exchange_whichever_rank_attends_longest(par, name):
    """Four 30K-context decodes on one rank, a 1,024-token chunk on another: the ranks wait for each other at
    every MoE layer's all-to-all (and, on vLLM's ranks, at a stage boundary), so the chunk's 1,024 tokens bound
    the exchange even when the decodes' rank sets the attention side."""
    v3 = get_model("deepseek-v3")
    batch = _labelled([1] * 4 + [1024], [30000] * 4 + [0], [0] * 4 + [1])
    sent = {step_cost(batch, v3, H200, par, rank=rank).by_name(name).bytes for rank in batch.by_rank()}
    chunk_alone = step_cost(_labelled([1024], [0], [1]), v3, H200, par).by_name(name).bytes
    assert sent == {chunk_alone}
    assert StepTimer(v3, H200, par)(batch) == step_cost(batch, v3, H200, par).total_s


def test_requests_piled_on_one_rank_cost_more_than_the_same_requests_spread():
    """Eight 4K-context decodes on one of eight ranks: that GPU attends for all of them, as it would in an engine
    whose balancer sent them there; one per rank, each attends for one. Unlabelled, the cost model deals them
    evenly. A lone prompt costs the same labelled or dealt: its rank is the step's."""
    v3, dp8 = get_model("deepseek-v3"), Parallelism(tp=8, ep=True, dp_attention=True)
    timer = StepTimer(v3, H200, dp8)
    piled, spread = _labelled([1] * 8, [4096] * 8, [0] * 8), _labelled([1] * 8, [4096] * 8, list(range(8)))
    dealt = StepBatch.of([1] * 8, [4096] * 8)
    assert timer(spread) == timer(dealt)
    assert attention_of(piled, v3, dp8) == pytest.approx(8 * attention_of(spread, v3, dp8), rel=1e-9)
    assert timer(piled) > timer(spread)
    lone = _labelled([6000], [0], [5])
    assert timer(lone) == timer(StepBatch.of([6000], [0]))


def test_only_a_rank_attending_decodes_beside_a_prefill_runs_both_attention_paths():
    """The mixed-batch overhead is the attending GPU's: a prompt on one rank and a decode on another run one path
    each; on one rank, that rank runs both."""
    v3, dp8 = get_model("deepseek-v3"), Parallelism(tp=8, ep=True, dp_attention=True)
    profile = Profile(mixed_layer_overhead_s=1e-3)
    apart, together = _labelled([512, 1], [0, 4000], [0, 1]), _labelled([512, 1], [0, 4000], [0, 0])
    overhead = [step_cost(b, v3, H200, dp8, profile).by_name("overhead").time_s for b in (apart, together)]
    plain = step_cost(apart, v3, H200, dp8, Profile()).by_name("overhead").time_s
    assert overhead[0] == pytest.approx(plain)
    assert overhead[1] == pytest.approx(
        step_cost(together, v3, H200, dp8, Profile()).by_name("overhead").time_s + 1e-3 * v3.num_layers
    )
    timer = StepTimer(v3, H200, dp8, profile)
    assert [timer(b) for b in (apart, together)] == [
        step_cost(b, v3, H200, dp8, profile).total_s for b in (apart, together)
    ]


def attention_of(batch: StepBatch, model, par: Parallelism) -> float:
    return step_cost(batch, model, H200, par).by_name("attention_decode").flops


def test_dp_attention_decode_stretches_cost_what_their_steps_do():
    """A fused decode stretch picks the busiest rank once: every context grows by one a step, so it holds the same
    requests throughout, and each step of the stretch costs bit-for-bit what stepping it costs."""
    timer = StepTimer(get_model("deepseek-v3"), H200, Parallelism(tp=8, ep=True, dp_attention=True))
    contexts = np.array([4000, 120, 9000, 30, 2500, 700, 60, 8000, 1500, 3300, 5])
    fused = timer.decode_stretch_s(contexts, 40)
    stepped = [timer(StepBatch.of(np.ones(len(contexts), np.int64), contexts + step)) for step in range(40)]
    assert fused.tolist() == stepped


def test_vllm_dp_ranks_send_and_sample_what_their_own_requests_need():
    """A lone 4,096-token prompt on Llama-3.1-8B's vLLM DP ranks over two stages: its rank sends the prompt's whole
    hidden states and residual (2 x 4096 x 4096 bf16) to the next stage. Its LM head runs on the rank with the most
    logits rows: a 512-token chunk short of its end and a decode on one rank, two decodes on the other, so 2."""
    llama, dp = get_model("llama-3.1-8b"), Parallelism(tp=4, pp=2, dp_attention=True, dense_replicated=True)
    lone = step_cost(StepBatch.uniform(1, 0, new_tokens=4096), llama, H100, dp)
    assert lone.by_name("pp_send").bytes == pytest.approx(2 * 4096 * 4096 * 2)
    mixed = StepBatch.of([512, 1, 1, 1], [0, 900, 800, 700], [False, True, True, True])
    head = step_cost(mixed, llama, H100, Parallelism(tp=2, dp_attention=True, dense_replicated=True)).by_name(
        "lm_head"
    )
    assert head.flops == pytest.approx(2 * 2 * 128256 * 4096)


def test_the_step_timer_keys_mla_steps_by_their_verify_tokens():
    """With MTP verify queries (decode path up to 3 tokens), two MLA steps of the same tokens, requests and prompt
    latents but differently split decode queries run the absorbed up-projection on different rows: the timer's
    cache tells them apart and matches step_cost."""
    v3, options = get_model("deepseek-v3"), CostOptions(decode_query_len=3)
    timer = StepTimer(v3, H200, Parallelism(tp=8), Profile(), options)
    first, second = StepBatch.of([4, 2], [3, 5]), StepBatch.of([5, 1], [2, 2])
    for batch in (first, second):
        assert (
            timer.fixed_s(batch) == step_cost(batch, v3, H200, Parallelism(tp=8), Profile(), options).fixed_s
        )


@pytest.mark.parametrize(
    "par",
    [
        Parallelism(tp=8),
        Parallelism(tp=8, ep=True, dp_attention=True),
        Parallelism(tp=8, dp_attention=True, dense_replicated=True),
    ],
)
@pytest.mark.parametrize("decode_query_len", [1, 3])
def test_a_decode_steps_cache_key_is_the_one_its_batch_has(par, decode_query_len):
    """The timer looks decode steps up without building their batch: the key it derives (the busiest DP rank holds
    ceil(n / tp) of them) must be the batch's own, or every fused stretch would miss the cache."""
    timer = StepTimer(
        get_model("deepseek-v3"), H200, par, Profile(), CostOptions(decode_query_len=decode_query_len)
    )
    for n in (1, 3, 8, 9, 17, 64):
        batch = StepBatch.of(np.ones(n, np.int64), np.arange(n) * 100)
        assert timer._decode_shape(n) == timer._rank_key(
            timer._step_shape(batch), *par.rank_batches(batch)
        ), n


def test_each_pipeline_stage_lasts_as_long_as_its_slowest_dp_rank_there():
    """DeepSeek-V3 over 2 stages of 4 vLLM DP ranks: a 384-token chunk on rank 0 and 16 decodes over 11K contexts
    on rank 1. The chunk's rank is the slower in the first stage (its 3 dense layers run the rank's tokens through
    whole weights), the decodes' in the second (their attention), by 0.1-0.3% (the experts' all-to-all and the
    rest are the group's): each stage waits for its own slowest rank, so the split is the stage-wise maximum, not
    the stages of the rank slowest over the whole step."""
    v3 = get_model("deepseek-v3")
    par = Parallelism(tp=4, pp=2, ep=True, dp_attention=True, dense_replicated=True)
    batch = _labelled([384] + [1] * 16, [0] + [11000] * 16, [0] + [1] * 16)
    chunk, decodes = (stage_seconds(batch, v3, H200, par, rank=rank) for rank in batch.by_rank())
    assert chunk[0] > decodes[0] and decodes[1] > chunk[1]
    assert stage_seconds(batch, v3, H200, par) == [chunk[0], decodes[1]]
    assert StepTimer(v3, H200, par).stage_s(batch) == [chunk[0], decodes[1]]
