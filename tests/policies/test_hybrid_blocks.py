"""vLLM's hybrid KV cache manager: sliding groups free what no query can see, hits need the window cached."""

from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.kv_groups import KVGroups
from servesim.policies.catalog import orderings, schedulers
from servesim.policies.config import EngineConfig
from servesim.policies.hybrid_blocks import HybridPrefixCachingBlockManager, make_kv_manager
from servesim.policies.step import TokenLog
from tests.policies.test_prefix_caching import req, serve
from servesim.workloads.request import Request

WINDOWS = (None, 8)  # one full-attention group, one sliding group of 8 tokens
BS = 4


def scheduler(
    kind: str,
    num_blocks: int,
    budget: int = 64,
    max_num_seqs: int = 8,
    windows=WINDOWS,
    async_scheduling: bool = False,
):
    cfg = EngineConfig(
        block_size=BS,
        prefix_caching=kind,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        async_scheduling=async_scheduling,
    )
    kv = make_kv_manager(cfg, num_blocks, BS, windows)
    return schedulers.get("vllm")(kv, cfg, orderings.get("fcfs"), TokenLog())


def test_a_prefill_chunk_needs_all_its_blocks_then_the_window_is_kept():
    """20 tokens in one chunk: 5 blocks per group while they are computed; then the sliding group keeps only
    the blocks tokens 13.. live in (13 = 20 - 8 + 1), and every decode adds a block per group each 4 tokens."""
    sched = scheduler("none", num_blocks=32)
    r = Request(0, 0.0, 20, 9)
    sched.add(r, 0.0)
    plan = sched.schedule(0.0)
    assert list(plan.num_new) == [20] and len(sched.kv.table(r)) == 5 + 5
    sched.commit(plan, 1.0)
    assert len(sched.kv.table(r)) == 5 + 2  # blocks 0-2 of the sliding group freed
    groups = KVGroups(WINDOWS, 1)
    now = 1.0
    while not r.is_done:
        plan = sched.schedule(now)
        now += 1.0
        sched.commit(plan, now)
        if not r.is_done:
            c = r.num_computed_tokens
            assert len(sched.kv.table(r)) == groups.blocks_held(c, c, BS)
        sched.kv.check_invariants()
    assert sched.kv.num_free_blocks == 32


@pytest.mark.parametrize("async_scheduling, pp, peak", [(False, 1, 520), (True, 1, 1032), (False, 4, 2048)])
def test_a_window_keeps_the_blocks_the_steps_in_flight_read(async_scheduling, pp, peak):
    """A 40,000-token prompt in 8,192-token chunks, 16-token blocks, a 128-token window. vLLM frees a sliding
    group's blocks below the processed tokens only (allocate_slots: computed - num_in_flight_tokens). Planning the
    chunk from c tokens, the group holds (c + 8192) / 16 blocks less the skipped ones: synchronously
    skipped(c) = (c - 127) // 16, so 1024 - 504 = 520 at c = 8192; under async scheduling the chunk before is in
    flight, skipped(c - 8192): 1536 - 504 = 1032 at c = 16384; with 4 pipeline stages 3 chunks are, and the
    fourth's plan holds all 32768 / 16 = 2048."""
    cfg = EngineConfig(
        block_size=16,
        max_num_batched_tokens=8192,
        max_num_seqs=8,
        async_scheduling=async_scheduling,
        scheduler_reserve_full_isl=False,
    )
    sched = schedulers.get("vllm")(
        make_kv_manager(cfg, 20000, 16, (None, 128)), cfg, orderings.get("fcfs"), TokenLog()
    )
    if pp > 1:
        sched.pipeline(pp)
    r = Request(0, 0.0, 40000, 5)
    sched.add(r, 0.0)
    flight, most, now = deque(), 0, 0.0
    while True:
        plan = sched.schedule(now) if len(flight) < pp and not r.is_done else None
        if plan is not None and not plan.is_empty:
            flight.append(plan)
            most = max(most, sum(b is not None for b in sched.kv._groups[r.id][1]))
            continue
        if not flight:
            break
        now += 1.0
        sched.commit(flight.popleft(), now)
        sched.kv.check_invariants()
    assert r.is_done and most == peak


def test_a_hit_needs_the_blocks_before_it_cached_in_the_sliding_group():
    """A (32 tokens) finishes; its sliding blocks 0-5 left the window early, so they sit at the front of the
    free queue and a newcomer's 10 blocks evict them. B = A's prompt + more still hits all 32 tokens (the
    sliding group needs only blocks 6-7 before position 8); B2 = A's first 16 tokens + more hits nothing,
    though the full-attention group still has those blocks: the sliding group lacks blocks 2-3."""
    sched = scheduler("vllm", num_blocks=20)
    assert isinstance(sched.kv, HybridPrefixCachingBlockManager)
    serve(sched, [req(0, [(1, 32)])])
    serve(sched, [req(1, [(9, 20)])])  # 5 + 5 blocks: the 4 never used, then A's sliding blocks 0-5
    b, b2 = req(2, [(1, 32), (2, 8)]), req(3, [(1, 16), (3, 8)])
    assert sched.kv.lookup(b) == 32
    assert sched.kv.lookup(b2) == 0
    assert serve(sched, [b]) == {2: 8} and b.num_cached_tokens == 32
    sched.kv.check_invariants()


