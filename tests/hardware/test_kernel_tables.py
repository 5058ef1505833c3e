"""Measured-kernel step costs: lookups return the tables' own latencies, shard as the engines do, and agree with an
independent interpolation of the raw tables; stepping and fast-forwarding stay bit-identical."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, Parallelism, step_cost
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.kernel_tables import SYSTEMS, Grid, _bracket, data_root, kernel_tables
from servesim.hardware.model import get_model
from servesim.hardware.profile import Profile, load_profile
from servesim.hardware.step_timer import StepTimer
from servesim.policies.families import family_of
from tests.hardware.test_step_timer import stepped_shrinking_stretch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from table_sums import TableSums, cases, vllm_table  # noqa: E402  (the independent oracle the benchmark prints)

MEASURED = load_profile("measured")


def _table(gpu: str, family: str, name: str) -> pd.DataFrame:
    return vllm_table(gpu, family, name)


def test_a_grid_point_is_the_tables_own_latency():
    tables = kernel_tables("vllm", "h100-sxm")
    gemm = _table("h100-sxm", "gemm", "gemm_perf.parquet")
    row = gemm[(gemm.gemm_dtype == "bfloat16") & (gemm.m == 64) & (gemm.n == 6144) & (gemm.k == 4096)].iloc[0]
    assert tables.gemm_s("bf16", 64, 6144, 4096) == pytest.approx(row.latency * 1e-3, rel=1e-12)
    attention = _table("h100-sxm", "attention", "generation_attention_perf.parquet")
    row = attention[
        (attention.batch_size == 64)
        & (attention.step == 1023)
        & (attention.num_heads == 32)
        & (attention.num_key_value_heads == 8)
        & (attention.head_dim == 128)
        & (attention.window_size == 0)
        & (attention.kv_cache_dtype == "bfloat16")
    ].iloc[0]
    # the decode table's KV length is its prompt (1) plus the steps before
    assert tables.attention_s(True, "bf16", 32, 8, 128, None, 64, 1024) == pytest.approx(
        row.latency * 1e-3, rel=1e-12
    )
    comm = _table("h100-sxm", "comm", "custom_allreduce_perf.parquet")
    row = comm[(comm.num_gpus == 4) & (comm.message_size == 65536) & (comm.backend == "vllm_graph")].iloc[0]
    # its message_size counts bf16 elements: 64K of them are 128 KiB
    assert tables.all_reduce_s(4, 2 * 65536) == pytest.approx(row.latency * 1e-3, rel=1e-12)


def test_off_grid_shapes_lie_between_their_neighbours_and_split_past_the_grid():
    tables = kernel_tables("vllm", "h100-sxm")
    low, high = tables.gemm_s("bf16", 1024, 4096, 12288), tables.gemm_s("bf16", 1024, 4096, 16384)
    assert low < tables.gemm_s("bf16", 1024, 4096, 14336) < high
    # 128,256 columns are past the largest measured (65,536): two halves, one after the other
    assert tables.gemm_s("bf16", 8, 128256, 4096) == pytest.approx(2 * tables.gemm_s("bf16", 8, 64128, 4096))
    # 256 decodes at 8K tokens were not measured; 32 at a time were
    assert tables.attention_s(True, "bf16", 32, 8, 128, None, 256, 8193) == pytest.approx(
        8 * tables.attention_s(True, "bf16", 32, 8, 128, None, 32, 8193)
    )
    assert tables.attention_s(True, "bf16", 32, 8, 128, None, 4, 200_000) is None  # longer than any measured
    assert tables.attention_s(True, "int4", 32, 8, 128, None, 4, 2000) is None  # a KV dtype the tables lack
    assert tables.gemm_s("mxfp4", 8, 4096, 4096) is None


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "b300", "gb200", "gb300"])
def test_measured_steps_are_the_tables_per_layer_sums(gpu):
    """The issue's check: Llama-3.1-8B and 70B at TP 1, 2, 4, decodes at batch 1/64/256 over 1K/8K and a 4K-token
    prefill, each priced within 5% of the tables' op latencies summed by hand (lookup and sharding)."""
    sums = TableSums(gpu)
    for model, tp, (batch, context, new), step in cases(gpu):
        cost = step_cost(step, model, get_gpu(gpu), Parallelism(tp=tp), MEASURED)
        kernels = [
            op
            for op in cost.operators
            if op.name not in ("embedding", "logits_gather", "elementwise", "overhead")
        ]
        assert all(op.bound == "measured" for op in kernels), (model.name, tp, batch, context)
        expected = sums.step_s(model, tp, batch, context, new)
        assert sum(op.time_s for op in kernels) == pytest.approx(expected, rel=0.05), (model.name, tp, batch)


