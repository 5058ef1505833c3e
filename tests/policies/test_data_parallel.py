"""A DP-attention group's ranks: where requests go, one plan of every rank's, and each rank keeping to its own limits."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.policies.config import EngineConfig
from servesim.policies.families import SGLANG_MAX_RUNNING
from servesim.policies.data_parallel import (
    DataParallelRanks,
    VllmBalancer,
    data_parallel_share,
    merge,
    round_robin,
)
from servesim.policies.step import StepPlan
from servesim.policies.token_budget import max_blocks_of
from tests.policies.helpers import assert_every_token_served, drive, make_requests, make_scheduler


def _group(name: str, ranks: int, pick, **knobs):
    log = None
    members = []
    for _ in range(ranks):
        sched, rank_log = make_scheduler(name, **knobs)
        if log is not None:
            sched.log = log  # one token log for the group, as the simulator keeps
        log = log or rank_log
        members.append(sched)
    return DataParallelRanks(members, pick), log


def test_vllm_sends_a_request_to_the_rank_with_the_lowest_four_times_waiting_plus_running():
    """vLLM's DP load balancer scores a rank 4 x waiting + running and takes the lowest, the first of equals."""
    group, _ = _group("vllm", 3, VllmBalancer(), num_blocks=100, block_size=4, async_scheduling=False)
    requests = make_requests([8] * 6, [4] * 6)
    for req in requests[:3]:
        group.add(req, 0.0)
    assert [r.extra["dp_rank"] for r in requests[:3]] == [0, 1, 2]  # empty ranks: the first, then the next
    group.commit(group.schedule(0.0), 1.0)  # each rank runs its request: running 1, waiting 0
    group.add(requests[3], 1.0)  # scores 1, 1, 1: rank 0
    group.add(requests[4], 1.0)  # rank 0 now scores 1 + 4: rank 1
    assert (requests[3].extra["dp_rank"], requests[4].extra["dp_rank"]) == (0, 1)
    group.commit(group.schedule(1.0), 2.0)  # ranks 0 and 1 run 2 each, rank 2 runs 1
    group.add(requests[5], 2.0)
    assert requests[5].extra["dp_rank"] == 2


def test_vllms_balancer_sees_the_counts_of_the_last_100_ms_tick_and_its_own_sends():
    """The coordinator publishes the ranks' counts every 100 ms; between two, the balancer counts each request it
    sent as one more waiting. A one-token request on rank 0 finishes at 0.05 s: a request at 0.06 s still sees rank
    0 with one waiting (score 4) and goes to rank 1; one at 0.1 s sees the new counts (both ranks idle): rank 0."""
    group, _ = _group("vllm", 2, VllmBalancer(), num_blocks=100, block_size=4, async_scheduling=False)
    first, second, third = make_requests([8] * 3, [1, 4, 4])
    group.add(first, 0.0)
    assert group.commit(group.schedule(0.0), 0.05) == [first]  # rank 0 is idle again
    group.add(second, 0.06)
    group.add(third, 0.1)
    assert [r.extra["dp_rank"] for r in (first, second, third)] == [0, 1, 0]


def test_sglang_sends_requests_to_its_ranks_in_turn():
    group, _ = _group("sglang", 3, round_robin, num_blocks=100, block_size=4)
    requests = make_requests([8] * 7, [4] * 7)
    for req in requests:
        group.add(req, 0.0)
    assert [r.extra["dp_rank"] for r in requests] == [0, 1, 2, 0, 1, 2, 0]


def test_one_step_is_every_ranks_plan_each_request_labelled_with_its_rank():
    a, b = make_requests([5, 6], [2, 2])
    (c,) = make_requests([7], [2])
    first = StepPlan((a, b), (5, 1), (0, 9), (True, True), num_draft=(0, 0))
    second = StepPlan((c,), (3,), (4,), (False,), preempted=(a,), swap_out_blocks=2)
    idle = StepPlan((), (), (), ())
    plan = merge([first, idle, second])
    assert plan.requests == (a, b, c) and plan.num_new == (5, 1, 3) and plan.num_context == (0, 9, 4)
    assert plan.rank == (0, 0, 2) and plan.preempted == (a,) and plan.swap_out_blocks == 2
    assert plan.num_draft == (0, 0, 0)  # a rank that does not draft this step guesses nothing
    assert plan.fed_to_draft == ()  # no rank runs a draft model
    assert list(plan.batch().rank) == [0, 0, 2]
    assert plan.rank_swap_blocks == 2  # the most one rank moves over its own PCIe link
    assert merge([idle, idle]).is_empty


