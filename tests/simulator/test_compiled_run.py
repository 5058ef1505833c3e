"""The compiled replica loop (simulator/world/compiled_run.py) against the SimPy engine: the same requests, steps and
summary to the bit, on random workloads and engine settings, on ties, and on the Azure trace; and which scenarios
it leaves to SimPy."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.cost import Parallelism, small_attention_pricer
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.hardware.profile import load_profile
from servesim.policies.token_budget import TokenBudgetScheduler
from servesim.simulator.world import compiled_engine, compiled_run
from servesim.simulator.world.compiled_run import compiled_reason
from servesim.simulator.world.run import World
from servesim.workloads.generate import Workload
from servesim.workloads.request import Request
from tests.simulator.conftest import SCENARIOS, scenario
from tests.simulator.test_simulate import assert_same_run


def both(s, requests=None):
    """The run of `s` in SimPy (fast-forwarded or stepped, as `s` says) and compiled, each on fresh copies of
    `requests` (None: the scenario's workload); asserts the second ran compiled."""
    runs = []
    for compiled in (False, True):
        t = s.model_copy(update={"simulation": s.simulation.model_copy(update={"compiled": compiled})})
        workload = None if requests is None else Workload([Request(*r) for r in requests])
        world = World(t, SCENARIOS, workload=workload)
        assert (compiled_reason(world) is None) == compiled
        runs.append(world.run())
    return runs


def with_engine(s, fast_forward=True, **engine):
    return s.model_copy(
        update={
            "engine": s.engine.model_copy(update=engine),
            "simulation": s.simulation.model_copy(update={"fast_forward": fast_forward}),
        }
    )


def with_profile(s, profile: str):
    return s.model_copy(update={"hardware": s.hardware.model_copy(update={"profile": profile})})


@pytest.mark.parametrize(
    ("async_scheduling", "profile"), [(True, "default"), (False, "default"), (True, "measured")]
)
def test_the_azure_trace_runs_as_in_simpy(async_scheduling, profile):
    """With the measured profile, attention comes from the kernel tables' grids (and the roofline past them)."""
    s = with_engine(scenario(), prefix_caching="none", async_scheduling=async_scheduling)
    simpy_run, compiled_run = both(with_profile(s, profile))
    assert len(simpy_run.steps) > 5000
    assert_same_run(simpy_run, compiled_run)


def test_a_tables_chunk_over_a_long_context_reads_it_all_as_in_simpy():
    """With the measured profile, a 61,456-token prompt in 2,048-token chunks ends with 16 tokens over 61,440 cached:
    the tables' time for that chunk is floored at its KV reads at full bandwidth, compiled as in SimPy."""
    s = with_profile(
        with_engine(scenario(), max_model_len=65536, max_num_batched_tokens=2048, prefix_caching="none"),
        "measured",
    )
    simpy_run, compiled_run = both(s, [(0, 0.0, 61_456, 2)])
    tail = simpy_run.steps[simpy_run.steps["prefill_tokens"] == 16]
    assert len(tail) == 1
    assert_same_run(simpy_run, compiled_run)


@pytest.mark.parametrize("prefix_caching", ["none", "vllm"])
def test_a_small_pool_preempts_and_refuses_as_in_simpy(prefix_caching):
    """With vLLM's prefix cache a preempted request comes back to the blocks it left, where nothing took them."""
    s = with_engine(
        scenario(workload={"num_requests": 400}), prefix_caching=prefix_caching, num_gpu_blocks_override=200
    )
    simpy_run, compiled_run = both(s)
    assert simpy_run.requests["preemptions"].sum() > 0
    assert simpy_run.requests["reject_reason"].notna().sum() > 0
    assert_same_run(simpy_run, compiled_run)


def test_a_finished_request_preempted_ahead_of_a_running_one_as_in_simpy(monkeypatch):
    """Async scheduling on a pool of 150 blocks: at least once a plan takes back the blocks of a request that
    finished in the step in flight instead of preempting a running one (vLLM's running list still holds it, last);
    the compiled loop does the same, to the bit."""
    freed, pop = [], TokenBudgetScheduler._pop_finished

    def counted(self, step):
        freed.append(pop(self, step))
        return freed[-1]

    monkeypatch.setattr(TokenBudgetScheduler, "_pop_finished", counted)
    s = with_engine(
        scenario(workload={"num_requests": 400}),
        prefix_caching="none",
        num_gpu_blocks_override=150,
        async_scheduling=True,
    )
    simpy_run, compiled_run = both(s)
    assert any(freed) and simpy_run.requests["preemptions"].sum() > 0
    assert_same_run(simpy_run, compiled_run)


@pytest.mark.parametrize("prefix_caching", ["none", "vllm"])
def test_small_buffers_flush_compact_and_grow_as_they_fill(prefix_caching, monkeypatch):
    """Buffers of a few slots: the loop hands over its rows and gaps, compacts and grows its arenas (gaps of requests
    still producing tokens, block tables) many times a run, and the run is the same."""
    monkeypatch.setattr(compiled_run, "ROWS", 5)
    monkeypatch.setattr(compiled_run, "GAPS", 7)
    monkeypatch.setattr(compiled_run, "ARENA", 50)
    monkeypatch.setattr(compiled_run, "TABLES", 1)
    compacted = []
    compact = compiled_run.ce.compact
    monkeypatch.setattr(
        compiled_run.ce,
        "compact",
        lambda ri, arena, *fields: compacted.append(arena.dtype) or compact(ri, arena, *fields),
    )
    s = with_engine(
        scenario(workload={"num_requests": 120}), prefix_caching=prefix_caching, num_gpu_blocks_override=150
    )
    simpy_run, compiled_run_ = both(s)
    assert simpy_run.requests["preemptions"].sum() > 0
    assert compacted.count(np.dtype(float)) > 2
    assert (np.dtype(np.int64) in compacted) == (prefix_caching == "vllm")
    assert_same_run(simpy_run, compiled_run_)


def test_a_preempted_request_finds_its_own_blocks_as_in_simpy():
    """Two requests outgrow a pool of 55 blocks: the newer is preempted, its blocks hashed as they are freed, and
    when the other finishes it is admitted again on the blocks of its own that nothing evicted: it finishes sooner
    than without a prefix cache, at the same time compiled."""
    requests = [(0, 0.0, 320, 200), (1, 0.01, 320, 200)]
    runs = {}
    for prefix_caching in ("none", "vllm"):
        s = with_engine(scenario(), prefix_caching=prefix_caching, num_gpu_blocks_override=55)
        simpy_run, compiled_run = both(s, requests)
        assert_same_run(simpy_run, compiled_run)
        runs[prefix_caching] = simpy_run.requests
    assert runs["vllm"]["preemptions"].tolist() == runs["none"]["preemptions"].tolist() == [0, 1]
    assert runs["vllm"]["finish_s"][1] < runs["none"]["finish_s"][1]


def _kernel_tables(model: str, gpu: str, tp: int) -> list:
    pricer = small_attention_pricer(
        get_model(model), get_gpu(gpu), Parallelism(tp=tp), load_profile("measured")
    )
    return [table for table in pricer.tables if table is not None]


@settings(max_examples=300, deadline=None)
@given(
    setup=st.sampled_from(
        [("llama-3.1-8b", "h100-sxm", 1), ("llama-3.1-70b", "h200", 4), ("qwen3-32b", "b200", 2)]
    ),
    decode=st.booleans(),
    requests=st.integers(1, 5000),
    log_length=st.floats(0.0, 14.0),
)
def test_the_loops_kernel_table_lookup_is_the_tables(setup, decode, requests, log_length):
    """The loop's attention lookup gives `AttentionTable.seconds` to the bit: interpolated inside the grid, the batch
    halved past it, NaN where the tables have no answer (None)."""
    tables = _kernel_tables(*setup)
    assert len(tables) == 2  # decode and prefill
    table = tables[0 if decode else 1]
    axes, sizes, log_t = compiled_run._table_arrays([t.grid for t in tables])
    t = 0 if decode else 1
    length = float(np.exp(log_length))
    want = table.seconds(requests, length)
    got = compiled_engine.table_s(axes[t], sizes[t], log_t[t], requests, length)
    assert (want is None and np.isnan(got)) or got == want


request_rows = st.lists(
    st.tuples(
        st.integers(0, 60),  # arrival in tenths of a second: many arrive together
        st.integers(1, 700),
        st.integers(1, 120),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=request_rows,
    scheduler=st.sampled_from(["vllm", "sarathi"]),
    prefix_caching=st.sampled_from(["none", "vllm"]),
    async_scheduling=st.booleans(),
    chunked=st.booleans(),
    seqs=st.integers(1, 12),
    budget=st.sampled_from([64, 256, 1024]),
    threshold=st.sampled_from([0, 48]),
    blocks=st.sampled_from([None, 12, 40, 120]),
    watermark=st.sampled_from([0.0, 0.05]),
    reserve_full=st.booleans(),
    api_server=st.booleans(),
    stop_s=st.sampled_from([None, 2.5]),
    fast_forward=st.booleans(),
    setup=st.sampled_from([("default", "h100-sxm"), ("measured", "h100-sxm"), ("measured", "b200")]),
    decode_only_graphs=st.booleans(),
)
def test_any_run_is_the_same_compiled(
    rows,
    scheduler,
    prefix_caching,
    async_scheduling,
    chunked,
    seqs,
    budget,
    threshold,
    blocks,
    watermark,
    reserve_full,
    api_server,
    stop_s,
    fast_forward,
    setup,
    decode_only_graphs,
):
    """Random arrivals (ties included), lengths and engine limits: a pool small enough to preempt and refuse (and
    with vLLM's prefix cache, to find a preempted request's blocks again or not), chunked and whole prompts, one step
    ahead or not, the API server or none, a stop time; attention from the roofline or the kernel tables, and on the
    B200 the measured profile's floor on eager steps (prefills past the largest CUDA graph, or every prefill)."""
    engine = {
        "scheduler": scheduler,
        "prefix_caching": prefix_caching,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": budget if chunked else 1024,
        "max_model_len": 1024,
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": threshold,
        "num_gpu_blocks_override": blocks,
        "watermark": watermark,
        "scheduler_reserve_full_isl": reserve_full,
        "api_server": api_server,
    }
    if scheduler == "sarathi":
        engine |= {"chunk_size": budget, "enable_chunked_prefill": True}
    else:
        engine["async_scheduling"] = async_scheduling
        engine["cuda_graph_mode"] = "full_decode_only" if decode_only_graphs else None
    profile, gpu = setup
    s = scenario(engine=engine, stop={"max_sim_time_s": stop_s}, hardware={"gpu": gpu})
    s = s.model_copy(update={"simulation": s.simulation.model_copy(update={"fast_forward": fast_forward})})
    s = with_profile(s, profile)
    requests = [(i, t / 10, prompt, output) for i, (t, prompt, output) in enumerate(sorted(rows))]
    simpy_run, compiled_run = both(s, requests)
    assert_same_run(simpy_run, compiled_run)


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("made_within_the_step", [True, False])
def test_an_arrival_at_the_very_end_of_a_step_is_ordered_as_simpy_orders_it(
    async_scheduling, made_within_the_step
):
    """SimPy runs the events of one instant in the order they were made, and the arrival process makes a request's
    timeout when the request before it arrives. So a request arriving exactly as a step ends is seen by the plan made
    then if the request before it came before the step began, and not if it came during the step."""
    s = with_engine(scenario(), fast_forward=False, prefix_caching="none", async_scheduling=async_scheduling)
    base = [(i, 0.3 * i, 300 + 17 * i, 60) for i in range(6)]
    first, _ = both(s, base)
    ends = first.steps["time_s"].to_numpy()
    step = 30  # a step no arrival falls in
    assert not any(ends[step - 1] < t <= ends[step] for _, t, _, _ in base)
    extra = [(6, float(ends[step]), 200, 20)]
    if made_within_the_step:
        extra.append((7, float((ends[step - 1] + ends[step]) / 2), 100, 10))
    requests = sorted(base + extra, key=lambda r: r[1])
    requests = [(i, *r[1:]) for i, r in enumerate(requests)]
    simpy_run, compiled_run = both(s, requests)
    assert ends[step] in set(simpy_run.steps["time_s"])
    assert_same_run(simpy_run, compiled_run)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"engine": {"prefix_caching": "radix", "scheduler": "sglang"}}, "sglang scheduler"),
        (
            {
                "workload": {
                    "trace": None,
                    "lengths": {
                        "prompt": {"kind": "fixed", "value": 500},
                        "output": {"kind": "fixed", "value": 20},
                    },
                    "num_requests": 50,
                    "arrivals": {"kind": "poisson", "rate_per_s": 5},
                    "shared_prefix": {"num_prefixes": 2, "prefix_tokens": 300, "zipf_s": 1.0, "share": 0.8},
                }
            },
            "share a prefix",
        ),
        (
            {
                "engine": {
                    "prefix_caching": "none",
                    "speculative": {"method": "ngram", "k": 3, "acceptance": 0.6},
                }
            },
            "speculative",
        ),
        ({"engine": {"prefix_caching": "none"}, "cluster": {"replicas": 2}}, "more than one replica"),
        ({"engine": {"prefix_caching": "none"}, "simulation": {"compiled": False}}, "compiled is off"),
        ({"engine": {"prefix_caching": "none", "preemption_mode": "swap"}}, "swapping"),
    ],
)
def test_what_it_cannot_reproduce_runs_in_simpy(overrides, reason):
    world = World(scenario(**{"simulation": {"compiled": True}, **overrides}), SCENARIOS)
    assert reason in compiled_reason(world)


