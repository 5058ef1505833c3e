"""Prefix caching: the seed's hash-chain and LPM examples, radix vs vLLM granularity, and both caches against
a brute-force longest-cached-prefix reference (hypothesis)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.policies.catalog import orderings, schedulers
from servesim.policies.config import EngineConfig
from servesim.policies.hybrid_blocks import make_kv_manager
from servesim.policies.prefix_blocks import PrefixCachingBlockManager
from servesim.policies.radix import RadixCache
from servesim.policies.step import TokenLog
from servesim.policies.token_ids import request_runs
from tests.policies.helpers import make_scheduler
from servesim.workloads.request import Request, mark_private_prefixes


def req(rid: int, runs, output: int = 1) -> Request:
    return Request(rid, float(rid), sum(n for _, n in runs), output, tuple(runs))


def serve(sched, requests, now: float = 0.0) -> dict[int, int]:
    """Add the requests, run until all finish; return the tokens each one prefilled in its first step."""
    first = {}
    for r in requests:
        sched.add(r, now)
    while any(not r.is_done for r in requests):
        plan = sched.schedule(now)
        for r, n in zip(plan.requests, plan.num_new):
            first.setdefault(r.id, n)
        now += 1
        sched.commit(plan, now)
        sched.kv.check_invariants()
    return first


def test_seed_hash_chain_example():
    """Blocks of 4: r2 = A B D reuses r1 = A B C's first two blocks; r3 = A E C only the first (its C block hashes
    differently because its parent differs)."""
    sched, _ = make_scheduler("vllm", num_blocks=32, block_size=4, prefix_caching="vllm")
    a, b, c, d, e = ((s, 4) for s in range(5))
    assert serve(sched, [req(0, [a, b, c])]) == {0: 12}
    r2, r3 = req(1, [a, b, d]), req(2, [a, e, c])
    assert serve(sched, [r2]) == {1: 4}
    assert serve(sched, [r3]) == {2: 8}
    assert (r2.num_cached_tokens, r3.num_cached_tokens) == (8, 4)


def test_unique_prompts_never_hit_each_other():
    """Regression: CPython hashes -1 and -2 alike, the unique-run ids of requests 0 and 1."""
    sched, _ = make_scheduler("vllm", num_blocks=64, block_size=4, prefix_caching="vllm")
    serve(sched, [Request(0, 0.0, 40, 2)])
    follower = Request(1, 1.0, 40, 2)
    assert serve(sched, [follower]) == {1: 40} and follower.num_cached_tokens == 0


def test_a_fully_cached_prompt_still_computes_its_last_token():
    sched, _ = make_scheduler("vllm", num_blocks=32, block_size=4, prefix_caching="vllm")
    serve(sched, [req(0, [(7, 8)], output=3)])
    assert serve(sched, [req(1, [(7, 8)])]) == {1: 4}  # 8 cached, but only whole blocks before the last token


def test_seed_lpm_example():
    """Tree: A(500) -> few-shot(300) -> q7+answer, and A -> q3+answer. Waiting in arrival order r1..r4 with
    matches 0, 500, 800, 0: LPM admits r3, r2, r1, r4; r3 prefills 30 and r2 40."""
    sched, _ = make_scheduler(
        "vllm",
        num_blocks=10_000,
        block_size=1,
        prefix_caching="radix",
        queue_order="lpm",
        max_num_batched_tokens=4096,
        max_num_seqs=8,
    )
    A, few, q7, q3 = (100, 500), (101, 300), (102, 40), (103, 60)
    serve(sched, [req(0, [A, few, q7], output=20), req(1, [A, q3], output=20)])
    r1, r2, r3, r4 = (
        req(10, [(200, 900)]),
        req(11, [A, (201, 40)]),
        req(12, [A, few, (202, 30)]),
        req(13, [(203, 20)]),
    )
    for r in (r1, r2, r3, r4):
        sched.add(r, 5.0)
    plan = sched.schedule(5.0)
    assert [r.id for r in plan.requests] == [12, 11, 10, 13]
    assert list(plan.num_new) == [30, 40, 900, 20]


def test_lpm_holds_back_requests_sharing_an_uncached_prefix():
    sched, _ = make_scheduler(
        "vllm",
        num_blocks=10_000,
        block_size=1,
        prefix_caching="radix",
        queue_order="lpm",
        max_num_batched_tokens=8192,
        max_num_seqs=8,
    )
    system = (300, 200)
    group = [req(i, [system, (400 + i, 50)]) for i in range(3)]
    for r in group:
        sched.add(r, 0.0)
    plan = sched.schedule(0.0)
    assert [r.id for r in plan.requests][:1] == [0] and list(plan.num_new)[0] == 250
    assert all(n == 250 for n in plan.num_new)  # held back ones still fill the batch after the others
    assert [r.id for r in plan.requests] == [0, 1, 2]


def test_requests_admitted_in_one_step_hit_the_blocks_that_step_computes():
    """vLLM registers a block's hash when it schedules the tokens that fill it: 4 samples of one 64-token prompt
    admitted together prefill it once (64 tokens) and then 16 each (3 blocks of 16 hit; the last is recomputed)."""
    sched, _ = make_scheduler(
        "vllm", num_blocks=64, block_size=16, prefix_caching="vllm", max_num_batched_tokens=1024
    )
    samples = [req(i, [(9, 64)], output=3) for i in range(4)]
    for r in samples:
        sched.add(r, 0.0)
    plan = sched.schedule(0.0)
    assert list(plan.num_new) == [64, 16, 16, 16] and list(plan.num_context) == [0, 48, 48, 48]
    assert [r.num_cached_tokens for r in samples] == [0, 48, 48, 48]
    # the prompt's 4 blocks, shared, plus each sample's own last one
    assert sched.kv.num_used_blocks == 4 + 3 * 1
    sched.commit(plan, 1.0)
    sched.kv.check_invariants()


def test_radix_hits_only_what_earlier_steps_computed():
    """SGLang inserts into the radix tree after a forward pass, so requests batched together do not share."""
    sched, _ = make_scheduler(
        "vllm", num_blocks=1024, block_size=1, prefix_caching="radix", max_num_batched_tokens=1024
    )
    samples = [req(i, [(9, 64)], output=3) for i in range(4)]
    for r in samples:
        sched.add(r, 0.0)
    assert list(sched.schedule(0.0).num_new) == [64] * 4


def test_blocks_registered_for_a_step_are_forgotten_when_their_request_is_preempted_in_it():
    """Blocks scheduled to be filled but never computed (the request preempted in that step) must not be hit;
    blocks it really computed before stay cached."""
    kv = PrefixCachingBlockManager(num_blocks=16, block_size=4)
    a = req(0, [(5, 16)])
    a.num_computed_tokens = 8  # two blocks computed in earlier steps
    kv.allocate(a, 8)  # room for all four
    kv.cache(a)
    kv.cache_scheduled(a, 16)  # this step would fill the last two
    b = req(1, [(5, 16)])
    assert kv.lookup(b) == 12  # registered blocks are findable at once (never the last token)
    kv.free(a)  # preempted before the step ran: tokens 8..15 were never computed
    assert kv.lookup(b) == 8
    kv.check_invariants()


def test_radix_reuses_unaligned_prefixes_vllm_only_whole_blocks():
    for prefix_len, vllm_hit, radix_hit in [(500, 496, 500), (512, 512, 512)]:
        hits = {}
        for kind, size in (("vllm", 16), ("radix", 1)):
            pages = 4096 if size == 16 else 65536
            sched, _ = make_scheduler("vllm", num_blocks=pages, block_size=size, prefix_caching=kind)
            serve(sched, [req(0, [(1, prefix_len), (2, 100)])])
            follower = req(1, [(1, prefix_len), (3, 100)])
            serve(sched, [follower])
            hits[kind] = follower.num_cached_tokens
        assert hits == {"vllm": vllm_hit, "radix": radix_hit}


# ---- brute force ------------------------------------------------------------------------------------


def tokens_of(r: Request) -> list[tuple[int, int]]:
    return [(seg, k) for seg, n in request_runs(r) for k in range(n)]


def common(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


segments = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 12)), min_size=1, max_size=4)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(st.tuples(segments, st.integers(1, 6)), min_size=1, max_size=10),
    kind=st.sampled_from(["vllm", "radix"]),
    block_size=st.sampled_from([1, 2, 4]),
    tight=st.booleans(),
)
def test_cache_hits_match_brute_force_longest_cached_prefix(prompts, kind, block_size, tight):
    """Requests run one after another. With room for everything, every lookup equals the longest prefix shared with
    any earlier request (capped below the last token, whole blocks for vllm); with a tight pool, never more."""
    size = block_size if kind == "vllm" else 1
    page = block_size if kind == "radix" else 1
    unit = size if kind == "vllm" else page
    total = sum(sum(n for _, n in runs) + out for runs, out in prompts)
    pages = (
        (-(-total // unit) + 8)
        if not tight
        else max(-(-max(sum(n for _, n in r) + o for r, o in prompts) // unit) + 2, 2)
    )
    cls = PrefixCachingBlockManager if kind == "vllm" else RadixCache
    sched, _ = make_scheduler("vllm", num_blocks=pages, block_size=unit, prefix_caching=kind, max_num_seqs=1)
    assert isinstance(sched.kv, cls)
    history: list[list] = []
    for i, (runs, out) in enumerate(prompts):
        r = req(i, [(seg, n) for seg, n in runs], output=out)
        expected = max((common(tokens_of(r), h) for h in history), default=0)
        expected = min(expected, r.num_prompt_tokens - 1)
        expected -= expected % unit
        got = sched.kv.lookup(r)
        assert got <= expected if tight else got == expected
        serve(sched, [r], now=float(i * 1000))
        history.append(tokens_of(r)[: r.num_prompt_tokens + r.num_output_tokens - 1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(st.tuples(segments, st.integers(1, 6)), min_size=1, max_size=10),
    block_size=st.sampled_from([1, 2, 4]),
)
def test_same_step_hits_match_brute_force_over_requests_admitted_before(prompts, block_size):
    """All requests arrive at once and fit one step: each one's hit is the longest prefix it shares with any
    request admitted before it in that step (capped below its last token, whole blocks)."""
    total = sum(sum(n for _, n in runs) + out for runs, out in prompts)
    sched, _ = make_scheduler(
        "vllm",
        num_blocks=-(-total // block_size) + 8,
        block_size=block_size,
        prefix_caching="vllm",
        max_num_seqs=len(prompts),
        max_num_batched_tokens=total + 1,
    )
    requests = [req(i, list(runs), output=out) for i, (runs, out) in enumerate(prompts)]
    for r in requests:
        sched.add(r, 0.0)
    plan = sched.schedule(0.0)
    assert [r.id for r in plan.requests] == [r.id for r in requests]
    for i, r in enumerate(requests):
        expected = max((common(tokens_of(r), tokens_of(e)) for e in requests[:i]), default=0)
        expected = min(expected, r.num_prompt_tokens - 1)
        assert r.num_cached_tokens == expected - expected % block_size
        assert plan.num_new[i] == r.num_prompt_tokens - r.num_cached_tokens
    sched.commit(plan, 1.0)
    sched.kv.check_invariants()


def _second_request_prefill(method: str, windows=(None,)) -> int:
    """Tokens the second of two 80-token prompts sharing 64 (four 16-token blocks) prefills, under `method`."""
    from servesim.policies.config import EngineConfig
    from servesim.policies.hybrid_blocks import make_kv_manager
    from servesim.policies.catalog import orderings, schedulers
    from servesim.policies.step import TokenLog

    cfg = EngineConfig(
        prefix_caching="vllm",
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=4096,
        async_scheduling=False,
        speculative={"method": method, "k": 2, "acceptance": 0.5},
    )
    kv = make_kv_manager(cfg, 64, 16, windows)
    sched = schedulers.get("vllm")(kv, cfg, orderings.get("fcfs"), TokenLog(), 0)
    serve(sched, [req(0, [(7, 64), (8, 16)], output=3)])
    return serve(sched, [req(1, [(7, 64), (9, 16)], output=3)], now=100.0)[1]


def test_eagle_and_mtp_prefix_hits_give_up_their_last_block():
    """vLLM's find_longest_cache_hit pops the last hit block under use_eagle: the draft heads need the hidden
    states of the last cached token, so that block is computed again (48 of 64 shared tokens hit, not 64)."""
    assert _second_request_prefill("ngram") == 16
    assert _second_request_prefill("eagle") == _second_request_prefill("mtp") == 32
    # hybrid groups: a sliding group needs one more block of its window run first, then the last goes too
    assert _second_request_prefill("ngram", (None, 32)) == 16
    assert _second_request_prefill("eagle", (None, 32)) == 32


def test_a_request_wanting_prompt_logprobs_reads_nothing_from_the_cache():
    """vLLM skips reading the prefix cache for a request with prompt logprobs (every prompt token's logits are
    needed): it prefills all 12 tokens of A B C though all but its last block are cached; it still registers."""
    for windows in ((None,), (None, 8)):
        cfg = EngineConfig(prefix_caching="vllm", max_num_seqs=8, max_num_batched_tokens=64)
        sched = schedulers.get("vllm")(
            make_kv_manager(cfg, 64, 4, windows), cfg, orderings.get("fcfs"), TokenLog()
        )
        a, b, c = ((s, 4) for s in range(3))
        serve(sched, [req(0, [a, b, c])])
        wants = Request(1, 1.0, 12, 1, (a, b, c), prompt_logprobs=True)
        assert serve(sched, [wants]) == {1: 12} and wants.num_cached_tokens == 0
        assert serve(sched, [req(2, [a, b, c])]) == {2: 4}


def test_a_private_request_is_hashed_when_preempted_and_comes_back_to_its_own_blocks():
    """Two unique prompts of 10 blocks in a pool of 22: B is preempted at a decode's block boundary, then readmitted
    onto its own cached blocks. Hashing only what can be hit (private requests, at the preemption) gives the
    same steps as hashing every block as it fills."""

    def run(private: bool) -> list[tuple]:
        sched, _ = make_scheduler("vllm", num_blocks=22, block_size=4, prefix_caching="vllm")
        a, b = Request(0, 0.0, 40, 12), Request(1, 0.0, 40, 12)
        if private:
            mark_private_prefixes([a, b])
        assert (a.private_prefix, b.private_prefix) == (private, private)
        steps, now = [], 0.0
        for r in (a, b):
            sched.add(r, now)
        while not (a.is_done and b.is_done):
            plan = sched.schedule(now)
            steps.append(tuple((r.id, n) for r, n in zip(plan.requests, plan.num_new)))
            now += 1
            sched.commit(plan, now)
            sched.kv.check_invariants()
        assert b.num_preemptions == 1
        return steps

    lazy = run(True)
    assert lazy == run(False)
    # back after the preemption: its 44 tokens less the 35 its own cached blocks hold
    assert ((1, 9),) in lazy