def test_a_short_chunk_over_a_long_cached_context_reads_all_of_it():
    """Llama-3.1-8B on an H100: 16 prompt tokens over 60,000 cached ones read 60,016 tokens' KV (4 KiB a token a
    layer, 7.9 GB in all), which the attention table's equivalent fresh prefill (~350 tokens: the same FLOPs) does
    not: the layer takes at least its bytes at full HBM bandwidth. A 4K prompt with nothing cached keeps the
    table's time. The step timer's fast path prices both the same to the bit."""
    model, h100 = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    timer = StepTimer(model, h100, Parallelism(), MEASURED)
    chunk = StepBatch.of(np.array([16]), np.array([60_000]))
    cost = step_cost(chunk, model, h100, Parallelism(), MEASURED)
    attention = cost.by_name("attention_prefill")
    # per layer: 60,016 tokens' KV read and 16 written (4 KiB each), 16 tokens' queries and outputs (32 heads x 256)
    read = 32 * ((60_016 + 16) * 4096 + 16 * 32 * 256 * 2)
    assert attention.bound == "measured"
    assert attention.time_s == pytest.approx(read / h100.memory_bytes_per_s, rel=1e-9)  # all 32 layers
    assert timer(chunk) == cost.total_s
    fresh = StepBatch.of(np.array([4096]), np.array([0]))
    prompt = step_cost(fresh, model, h100, Parallelism(), MEASURED).by_name("attention_prefill")
    assert prompt.time_s > prompt.bytes / h100.memory_bytes_per_s


def test_without_tables_an_operator_keeps_its_roofline():
    model, h100 = get_model("deepseek-v2"), get_gpu("h100-sxm")
    step = StepBatch.of(np.ones(8, int), np.full(8, 500))
    measured = step_cost(step, model, h100, Parallelism(tp=2), MEASURED)
    default = step_cost(step, model, h100, Parallelism(tp=2))
    for name in ("attention_decode", "moe"):  # MLA and routed experts are not in the looked-up tables
        assert measured.by_name(name).bound != "measured"
        assert measured.by_name(name).time_s == default.by_name(name).time_s
    mi300x = step_cost(step, get_model("llama-3.1-8b"), get_gpu("mi300x"), Parallelism(), MEASURED)
    assert not any(op.bound.startswith("measured") for op in mi300x.operators)  # no tables for that GPU


def test_engine_tables_follow_the_scheduler(tmp_path):
    def tables(scheduler: str, profile: Profile = MEASURED) -> Profile:
        return profile.for_engine(family_of(scheduler).kernel_tables)

    assert tables("sglang").kernels == "sglang"
    assert tables("orca").kernels == "vllm"  # schedulers imitating no engine run vLLM's
    assert tables("sglang", Profile(kernels="engine@0.5.14")).kernels == "sglang@0.5.14"
    model, h100 = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    step = StepBatch.of(np.ones(32, int), np.full(32, 2000))
    vllm, sglang = (
        step_cost(step, model, h100, Parallelism(), tables(s)).total_s for s in ("vllm", "sglang")
    )
    assert vllm != sglang  # each engine's own kernels
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nkernels: tensorrt\n")
    with pytest.raises(
        SpecError, match=r"bad.yaml: kernels: 'tensorrt'.*allowed: engine, vllm, sglang, trtllm"
    ):
        load_profile(bad)


