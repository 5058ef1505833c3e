"""SGLang's sliding-window radix cache (policies/swa_radix.py): two pools, tombstones, windows, and its admission."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.errors import SpecError
from servesim.policies.config import EngineConfig
from servesim.policies.hybrid_blocks import make_kv_manager
from servesim.policies.swa_radix import SWARadixCache
from tests.policies.helpers import assert_every_token_served, drive, make_scheduler
from tests.policies.test_prefix_caching import req
from servesim.workloads.request import Request, output_segment_id


def admit(kv: SWARadixCache, r: Request) -> None:
    """Admit `r` as a scheduler would (its prefix hit first), compute its whole prompt and insert it."""
    r.num_computed_tokens = kv.lookup(r)
    assert kv.allocate(r, r.num_tokens - r.num_computed_tokens, admitting=True) is not None
    r.num_computed_tokens = r.num_tokens
    kv.cache(r)
    kv.check_invariants()


def serve_prompt(kv: SWARadixCache, r: Request) -> None:
    admit(kv, r)
    kv.free(r)
    kv.check_invariants()


def test_a_tombstone_cuts_the_usable_prefix_unless_a_window_of_live_tokens_follows_it():
    """Window 12, 30 sliding slots. A caches N1 (10 tokens), B extends it by N2 (10 tokens): 20 slots held, all
    unlocked once they end. C (15 new tokens) finds 10 slots free: the tree frees 10 more by tombstoning the least
    recently used live node, N1 (a parent counts as used before its children). N1 keeps its full KV, but a
    prefix through it is usable only where 12 live tokens follow: N2's 10 do not, so D hits nothing; had B added
    14 (E's case), its whole 24-token prefix would be usable."""
    for extension, hit in ((10, 0), (14, 24)):
        kv = SWARadixCache(100, 1, 0.0, window=12, swa_blocks=30)
        n1, n2 = (1, 10), (2, extension)
        serve_prompt(kv, req(0, [n1]))
        serve_prompt(kv, req(1, [n1, n2]))
        assert kv.swa_free_blocks == 30 and len(kv._swa_free) == 30 - 10 - extension
        c = req(2, [(3, 15)])
        admit(kv, c)
        n1_node = (
            kv.root.children[next(iter(kv.root.children))]
            if len(kv.root.children) == 1
            else next(node for node in kv.root.children.values() if node.key[0][0] == 1)
        )
        assert n1_node.tombstone and not next(iter(n1_node.children.values())).tombstone
        assert kv.full_free_blocks == 100 - 15  # tombstoning frees no full KV: N1 and N2 stay cached
        assert kv.lookup(req(3, [n1, n2, (4, 3)])) == hit
        assert kv.lookup(req(4, [(1, 5), (5, 2)])) == 0  # inside the tombstone
        kv.free(c)
        kv.check_invariants()


def test_a_prefix_with_no_tombstone_is_usable_however_short():
    kv = SWARadixCache(64, 1, 0.0, window=16, swa_blocks=40)
    serve_prompt(kv, req(0, [(1, 10)]))
    assert kv.lookup(req(1, [(1, 5), (2, 3)])) == 5


def test_a_running_request_frees_its_own_out_of_window_slots_and_they_join_the_tree_as_a_tombstone():
    """Window 8, pages of 1 token, prompt 20, 40 outputs, alone. The prompt joins the tree after its prefill; the
    decode tokens are the request's own. From its second decode step on, once 8 of its own tokens lie before the
    window (computed - 8 - freed >= 8), it frees them: before computing token 36 it frees [20, 28), then [28, 36)
    at 44 and [36, 44) at 52. It ends with 59 tokens computed: the tree keeps [20, 44) as a tombstone and [44, 59)
    live, so a follow-up still hits all 59 (15 live tokens >= 8 follow the tombstone)."""
    sched, log = make_scheduler("sglang", num_blocks=200, block_size=1, prefix_caching="radix", swa=(8, 100))
    a = Request(0, 0.0, 20, 40, ((1, 20),))
    freed_at = {}
    sched.add(a, 0.0)
    now = 0.0
    while not a.is_done:
        before = sched.kv._swa_done.get(a.id, 0)
        plan = sched.schedule(now)  # a decode step allocates its token, freeing first
        if sched.kv._swa_done.get(a.id, 0) != before:
            freed_at[a.num_computed_tokens] = sched.kv._swa_done[a.id]
        now += 1.0
        sched.commit(plan, now)
        sched.kv.check_invariants()
    assert freed_at == {36: 28, 44: 36, 52: 44}
    kv = sched.kv
    prompt = next(iter(kv.root.children.values()))
    (dead,) = prompt.children.values()
    (live,) = dead.children.values()
    assert (
        prompt.num_tokens,
        prompt.tombstone,
        dead.num_tokens,
        dead.tombstone,
        live.num_tokens,
        live.tombstone,
    ) == (20, False, 24, True, 15, False)
    follow_up = Request(1, 0.0, 20 + 40 + 5, 1, ((1, 20), (output_segment_id(a.id), 40), (2, 5)))
    assert kv.lookup(follow_up) == 59
    assert kv.swa_free_blocks == 100 and len(kv._swa_free) == 100 - 20 - 15


def test_admission_cuts_a_chunk_to_what_the_sliding_pool_holds():
    """SGLang's sliding-window check: a 100-token prompt, chunks of 64, window 16, 40 sliding slots. Its first
    chunk would need max(64, 16) + 1 = 65 >= 40 slots: it is cut to 40 - 16 - 1 = 23. The chunk joins the tree,
    locked by the request's window (one 23-token node), so 17 slots are free: the next chunk takes 17 - 1 = 16.
    Now the request's window lies in that 16-token node and the first goes unlocked: 1 free + 23 evictable, so
    the third chunk takes 23 and the tree tombstones the first node for it."""
    sched, _ = make_scheduler(
        "sglang",
        num_blocks=1000,
        block_size=1,
        prefix_caching="radix",
        swa=(16, 40),
        max_num_batched_tokens=64,
        enable_chunked_prefill=True,
    )
    r = Request(0, 0.0, 100, 4, ((1, 100),))
    sched.add(r, 0.0)
    chunks, now = [], 0.0
    for _ in range(3):
        plan = sched.schedule(now)
        chunks.append(dict(zip(plan.requests, plan.num_new))[r])
        now += 1.0
        sched.commit(plan, now)
        sched.kv.check_invariants()
    assert chunks == [23, 16, 23]
    first = next(iter(sched.kv.root.children.values()))
    assert first.tombstone and first.num_tokens == 23


def test_a_new_prompt_the_sliding_pool_cannot_hold_waits_while_others_run():
    """130 sliding slots, window 16, chunks of 64. A (130 tokens) decodes, leaving 63 slots free or evictable; B's
    100-token prompt would need max(64, 16) + 1 = 65 >= 63: SGLang's add_one_req refuses it (NO_TOKEN) rather than
    cut it to fit, so the step decodes A alone and B waits; once A finishes B runs whole chunks."""
    sched, _ = make_scheduler(
        "sglang",
        num_blocks=5000,
        block_size=1,
        prefix_caching="radix",
        swa=(16, 130),
        max_num_batched_tokens=64,
        enable_chunked_prefill=True,
        async_scheduling=False,
    )
    a = Request(0, 0.0, 130, 40, ((1, 130),))
    sched.add(a, 0.0)
    now = 0.0
    for _ in range(4):
        plan = sched.schedule(now)
        now += 1.0
        sched.commit(plan, now)
    assert sched.kv.swa_free_blocks == 63
    b = Request(1, now, 100, 4, ((2, 100),))
    sched.add(b, now)
    chunks = []
    while not b.is_done:
        plan = sched.schedule(now)
        chunks += [n for r, n in zip(plan.requests, plan.num_new) if r is b and n > 1]
        assert b not in plan.requests or a.is_done
        now += 1.0
        sched.commit(plan, now)
        sched.kv.check_invariants()
    assert chunks == [64, 36]


@pytest.mark.parametrize("swa", [(8, 1000), None])
def test_a_hybrid_swa_engine_retries_a_refused_prompt_every_pass(swa):
    """A 1,000-token pool: A (40 + 1,000 outputs) decodes; B (200 + 100) is refused, its 301 tokens over what the
    reserve for A's outputs leaves. SGLang clears batch_is_full every pass for a hybrid sliding-window model, so B
    gets in at the first pass k where the free tokens (961 - k) less the reserve for A's 1,000 - k outputs at the
    ratio decayed k - 1 times exceed 200 + 100 + a page; otherwise the flag holds until the batch shrinks, here when
    A is retracted some 960 passes on."""
    sched, _ = make_scheduler(
        "sglang", num_blocks=1000, block_size=1, prefix_caching="radix", swa=swa, async_scheduling=False
    )
    a, b = Request(0, 0.0, 40, 1000, ((1, 40),)), Request(1, 0.0, 200, 100, ((2, 200),))
    sched.add(a, 0.0)
    for k in range(1200):
        if k == 1:
            sched.add(b, float(k))
        plan = sched.schedule(float(k))
        if b in plan.requests:
            break
        sched.commit(plan, float(k + 1))
    ratio = [0.7 - j * (0.7 - 0.098) / 600 for j in range(600)]
    first = next(j for j in range(1, 600) if 961 - j - (1000 - j) * ratio[j - 1] > 200 + 100 + 1)
    assert (k == first == 65 and not a.num_preemptions) if swa else (k > 900 and a.num_preemptions == 1)


def test_an_admission_counts_the_sliding_slots_its_hit_locks():
    """30 sliding slots, window 4; a cached 15-token node, unlocked. A request hitting it locks the node for its
    window (whole nodes): 16 new tokens would need 15 + 16 = 31 slots, more than the pool, so the allocation is
    refused (nothing is taken); 15 new tokens fit exactly."""
    kv = SWARadixCache(100, 1, 0.0, window=4, swa_blocks=30)
    serve_prompt(kv, req(0, [(1, 15)]))
    for rid, new, fits in ((1, 16, False), (2, 15, True)):
        r = req(rid, [(1, 15), (rid + 1, new)])
        r.num_computed_tokens = kv.lookup(r)
        assert r.num_computed_tokens == 15
        assert (kv.allocate(r, new, admitting=True) is not None) == fits
        kv.check_invariants()
    assert kv.swa_free_blocks == 0


def test_admission_counts_the_window_its_hit_locks_before_sizing_the_chunk():
    """Window 8, 60 sliding slots, a cached 30-token node (evictable). A request hitting it with 40 new tokens:
    before its hit is locked the pool has 60 slots of room (max(40, 8) + 1 = 41 fits), but the hit's window locks
    the whole 30-token node, leaving 30: SGLang checks again and cuts the chunk to 30 - 8 - 1 = 21."""
    sched, _ = make_scheduler(
        "sglang",
        num_blocks=200,
        block_size=1,
        prefix_caching="radix",
        swa=(8, 60),
        max_num_batched_tokens=64,
        enable_chunked_prefill=True,
    )
    serve_prompt(sched.kv, req(0, [(1, 30)]))
    r = req(1, [(1, 30), (2, 40)])
    sched.add(r, 0.0)
    plan = sched.schedule(0.0)
    assert r.num_cached_tokens == 30 and dict(zip(plan.requests, plan.num_new))[r] == 21


def test_a_sliding_pool_needs_the_radix_or_no_cache():
    with pytest.raises(SpecError, match="use radix"):
        make_kv_manager(EngineConfig(scheduler="sglang", prefix_caching="vllm"), 64, 1, swa=(8, 32))
    assert not make_kv_manager(
        EngineConfig(scheduler="sglang", prefix_caching="none"), 64, 1, swa=(8, 32)
    ).caching


def test_without_a_tree_a_prompt_frees_its_out_of_window_slots_chunk_by_chunk():
    """SWAChunkCache (--disable-radix-cache): a 100-token prompt in chunks of 32, window 16, holds at most a
    window and a chunk of sliding slots: before each chunk it frees what lies before computed - 16."""
    sched, _ = make_scheduler(
        "sglang",
        num_blocks=400,
        block_size=1,
        prefix_caching="none",
        swa=(16, 200),
        max_num_batched_tokens=32,
        enable_chunked_prefill=True,
    )
    r = Request(0, 0.0, 100, 2, ((1, 100),))
    sched.add(r, 0.0)
    held, now = [], 0.0
    while not r.is_done:
        plan = sched.schedule(now)
        held.append(200 - len(sched.kv._swa_free))
        now += 1.0
        sched.commit(plan, now)
        sched.kv.check_invariants()
    assert held[:4] == [32, 16 + 32, 16 + 32, 16 + 4]  # chunks of 32, 32, 32, 4 after 0, 16, 48 and 80 freed


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 30)), min_size=1, max_size=10
    ),
    caching=st.sampled_from(["radix", "none"]),
    window=st.sampled_from([4, 8, 16]),
    swa_spare=st.integers(0, 40),
    chunk=st.sampled_from([16, 32, 128]),
    overlap=st.booleans(),
    page=st.sampled_from([1, 4]),
)
def test_every_request_finishes_and_no_slot_leaks(prompts, caching, window, swa_spare, chunk, overlap, page):
    """Random prompts (some sharing a segment) through tight pools, chunked or not, overlapped or not: every
    invariant holds after every step (each sliding slot behind exactly one full page, live nodes whole, a
    request's own pages live past what it freed, counts exact), every request gets every token, and both pools
    are whole again at the end."""
    requests = [Request(i, 0.0, p, o, ((seg, p),)) for i, (seg, p, o) in enumerate(prompts)]
    longest = max(r.num_prompt_tokens + r.num_output_tokens for r in requests)
    pages = -(-longest // page) + 2
    # what plan_memory requires of the sliding pool
    least = -(-(2 * min(chunk, longest) + 3 * window) // page) + 2
    sched, log = make_scheduler(
        "sglang",
        num_blocks=pages + 8,
        block_size=page,
        prefix_caching=caching,
        swa=(window, least + swa_spare),
        max_num_batched_tokens=chunk,
        enable_chunked_prefill=True,
        max_num_seqs=4,
        async_scheduling=overlap,
    )
    drive(sched, requests)
    assert_every_token_served(requests, log)
