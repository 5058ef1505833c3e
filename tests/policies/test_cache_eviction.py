"""Eviction and admission details of both prefix caches: LRU order, locked radix paths, LPM's FCFS fallback,
and a recompute-preempted request hitting its own blocks when it comes back."""

from servesim.policies.ordering import by_arrival
from servesim.policies.waiting import LPM_MAX_WAITING, WaitingQueue
from tests.policies.helpers import make_scheduler
from tests.policies.test_prefix_caching import req, serve
from servesim.workloads.request import Request


def test_vllm_evicts_the_least_recently_used_cached_blocks_first():
    """Pool of 8 blocks of 4. A, then B, then A again are served; a request that needs 6 fresh blocks takes the
    two blocks no one ever filled, then the partly filled tails (no hash: at the front of the free queue), then
    evicts from the front of the cached ones: B's blocks (used longer ago), not A's (refreshed by the second hit)."""
    sched, _ = make_scheduler("vllm", num_blocks=8, block_size=4, prefix_caching="vllm")
    a, b = (1, 9), (2, 9)  # 9 tokens: two full blocks and the last token's
    serve(sched, [req(0, [a])])
    serve(sched, [req(1, [b])])
    again = req(2, [a])
    serve(sched, [again])
    assert again.num_cached_tokens == 8
    serve(sched, [req(3, [(3, 24)])])  # 24 tokens: 6 blocks
    assert sched.kv.lookup(req(4, [a])) == 8 and sched.kv.lookup(req(5, [b])) == 0


def test_vllm_spends_blocks_that_hold_no_hash_before_evicting_cached_ones():
    """Pool of 8 blocks of 4. A and B (9 tokens: two full blocks and a partly filled one) finish; a request that
    needs 4 blocks takes the 2 never filled and the 2 partly filled tails, which vLLM's free_blocks puts at the
    front of the free queue (nothing can hit them): both A's and B's cached blocks survive."""
    sched, _ = make_scheduler("vllm", num_blocks=8, block_size=4, prefix_caching="vllm")
    a, b = (1, 9), (2, 9)
    serve(sched, [req(0, [a])])
    serve(sched, [req(1, [b])])
    serve(sched, [req(2, [(3, 13)])])  # 13 tokens: 4 blocks
    assert sched.kv.lookup(req(4, [a])) == 8 and sched.kv.lookup(req(5, [b])) == 8


def test_radix_never_evicts_the_prefix_a_running_request_holds():
    """Q is cached by a finished request, P by a running one. A newcomer that needs more pages than are free
    evicts Q's unlocked pages; P's stay."""
    sched, _ = make_scheduler(
        "vllm", num_blocks=16, block_size=1, prefix_caching="radix", max_num_batched_tokens=64, max_num_seqs=8
    )
    q, p = (10, 6), (11, 8)
    serve(sched, [req(0, [q])])  # Q: 6 pages in the tree, evictable; 10 free
    running = req(1, [p], output=6)
    sched.add(running, 0.0)
    plan = sched.schedule(0.0)
    sched.commit(plan, 1.0)  # P's 8 tokens are computed and inserted, locked by the running request
    newcomer = req(2, [(12, 6)], output=1)
    sched.add(newcomer, 1.0)
    plan = sched.schedule(1.0)
    assert newcomer in plan.requests and running in plan.requests  # 2 free pages + Q's 6 evicted
    sched.commit(plan, 2.0)
    sched.kv.check_invariants()
    assert sched.kv.lookup(req(3, [p, (13, 2)])) == 8
    assert sched.kv.lookup(req(4, [q, (14, 2)])) == 0


class _Matches:
    """A KV stand-in whose lookup returns a fixed match per request id."""

    def __init__(self, matched: dict[int, int]):
        self.matched = matched

    def lookup(self, r) -> int:
        return self.matched[r.id]


def _order_after_prepare(num_waiting: int) -> list[int]:
    requests = [req(i, [(100 + i, 20)]) for i in range(num_waiting)]  # 20 tokens: below the in-batch check
    queue = WaitingQueue(by_arrival, _Matches({i: 100 * (i % 2) for i in range(num_waiting)}), lpm=True)
    for r in requests:
        queue.push(r)
    queue.prepare()
    return [queue.pop().id for _ in range(num_waiting)]


def test_lpm_sorts_by_match_up_to_128_waiting_and_falls_back_to_fcfs_above():
    n = LPM_MAX_WAITING
    assert LPM_MAX_WAITING == 128  # SGLang's WAITING_QUEUE_PREFIX_MATCH_MAX
    # matched first, then arrival
    assert _order_after_prepare(n) == list(range(1, n, 2)) + list(range(0, n, 2))
    assert _order_after_prepare(n + 1) == list(range(n + 1))


