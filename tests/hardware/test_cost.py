"""Roofline cost model: the seed's H200 arithmetic, FLOP accounting, TP, MoE, windows, MLA, fast prefill."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, Parallelism, causal_keys, fast_prefill_layers, step_cost
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model, model_from_config
from servesim.hardware.profile import EfficiencyCurve, Profile

H200 = get_gpu("h200")
LLAMA_8B = get_model("llama-3.1-8b")


def test_h200_8b_single_sequence_matches_the_seed():
    cost = step_cost(StepBatch.uniform(1, 1024), LLAMA_8B, H200)
    assert cost.floor_s == pytest.approx(16e9 / 4.8e12, rel=0.1)  # ~3.3 ms: every weight crosses the bus once
    assert 3.5e-3 <= cost.total_s <= 4.6e-3  # the seed's "~4 ms" with real kernels
    assert cost.bound == "memory"


def test_h200_8b_256_sequences_matches_the_seed():
    cost = step_cost(StepBatch.uniform(256, 1024), LLAMA_8B, H200)
    assert cost.floor_s == pytest.approx(10.5e-3, rel=0.05)  # 16 GB weights + 34 GB KV at 4.8 TB/s
    assert 13e-3 <= cost.total_s <= 20e-3
    kv_read = cost.by_name("attention_decode").bytes
    assert kv_read == pytest.approx(256 * 1025 * 131072, rel=0.01)


def test_floor_is_bytes_over_bandwidth():
    cost = step_cost(StepBatch.uniform(8, 2048), LLAMA_8B, H200)
    assert cost.floor_s == pytest.approx(cost.hbm_bytes / H200.memory_bytes_per_s)
    assert cost.total_s > cost.floor_s


def _mha_model(d: int, heads: int = 8):
    """The seed's accounting model: MHA, non-gated MLP of width 4d (24 d^2 linear FLOPs per token per layer)."""
    return model_from_config(
        {
            "hidden_size": d,
            "num_attention_heads": heads,
            "num_hidden_layers": 1,
            "intermediate_size": 4 * d,
            "vocab_size": 1000,
            "max_position_embeddings": 1 << 20,
            "hidden_act": "gelu",
            "model_type": "gpt",
        },
        "mha",
    )


def test_linear_and_attention_flops_cross_at_six_d():
    d = 512
    model = _mha_model(d)

    def flops(context_keys):
        cost = step_cost(StepBatch.of([1], [context_keys - 1]), model, H200)
        linear = sum(cost.by_name(n).flops for n in ("qkv_proj", "o_proj", "mlp"))
        return linear, cost.by_name("attention_decode").flops

    linear, attn = flops(6 * d)
    assert linear == 24 * d * d
    assert attn == 4 * (6 * d) * d == linear
    assert flops(6 * d - 1)[1] < linear < flops(6 * d + 1)[1]


@given(n=st.integers(1, 300), c=st.integers(0, 300), window=st.one_of(st.none(), st.integers(1, 200)))
def test_causal_keys_matches_brute_force(n, c, window):
    brute = sum(min(c + j + 1, window) if window else c + j + 1 for j in range(n))
    assert causal_keys(np.array([n]), np.array([c]), window)[0] == brute


def test_sliding_window_caps_decode_kv_reads():
    gemma = get_model("gemma-2-9b")  # half its layers slide over 4096 tokens
    long = step_cost(StepBatch.uniform(1, 32000), gemma, H200).by_name("attention_decode").bytes
    short = step_cost(StepBatch.uniform(1, 4095), gemma, H200).by_name("attention_decode").bytes
    per_layer_token = gemma.kv_values_per_token_per_layer() * 2
    # 21 full layers read all 32001 tokens, 21 sliding layers read their 4096-token window
    expected = 21 * per_layer_token * (32001 + 4096)
    assert long == pytest.approx(expected, rel=1e-3)
    assert short == pytest.approx(42 * per_layer_token * 4096, rel=1e-3)


def test_mla_decode_reads_the_latent_and_absorbs():
    v2 = get_model("deepseek-v2")
    cost = step_cost(StepBatch.uniform(1, 4095), v2, H200)
    attn = cost.by_name("attention_decode")
    latent = 576 * 2  # bytes per token per layer
    per_layer = 4096 * latent + 1 * latent + 128 * (576 + 512) * 2  # read cache, write new latent, q in / out
    assert attn.bytes == pytest.approx(per_layer * v2.num_layers)
    # absorbed: each of the 128 heads scores against 576 dims and sums 512-dim latents
    assert attn.flops == pytest.approx(2 * 128 * (576 + 512) * 4096 * v2.num_layers)