def test_a_finished_requests_partly_filled_tails_are_spent_first():
    """A (30 tokens) takes blocks 0-7 for the full group and 8-15 for the sliding one from an empty pool. Finished,
    its two partly filled tails (7 and 15) hold no hash, so vLLM's free_blocks puts them at the very front of the
    free queue, sliding group's first (freed after the full group's), ahead of the 4 never used (16-19); its full
    blocks go to the back, after the sliding blocks that left the window during the prefill."""
    sched = scheduler("vllm", num_blocks=20)
    serve(sched, [req(0, [(1, 30)])])
    queue = list(sched.kv._free_queue)
    assert queue[:6] == [15, 7, 16, 17, 18, 19]
    assert queue[-9:] == [6, 5, 4, 3, 2, 1, 0, 14, 13]  # then the sliding group's, tail first
    sched.kv.check_invariants()


def test_radix_is_refused_with_sliding_layers():
    import pytest

    from servesim.hardware.errors import SpecError

    with pytest.raises(SpecError, match="disable_hybrid_kv_cache_manager"):
        make_kv_manager(EngineConfig(prefix_caching="radix"), 16, 1, WINDOWS)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 30), st.integers(1, 12)), min_size=1, max_size=8
    ),
    kind=st.sampled_from(["none", "vllm"]),
    windows=st.sampled_from([(None, 8), (None, 5, 5), (6,)]),
    budget=st.sampled_from([8, 16, 64]),
    spare=st.integers(0, 12),
)
def test_every_request_finishes_and_holds_exactly_its_window(prompts, kind, windows, budget, spare):
    """Random prompts (some sharing a segment) through a tight pool with chunked prefill: no block leaks, every
    request finishes, and after each step a running request holds cdiv(c, bs) blocks per full group and
    cdiv(c, bs) - skipped(c) per sliding group (c = its computed tokens)."""
    groups = KVGroups(windows, 1)
    requests = [Request(i, 0.0, p, o, ((seg, p),)) for i, (seg, p, o) in enumerate(prompts)]
    need = max(
        groups.peak_blocks(r.num_prompt_tokens + r.num_output_tokens - 1, BS, budget) for r in requests
    )
    sched = scheduler(kind, num_blocks=need + spare, budget=budget, max_num_seqs=4, windows=windows)
    for r in requests:
        sched.add(r, 0.0)
    now, steps = 0.0, 0
    while not all(r.is_done for r in requests):
        plan = sched.schedule(now)
        assert not plan.is_empty and steps < 5000
        now, steps = now + 1.0, steps + 1
        sched.commit(plan, now)
        sched.kv.check_invariants()
        for r in sched.running:
            c = r.num_computed_tokens
            assert len(sched.kv.table(r)) == groups.blocks_held(c, c, BS), (r.id, c)
    assert sched.kv.num_free_blocks == sched.kv.num_blocks


def _decoding(windows, prompts, outputs, num_blocks=400, async_scheduling=False):
    """A vLLM scheduler over a hybrid prefix-caching pool with every request prefilled and decoding."""
    sched = scheduler("vllm", num_blocks, budget=512, windows=windows, async_scheduling=async_scheduling)
    reqs = [Request(i, 0.0, p, o) for i, (p, o) in enumerate(zip(prompts, outputs))]
    for r in reqs:
        sched.add(r, 0.0)
    now = 0.0
    while any(r.num_generated == 0 for r in reqs):
        plan = sched.schedule(now)
        now += 1.0
        sched.commit(plan, now)
    return sched, reqs, now