def test_a_pinned_build_reads_that_builds_tables():
    old = kernel_tables("vllm@0.22.0", "b200").attention_s(True, "bf16", 32, 8, 128, None, 16, 2048)
    new = kernel_tables("vllm", "b200").attention_s(True, "bf16", 32, 8, 128, None, 16, 2048)
    assert old is not None and new is not None and old != new
    with pytest.raises(
        SpecError,
        match=r"kernels 'vllm@9.9': no vllm 9.9 tables for b200; builds there: 0.19.0, "
        r"0.22.0, 0.24.0",
    ):
        kernel_tables("vllm@9.9", "b200")


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["llama-3.1-8b", "gemma-2-9b", "qwen3-32b"]),
    contexts=st.lists(st.integers(0, 20000), min_size=1, max_size=300),
    steps=st.integers(1, 40),
    tp=st.sampled_from([1, 2]),
)
def test_decode_stretch_equals_stepping_with_measured_kernels(name, contexts, steps, tp):
    model, h100, par = get_model(name), get_gpu("h100-sxm"), Parallelism(tp=tp)
    timer = StepTimer(model, h100, par, MEASURED)
    c = np.array(contexts)
    stepped = [
        step_cost(StepBatch.of(np.ones(len(c), int), c + i), model, h100, par, MEASURED).total_s
        for i in range(steps)
    ]
    assert timer.decode_stretch_s(c, steps).tolist() == stepped
    # requests leaving as the stretch goes: each step priced with the tables at its own batch size
    finish = np.arange(len(c)) % (steps + 1)
    finish[0] = steps
    stepped = stepped_shrinking_stretch(c, finish, steps, model, h100, par, MEASURED)
    assert timer.shrinking_stretch_s(c, finish, steps).tolist() == stepped


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 5),
    holes=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), max_size=3),
    x=st.one_of(st.sampled_from([0.0, 1.0, 2.0, 4.0, 8.0]), st.floats(0.1, 20.0)),
    ys=st.lists(st.one_of(st.sampled_from([-1.0, 0.0, 1.0, 3.0, 9.0, 27.0, 81.0]), st.floats(0.01, 200.0))),
    seed=st.integers(0, 100),
)
def test_a_grids_lookups_along_an_axis_are_its_point_lookups(rows, cols, holes, x, ys, seed):
    """On and between grid points, below (held) and above (None) either axis, next to unmeasured points (NaN) and
    on one-point axes: every value the same to the bit as `at`, looked up in Python (short lists) or numpy."""
    log_t = np.random.default_rng(seed).normal(-9.0, 2.0, (rows, cols))
    for i, j in holes:
        log_t[i % rows, j % cols] = np.nan
    grid = Grid([2.0 ** np.arange(rows), 3.0 ** np.arange(cols)], log_t)
    expected = [grid.at(x, y) for y in ys]
    assert grid.at2_along(x, ys) == expected
    first = _bracket(grid.log_axes[0], x)
    if first is not None:  # both ways, whatever the list's length picks
        assert grid._along_numpy(first, ys) == grid._along_python(first, ys) == expected


@pytest.mark.parametrize("batch", [1, 3, 64, 200, 512])
def test_lookups_along_a_stretch_are_the_one_by_one_lookups(batch):
    """Lengths on and between the grid's, past it (split into pieces, or None) and below it: the same seconds."""
    table = kernel_tables("vllm", "h100-sxm").attention(True, "bf16", 32, 8, 128, None)
    lengths = [0.5, 1.0, 100.0, 1000.0, 1024.0, 1500.25, 8193.0, 30000.0, 200_000.0]
    assert table.seconds_along(batch, lengths) == [table.seconds(batch, n) for n in lengths]
    assert None in table.seconds_along(batch, lengths) and table.seconds_along(batch, []) == []