def test_mla_prefill_reads_the_latents_and_then_the_k_and_v_expanded_from_them():
    """A 64-token chunk over 32,704 cached tokens (DeepSeek-V3, TP 8, 16 heads a GPU): vLLM gathers each key's
    576-value latent, up-projects it to a 192-wide K and a 128-wide V per head (mla_kv_up writes them), and the
    attention kernel reads those back. Short chunks over long contexts are memory-bound on that read."""
    v3 = get_model("deepseek-v3")
    cost = step_cost(StepBatch.of([64], [32704], [True]), v3, H200, Parallelism(tp=8))
    attn = cost.by_name("attention_prefill")
    keys, heads = 32768, 16
    per_layer = keys * 576 * 2 + 64 * 576 * 2 + 64 * heads * (192 + 128) * 2 + keys * heads * (192 + 128) * 2
    assert attn.bytes == pytest.approx(per_layer * v3.num_layers)


def test_moe_touches_more_experts_as_tokens_grow():
    mixtral = get_model("mixtral-8x7b")
    one = step_cost(StepBatch.uniform(1, 100), mixtral, H200).by_name("moe")
    many = step_cost(StepBatch.uniform(64, 100), mixtral, H200).by_name("moe")
    expert_bytes = mixtral.expert_params() * 2 * 32
    assert one.bytes == pytest.approx(2 * expert_bytes, rel=0.01)  # top-2 of 8
    assert many.bytes == pytest.approx(8 * expert_bytes, rel=0.01)  # 64 tokens touch all 8


def test_lm_head_runs_only_on_logits_tokens():
    chunk = StepBatch.of([512], [0], [False])  # an intermediate prefill chunk samples nothing
    names = [op.name for op in step_cost(chunk, LLAMA_8B, H200).operators]
    assert "lm_head" not in names
    cost = step_cost(StepBatch.of([512, 1], [0, 100], [False, True]), LLAMA_8B, H200)
    assert cost.by_name("lm_head").flops == 2 * LLAMA_8B.lm_head_params


#: Efficiency falling from 0.9 at one token row to 0.1 at 2048: any operator priced at the wrong row count
#: shows up as a factor of up to 9 in its time.
FALLING = Profile(
    gemm_memory=EfficiencyCurve(points=((1, 0.9), (2048, 0.1))),
    attn_memory=EfficiencyCurve(points=((1, 0.9), (2048, 0.1))),
)


def test_lm_head_efficiency_is_read_at_its_logits_rows():
    """The LM head of a prefill step is a GEMV over the logits rows: it costs what a one-token step's does,
    however many tokens the rest of the step has."""
    prefill = step_cost(StepBatch.of([2048], [0], [True]), LLAMA_8B, H200, profile=FALLING)
    decode = step_cost(StepBatch.uniform(1, 100), LLAMA_8B, H200, profile=FALLING)
    assert prefill.by_name("lm_head").time_s == pytest.approx(decode.by_name("lm_head").time_s, rel=1e-3)
    head_bytes = LLAMA_8B.lm_head_params * 2  # bf16 weights dominate; read at 90% of the bandwidth
    assert decode.by_name("lm_head").time_s == pytest.approx(
        head_bytes / (0.9 * H200.memory_bytes_per_s), rel=0.01
    )


def test_fast_prefill_layers_read_efficiencies_at_one_token_per_request():
    """Under YOCO fast prefill the trailing KV-sharing layers process one row per request, so their
    operators are priced at that row count, not at the step's."""
    from servesim.hardware.cost import operator_terms

    model = get_model("gemma-3n-e2b")
    batch = StepBatch.of([1024, 1, 1], [0, 300, 300], [True, True, True])
    terms = operator_terms(
        batch, model, H200, profile=FALLING, options=CostOptions(kv_sharing_fast_prefill=True)
    )
    by_rows = {}
    for term in terms:
        by_rows.setdefault(term.tokens, set()).add(term.name)
    assert set(by_rows) == {1026.0, 3.0}  # the step's tokens; one per request (the LM head: 3 logits rows)
    assert {"qkv_proj", "mlp", "attention_decode", "attention_prefill"} <= by_rows[1026.0]
    assert {"qkv_proj", "mlp", "attention_decode", "lm_head"} <= by_rows[3.0]
    for term in terms:  # every term's memory time is its bytes at that row count's efficiency
        assert term.memory_s == pytest.approx(
            term.bytes / (H200.memory_bytes_per_s * FALLING.gemm_memory.at(term.tokens))
        )


