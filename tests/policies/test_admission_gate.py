"""vLLM's full-prompt admission gate (`scheduler_reserve_full_isl`, on by default since 0.19): a waiting request is
admitted only if the free pool could hold its whole prompt, so a long prompt cannot get in on one chunk's blocks,
drain the pool halfway through its prefill and be preempted to start again."""

import pytest

from servesim.policies.hybrid_blocks import HybridBlockManager
from servesim.policies.kv_blocks import BlockManager
from servesim.policies.prefix_blocks import PrefixCachingBlockManager
from tests.policies.helpers import drive, make_requests, make_scheduler
from servesim.workloads.request import Request


def two_long_prompts(gate: bool):
    """10 blocks of 4 tokens, 8 tokens a step: A (24 + 4 tokens, 7 blocks at its end) then B (20 + 2, 6 blocks)."""
    sched, _ = make_scheduler(
        "vllm",
        num_blocks=10,
        block_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        scheduler_reserve_full_isl=gate,
    )
    requests = make_requests([24, 20], [4, 2])
    return drive(sched, requests), requests


def test_without_the_gate_the_second_prompt_gets_in_on_a_chunk_and_is_preempted():
    steps, (a, b) = two_long_prompts(gate=False)
    assert steps[3].batch == [0, 1] and steps[3].num_new == [1, 7]  # 7 + 2 blocks of 10: B's first chunk fits
    assert any(s.preempted == [1] for s in steps) and b.num_preemptions >= 1


def test_with_the_gate_the_second_prompt_waits_for_room_for_all_of_it():
    steps, (a, b) = two_long_prompts(gate=True)
    # A holds 6 blocks after its prefill and 7 with its 25th token: 3 free < B's 5 until A finishes (step 5)
    assert [s.batch for s in steps[:6]] == [[0], [0], [0], [0], [0], [0]]
    assert steps[6].batch == [1] and steps[6].num_new == [8]
    assert not any(s.preempted for s in steps) and a.num_preemptions == b.num_preemptions == 0


def test_the_gate_counts_the_whole_prompt_less_held_blocks_and_keeps_the_watermark():
    marked = BlockManager(num_blocks=10, block_size=4, watermark=0.2)  # 2 blocks kept back at admission
    req = Request(0, 0.0, 40, 4)
    assert marked.fits_whole(req, 32, step_tokens=8) and not marked.fits_whole(req, 33, step_tokens=8)
    kv = BlockManager(num_blocks=10, block_size=4)
    kv.allocate(req, 8)  # 2 blocks held, 8 free
    assert kv.fits_whole(req, 40, step_tokens=8) and not kv.fits_whole(req, 41, step_tokens=8)


def test_cached_blocks_in_use_cost_nothing_and_evictable_ones_count_as_taken():
    kv = PrefixCachingBlockManager(num_blocks=10, block_size=4)
    first = Request(0, 0.0, 16, 2, ((7, 16),))  # 4 blocks of a shared run
    kv.allocate(first, 16)
    kv.cache_scheduled(first, 16)
    follower = Request(1, 1.0, 32, 2, ((7, 16), (-2, 16)))  # the same 16 tokens, then 16 of its own
    follower.num_computed_tokens = kv.lookup(follower)
    assert follower.num_computed_tokens == 16
    assert kv.fits_whole(follower, 32, 8)  # 4 new blocks of 6 free: the 4 hit blocks are first's, in use
    assert not kv.fits_whole(follower, 44, 8)  # 7 new blocks
    kv.free(first)  # its 4 blocks stay cached but evictable: taking them empties the pool by as many
    assert kv.num_free_blocks == 10
    assert kv.fits_whole(follower, 40, 8) and not kv.fits_whole(follower, 44, 8)  # 6 new + 4 evictable <= 10


@pytest.mark.parametrize("step_tokens, fits_in", [(8, 15), (16, 17)])
def test_a_sliding_group_needs_only_its_window_plus_one_steps_tokens(step_tokens, fits_in):
    """Full group: 40 tokens are 10 blocks of 4; window 8: cdiv(8 - 1 + step_tokens, 4) + 1 blocks (5, then 7)."""
    req = Request(0, 0.0, 40, 2)
    for num_blocks in (fits_in - 1, fits_in):
        kv = HybridBlockManager(num_blocks=num_blocks, block_size=4, windows=(None, 8))
        assert kv.fits_whole(req, 40, step_tokens) is (num_blocks == fits_in)


def test_the_watermark_holds_back_admissions_only_while_another_request_runs():
    """vLLM applies it only when something is scheduled: a prompt needing the whole pool still gets in alone."""
    sched, _ = make_scheduler(
        "vllm", num_blocks=10, block_size=4, max_num_batched_tokens=8, max_num_seqs=4, watermark=0.2
    )
    alone = make_requests([40], [1])
    assert drive(sched, alone)[0].num_new == [8]  # 10 blocks + the watermark's 2 > 10, but nothing else runs
    sched, _ = make_scheduler(
        "vllm", num_blocks=10, block_size=4, max_num_batched_tokens=8, max_num_seqs=4, watermark=0.2
    )
    pair = make_requests([4, 32], [3, 1])
    steps = drive(sched, pair)
    # beside the first (1 block, then 2), the second's 8 blocks + 2 kept free exceed the 9 or 8 left: it waits
    assert [s.batch for s in steps[:4]] == [[0], [0], [0], [1]]


def test_a_failed_check_leaves_no_stale_hit_behind():
    """Radix: the path a failed gate check matched must not count against a later plain allocation. vLLM-style
    cache: a hit recorded by a failed check must not skip registering the blocks of a later zero-hit admission."""
    from servesim.policies.radix import RadixCache

    kv = RadixCache(num_blocks=10, block_size=1)
    seed = Request(0, 0.0, 4, 1, ((7, 4),))
    kv.allocate(seed, 4)
    seed.num_computed_tokens = 4
    kv.free(seed)  # 4 pages cached, unlocked
    runner = Request(1, 0.0, 2, 10)
    kv.allocate(runner, 2)
    runner.num_computed_tokens = 2
    big = Request(2, 0.0, 20, 1, ((7, 4), (-9, 16)))
    big.num_computed_tokens = kv.lookup(big)
    assert big.num_computed_tokens == 4 and not kv.fits_whole(big, big.num_tokens, 8, watermark=False)
    big.num_computed_tokens = 0
    assert kv.num_free_blocks == 8 and kv.allocate(runner, 8) is not None  # 4 free + 4 evictable

    kv = PrefixCachingBlockManager(num_blocks=12, block_size=4)
    first = Request(0, 0.0, 16, 1, ((7, 16),))
    kv.allocate(first, 16)
    kv.cache_scheduled(first, 16)
    first.num_computed_tokens = 16
    kv.free(first)
    late = Request(1, 0.0, 60, 1, ((7, 16), (-5, 44)))
    late.num_computed_tokens = kv.lookup(late)
    assert late.num_computed_tokens == 16 and not kv.fits_whole(late, late.num_tokens, 8, watermark=False)
    late.num_computed_tokens = 0
    evictor = Request(2, 0.0, 48, 1)
    kv.allocate(evictor, 48)  # takes every block: the cached prefix is gone
    kv.free(evictor)
    assert kv.lookup(late) == 0
    kv.allocate(late, 8, admitting=True)
    kv.cache_scheduled(late, 8)
    follower = Request(3, 0.0, 12, 1, ((7, 8), (-7, 4)))  # shares late's first 8 tokens: 2 registered blocks
    assert kv.lookup(follower) == 8
