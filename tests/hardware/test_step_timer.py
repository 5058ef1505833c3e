"""The simulator's step timer must agree exactly with the cost model, stepped or fast-forwarded."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import (
    CostOptions,
    FixedParts,
    Parallelism,
    fixed_seconds,
    stage_seconds,
    step_cost,
)
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.hardware.profile import EfficiencyCurve, Profile, load_profile
from servesim.hardware.step_timer import StepTimer
from servesim.policies.families import SGLANG, TRTLLM, VLLM

H100 = get_gpu("h100-sxm")
MODELS = ["llama-3.1-8b", "gemma-2-9b", "gemma-3n-e2b", "deepseek-v2", "mixtral-8x7b"]
_LIMITS = SimpleNamespace(
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    cuda_graph_max_size=None,
    cuda_graph_sizes=None,
    cuda_graph_mode=None,
)
#: CUDA graphs as each engine pads (none; every step, vLLM's; decode only, expert rows masked, SGLang's; decode
#: only, TensorRT-LLM's with padding on): a cache
#: keyed on a shape that misses the padding shows
GRAPH_OPTIONS = [
    {},
    VLLM.graph_options(H100, _LIMITS, 1, False, 1),
    SGLANG.graph_options(H100, _LIMITS, 1, True, 1),
    TRTLLM.graph_options(H100, SimpleNamespace(**{**vars(_LIMITS), "cuda_graph_max_size": 256}), 1, False, 1),
]
GRAPHS = st.sampled_from(GRAPH_OPTIONS)
#: attention efficiencies that vary with the step's tokens, so a pricer reading them at the wrong size shows
VARYING_ATTENTION = Profile(
    attn_compute=EfficiencyCurve(points=((1, 0.3), (64, 0.45), (2048, 0.6))),
    attn_memory=EfficiencyCurve(points=((1, 0.5), (16, 0.7), (512, 0.85))),
    host_step_s=1e-5,
    mixed_layer_overhead_s=7e-6,
    fast_prefill_layer_s=9e-6,
    kv_write_token_s=4e-9,
)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(MODELS),
    contexts=st.lists(st.integers(0, 9000), min_size=1, max_size=40),
    steps=st.integers(1, 50),
    fast_prefill=st.booleans(),
    graphs=GRAPHS,
)
def test_decode_stretch_equals_stepping_bit_for_bit(name, contexts, steps, fast_prefill, graphs):
    model = get_model(name)
    options = CostOptions(kv_sharing_fast_prefill=fast_prefill, **graphs)
    par = Parallelism(tp=2 if name == "deepseek-v2" else 1)
    timer = StepTimer(model, H100, par, options=options)
    c = np.array(contexts)
    stretch = timer.decode_stretch_s(c, steps)
    stepped = [
        step_cost(StepBatch.of(np.ones(len(c), int), c + i), model, H100, par, options=options).total_s
        for i in range(steps)
    ]
    assert stretch.tolist() == stepped


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(MODELS),
    requests=st.lists(st.tuples(st.integers(0, 9000), st.integers(0, 60)), min_size=1, max_size=24),
    steps=st.integers(1, 50),
    fast_prefill=st.booleans(),
    graphs=GRAPHS,
    dp_attention=st.booleans(),
)
def test_a_shrinking_stretch_is_each_step_stepped_bit_for_bit(
    name, requests, steps, fast_prefill, graphs, dp_attention
):
    """Request j decodes in steps 0..finish[j]: each step priced as a stepped step of the requests still there
    (in one pass where the roofline prices attention; DP attention takes the per-size path)."""
    model = get_model(name)
    options = CostOptions(kv_sharing_fast_prefill=fast_prefill, **graphs)
    tp = 2 if name == "deepseek-v2" or dp_attention else 1
    par = Parallelism(tp=tp, dp_attention=dp_attention and name == "deepseek-v2")
    timer = StepTimer(model, H100, par, VARYING_ATTENTION, options)
    c, finish = np.array([r[0] for r in requests]), np.array([r[1] for r in requests])
    steps = min(steps, int(finish.max()) + 1)  # somebody decodes in every step
    stepped = stepped_shrinking_stretch(c, finish, steps, model, H100, par, VARYING_ATTENTION, options)
    assert timer.shrinking_stretch_s(c, finish, steps).tolist() == stepped


def stepped_shrinking_stretch(c, finish, steps, *cost_args) -> list[float]:
    """Each step of a stretch in which request j decodes up to step `finish[j]`, priced on its own by `step_cost`."""
    return [
        step_cost(
            StepBatch.of(np.ones(int((finish >= i).sum()), int), c[finish >= i] + i), *cost_args
        ).total_s
        for i in range(steps)
    ]


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(MODELS),
    reqs=st.lists(
        st.tuples(st.integers(1, 600), st.integers(0, 5000), st.booleans()), min_size=1, max_size=20
    ),
    graphs=GRAPHS,
    fast_prefill=st.booleans(),
)
def test_cached_timer_equals_step_cost(name, reqs, graphs, fast_prefill):
    model, options = get_model(name), CostOptions(kv_sharing_fast_prefill=fast_prefill, **graphs)
    # every fixed cost set, so one keyed on the wrong shape (tokens, requests) shows
    profile = Profile(
        layer_overhead_s=3e-5,
        request_overhead_s=4e-6,
        token_overhead_s=5e-8,
        host_step_s=1e-5,
        host_request_s=2e-6,
        mixed_layer_overhead_s=7e-6,
        fast_prefill_layer_s=9e-6,
        kv_write_token_s=4e-9,
    )
    timer = StepTimer(model, H100, profile=profile, options=options)
    batch = StepBatch.of([n for n, _, _ in reqs], [c for _, c, _ in reqs], [lg for _, _, lg in reqs])
    expected = step_cost(batch, model, H100, profile=profile, options=options).total_s
    assert timer(batch) == expected  # first call fills the cache
    assert timer(batch) == expected  # second call uses it


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from([*MODELS, "llama-3.1-70b", "qwen3-30b-a3b"]),
    tp=st.sampled_from([1, 2]),
    measured=st.booleans(),
    reqs=st.lists(
        st.tuples(st.integers(1, 3000), st.integers(0, 20000), st.booleans()), min_size=1, max_size=70
    ),
    graphs=GRAPHS,
    decode_query_len=st.sampled_from([1, 3]),
)
def test_pricing_from_lists_equals_pricing_the_batch(name, tp, measured, reqs, graphs, decode_query_len):
    """`lists_s` (no batch built, plain-Python sums up to SMALL_BATCH requests) gives the batch's very step time,
    from the roofline (efficiencies varying with the step's size) and from the measured kernel tables (MLA and
    YOCO models take the batch path), with verify queries of 1 + 2 drafts taking the decode path or not."""
    model = get_model(name)
    profile = load_profile("measured") if measured else VARYING_ATTENTION
    args = (
        model,
        H100,
        Parallelism(tp=tp),
        profile,
        CostOptions(decode_query_len=decode_query_len, **graphs),
    )
    timer = StepTimer(*args)
    new, context = [n for n, _, _ in reqs], [c for _, c, _ in reqs]
    # one timer for all, so a cache keyed on the wrong shape shows: logits differ, then query lengths
    for logits, num_new in [
        ([lg for _, _, lg in reqs], new),
        ([True] * len(reqs), new),
        ([False] * len(reqs), new),
        ([True] * len(reqs), [1] * (len(reqs) - 1) + [sum(new) - len(reqs) + 1]),
    ]:
        expected = StepTimer(*args)(StepBatch.of(num_new, context, logits))
        assert timer.lists_s(num_new, context, logits) == expected


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b", "gemma-2-9b"]),
    tp=st.sampled_from([1, 2]),
    contexts=st.lists(st.integers(0, 20000), max_size=70),
    chunk=st.integers(1, 3000),
    fed=st.integers(0, 20000),
    last=st.booleans(),
    graphs=GRAPHS,
    decode_query_len=st.sampled_from([1, 3]),
)
def test_a_chunk_step_priced_from_its_sums_equals_pricing_its_lists(
    name, tp, contexts, chunk, fed, last, graphs, decode_query_len
):
    """`chunk_step_pricer` prices decodes beside a prompt chunk from their sums alone, to the bit as `lists_s` prices
    the step's lists (a chunk of up to decode_query_len tokens on the decode path, more than SMALL_BATCH decodes on
    the batch path), with the roofline's attention or the measured kernel tables'; models with sliding windows
    (gemma-2) have none."""
    model = get_model(name)
    options = CostOptions(decode_query_len=decode_query_len, **graphs)
    n = len(contexts)
    for profile in (VARYING_ATTENTION, load_profile("measured")):
        price = StepTimer(model, H100, Parallelism(tp=tp), profile, options).chunk_step_pricer
        if name == "gemma-2-9b":
            assert price is None
            continue
        expected = StepTimer(model, H100, Parallelism(tp=tp), profile, options).lists_s(
            [1] * n + [chunk], contexts + [fed], [True] * n + [last]
        )
        assert price(n, sum(contexts) + n, chunk, fed, last) == expected


def test_the_cache_tells_a_mixed_step_from_prefills_of_the_same_size():
    """[1, 127] and [64, 64] have the same tokens, requests and logits; only the first runs both attention paths."""
    model = get_model("llama-3.1-8b")
    profile = Profile(mixed_layer_overhead_s=1e-4)
    timer = StepTimer(model, H100, profile=profile)
    prefills, mixed = StepBatch.of([64, 64], [0, 0]), StepBatch.of([1, 127], [300, 0])
    for batch in (prefills, mixed, prefills):
        assert timer(batch) == step_cost(batch, model, H100, profile=profile).total_s
    assert timer.fixed_s(mixed) - timer.fixed_s(prefills) > 32 * 1e-4 * 0.999  # every layer's second path


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(MODELS),
    pp=st.sampled_from([2, 3]),
    fast_prefill=st.booleans(),
    reqs=st.lists(
        st.tuples(st.integers(1, 600), st.integers(0, 5000), st.integers(0, 5000), st.booleans()),
        min_size=1,
        max_size=20,
    ),
    graphs=GRAPHS,
)
def test_cached_stage_times_equal_stage_seconds(name, pp, fast_prefill, reqs, graphs):
    """Two batches of one shape (tokens, requests, logits) but other contexts: the second reuses the first's
    cached non-attention stage times and must still get its own attention."""
    model = get_model(name)
    par = Parallelism(tp=2 if name == "deepseek-v2" else 1, pp=pp)
    options = CostOptions(kv_sharing_fast_prefill=fast_prefill, **graphs)
    profile = Profile(
        layer_overhead_s=3e-5,
        request_overhead_s=4e-6,
        token_overhead_s=5e-8,
        host_step_s=1e-5,
        mixed_layer_overhead_s=7e-6,
    )
    timer = StepTimer(model, H100, par, profile, options)
    for contexts in ([c for _, c, _, _ in reqs], [c for _, _, c, _ in reqs]):
        batch = StepBatch.of([n for n, _, _, _ in reqs], contexts, [lg for _, _, _, lg in reqs])
        expected = stage_seconds(batch, model, H100, par, profile, options)
        assert timer.stage_s(batch) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from([*MODELS, "qwen3-30b-a3b"]),
    tp=st.sampled_from([1, 2, 4]),
    dp_attention=st.booleans(),
    measured=st.booleans(),
    reqs=st.lists(
        st.tuples(st.integers(1, 3000), st.integers(0, 20000), st.booleans()), min_size=0, max_size=40
    ),
    graphs=GRAPHS,
)
def test_fixed_seconds_is_step_costs_fixed_part(name, tp, dp_attention, measured, reqs, graphs):
    """The fixed part priced without operator records is `step_cost(...).fixed_s` to the last bit (DP ranks, MLA's
    K/V up-projection, the overheads, an empty step)."""
    model = get_model(name)
    par = Parallelism(tp=tp, dp_attention=dp_attention and tp > 1 and model.moe is not None)
    profile = load_profile("measured") if measured else Profile(host_step_s=1e-5, mixed_layer_overhead_s=7e-6)
    batch = StepBatch.of([n for n, _, _ in reqs], [c for _, c, _ in reqs], [lg for _, _, lg in reqs])
    options = CostOptions(**graphs)
    assert (
        fixed_seconds(batch, model, H100, par, profile, options)
        == step_cost(batch, model, H100, par, profile, options).fixed_s
    )


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from([*MODELS, "qwen3-30b-a3b", "llama-3.1-70b"]),
    tp=st.sampled_from([1, 2, 4]),
    measured=st.booleans(),
    steps=st.lists(
        st.tuples(st.sampled_from([3, 8, 40, 300, 2000]), st.integers(1, 40), st.booleans()),
        min_size=1,
        max_size=6,
    ),
)
def test_the_fixed_part_from_cached_parts_is_fixed_seconds(name, tp, measured, steps):
    """`FixedParts` reuses the sum up to the logits operators for every step of the same tokens (and prefill or not)
    and the logits operators' values for the same logits rows. Steps of a few sizes, each as decodes beside a chunk or
    equal prompts, as one prompt and (when few) as decodes, all sampling or every other one, one after another
    through one object under each engine's CUDA graphs (some padding decodes, one its logits too): each priced to the
    last bit as `fixed_seconds`."""
    model = get_model(name)
    if model.mla is not None or tp > model.num_kv_heads:
        return
    profile = load_profile("measured") if measured else VARYING_ATTENTION
    for graphs in GRAPH_OPTIONS:
        args = (model, H100, Parallelism(tp=tp), profile, CostOptions(**graphs))
        if not FixedParts.applies(model, args[2], args[4]):
            return
        parts = FixedParts(*args)
        for tokens, requests, decodes_first in steps:
            requests = min(requests, tokens)
            if decodes_first:
                new = [1] * (requests - 1) + [tokens - requests + 1]
            else:
                share, extra = divmod(tokens, requests)
                new = [share + (i < extra) for i in range(requests)]
            for num_new in (new, [tokens], [1] * tokens if tokens <= 40 else new):
                for every in (1, 2):
                    logits = [i % every == 0 for i in range(len(num_new))]
                    batch = StepBatch.of(num_new, [100 * i for i in range(len(num_new))], logits)
                    assert parts(batch) == fixed_seconds(batch, *args, batch)


#: a floor of 32 x 1 ms on Llama-3.1-8B: above a small step's GPU time, below a long prefill's
EAGER = Profile(eager_layer_s=1e-3)
DECODE_GRAPHS = CostOptions(
    graph_sizes=(1, 2, 4, 8)
)  # FULL_DECODE_ONLY: prefills, and decodes past 8, run eagerly


def _eager_reference(batch: StepBatch, options: CostOptions) -> float:
    """A step's time: the cost model's without a floor, held at 32 ms if it runs outside CUDA graphs."""
    gpu_s = step_cost(batch, get_model("llama-3.1-8b"), H100, Parallelism(), Profile(), options).total_s
    return gpu_s if options.graphed(batch) else max(gpu_s, 0.032)


def test_an_eager_step_lasts_at_least_the_hosts_launches():
    model = get_model("llama-3.1-8b")
    timer = StepTimer(model, H100, Parallelism(), EAGER, DECODE_GRAPHS)
    assert timer.eager_floor_s == 32 * 1e-3
    prefill, long_prefill = StepBatch.of([16], [0]), StepBatch.of([8192], [0])
    decodes, wide = StepBatch.of([1] * 4, [900] * 4), StepBatch.of([1] * 12, [900] * 12)
    assert timer(prefill) == 0.032 > step_cost(prefill, model, H100, options=DECODE_GRAPHS).total_s
    assert timer(long_prefill) == step_cost(long_prefill, model, H100, options=DECODE_GRAPHS).total_s > 0.032
    assert timer(decodes) == step_cost(decodes, model, H100, options=DECODE_GRAPHS).total_s < 0.032  # graphed
    assert timer(wide) == 0.032  # 12 decodes: past the largest graph
    for batch in (prefill, long_prefill, decodes, wide):
        assert step_cost(batch, model, H100, Parallelism(), EAGER, DECODE_GRAPHS).total_s == timer(batch)
    # every graph captured: the same prefill replays one, no floor
    graphs_all = CostOptions(graph_sizes=(1, 2, 4, 8, 16), graph_prefills=True)
    assert StepTimer(model, H100, Parallelism(), EAGER, graphs_all)(prefill) < 0.032


@settings(max_examples=40, deadline=None)
@given(
    decodes=st.integers(0, 12),
    chunk=st.integers(0, 40),
    fed=st.integers(0, 300),
    contexts=st.lists(st.integers(0, 3000), min_size=1, max_size=14),
    finish=st.lists(st.integers(0, 12), min_size=14, max_size=14),
    steps=st.integers(1, 12),
)
def test_every_pricing_path_holds_an_eager_step_at_the_floor(decodes, chunk, fed, contexts, finish, steps):
    """Lists, the chunk pricer, a decode stretch and a shrinking one (across the largest graph: 9+ decodes eager,
    fewer graphed) agree with the floored cost model, step by step."""
    timer = StepTimer(get_model("llama-3.1-8b"), H100, Parallelism(), EAGER, DECODE_GRAPHS)
    if decodes + chunk:
        new, ctx = [1] * decodes + ([chunk] if chunk else []), [500] * decodes + ([fed] if chunk else [])
        logits = [True] * len(new)
        want = _eager_reference(StepBatch.of(new, ctx, logits), DECODE_GRAPHS)
        assert timer.lists_s(new, ctx, logits) == want
        if chunk:
            assert timer.chunk_step_pricer(decodes, 501 * decodes, chunk, fed, True) == want
    c, ends = np.array(contexts), np.array(finish[: len(contexts)])
    steps = min(steps, int(ends.max()) + 1)
    stepped = [
        _eager_reference(StepBatch.of(np.ones(int((ends >= i).sum()), int), c[ends >= i] + i), DECODE_GRAPHS)
        for i in range(steps)
    ]
    assert timer.shrinking_stretch_s(c, ends, steps).tolist() == stepped
    assert timer.decode_stretch_s(c, steps).tolist() == [
        _eager_reference(StepBatch.of(np.ones(len(c), int), c + i), DECODE_GRAPHS) for i in range(steps)
    ]


def test_each_pipeline_stage_holds_its_share_of_the_floor():
    model = get_model("llama-3.1-8b")
    timer = StepTimer(model, H100, Parallelism(pp=2), EAGER, DECODE_GRAPHS)
    assert timer.stage_s(StepBatch.of([16], [0])) == [0.016, 0.016]
    graphed = StepBatch.of([1, 1], [100, 200])
    assert timer.stage_s(graphed) == StepTimer(model, H100, Parallelism(pp=2), options=DECODE_GRAPHS).stage_s(
        graphed
    )
