"""Scheduler behaviour against the seed's numbers, and invariants over random workloads (hypothesis)."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.policies.token_budget import max_blocks_of
from tests.policies.helpers import assert_every_token_served, drive, make_requests, make_scheduler
from servesim.workloads.request import Request

PROMPTS, WANTED = [5, 2, 7, 3, 4], [3, 8, 2, 6, 4]


def test_static_batching_pads_to_7_and_holds_finished_slots():
    sched, _ = make_scheduler("static", num_blocks=100, block_size=4, max_num_seqs=5)
    requests = make_requests(PROMPTS, WANTED)
    steps = drive(sched, requests)
    assert len(steps) == 8  # 1 padded prefill + 7 decodes for the longest (8 tokens)
    assert steps[0].num_new == [7] * 5  # every prompt padded to 7
    assert all(s.batch == [0, 1, 2, 3, 4] for s in steps)
    assert requests[2].finish_s == 2.0  # done at step 2 ...
    assert sum(2 in s.batch for s in steps[2:]) == 6  # ... yet computes in the 6 steps after


def test_continuous_batching_frees_a_finished_slot_at_once():
    sched, _ = make_scheduler("vllm", num_blocks=100, block_size=4, max_num_seqs=3)
    requests = make_requests(PROMPTS, WANTED)
    steps = drive(sched, requests)
    assert requests[2].finish_s == 2.0
    assert 2 not in steps[2].batch and 3 in steps[2].batch  # r3 takes r2's slot in the very next step


def test_async_scheduling_frees_a_finished_slot_one_step_late():
    """vLLM plans step 2 while step 1 runs: r0 finishes in step 1 (its second token), so its slot is still taken
    when step 2 is planned and r2 gets in at step 3; synchronously it takes the slot in step 2."""
    steps = {}
    for ahead in (False, True):
        sched, _ = make_scheduler(
            "vllm", num_blocks=100, block_size=4, max_num_seqs=2, async_scheduling=ahead
        )
        requests = make_requests([4, 4, 4], [2, 8, 3])
        steps[ahead] = drive(sched, requests)
        assert requests[0].finish_s == 2.0
    assert [s.batch for s in steps[False][:3]] == [[0, 1], [0, 1], [1, 2]]
    assert [s.batch for s in steps[True][:4]] == [[0, 1], [0, 1], [1], [1, 2]]


def test_async_scheduling_sees_an_arrival_one_step_late():
    """r1 arrives at 1.5, while step 1 (scheduled at 1) runs. Step 2, planned at 2, was planned in vLLM as step
    1 started, before r1 came: r1's prefill is step 3 (first token at 4), not step 2 (first token at 3)."""
    first_token = {}
    for ahead in (False, True):
        sched, _ = make_scheduler("vllm", num_blocks=100, block_size=4, async_scheduling=ahead)
        requests = make_requests([4, 4], [10, 3])
        steps = drive(sched, requests, arrivals=[0.0, 1.5])
        first_token[ahead] = requests[1].first_token_s
        assert steps[0].batch == [0]
    assert first_token == {False: 3.0, True: 4.0}


def test_async_scheduling_plans_again_when_nothing_else_could_run():
    """One slot: r0's finish leaves nothing to run in the step planned ahead, so vLLM waits for r0's outputs and
    plans again; r1 starts at once, as it does synchronously."""
    for ahead in (False, True):
        sched, _ = make_scheduler(
            "vllm", num_blocks=100, block_size=4, max_num_seqs=1, async_scheduling=ahead
        )
        requests = make_requests([4, 4], [2, 2])
        steps = drive(sched, requests)
        assert [s.batch for s in steps] == [[0], [0], [1], [1]]