def test_tp2_adds_all_reduce_and_speeds_decode_by_less_than_2x():
    batch = StepBatch.uniform(32, 2048)
    tp1 = step_cost(batch, LLAMA_8B, H200)
    tp2 = step_cost(batch, LLAMA_8B, H200, Parallelism(tp=2))
    assert "all_reduce" not in [op.name for op in tp1.operators]
    assert tp2.by_name("all_reduce").time_s > 0
    assert tp2.by_name("mlp").bytes < tp1.by_name("mlp").bytes / 1.9
    assert 1.0 < tp1.total_s / tp2.total_s < 2.0


def test_gemma_3n_fast_prefill_runs_last_10_layers_on_one_token():
    model = get_model("gemma-3n-e2b")
    assert fast_prefill_layers(model) == 10
    prefill = StepBatch.of([6], [0])
    plain = step_cost(prefill, model, H200)
    fast = step_cost(prefill, model, H200, options=CostOptions(kv_sharing_fast_prefill=True))
    # QKV FLOPs: 20 layers x 6 tokens + 10 layers x 1 token, against 30 x 6
    assert fast.by_name("qkv_proj").flops / plain.by_name("qkv_proj").flops == pytest.approx(130 / 180)
    assert fast.by_name("mlp").flops < plain.by_name("mlp").flops
    decode = StepBatch.uniform(4, 300)
    assert (
        step_cost(decode, model, H200).total_s
        == step_cost(decode, model, H200, options=CostOptions(kv_sharing_fast_prefill=True)).total_s
    )


def test_a_mixed_step_pays_a_second_attention_path_in_every_layer_that_attends_both():
    """Decodes beside a prefill chunk: each layer runs both attention paths; YOCO's fast-prefill layers see one
    query per request, so only the layers before them do."""
    model, profile = get_model("gemma-3n-e2b"), Profile(mixed_layer_overhead_s=1e-4)
    mixed, prefill, decode = (
        StepBatch.of([1, 1, 200], [300, 50, 0]),
        StepBatch.of([200], [0]),
        StepBatch.uniform(2, 300),
    )
    assert mixed.is_mixed() and not prefill.is_mixed() and not decode.is_mixed()
    assert not StepBatch.of([1], [0]).is_mixed() and not StepBatch.of([], []).is_mixed()
    verify = StepBatch.of([3, 3, 200], [300, 50, 0])  # two verify queries of 1 + 2 drafts beside a chunk
    assert not verify.is_mixed() and verify.is_mixed(decode_query_len=3) and not verify.is_mixed(200)

    def extra(batch, fast):
        options = CostOptions(kv_sharing_fast_prefill=fast)
        return (
            step_cost(batch, model, H200, profile=profile, options=options).total_s
            - step_cost(batch, model, H200, options=options).total_s
        )

    assert extra(mixed, False) == pytest.approx(30 * 1e-4)  # Gemma 3n E2B: 30 layers
    assert extra(mixed, True) == pytest.approx(20 * 1e-4)  # its last 10 share KV: fast prefill's layers
    assert extra(prefill, False) == extra(decode, False) == extra(decode, True) == 0.0


def test_a_fast_prefill_step_pays_the_cross_decoder_path_in_its_kv_sharing_layers():
    """With YOCO fast prefill on, a step that prefills runs its KV-sharing layers on their own metadata and the
    decode attention path: `fast_prefill_layer_s` each. An all-decode step runs them as every other layer."""
    model, profile = get_model("gemma-3n-e2b"), Profile(fast_prefill_layer_s=1e-4)
    mixed, prefill, decode = (
        StepBatch.of([1, 1, 200], [300, 50, 0]),
        StepBatch.of([200], [0]),
        StepBatch.uniform(2, 300),
    )

    def extra(batch, fast, **options):
        opts = CostOptions(kv_sharing_fast_prefill=fast, **options)
        return (
            step_cost(batch, model, H200, profile=profile, options=opts).total_s
            - step_cost(batch, model, H200, options=opts).total_s
        )

    assert extra(prefill, True) == pytest.approx(10 * 1e-4)  # Gemma 3n E2B: its last 10 of 30 layers share KV
    assert extra(mixed, True) == pytest.approx(10 * 1e-4)
    assert extra(prefill, False) == extra(mixed, False) == extra(decode, True) == 0.0
    # verify queries of 1 + 2 drafts are decodes when the engine reads them so, prefills when not
    verify = StepBatch.of([3, 3], [300, 50])
    assert extra(verify, True, decode_query_len=3) == 0.0
    assert extra(verify, True) == pytest.approx(10 * 1e-4)
    # a model without KV-sharing layers has none to pay for
    assert (
        step_cost(
            prefill,
            get_model("llama-3.1-8b"),
            H200,
            profile=profile,
            options=CostOptions(kv_sharing_fast_prefill=True),
        ).total_s
        == step_cost(prefill, get_model("llama-3.1-8b"), H200).total_s
    )