def _state(sched):
    kv = sched.kv
    return (
        kv._groups,
        kv._hash_of,
        list(kv._free_queue),
        kv._cached,
        kv._registered,
        kv._refs,
        [(r.num_computed_tokens, r.num_in_flight_tokens, r.num_generated, r.is_done) for r in sched.running],
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=st.sampled_from([5, 8, 13]),
    steps=st.integers(2, 40),
    prompts=st.lists(st.integers(1, 30), min_size=1, max_size=5),
    seed_out=st.integers(0, 3),
    async_scheduling=st.booleans(),
)
def test_a_fused_decode_stretch_leaves_the_pool_exactly_as_stepping_does(
    window, steps, prompts, seed_out, async_scheduling
):
    """simulator/fast_forward.apply_stretch against scheduler steps: the same blocks opened, registered, freed by
    the window and retired, in the same order (free queue, hashes, tables and reference counts all equal); under
    async scheduling each step's token stays in flight, and the first decode frees what the prompt's held."""
    from servesim.simulator.world.fast_forward import Stretch, apply_stretch

    # some finish inside it
    outputs = [max(2, steps - 6 + (i + seed_out) % 3 * 7) for i in range(len(prompts))]
    # a stretch's last step finishes nobody (plan_stretch)
    outputs = [o + 1 if o == steps + 1 else o for o in outputs]
    windows = (None, window)
    stepped, _, now = _decoding(windows, prompts, outputs, async_scheduling=async_scheduling)
    for k in range(steps):
        plan = stepped.schedule(now + k)
        stepped.commit(plan, now + k + 1)
    # under async scheduling, what finished last goes back as the next step is planned
    stepped.schedule(now + steps)
    fused, _, now = _decoding(windows, prompts, outputs, async_scheduling=async_scheduling)
    plan = fused.schedule(now)  # step 0 is scheduled and allocated, as the engine hands it over
    requests = list(fused.decode_stretch(plan))
    finish = np.array([r.num_output_tokens - r.num_generated - 1 for r in requests])
    ends = now + 1 + np.arange(steps, dtype=float)
    late = fused.release_retired if fused.holds_finished else None
    apply_stretch(
        requests,
        Stretch(np.ones(steps), ends, finish),
        fused.kv,
        fused.log,
        fused.retire,
        late,
        fused.decode_tokens_in_flight,
    )[3]()
    fused.schedule(now + steps)
    assert _state(fused) == _state(stepped)
    fused.kv.check_invariants()


def test_a_prefix_computed_twice_stays_findable_when_one_copy_is_evicted():
    """A and B compute the same 960-token prefix side by side (128-token chunks), so its blocks are registered
    twice; a 2176-token request then evicts the copies freed first. vLLM keeps every copy under its hash, so C
    still finds the whole prefix, with or without a sliding group (a window longer than any prompt)."""
    from tests.policies.helpers import drive

    for windows in [(None,), (None, 10**6)]:
        cfg = EngineConfig(
            block_size=16,
            prefix_caching="vllm",
            max_num_seqs=8,
            max_num_batched_tokens=256,
            async_scheduling=False,
            long_prefill_token_threshold=128,
        )
        kv = make_kv_manager(cfg, 200 * len(windows), 16, windows)
        sched = schedulers.get("vllm")(kv, cfg, orderings.get("fcfs"), TokenLog(), 0)
        a, b = Request(0, 0.0, 1000, 2, ((5, 960), (-1, 40))), Request(1, 0.0, 980, 2, ((5, 960), (-2, 20)))
        drive(sched, [a, b], arrivals=[0.0, 0.5])
        drive(sched, [Request(3, 0.0, 136 * 16, 2)])
        kv.check_invariants()
        assert kv.lookup(Request(2, 0.0, 980, 2, ((5, 960), (-3, 20)))) == 960, windows


def test_admission_bounds_a_window_by_the_tokens_in_flight_not_the_prefill_threshold():
    """vLLM's SlidingWindowSpec admits by max_in_flight_tokens: the step budget times the steps in flight (2 under
    async scheduling, pp with a pipeline's batch queue); long_prefill_token_threshold plays no part."""
    for ahead, pp, expected in ((False, 1, 8192), (True, 1, 16384), (False, 4, 4 * 8192)):
        cfg = EngineConfig(
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            async_scheduling=ahead,
            long_prefill_token_threshold=512,
        )
        sched = schedulers.get("vllm")(
            make_kv_manager(cfg, 100, 16, (None, 128)), cfg, orderings.get("fcfs"), TokenLog()
        )
        if pp > 1:
            sched.pipeline(pp)
        assert sched.admission_window_tokens == expected and sched.earlier_tokens_in_flight == expected - 8192


def test_sarathi_and_orca_count_the_steps_in_flight_by_their_own_budget():
    """Sarathi's step is its chunk (512 here, not max_num_batched_tokens); Orca reserves a request's every block at
    admission, so nothing is counted for it (its unbounded budget used to leak into the arrival check: a
    negative bound that admitted requests which could never run, or an int64 overflow)."""
    for ahead, pp, steps in ((False, 1, 1), (True, 1, 2), (False, 3, 3)):
        cfg = EngineConfig(
            max_num_seqs=256, max_num_batched_tokens=8192, chunk_size=512, async_scheduling=ahead
        )
        sarathi, orca = (
            schedulers.get(name)(
                make_kv_manager(cfg, 100, 16, (None, 128)), cfg, orderings.get("fcfs"), TokenLog()
            )
            for name in ("sarathi", "orca")
        )
        if pp > 1:
            sarathi.pipeline(pp)
            orca.pipeline(pp)
        assert (sarathi.admission_window_tokens, sarathi.earlier_tokens_in_flight) == (
            512 * steps,
            512 * (steps - 1),
        )
        assert (orca.admission_window_tokens, orca.earlier_tokens_in_flight) == (None, 0)