def test_async_scheduling_preempts_a_finished_request_before_a_running_one():
    """3 blocks of 4 tokens: r0 (7 + 5) and r1 (3 + 2). r1 finishes in step 2; planned ahead, step 3 finds r0 in
    need of a third block and none free. vLLM's running list still holds r1, last, so preemption pops r1 (its
    block comes back, nothing is recomputed) and r0 decodes on, as it does synchronously."""
    for ahead in (False, True):
        sched, _ = make_scheduler("vllm", num_blocks=3, block_size=4, async_scheduling=ahead)
        requests = make_requests([7, 3], [5, 2])
        steps = drive(sched, requests)
        assert [(s.batch, s.num_new) for s in steps[:3]] == [([0, 1], [7, 3]), ([0, 1], [1, 1]), ([0], [1])]
        assert not any(s.preempted for s in steps) and requests[0].num_preemptions == 0
        assert requests[1].finish_s == 2.0


def test_chunked_prefill_bounds_the_decode_stall():
    sched, _ = make_scheduler(
        "vllm", num_blocks=10_000, block_size=16, max_num_seqs=64, max_num_batched_tokens=512
    )
    decoders = make_requests([10] * 50, [100] * 50)
    for req in decoders:
        sched.add(req, 0.0)
    plan = sched.schedule(0.0)  # all 50 prefill together (500 tokens)
    sched.commit(plan, 1.0)
    long = make_requests([8000], [5])[0]
    long.id = 99
    sched.add(long, 1.0)
    prompt_chunks = []
    for step in range(30):
        plan = sched.schedule(2.0 + step)
        tokens = dict(zip((r.id for r in plan.requests), plan.num_new))
        assert all(tokens.get(r.id) == 1 for r in decoders), "a decode skipped a step"
        if long.num_computed_tokens < 8000:
            prompt_chunks.append(tokens[99])
        sched.commit(plan, 3.0 + step)
    assert prompt_chunks[:17] == [462] * 17  # 512 budget - 50 decodes
    assert len(prompt_chunks) == math.ceil(8000 / 462) == 18
    assert sum(prompt_chunks) == 8000


def test_long_prefill_token_threshold_lets_long_prompts_advance_side_by_side():
    """Threshold 1000, budget 8192: prompts of 3000 and 2500 each take 1000 a step (not 3000 + 2500 at once),
    and the short one behind them its whole 300 in the first step."""
    sched, _ = make_scheduler("vllm", num_blocks=1000, block_size=16, long_prefill_token_threshold=1000)
    steps = drive(sched, make_requests([3000, 2500, 300], [2, 2, 2]))
    assert [s.num_new for s in steps] == [[1000, 1000, 300], [1000, 1000, 1], [1000, 500], [1, 1]]
    # the threshold caps chunks only
    unchunked, _ = make_scheduler(
        "vllm",
        num_blocks=1000,
        block_size=16,
        long_prefill_token_threshold=1000,
        enable_chunked_prefill=False,
    )
    assert drive(unchunked, make_requests([3000], [2]))[0].num_new == [3000]


def test_without_chunked_prefill_a_long_prompt_waits_for_the_budget():
    sched, _ = make_scheduler(
        "vllm",
        num_blocks=1000,
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        enable_chunked_prefill=False,
    )
    requests = make_requests([1000, 1500], [3, 3])
    steps = drive(sched, requests)
    assert steps[0].num_new == [1000]  # 1000 + 1500 > 2048: the second waits a step, whole
    assert steps[1].num_new == [1, 1500]


def test_recompute_preempts_the_newest_first():
    sched, _ = make_scheduler("vllm", num_blocks=6, block_size=4, max_num_seqs=3)
    requests = make_requests([8, 4, 4], [6, 6, 6])  # 2 + 1 + 1 blocks at admission, all grow
    steps = drive(sched, requests)
    first = next(s for s in steps if s.preempted)
    assert first.preempted == [2]  # the most recently admitted goes first
    assert all(r.num_generated == 6 for r in requests)


def test_swap_preemption_keeps_computed_tokens():
    sched, _ = make_scheduler(
        "vllm", num_blocks=6, block_size=4, max_num_seqs=3, preemption_mode="swap", host_blocks=100
    )
    requests = make_requests([8, 4, 4], [6, 6, 6])
    plans = []
    for req in requests:
        sched.add(req, 0.0)
    now = 0.0
    while any(not r.is_done for r in requests):
        plan = sched.schedule(now)
        plans.append(plan)
        now += 1
        sched.commit(plan, now)
        sched.kv.check_invariants()
    assert sum(p.swap_out_blocks for p in plans) == sum(p.swap_in_blocks for p in plans) > 0
    assert all(r.num_generated == 6 for r in requests)
    # swapped requests resume where they were: every token is computed exactly once (the last is never fed back)
    assert sum(sum(p.num_new) for p in plans) == sum(
        r.num_prompt_tokens + r.num_output_tokens - 1 for r in requests
    )


