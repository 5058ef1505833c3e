"""The fused decode steps' block openings: which requests open a block in which step, and opening them together."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.policies.config import EngineConfig
from servesim.policies.hybrid_blocks import make_kv_manager
from servesim.policies.kv_blocks import BlockManager
from servesim.simulator.world.fast_forward import _block_openings
from servesim.workloads.request import Request


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 16),
    rows=st.lists(st.tuples(st.integers(0, 200), st.integers(-3, 60)), min_size=1, max_size=8),
)
def test_block_openings_are_each_steps_requests_in_order(size, rows):
    """Step i brings request j to context_j + i + 1 tokens: it opens a block where context_j + i is a multiple of
    the block size, from step 1 (step 0 is allocated) to its last step; counted one step at a time."""
    context = np.array([c for c, _ in rows], np.int64)
    last = np.array([n for _, n in rows], np.int64)
    expected: dict[int, list[int]] = {}
    for i in range(1, int(last.max()) + 1):
        for j, (c, n) in enumerate(rows):
            if i <= n and (c + i) % size == 0:
                expected.setdefault(i, []).append(j)
    assert _block_openings(context, last, size) == expected


@pytest.mark.parametrize("prefix_caching", ["none", "vllm", "radix"])
def test_opening_a_steps_blocks_together_is_opening_them_one_by_one(prefix_caching):
    """The same blocks, from the same place in the pool, for the same requests in the same order: whole pools
    compared (tables, free queues, hashes, references), with cached blocks to evict, requests whose next token
    needs a block and some whose last block still has room."""
    cfg = EngineConfig(block_size=4, prefix_caching=prefix_caching)
    kv = make_kv_manager(cfg, 64, 4, (None,))
    gone = [Request(100 + i, 0.0, 8, 2, ((7, 8),)) for i in range(2)]
    for req in gone:  # blocks a prefix cache keeps, evictable once freed
        kv.allocate(req, 8, admitting=True)
        req.num_computed_tokens = 8
        kv.cache(req)
        kv.free(req)
    reqs = [Request(i, 0.0, p, 9) for i, p in enumerate([4, 6, 8, 3, 12])]
    for req in reqs:
        kv.allocate(req, req.num_prompt_tokens, admitting=True)
        req.num_computed_tokens = req.num_prompt_tokens
    tokens = [r.num_computed_tokens + 1 for r in reqs]
    together, one_by_one = copy.deepcopy(kv), copy.deepcopy(kv)
    together.open_decode_blocks_in_order(reqs, tokens)
    for req, n in zip(reqs, tokens):
        one_by_one.open_decode_blocks(req, n)
    assert [len(together.table(r)) for r in reqs] == [2, 2, 3, 1, 4]
    assert pickle.dumps(together) == pickle.dumps(one_by_one)
    together.check_invariants()


def test_a_pool_that_opens_decode_blocks_its_own_way_must_open_a_steps_together_too():
    """The fused steps call `open_decode_blocks_in_order`, whose fast path skips `open_decode_blocks`."""
    with pytest.raises(TypeError, match="open_decode_blocks_in_order"):

        class Windowed(BlockManager):
            def open_decode_blocks(self, req, num_tokens):
                return []