@pytest.mark.parametrize("graphs", [{"cuda_graph_mode": "full_decode_only"}, {"cuda_graph_max_size": 8}])
def test_a_floor_on_eager_steps_holds_as_in_simpy(tmp_path, graphs):
    """A step outside CUDA graphs lasts at least the profile's eager floor, one just inside them may last less."""
    (tmp_path / "eager.yaml").write_text("name: eager\neager_layer_s: 0.0002\n")
    s = with_engine(scenario(workload={"num_requests": 200}), prefix_caching="none", **graphs)
    simpy_run, compiled_run = both(with_profile(s, str(tmp_path / "eager.yaml")))
    durations = simpy_run.steps["duration_s"]
    floor = 0.0002 * 32  # llama-3.1-8b's layers
    assert (durations == floor).sum() > 0 and (durations < floor).sum() > 0
    assert_same_run(simpy_run, compiled_run)


class _Compiling:
    """A loop whose first call in the process takes a while, as numba compiling it does."""

    def __init__(self, seconds: float):
        self.signatures, self.seconds = [], seconds

    def __call__(self, loop):
        time.sleep(self.seconds)
        self.signatures.append("compiled")
        return loop


@pytest.mark.parametrize(
    ("seconds", "terminal", "told"), [(0.3, True, True), (0.0, True, False), (0.3, False, False)]
)
def test_a_terminal_is_told_when_the_first_call_compiles_the_loop(
    monkeypatch, capsys, seconds, terminal, told
):
    """The first run after an install stands still ~40 s while numba compiles the loop: a terminal hears why once the
    first call has taken COMPILE_NOTICE_S; a quick first call (the loop loaded from the disk cache), a later call or
    output that is not a terminal hear nothing."""
    fake = _Compiling(seconds)
    monkeypatch.setattr(compiled_run.ce, "run_replica", fake)
    monkeypatch.setattr(compiled_run, "COMPILE_NOTICE_S", 0.1)
    monkeypatch.setattr(compiled_run.sys.stderr, "isatty", lambda: terminal)
    assert compiled_run.run_loop("loop") == "loop"
    assert compiled_run.run_loop("again") == "again"  # compiled by now: no timer, however long it takes
    time.sleep(0.2)  # past the timer, had it not been cancelled
    err = capsys.readouterr().err
    assert ("compiling the simulation loop" in err) == told and err.count("compiling") <= 1
