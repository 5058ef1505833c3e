"""The seed's toy engine, step by step: 5 requests, 3 slots, 10 blocks of 4 tokens (and 4 blocks, with preemption)."""

from tests.policies.helpers import drive, make_requests, make_scheduler

PROMPTS, WANTED = [5, 2, 7, 3, 4], [3, 8, 2, 6, 4]


def test_reproduces_the_printed_batches_free_blocks_and_tables():
    sched, _ = make_scheduler("seed_toy", num_blocks=10, block_size=4, max_num_seqs=3)
    steps = drive(sched, make_requests(PROMPTS, WANTED))
    printed = [  # (batch, free blocks, tables) as the post prints them
        ([0, 1, 2], 5, {0: [0, 1], 1: [2], 2: [3, 4]}),
        ([0, 1, 3], 6, {0: [0, 1], 1: [2], 3: [5]}),
        ([1, 3, 4], 4, {1: [2, 7], 3: [5, 8], 4: [6, 9]}),
        ([1, 3, 4], 4, {1: [2, 7], 3: [5, 8], 4: [6, 9]}),
        ([1, 3, 4], 4, {1: [2, 7], 3: [5, 8], 4: [6, 9]}),
        ([1, 3], 6, {1: [2, 7], 3: [5, 8]}),
        ([1], 7, {1: [2, 7, 3]}),
    ]
    assert [(s.batch, s.free_blocks, s.tables) for s in steps] == printed


def test_four_blocks_preempt_and_every_request_completes():
    sched, _ = make_scheduler("seed_toy", num_blocks=4, block_size=4, max_num_seqs=3)
    requests = make_requests(PROMPTS, WANTED)
    steps = drive(sched, requests)
    assert any(s.preempted for s in steps)
    assert all(r.num_generated == w for r, w in zip(requests, WANTED))
    assert sum(r.num_preemptions for r in requests) >= 1