def test_every_layer_that_owns_kv_writes_each_token_of_the_step():
    """`kv_write_token_s` per token per KV-owning layer, prefill or decode, fast prefill or not: Gemma 3n E2B's 20
    of 30 layers own KV (its KV-sharing ones skip the write), every one of Llama-3.1-8B's 32."""
    profile = Profile(kv_write_token_s=1e-7)
    for name, kv_layers in (("gemma-3n-e2b", 20), ("llama-3.1-8b", 32)):
        model = get_model(name)
        for batch in (StepBatch.of([1, 1, 200], [300, 50, 0]), StepBatch.uniform(8, 300)):
            for fast in (False, True):
                options = CostOptions(kv_sharing_fast_prefill=fast)
                extra = (
                    step_cost(batch, model, H200, profile=profile, options=options).total_s
                    - step_cost(batch, model, H200, options=options).total_s
                )
                assert extra == pytest.approx(kv_layers * batch.num_tokens * 1e-7), (name, fast)


def test_kv_sharing_layers_write_no_kv():
    model = get_model("gemma-3n-e2b")
    cost = step_cost(StepBatch.of([100], [0]), model, H200)
    prefill = cost.by_name("attention_prefill")
    assert prefill.layers == 30
    per_token_layer = model.kv_values_per_token_per_layer() * 2
    # reads: the 100 new tokens' KV in all 30 layers; writes only in the 20 owning layers
    reads = 30 * 100 * per_token_layer
    writes = 20 * 100 * per_token_layer
    activations = 30 * 100 * model.num_heads * 2 * model.head_dim * 2
    assert prefill.bytes == pytest.approx(reads + writes + activations)


def test_fp8_weights_halve_weight_bytes_and_use_fp8_peak():
    bf16 = step_cost(StepBatch.uniform(1, 10), LLAMA_8B, H200).by_name("mlp")
    fp8 = step_cost(
        StepBatch.uniform(1, 10), LLAMA_8B, H200, options=CostOptions(weight_dtype="fp8")
    ).by_name("mlp")
    assert fp8.bytes < 0.51 * bf16.bytes


def test_profile_efficiency_scales_time():
    fast = Profile(
        gemm_memory=EfficiencyCurve.constant(1.0),
        attn_memory=EfficiencyCurve.constant(1.0),
        step_overhead_s=0,
        request_overhead_s=0,
    )
    cost = step_cost(StepBatch.uniform(1, 1024), LLAMA_8B, H200, profile=fast)
    # at 100% bandwidth a decode runs at the floor
    assert cost.total_s == pytest.approx(cost.floor_s, rel=0.01)


def test_efficiency_curve_interpolates_in_log_tokens():
    curve = EfficiencyCurve(points=((1, 0.2), (100, 0.8)))
    assert curve.at(0.5) == 0.2 and curve.at(1000) == 0.8
    assert curve.at(10) == pytest.approx(0.5)


@given(
    reqs=st.lists(st.tuples(st.integers(1, 400), st.integers(0, 5000)), min_size=1, max_size=150),
    window=st.one_of(st.none(), st.integers(1, 3000)),
    decode=st.booleans(),
    decode_query_len=st.integers(1, 5),
)
def test_small_batch_stats_equal_the_numpy_ones(reqs, window, decode, decode_query_len):
    """Batches up to 64 requests take a plain-Python path for speed; it must count exactly what numpy does."""
    from servesim.hardware.cost import _AttnStats, _paired_stats, causal_keys, kv_read_tokens

    new, ctx = np.array([n for n, _ in reqs]), np.array([c for _, c in reqs])
    mask = new <= decode_query_len if decode else new > decode_query_len
    n, c = new[mask], ctx[mask]
    numpy_stats = _AttnStats(
        int(n.sum()),
        int(mask.sum()),
        int(causal_keys(n, c, window).sum()),
        int(kv_read_tokens(n, c, window).sum()),
        int((n + c).sum()),
    )
    paths = _paired_stats(new.tolist(), ctx.tolist(), window, decode_query_len)
    assert _AttnStats(*paths[0 if decode else 1]) == numpy_stats