def test_a_recomputed_request_hits_its_own_blocks_when_it_comes_back():
    """Recompute preemption frees the victim's blocks into the cache with their hashes; on re-admission it
    matches them again (prompt and generated tokens alike) and prefills only the rest."""
    sched, _ = make_scheduler(
        "vllm", num_blocks=12, block_size=4, prefix_caching="vllm", max_num_batched_tokens=64, max_num_seqs=8
    )
    first, second = req(0, [(1, 16)], output=24), req(1, [(2, 16)], output=24)
    for r in (first, second):
        sched.add(r, 0.0)
    now, readmitted = 0.0, None
    while not (first.is_done and second.is_done):
        plan = sched.schedule(now)
        for r, n, c in zip(plan.requests, plan.num_new, plan.num_context):
            if r is second and second.num_preemptions and readmitted is None and n > 1:
                readmitted = (n, c, second.num_tokens)
        now += 1.0
        sched.commit(plan, now)
        sched.kv.check_invariants()
    assert second.num_preemptions >= 1 and readmitted is not None
    n, context, tokens = readmitted
    assert context > 0 and n + context == tokens  # part of what it had computed was hit, the rest recomputed


def _radix_serve(kv, r) -> int:
    """Admit `r` on its prefix hit, compute the rest of its prompt and finish it; returns the hit."""
    hit = kv.lookup(r)
    r.num_computed_tokens = hit
    assert kv.allocate(r, r.num_prompt_tokens - hit, admitting=True) is not None
    r.num_computed_tokens = r.num_prompt_tokens
    kv.free(r)
    return hit


def _radix_after_a_b_and(touch_a) -> tuple[int, int]:
    """A then B cached (10 pages each of 25), `touch_a(kv)`, then C's 10 pages evict one of them: what A and B
    still hit."""
    from servesim.policies.radix import RadixCache

    kv = RadixCache(num_blocks=25, block_size=1)
    a, b = (100, 10), (200, 10)
    _radix_serve(kv, req(0, [a]))
    _radix_serve(kv, req(1, [b]))
    touch_a(kv)
    _radix_serve(kv, req(3, [(400, 10)]))
    kv.check_invariants()
    return kv.lookup(req(4, [a, (500, 1)])), kv.lookup(req(5, [b, (500, 1)]))


def test_radix_evicts_by_last_use_not_by_first_caching():
    """SGLang evicts the least recently used leaf. A is cached before B but used again after it (by a request
    retracted before its own token, so A stays a leaf), so C evicts B. (The heap kept A's first stamp.)"""

    def reuse_a(kv):
        again = req(2, [(100, 10), (300, 1)])
        again.num_computed_tokens = kv.lookup(again)
        assert again.num_computed_tokens == 10 and kv.allocate(again, 1, admitting=True) is not None
        kv.free(again, keep_uncached=False)

    assert _radix_after_a_b_and(reuse_a) == (10, 0)
    assert _radix_after_a_b_and(lambda kv: None) == (0, 10)  # untouched, A is the older


def test_radix_lookup_of_a_waiting_request_counts_as_a_use():
    """SGLang's match_prefix stamps every node it walks, for a request that only waits too."""
    assert _radix_after_a_b_and(lambda kv: kv.lookup(req(2, [(100, 10), (600, 2)]))) == (10, 0)


def test_above_128_waiting_lpm_keeps_its_last_order_and_newcomers_queue_behind():
    """SGLang's FCFS fallback sorts nothing: the list keeps the last LPM order. The last of 128 arrivals has the
    longest match, so LPM puts it first; a 129th arrival then leaves it first instead of re-sorting by arrival."""
    requests = [req(i, [(100 + i, 20)]) for i in range(LPM_MAX_WAITING + 1)]
    queue = WaitingQueue(
        by_arrival,
        _Matches({i: 64 if i == LPM_MAX_WAITING - 1 else 0 for i in range(LPM_MAX_WAITING + 1)}),
        lpm=True,
    )
    for r in requests[:LPM_MAX_WAITING]:
        queue.push(r)
    queue.prepare()
    assert queue.head().id == LPM_MAX_WAITING - 1
    queue.push(requests[-1])
    queue.prepare()
    order = [queue.pop().id for _ in range(LPM_MAX_WAITING + 1)]
    assert order == [LPM_MAX_WAITING - 1, *range(LPM_MAX_WAITING - 1), LPM_MAX_WAITING]


def test_the_radix_cache_evicts_a_whole_allocation_when_short_as_sglang_does():
    """SGLang's evict_from_tree_cache: with 100 pages free and 300 wanted, it evicts LRU leaves until 300 pages are
    freed, not the 200 short: of nine cached 100-page prompts three go, and 100 pages stay free."""
    from servesim.policies.radix import RadixCache

    kv = RadixCache(num_blocks=1000, block_size=1)
    for i in range(9):
        req = Request(i, 0.0, 100, 1, ((100 + i, 100),))
        kv.allocate(req, 100, admitting=True)
        req.num_computed_tokens = 100
        kv.free(req)
    assert (len(kv._free), kv._evictable_pages) == (100, 900)
    kv.allocate(Request(99, 0.0, 300, 1, ((999, 300),)), 300, admitting=True)
    assert (len(kv._free), kv._evictable_pages) == (100, 600)
    kv.check_invariants()