@pytest.mark.parametrize("framework", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("gpu", sorted(SYSTEMS))
def test_every_gpu_and_engines_tables_answer(gpu, framework):
    """Older builds' tables lack columns (no sliding-window or graph/eager split): they still load and answer."""
    tables = kernel_tables(framework, gpu)
    assert 0 < tables.gemm_s("bf16", 64, 6144, 4096) < 1e-3
    assert 0 < tables.attention_s(True, "bf16", 32, 8, 128, None, 64, 1024) < 1e-2
    assert 0 < tables.attention_s(False, "bf16", 32, 8, 128, None, 1, 2048) < 1e-2
    assert 0 < tables.all_reduce_s(2, 65536) < 1e-3


def test_elementwise_kernels_move_the_hidden_states_and_wait_their_launch():
    """Llama-3.1-8B, 64 decodes on one H100: per layer two fused residual add + RMSNorm (4 x 4,096 values each), the
    rotary embedding over the 6,144 projected values (in and out) and SiLU-and-mul (3 x 14,336), in bf16, at the
    GEMM streaming efficiency, plus 3 us for each of the 4 kernels. The defaults leave them out."""
    model, h100 = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    step = StepBatch.of(np.ones(64, int), np.full(64, 1000))
    op = step_cost(step, model, h100, Parallelism(), MEASURED).by_name("elementwise")
    nbytes = 64 * 2 * (2 * 4 * 4096 + 2 * 6144 + 3 * 14336)
    assert op.bytes == pytest.approx(32 * nbytes)
    assert op.time_s == pytest.approx(32 * (nbytes / (3.35e12 * 0.85) + 4 * 3e-6))
    assert "elementwise" not in {o.name for o in step_cost(step, model, h100, Parallelism()).operators}


def test_without_the_package_the_profile_says_how_to_install_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    kernel_tables.cache_clear()
    try:
        with pytest.raises(
            SpecError, match=r'need the aiconfigurator-core package: pip install -e "\.\[kernels\]"'
        ):
            step_cost(
                StepBatch.of(np.ones(2, int), np.full(2, 100)),
                get_model("llama-3.1-8b"),
                get_gpu("h100-sxm"),
                Parallelism(),
                MEASURED,
            )
    finally:
        kernel_tables.cache_clear()


def test_a_gemm_far_slower_than_one_of_more_rows_is_priced_as_that_one():
    """A GEMM of m rows can run padded as one of more rows, so a point more than RISING_TOLERANCE above the least
    measured past it on m is lowered to that; neighbours' noise and unmeasured points stay as they are."""
    micro = np.array([[[20.0, np.nan, 21.0, 10.5, 10.0, 30.0]]])  # m = 1, 2, 4, 8, 16, 32
    grid = Grid(
        [np.array([1024.0]), np.array([4096.0]), np.array([1, 2, 4, 8, 16, 32.0])], np.log(micro * 1e-6)
    )
    lowered = np.exp(grid.rising().log_t[0, 0]) * 1e6
    assert lowered[[0, 2]] == pytest.approx([10.0, 10.0])  # 2x the 16-row GEMM's time: a dispatch, not a cost
    assert np.isnan(lowered[1]) and lowered[3:] == pytest.approx([10.5, 10.0, 30.0])  # 5% above: noise, kept


def test_b200_fp8_gemms_of_fewer_than_eight_rows_cost_no_more_than_eight():
    """The vLLM tables' B200 FP8 GEMMs of 1-7 rows take about twice eight rows' time; InferenceMAX's B200 runs at
    4 clients decode FP8 Llama 3.3 70B about as fast as NVFP4 (7.75 against 7.49 ms at TP 4), so the lookup does
    not."""
    tables = kernel_tables("vllm", "b200")
    gemm = pd.read_parquet(tables._path("gemm", "gemm_perf.parquet"))
    fp8 = gemm[gemm.gemm_dtype == "fp8"].groupby(["n", "k", "m"])["latency"].mean()
    n, k = 2560, 8192  # Llama-70B's QKV projection at TP 4
    assert fp8[(n, k, 4)] > 1.5 * fp8[(n, k, 8)]  # the anomaly, as measured
    assert tables.gemm_s("fp8", 4, n, k) == pytest.approx(fp8[(n, k)].loc[4:].min() * 1e-3, rel=1e-9)
    assert tables.gemm_s("fp8", 8, n, k) == pytest.approx(fp8[(n, k, 8)] * 1e-3, rel=1e-9)


def test_b200_all_reduces_of_a_quarter_megabyte_cost_no_more_than_a_megabyte():
    """vLLM's 8-GPU custom all-reduce on B200 measured 26 us at 128K and 256K bf16 values but 17 us at 512K: the
    smaller messages are priced as the larger one (a decode of 16 requests at TP 8 all-reduces 128K values)."""
    tables = kernel_tables("vllm", "b200")
    comm = pd.read_parquet(tables._path("comm", "custom_allreduce_perf.parquet"))
    graph = comm[(comm.num_gpus == 8) & (comm.backend == "vllm_graph")].set_index("message_size")["latency"]
    assert graph[131072] > 1.4 * graph[524288]
    assert tables.all_reduce_s(8, 2 * 131072) == pytest.approx(graph.loc[131072:].min() * 1e-3, rel=1e-9)
    assert tables.all_reduce_s(8, 2 * 65536) == pytest.approx(graph[65536] * 1e-3, rel=1e-9)  # as measured


def test_nvfp4_gemms_are_measured_on_blackwell_only():
    # a quarter of the weight bytes to stream
    assert (
        0
        < kernel_tables("vllm", "b200").gemm_s("nvfp4", 64, 6144, 4096)
        < kernel_tables("vllm", "b200").gemm_s("bf16", 64, 6144, 4096)
    )
    # roofline (dequantized) there
    assert kernel_tables("vllm", "h100-sxm").gemm_s("nvfp4", 64, 6144, 4096) is None


@pytest.mark.parametrize(
    "engine,dtype,stand_in,gpu,shape",
    [
        ("trtllm", "nvfp4", "vllm", "b200", (4, 8192, 8192)),
        ("trtllm", "nvfp4", "vllm", "gb300", (4, 8192, 8192)),
        ("vllm", "fp8_block", "sglang", "h200", (64, 2048, 2048)),
        ("vllm", "fp8_block", "sglang", "b200", (64, 2048, 2048)),
    ],
)
def test_gemm_rows_not_timed_as_served_take_another_engines(engine, dtype, stand_in, gpu, shape):
    """TensorRT-LLM's NVFP4 rows time its autotuner's fallback tactic (~21 us for 4 rows on the B200, however
    narrow) and vLLM's block-FP8 rows carry 60-180 us of the collector's host work a call: those GEMMs take the
    rows another engine's table timed of the same kernels, while the engine's other dtypes keep its own."""
    own, other = kernel_tables(engine, gpu), kernel_tables(stand_in, gpu)
    m, n, k = shape
    collected = _latency_ms(own, "gemm", "gemm_perf.parquet", gemm_dtype=dtype, m=m, n=n, k=k)
    served = _latency_ms(other, "gemm", "gemm_perf.parquet", gemm_dtype=dtype, m=m, n=n, k=k)
    assert collected > 1.5 * served
    assert own.gemm_s(dtype, m, n, k) == pytest.approx(served * 1e-3, rel=1e-9)
    assert own.gemm_s(dtype, 1000, 6000, 5000) == other.gemm_s(dtype, 1000, 6000, 5000)
    bf16 = _latency_ms(own, "gemm", "gemm_perf.parquet", gemm_dtype="bfloat16", m=m, n=n, k=k)
    assert own.gemm_s("bf16", m, n, k) == pytest.approx(bf16 * 1e-3, rel=1e-9)


def test_the_breakdown_names_the_engine_whose_table_stands_in():
    """Llama-3.1-70B's NVFP4 projections under TensorRT-LLM on a B200 are priced from vLLM's table, and the
    breakdown says so; its bf16 LM head and its all-reduces keep TensorRT-LLM's own, as vLLM's NVFP4 GEMMs do."""
    step, model, b200 = (
        StepBatch.of(np.ones(4, int), np.full(4, 1024)),
        get_model("llama-3.1-70b"),
        get_gpu("b200"),
    )
    options = CostOptions(weight_dtype="nvfp4")

    def bounds(engine: str) -> dict[str, str]:
        cost = step_cost(step, model, b200, Parallelism(tp=2), MEASURED.for_engine(engine), options)
        return {op.name: op.bound for op in cost.operators}

    trtllm, vllm = bounds("trtllm"), bounds("vllm")
    assert {trtllm[name] for name in ("qkv_proj", "o_proj", "mlp")} == {"measured (vllm)"}
    assert trtllm["lm_head"] == trtllm["all_reduce"] == "measured"
    assert {vllm[name] for name in ("qkv_proj", "o_proj", "mlp", "lm_head")} == {"measured"}


def test_block_fp8_gemms_without_a_stand_in_keep_the_roofline():
    """The L40S's vLLM block-FP8 rows (Triton, 300-350 us a call) have no SGLang table to stand in: the roofline."""
    assert kernel_tables("vllm", "l40s").gemm_s("fp8_block", 64, 2048, 2048) is None
    assert kernel_tables("vllm", "l40s").gemm_s("fp8", 64, 2048, 2048) is not None


def gpt_oss_20b_experts(frame: pd.DataFrame, dtype: str) -> pd.Series:
    """A fused-MoE table's rows of gpt-oss-20b's experts (32 of width 2,880, top 4) on one GPU at 64 tokens, evenly
    routed."""
    return (
        (frame.moe_dtype == dtype)
        & (frame.hidden_size == 2880)
        & (frame.inter_size == 2880)
        & (frame.num_experts == 32)
        & (frame.topk == 4)
        & (frame.moe_tp_size == 1)
        & (frame.moe_ep_size == 1)
        & (frame.num_tokens == 64)
        & (frame.distribution == "balanced")
    )


def test_tensorrt_llm_feeds_mxfp4_experts_mxfp8_activations_on_blackwell():
    """gpt-oss-20b's experts (64 tokens, 32 of width 2,880, top 4) in TensorRT-LLM's B200 tables: at compute
    capability 10.x the W4A8 MXFP4 x MXFP8 row, elsewhere the W4A16 one, and vLLM's stay W4A16. The newest
    TensorRT-LLM build (1.3.0rc23) measured no gpt-oss experts: the lookup takes 1.3.0rc20's."""
    folder = data_root() / SYSTEMS["b200"] / "moe" / "trtllm"
    assert not (pd.read_parquet(folder / "1.3.0rc23" / "moe_perf.parquet").hidden_size == 2880).any()
    frame = pd.read_parquet(folder / "1.3.0rc20" / "moe_perf.parquet")
    w4a8, w4a16 = (
        frame[gpt_oss_20b_experts(frame, d)].latency.iloc[0] * 1e-3
        for d in ("w4a8_mxfp4_mxfp8", "w4a16_mxfp4")
    )
    trtllm = kernel_tables("trtllm", "b200")
    experts = ("mxfp4", 64, 2880, 2880, 4, 32, 1, 1)
    assert get_gpu("b200").datacenter_blackwell and not get_gpu("h200").datacenter_blackwell
    assert trtllm.moe_s(*experts, blackwell=True) == pytest.approx(w4a8, rel=1e-12)
    assert trtllm.moe_s(*experts, blackwell=False) == pytest.approx(w4a16, rel=1e-12)
    assert trtllm.moe_s(*experts) == pytest.approx(w4a16, rel=1e-12)
    vllm = kernel_tables("vllm", "b200")
    assert vllm.moe_s(*experts, blackwell=True) == vllm.moe_s(*experts, blackwell=False)
    # the measured profile prices them so under TensorRT-LLM on a B200 (its 24 MoE layers), and keeps the fitted
    # numbers under vLLM there and under TensorRT-LLM on an H200
    step, model = StepBatch.of(np.ones(64, int), np.full(64, 1000)), get_model("gpt-oss-20b")

    def moe(engine: str, gpu: str):
        return step_cost(step, model, get_gpu(gpu), Parallelism(), MEASURED.for_engine(engine)).by_name("moe")

    assert moe("trtllm", "b200").bound == "measured"
    assert moe("trtllm", "b200").time_s == pytest.approx(24 * w4a8, rel=1e-12)
    assert moe("vllm", "b200").bound != "measured" and moe("trtllm", "h200").bound != "measured"


def test_routed_experts_are_the_fused_moe_tables_latency_where_a_profile_asks():
    """With `kernel_ops` naming moe, gpt-oss-20b's 24 MoE layers at 64 decodes on one H100: the mxfp4 (W4A16) fused-MoE row of 64 tokens, 32
    experts of width 2,880, top 4, balanced routing; DeepSeek-V3's block-fp8 checkpoint looks up block-scaled
    kernels, and a model shape the tables were not collected for keeps the routed-expert roofline."""
    frame = vllm_table("h100-sxm", "moe", "moe_perf.parquet")
    row = frame[gpt_oss_20b_experts(frame, "w4a16_mxfp4")]
    step = StepBatch.of(np.ones(64, int), np.full(64, 1000))
    with_moe = MEASURED.model_copy(update={"kernel_ops": ("gemm", "attention", "all_reduce", "moe")})
    moe = step_cost(step, get_model("gpt-oss-20b"), get_gpu("h100-sxm"), Parallelism(), with_moe).by_name(
        "moe"
    )
    assert moe.bound == "measured" and moe.time_s == pytest.approx(24 * row.latency.iloc[0] * 1e-3, rel=1e-12)
    tables, deepseek = kernel_tables("vllm", "h200"), get_model("deepseek-v3")
    assert deepseek.block_quantized and not get_model("qwen3-30b-a3b").block_quantized
    assert tables.moe_s("fp8_block", 64, 7168, 2048, 8, 256, 8, 1) != tables.moe_s(
        "fp8", 64, 7168, 2048, 8, 256, 8, 1
    )
    assert tables.moe_s("bf16", 64, 7168, 2048, 8, 100, 8, 1) is None  # no such model collected
    v3 = step_cost(step, deepseek, get_gpu("h200"), Parallelism(tp=8), with_moe)
    # its 58 MoE layers
    assert v3.by_name("moe").time_s == pytest.approx(
        58 * tables.moe_s("fp8_block", 64, 7168, 2048, 8, 256, 8, 1), rel=1e-12
    )
    # the bundled profile leaves routed experts to their fitted efficiencies
    assert (
        step_cost(step, deepseek, get_gpu("h200"), Parallelism(tp=8), MEASURED).by_name("moe").bound
        != "measured"
    )


def _latency_ms(tables, family: str, name: str, **columns) -> float:
    """The mean latency of a raw table's rows with these column values."""
    frame = pd.read_parquet(tables._path(family, name))
    for column, value in columns.items():
        frame = frame[frame[column] == value]
    return frame.latency.mean()


def test_tensorrt_llm_fp8_gemms_run_as_a_static_scale_checkpoint_runs_them():
    """aiconfigurator's TensorRT-LLM collector times per-tensor FP8 GEMMs with dynamic activation scales (an amax
    pass per call); a static-scale checkpoint's GEMM is the table's less that pass (`computescale`, dynamic less
    static), and less the quantization too (`scale_matrix`) where the kernel before emits FP8, as aiconfigurator
    prices fp8_static: ~7 us less per H200 GEMM of a few rows, the gap to vLLM's static-scale table."""
    trtllm, vllm = kernel_tables("trtllm", "h200"), kernel_tables("vllm", "h200")
    m, n, k = 64, 8192, 1024  # a point the rising rule leaves as measured
    measured = _latency_ms(trtllm, "gemm", "gemm_perf.parquet", gemm_dtype="fp8", m=m, n=n, k=k)
    amax = _latency_ms(trtllm, "quantize", "computescale_perf.parquet", quant_dtype="fp8", m=m, k=k)
    quantize = _latency_ms(trtllm, "quantize", "scale_matrix_perf.parquet", quant_dtype="fp8", m=m, k=k)
    assert 5e-3 < amax < 10e-3 and 0 < quantize < amax  # ms
    assert trtllm.gemm_s("fp8", m, n, k) == pytest.approx((measured - amax) * 1e-3, rel=1e-9)
    assert trtllm.gemm_s("fp8", m, n, k, quantized_input=True) == pytest.approx(
        (measured - amax - quantize) * 1e-3, rel=1e-9
    )
    assert trtllm.gemm_s("fp8", m, n, k, True, floor_s=1.0) == 1.0  # never below the GEMM's roofline
    # vLLM's collector measured the static path; other dtypes carry no dynamic scale
    static = _latency_ms(vllm, "gemm", "gemm_perf.parquet", gemm_dtype="fp8", m=m, n=n, k=k)
    assert vllm.gemm_s("fp8", m, n, k, quantized_input=True) == pytest.approx(static * 1e-3, rel=1e-9)
    bf16 = _latency_ms(trtllm, "gemm", "gemm_perf.parquet", gemm_dtype="bfloat16", m=m, n=n, k=k)
    assert trtllm.gemm_s("bf16", m, n, k, quantized_input=True) == pytest.approx(bf16 * 1e-3, rel=1e-9)


def test_tensorrt_llm_steps_take_fp8_inputs_for_the_output_and_down_projections():
    """Under TensorRT-LLM's tables Llama-3.1-70B FP8 at TP 8: the QKV and gate-up projections keep their static
    quantization, the attention output and down projections (FP8 from the kernel before) drop it, in every layer."""
    model, h200 = get_model("llama-3.1-70b"), get_gpu("h200")
    tables, layers, h = kernel_tables("trtllm", "h200"), model.num_layers, model.hidden_size
    step = StepBatch.of(np.ones(16, int), np.full(16, 1500))
    options = CostOptions(weight_dtype="fp8", kv_dtype="fp8")
    cost = step_cost(step, model, h200, Parallelism(tp=8), MEASURED.for_engine("trtllm"), options)
    heads = model.num_heads * model.head_dim / 8
    qkv, width = heads + 2 * model.num_kv_heads * model.head_dim / 8, 28672 / 8
    assert cost.by_name("qkv_proj").time_s == pytest.approx(layers * tables.gemm_s("fp8", 16, qkv, h))
    assert cost.by_name("o_proj").time_s == pytest.approx(layers * tables.gemm_s("fp8", 16, h, heads, True))
    mlp = tables.gemm_s("fp8", 16, 2 * width, h) + tables.gemm_s("fp8", 16, h, width, True)
    assert cost.by_name("mlp").time_s == pytest.approx(layers * mlp)


def test_gpt_oss_bf16_projections_come_from_the_bf16_gemm_tables():
    """gpt-oss quantizes only its experts (MXFP4): its attention projections are bf16 GEMMs, which the tables time
    (looked up under "mxfp4", a dtype the GEMM tables lack, they fell back to the roofline); its experts still take
    the MXFP4 fit."""
    model, gpu = get_model("gpt-oss-120b"), get_gpu("h200")
    ops = {
        o.name: o
        for o in step_cost(StepBatch.uniform(16, 1024), model, gpu, Parallelism(), MEASURED).operators
    }
    tables = kernel_tables("vllm", "h200")
    h, d = model.hidden_size, model.head_dim
    qkv = tables.gemm_s("bf16", 16, (model.num_heads + 2 * model.num_kv_heads) * d, h)
    assert ops["qkv_proj"].bound == "measured" and qkv is not None
    assert ops["qkv_proj"].time_s == pytest.approx(model.num_layers * qkv, rel=0.02)
    assert ops["o_proj"].bound == "measured" and ops["moe"].bound in ("memory", "compute")