def test_the_groups_kv_usage_is_its_fullest_ranks():
    """A rank preempts when its own pool runs dry: the group reads as full as its fullest rank, its blocks summed."""
    group, _ = _group("vllm", 2, VllmBalancer(), num_blocks=10, block_size=4, async_scheduling=False)
    (req,) = make_requests([24], [4])
    group.add(req, 0.0)
    group.schedule(0.0)  # 6 of rank 0's 10 blocks; rank 1 holds none
    assert group.kv.num_used_blocks == 6 and group.kv.num_blocks == 20
    assert group.kv.usage == 0.6


def test_a_plan_that_only_preempted_commits_nothing():
    group, _ = _group("vllm", 2, VllmBalancer(), num_blocks=100, block_size=4)
    (a,) = make_requests([5], [2])
    only_preempted = merge([StepPlan((), (), (), (), preempted=(a,)), StepPlan((), (), (), ())])
    assert group.schedule(0.0).is_empty and group.commit(only_preempted, 1.0) == []


def test_a_ranks_share_of_the_groups_limits():
    vllm = EngineConfig(max_num_batched_tokens=8192 * 8, max_num_seqs=1024 * 8)
    assert data_parallel_share(vllm, 8).max_num_batched_tokens == 8192
    assert data_parallel_share(vllm, 8).max_num_seqs == 1024
    assert data_parallel_share(vllm, 1) is vllm
    sglang = EngineConfig(scheduler="sglang", max_num_batched_tokens=16384, max_num_seqs=SGLANG_MAX_RUNNING)
    share = data_parallel_share(sglang, 4)
    assert share.max_num_batched_tokens == 4096
    assert share.max_num_seqs == SGLANG_MAX_RUNNING  # each rank derives its default from its own pool
    # vLLM's launch command gives each rank the share rounded up; SGLang divides the group's itself, rounding down
    odd = {"max_num_batched_tokens": 16385, "max_num_seqs": 102}
    assert data_parallel_share(EngineConfig(**odd), 4).max_num_batched_tokens == 4097
    assert data_parallel_share(EngineConfig(**odd), 4).max_num_seqs == 26
    assert data_parallel_share(EngineConfig(scheduler="sglang", **odd), 4).max_num_batched_tokens == 4096
    assert data_parallel_share(EngineConfig(scheduler="sglang", **odd), 4).max_num_seqs == 25


@given(
    scheduler=st.sampled_from(["vllm", "sglang"]),
    ranks=st.integers(2, 4),
    lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 20)), min_size=1, max_size=14),
    block_size=st.sampled_from([1, 4, 16]),
    spare_blocks=st.integers(0, 12),
    max_num_seqs=st.integers(1, 4),
    budget=st.integers(16, 96),
    ahead=st.booleans(),
    gap=st.sampled_from([0.0, 0.5, 1.5]),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_request_finishes_on_the_rank_it_was_sent_to_within_that_ranks_limits(
    scheduler, ranks, lengths, block_size, spare_blocks, max_num_seqs, budget, ahead, gap
):
    """Each rank has its own budget, slots and pool: no step gives a rank more tokens or requests than its own
    limits, a request never moves, no rank's pool runs over, and every block comes back."""
    requests = make_requests([p for p, _ in lengths], [o for _, o in lengths])
    biggest = max(max_blocks_of(r, block_size) for r in requests)
    pick = round_robin if scheduler == "sglang" else VllmBalancer()
    knobs = {"async_scheduling": ahead} if scheduler == "vllm" else {}
    group, log = _group(
        scheduler,
        ranks,
        pick,
        num_blocks=biggest + spare_blocks + 1,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        **knobs,
    )
    plans: list[StepPlan] = []
    schedule = group.schedule

    def recorded(now: float) -> StepPlan:
        plan = schedule(now)
        plans.append(plan)
        return plan

    group.schedule = recorded
    # checks every rank's pool each step
    drive(group, requests, arrivals=[i * gap for i in range(len(requests))])
    assert_every_token_served(requests, log)
    for plan in plans:
        assert all(rank == req.extra["dp_rank"] for rank, req in zip(plan.rank, plan.requests))
        for rank in range(ranks):
            mine = [n for n, r in zip(plan.num_new, plan.rank) if r == rank]
            assert sum(mine) <= budget and len(mine) <= max_num_seqs
    assert all(pool.num_free_blocks == pool.num_blocks for pool in group.kv.pools)
    if scheduler == "sglang":
        assert [r.extra["dp_rank"] for r in sorted(requests, key=lambda r: r.id)] == [
            i % ranks for i in range(len(requests))
        ]