def test_orca_reserves_the_whole_output_and_never_preempts():
    sched, _ = make_scheduler("orca", num_blocks=12, block_size=4, max_num_seqs=3)
    requests = make_requests(PROMPTS, WANTED)
    steps = drive(sched, requests)
    assert not any(s.preempted for s in steps)
    assert steps[0].tables[0] == [0, 1]  # 5 prompt + 3 out - 1 = 7 tokens reserved: 2 blocks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scheduler=st.sampled_from(["vllm", "sarathi", "orca", "static", "seed_toy"]),
    lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30)), min_size=1, max_size=12),
    block_size=st.sampled_from([1, 4, 16]),
    spare_blocks=st.integers(0, 20),
    max_num_seqs=st.integers(1, 8),
    budget=st.integers(64, 256),
    chunked=st.booleans(),
    swap=st.booleans(),
    order=st.sampled_from(["fcfs", "sjf"]),
    gate=st.booleans(),
    threshold=st.sampled_from([0, 8, 40]),
    ahead=st.booleans(),
    gap=st.sampled_from([0.0, 0.5, 1.5]),
)
def test_every_request_finishes_with_no_block_leaked(
    scheduler,
    lengths,
    block_size,
    spare_blocks,
    max_num_seqs,
    budget,
    chunked,
    swap,
    order,
    gate,
    threshold,
    ahead,
    gap,
):
    """`ahead`: vLLM's async scheduling (the vllm scheduler only); `gap`: seconds between arrivals (steps: 1 s)."""
    requests = make_requests([p for p, _ in lengths], [o for _, o in lengths])
    biggest = max(max_blocks_of(r, block_size) for r in requests)
    if scheduler == "static":  # a padded batch of one must fit
        biggest = -(-(max(p for p, _ in lengths) + max(o for _, o in lengths)) // block_size)
    if scheduler == "seed_toy":  # the toy admits with room for one more token
        biggest += 1
    budget = max(budget, max(p + o for p, o in lengths)) if not chunked else budget
    sched, log = make_scheduler(
        scheduler,
        num_blocks=biggest + spare_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        chunk_size=max(16, budget // 4),
        preemption_mode="swap" if swap else "recompute",
        host_blocks=8,
        queue_order=order,
        scheduler_reserve_full_isl=gate,
        long_prefill_token_threshold=threshold,
        async_scheduling=ahead and scheduler == "vllm",
    )
    # checks invariants after
    steps = drive(sched, requests, arrivals=[i * gap for i in range(len(requests))])
    # every step and that every block came back
    assert_every_token_served(requests, log)
    assert all(s.free_blocks >= 0 for s in steps)


def test_a_running_request_preempting_itself_ends_the_running_pass():
    """Priority order: A (priority 5, admitted first) needs a block with none free and is itself the lowest
    priority; vLLM then stops scheduling running requests, so B (priority 0, after A in the batch) waits a step."""
    sched, _ = make_scheduler(
        "vllm", num_blocks=4, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, queue_order="priority"
    )
    a, b = Request(0, 0.0, 4, 8, priority=5), Request(1, 0.0, 4, 8, priority=0)
    sched.add(a, 0.0)
    plans, now = [], 0.0
    while not (a.is_done and b.is_done):
        plans.append(sched.schedule(now))
        if len(plans) == 1:
            sched.add(b, now)  # arrives after A's prefill was scheduled
        now += 1.0
        sched.commit(plans[-1], now)
        sched.kv.check_invariants()
    # A's 9th token (step 5) opens its third block: the pool (A 2 + B 2 blocks) is full
    assert [r.id for r in plans[4].requests] == [0, 1]
    assert plans[5].preempted == (a,) and plans[5].requests == ()
    assert [r.id for r in plans[6].requests][0] == 1
