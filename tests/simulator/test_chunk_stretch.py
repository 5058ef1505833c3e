"""Fast-forward over chunked prefills (simulator/world/chunk_stretch.py): chunk sizes by hand, and runs identical to
stepping one step at a time."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.policies.kv_blocks import BlockManager
from servesim.simulator.world import engine
from servesim.simulator.world.chunk_stretch import plan_chunk_stretch
from servesim.workloads.request import Request
from tests.simulator.conftest import run, scenario
from tests.simulator.test_simulate import assert_same_run

BUDGET = 512


def decoding(rid: int, context: int, generated: int, output: int) -> Request:
    req = Request(rid, 0.0, context - generated + 1, output)
    req.num_computed_tokens, req.num_generated = context, generated
    return req


def chunk_of(pending: int, decodes: int) -> tuple[int, int]:
    n = min(pending, BUDGET - decodes)
    return n, BUDGET - decodes - n


def example(outputs=(7, 50), **kwargs):
    """Two decodes (with these outputs the first finishes in step 1) beside a 1,500-token prompt whose first 510
    tokens step 0 holds; a step takes 10 ms."""
    kv = BlockManager(1000, 16)
    decodes = [decoding(0, 100, 5, outputs[0]), decoding(1, 200, 5, outputs[1])]
    prefill = Request(2, 0.0, 1500, 10)
    for req in decodes:
        kv.reserve(req, req.num_computed_tokens + 1)
    kv.reserve(prefill, 510)
    steps = {"next_event_s": 1.0, "finishes_allowed": True, "waiting": False} | kwargs
    return plan_chunk_stretch(decodes, prefill, 510, kv, chunk_of, lambda *batch: 0.01, 0.0, **steps)


def test_chunks_take_the_budget_the_decodes_leave_until_the_prompt_is_done():
    stretch = example()
    # step 2: one decode left, 480 tokens to go
    assert stretch.chunks == (510, 510, 480)
    assert stretch.ends_s.tolist() == [0.01, 0.01 + 0.01, 0.01 + 0.01 + 0.01]
    assert stretch.finish_step.tolist() == [1, 44]


def test_a_waiting_request_ends_the_stretch_before_a_step_with_budget_left():
    # step 2 would leave 30 tokens to admit it
    assert example((50, 50), finishes_allowed=False, waiting=True).chunks == (510, 510)


def test_without_finishes_inside_it_stops_before_the_first():
    assert example(finishes_allowed=False) is None  # only step 0 is before the finish in step 1
    assert example((50, 50), finishes_allowed=False).chunks == (510, 510, 480)


def test_nothing_is_fused_past_the_next_event_or_into_a_full_pool():
    # step 1 starts before the event, step 2 after; step 1 finishes a decode, so it cannot be the last
    assert example((50, 50), next_event_s=0.015).chunks == (510, 510)
    assert example(next_event_s=0.015) is None
    assert example(next_event_s=0.005) is None
    kv = BlockManager(92, 16)  # 7 + 13 + 32 blocks held, 40 free: step 1 needs 32 more, step 2 another 30
    decodes = [decoding(0, 100, 5, 50), decoding(1, 200, 5, 50)]
    prefill = Request(2, 0.0, 1500, 10)
    for req in decodes:
        kv.reserve(req, req.num_computed_tokens + 1)
    kv.reserve(prefill, 510)
    stretch = plan_chunk_stretch(decodes, prefill, 510, kv, chunk_of, lambda *batch: 0.01, 0.0, 1.0)
    assert stretch.chunks == (510, 510)


def long_prompts(rate: float = 3.0, shared: bool = False, **engine_overrides):
    """80 prompts of ~1,500 tokens; `shared`: most behind one of 4 prefixes of 1,200 tokens (prefix-cache hits)."""
    workload = {
        "trace": None,
        "lengths": {
            "prompt": {"kind": "lognormal", "median": 1500, "sigma": 0.6},
            "output": {"kind": "uniform", "low": 1, "high": 200},
        },
        "arrivals": {"kind": "poisson", "rate_per_s": rate},
        "num_requests": 80,
    }
    if shared:
        workload["shared_prefix"] = {"num_prefixes": 4, "prefix_tokens": 1200, "zipf_s": 1.0, "share": 0.8}
    return scenario(
        engine={"max_model_len": 16384, "max_num_batched_tokens": BUDGET, **engine_overrides},
        workload=workload,
    )


def stretched(s, monkeypatch) -> tuple:
    """The run with fast-forward and the number of chunk stretches it fused, and the run stepped."""
    fused = []

    def counting(*args, **kwargs):
        stretch = plan_chunk_stretch(*args, **kwargs)
        fused.append(stretch is not None)
        return stretch

    monkeypatch.setattr(engine, "plan_chunk_stretch", counting)
    fast = run(s.model_copy(update={"simulation": s.simulation.model_copy(update={"fast_forward": True})}))
    slow = run(s.model_copy(update={"simulation": s.simulation.model_copy(update={"fast_forward": False})}))
    return fast, sum(fused), slow


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_fused_chunked_prefills_give_the_same_run_as_stepping(async_scheduling, monkeypatch):
    fast, fused, slow = stretched(long_prompts(async_scheduling=async_scheduling), monkeypatch)
    assert fused > 20
    assert_same_run(fast, slow)


def test_a_radix_cache_is_not_fused(monkeypatch):
    """Its `cache` after each step inserts the chunk into the tree (one node per chunk), which registering chunks as
    they are scheduled does not do: fused chunks once gave other prefix hits than stepping."""
    s = long_prompts(shared=True, prefix_caching="radix", num_gpu_blocks_override=800, async_scheduling=False)
    fast, fused, slow = stretched(s, monkeypatch)
    assert fused == 0
    assert_same_run(fast, slow)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    scheduler=st.sampled_from(["vllm", "sarathi", "trtllm"]),
    async_scheduling=st.booleans(),
    prefix_caching=st.sampled_from(["none", "vllm", "radix"]),
    shared=st.booleans(),
    threshold=st.sampled_from([0, 300]),
    rate=st.sampled_from([1.0, 6.0, 30.0]),
    blocks=st.sampled_from([None, 900]),
    lpm=st.booleans(),
    router=st.sampled_from([None, "round_robin", "least_outstanding", "least_kv"]),
)
def test_any_chunked_run_is_the_same_fused_or_stepped(
    scheduler, async_scheduling, prefix_caching, shared, threshold, rate, blocks, lpm, router, monkeypatch
):
    """Fused steps (chunked prefills and decodes, under async scheduling also the step planned before an arrival
    was seen) give the run stepping gives, one replica or two behind a router."""
    engine_overrides = {
        "scheduler": scheduler,
        "prefix_caching": prefix_caching,
        "long_prefill_token_threshold": 0 if scheduler == "trtllm" else threshold,  # vLLM's and sarathi's
        "num_gpu_blocks_override": blocks,  # a small pool: preemptions, requests waiting for blocks
        # longest prefix match: the waiting queue re-sorted by the cache every plan
        "queue_order": "lpm" if lpm and prefix_caching != "none" else "fcfs",
    }
    if scheduler == "sarathi":
        engine_overrides["chunk_size"] = BUDGET
    else:
        engine_overrides["async_scheduling"] = async_scheduling
    if scheduler == "trtllm":
        engine_overrides["enable_chunked_prefill"] = True
    s = long_prompts(rate, shared, **engine_overrides)
    if router is not None:
        s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"replicas": 2, "router": router})})
    fast, _, slow = stretched(s, monkeypatch)
    assert_same_run(fast, slow)