def test_routed_experts_take_their_own_efficiencies_and_unset_read_the_gemm_ones():
    """Fused-MoE kernels (routed experts) are priced with moe_compute/moe_memory (by default what published MoE
    runs need: 0.180 and 0.273); unset (None, as executor fits write them) they read the GEMM curves. The router and
    shared experts, dense models too, never read them."""
    mixtral, batch = get_model("mixtral-8x7b"), StepBatch.uniform(1, 0, 4096)
    unset = Profile(moe_compute=None, moe_memory=None)
    base = step_cost(batch, mixtral, H200, profile=unset)
    as_gemm = Profile(moe_compute=Profile().gemm_compute, moe_memory=Profile().gemm_memory)
    assert base.total_s == step_cost(batch, mixtral, H200, profile=as_gemm).total_s
    slow = step_cost(batch, mixtral, H200, profile=Profile(moe_compute=0.35, moe_memory=0.425))
    moe, slow_moe = base.by_name("moe"), slow.by_name("moe")
    assert moe.kind == "moe" and slow_moe.time_s == pytest.approx(2 * moe.time_s, rel=1e-9)  # 0.70 -> 0.35
    others = [(op.name, op.time_s) for op in base.operators if op.name != "moe"]
    assert others == [(op.name, op.time_s) for op in slow.operators if op.name != "moe"]
    default = step_cost(batch, mixtral, H200).by_name("moe")  # compute-bound prefill: 0.70 / 0.180 as long
    assert default.time_s == pytest.approx(moe.time_s * 0.70 / 0.180, rel=1e-9)
    assert (
        step_cost(batch, LLAMA_8B, H200, profile=Profile(moe_compute=0.1)).total_s
        == step_cost(batch, LLAMA_8B, H200).total_s
    )


def test_mla_verify_queries_take_the_absorbed_decode_path_when_speculating():
    """DeepSeek-V3 TP8, 32 verify queries of 1 + 1 draft over 4096 cached tokens. With decode_query_len 2 (vLLM's
    reorder_batch_threshold under MTP, FlashMLA) they attend over the latent, and the K/V up-projection runs on the
    64 query rows only: 2 x 64 x (512 x 128 heads x (128 + 128) / 8) FLOPs in each of the 61 layers. As prefill
    chunks they would expand all 32 x 4098 latents to K/V."""
    model, par = get_model("deepseek-v3"), Parallelism(tp=8)
    verify = StepBatch.of([2] * 32, [4096] * 32)
    spec = step_cost(verify, model, H200, par, options=CostOptions(decode_query_len=2))
    assert spec.by_name("mla_kv_up").flops == 2 * 64 * (512 * 128 * 256 // 8) * 61
    assert spec.by_name("attention_decode").layers == 61
    assert "attention_prefill" not in {op.name for op in spec.operators}
    chunks = step_cost(verify, model, H200, par)
    assert chunks.by_name("mla_kv_up").flops == 2 * 32 * 4098 * (512 * 128 * 256 // 8) * 61
    assert spec.total_s < 0.8 * chunks.total_s


def test_a_speculating_scenario_prices_verify_queries_as_decodes():
    from servesim.simulator.world.replicas import build_timer
    from servesim.simulator.scenario import load_scenario

    s, _ = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "speculative_70b.yaml")
    assert build_timer(s).options.decode_query_len == 1 + s.engine.speculative.k
    assert (
        build_timer(
            s.model_copy(update={"engine": s.engine.model_copy(update={"speculative": None})})
        ).options.decode_query_len
        == 1
    )


def test_bridged_pcie_cards_all_reduce_over_pcie_beyond_a_pair():
    """H100 PCIe: a 2-card NVLink bridge (300 GB/s) joins pairs only, so a TP4 ring crosses PCIe Gen5 (64 GB/s)."""
    model, batch, gpu = get_model("llama-3.1-70b"), StepBatch.of([4096], [0]), get_gpu("h100-pcie")

    def all_reduce_s(spec, tp):
        return step_cost(batch, model, spec, Parallelism(tp=tp)).by_name("all_reduce").time_s

    over_pcie = gpu.model_copy(update={"intra_node_link": "pcie5"})
    assert all_reduce_s(gpu, 4) == all_reduce_s(over_pcie, 4)
    assert all_reduce_s(gpu, 2) < all_reduce_s(over_pcie, 2) / 4  # the pair itself is bridged


def test_tp_sums_the_vocab_parallel_embedding_and_gathers_the_logits():
    """Llama-3.1-8B TP2, 256 decodes: the embedding all-reduce moves the step's hidden states (256 x 4096 bf16) once;
    the LM head's vocab slices (256 x 128256 / 2 bf16 each) are gathered to the sampling rank: half of 256 x 128256
    x 2 bytes crosses its link. Neither exists at TP1."""
    model, batch = get_model("llama-3.1-8b"), StepBatch.uniform(256, 1000)
    tp2, tp1 = step_cost(batch, model, H200, Parallelism(tp=2)), step_cost(batch, model, H200)
    assert tp2.by_name("embedding_all_reduce").bytes == 256 * 4096 * 2
    assert tp2.by_name("logits_gather").bytes == 256 * 128256 * 2 / 2
    assert tp2.by_name("logits_gather").time_s > 0
    assert not {"embedding_all_reduce", "logits_gather"} & {op.name for op in tp1.operators}


def test_mla_decode_streams_the_bf16_copies_of_the_up_projection():
    """vLLM and SGLang absorb MLA's K/V up-projection in decode as bf16 batched GEMMs over bf16 copies of kv_b_proj
    (dequantized from DeepSeek-V3's fp8), while prefill expands the latents with kv_b_proj itself. At TP8 a decode
    streams 512 x 128 x 256 / 8 bf16 values per layer, whatever the checkpoint; a prefill streams them at fp8."""
    model, par, up = get_model("deepseek-v3"), Parallelism(tp=8), 512 * 128 * 256 // 8
    decode, prefill = StepBatch.uniform(1, 4096), StepBatch.uniform(1, 0, 512)
    for weights in ("fp8", "bf16"):
        step = step_cost(decode, model, H200, par, options=CostOptions(weight_dtype=weights)).by_name(
            "mla_kv_up"
        )
        # weights, then the one query row
        assert step.bytes == pytest.approx(61 * (up * 2 + 1 * up / 512 * 2))
    fp8 = step_cost(prefill, model, H200, par, options=CostOptions(weight_dtype="fp8")).by_name("mla_kv_up")
    assert fp8.bytes == pytest.approx(61 * (up * 1 + 512 * up / 512 * 2))


def test_deep_ep_runs_the_shared_experts_whole_on_each_gpus_own_tokens():
    """SGLang builds DeepSeek's shared experts at tp_size 1 under DeepEP (expert parallel over DP attention): each of
    the 8 GPUs streams the whole shared expert (3 x 7168 x 2048 fp8 weights) in each of the 58 MoE layers, and runs
    it on its own 1/8 of the tokens: the same FLOPs per GPU as TP, 8x the bytes."""
    model, batch = get_model("deepseek-v3"), StepBatch.uniform(64, 2048)
    shared = 3 * 7168 * 2048
    tp = step_cost(batch, model, H200, Parallelism(tp=8, dp_attention=True)).by_name("moe_router_shared")
    deep_ep = step_cost(batch, model, H200, Parallelism(tp=8, ep=True, dp_attention=True)).by_name(
        "moe_router_shared"
    )
    assert deep_ep.bytes - tp.bytes == pytest.approx(58 * shared * (1 - 1 / 8))
    assert deep_ep.flops == pytest.approx(tp.flops)


def test_a_true_or_false_in_a_profile_is_refused_not_read_as_full_efficiency(tmp_path):
    """`gemm_compute: true` would otherwise be the number 1: a GEMM at 100% of peak."""
    from servesim.hardware.errors import SpecError
    from servesim.hardware.profile import load_profile

    path = tmp_path / "p.yaml"
    path.write_text("name: p\ngemm_compute: true\n")
    with pytest.raises(SpecError, match=r"p.yaml: gemm_compute: .*expected a number, not a true/false"):
        load_profile(str(path))


def test_a_context_at_other_tokens_differs_in_its_tokens_alone():
    import dataclasses

    from servesim.hardware.cost import _context

    batch = StepBatch.of([512, 1, 1], [0, 300, 700])
    ctx = _context(
        batch, get_model("llama-3.1-8b"), get_gpu("h100-sxm"), Parallelism(), Profile(), CostOptions()
    )
    assert ctx.with_tokens(96) == dataclasses.replace(ctx, tokens=96.0)
    assert ctx.with_tokens(ctx.tokens) is ctx
