"""Paged KV block manager: integer block ids, per-request block tables, allocate on demand, free at finish.

Like vLLM's BlockPool, free blocks form one queue: allocation takes from the front, freed blocks
join the back. `allocate` returns None when there is no room, and the caller decides whether to
wait or preempt. The optional watermark keeps a fraction of blocks free when admitting new requests
(vLLM v0's `watermark`), so running requests can grow without immediate preemption.
"""

from __future__ import annotations

from collections import deque

from servesim.workloads.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens (the last one possibly partly filled)."""
    return -(-num_tokens // block_size)


def fits_in_last_block(kv: BlockManager, req: Request, num_tokens: int) -> bool:
    """A decode token that lands in `req`'s last, partly filled block needs no new block. Both schedulers take
    this shortcut, and the fused decode stretches (simulator/world/fast_forward.py) count blocks the same way."""
    return num_tokens == 1 and req.num_computed_tokens % kv.block_size != 0


class BlockManager:
    """No prefix caching (`prefix_caching: none`): a block belongs to one request and is free again when it ends."""

    supports_fast_forward = (
        True  # decode steps open blocks in a pattern simulator/world/fast_forward.py replays
    )
    # what a step computes is made findable when it is scheduled (`cache_scheduled`), so the `cache` after each step
    # adds nothing for a prefill and its fused chunks (simulator/world/chunk_stretch.py) need none
    caches_when_scheduled = True
    windows: tuple[int | None, ...] = (None,)  # KV cache groups' sliding windows: one full-attention group
    swa_window: int | None = None  # SGLang's separate sliding-window pool (policies/swa_radix.py): its window
    # EAGLE/MTP drafting reads the target's hidden states at the last cached token, which a hit does not have:
    # vLLM gives up the last hit block (find_longest_cache_hit's use_eagle), so that block is computed again
    eagle_hits = False

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (for prefix caching: free plus evictable cached blocks)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def table(self, req: Request) -> list[int]:
        return self._tables.get(req.id, [])

    def lookup(self, req: Request) -> int:
        """Prompt tokens of a new (or recomputing) request whose KV is already cached; 0 without prefix caching."""
        return 0

    def cache(self, req: Request) -> None:
        """Called after each step that computed tokens of `req`: make its full blocks findable (prefix caching)."""

    def cache_scheduled(self, req: Request, num_tokens: int) -> None:
        """Called when a step has allocated KV for `req`'s tokens up to `num_tokens`: vLLM registers the blocks
        those tokens fill right then, so requests admitted later in the same step hit them (prefix caching)."""

    # ---- fused decode steps (simulator/world/fast_forward.py) -------------------------------------------
    def decode_table_len(self, req: Request) -> int:
        """Token blocks `req`'s table spans in each group (all groups grow together)."""
        return len(self._tables.get(req.id, ()))

    def open_decode_blocks(self, req: Request, num_tokens: int) -> list[int]:
        """The blocks a decode step opens so that `req` holds `num_tokens` tokens (they fit: checked before)."""
        return self.reserve(req, num_tokens)

    def end_decode_step(self, req: Request, computed: int) -> int:
        """Bookkeeping after a decode step brought `req` to `computed` tokens; returns the blocks it freed."""
        return 0

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """Extra blocks to hold `num_new_tokens` more tokens; the partly filled last block is used first."""
        held = len(self._tables.get(req.id, ()))
        return max(blocks_for(req.num_computed_tokens + num_new_tokens, self.block_size) - held, 0)

    def allocate(
        self, req: Request, num_new_tokens: int, admitting: bool = False, watermark: bool = True
    ) -> list[int] | None:
        """Grow `req`'s table for `num_new_tokens` more tokens; None if the pool (less the watermark, when
        admitting and `watermark`: vLLM keeps it only while another request runs) is short.

        When admitting after a `lookup` hit, the caller has set `req.num_computed_tokens` to the hit and
        the cached blocks join the table first.
        """
        hit = self._hit_blocks(req) if admitting else []
        need = self.blocks_needed(req, num_new_tokens) - len(hit)
        reserve = self.watermark_blocks if admitting and watermark else 0
        if not self._fits(need, reserve, hit):
            return None
        table = self._tables.setdefault(req.id, [])
        if hit:
            self._touch(hit)
            table.extend(hit)
        new = self._pop_free_many(need)
        table.extend(new)
        return new

    def fits_whole(self, req: Request, num_tokens: int, step_tokens: int, watermark: bool = True) -> bool:
        """vLLM's admission gate (`scheduler_reserve_full_isl`): whether the pool, less the watermark (as in
        `allocate`), could hold `req`'s first `num_tokens` tokens now. The caller has set
        `req.num_computed_tokens` to its prefix hit; hit blocks that sit evictable in the pool count as taken.
        `step_tokens` (the most one step schedules) only bounds sliding windows (HybridBlockManager)."""
        hit = self._hit_blocks(req)
        need = max(blocks_for(num_tokens, self.block_size) - len(self.table(req)) - len(hit), 0)
        return need + self._evictable_among(hit) + self.watermark_blocks * watermark <= self.num_free_blocks

    def evictable_hit(self, req: Request) -> int:
        """Blocks of `req`'s prefix hit (the caller has set `req.num_computed_tokens` to it) that sit evictable in
        the pool now: admitting it takes them out (SGLang counts its lock on the matched prefix before it admits)."""
        return self._evictable_among(self._hit_blocks(req))

    def reserve(self, req: Request, num_tokens: int) -> list[int] | None:
        """Allocate blocks for `num_tokens` tokens at once (up-front reservation, as Orca/static batching do)."""
        need = blocks_for(num_tokens, self.block_size) - len(self._tables.get(req.id, ()))
        if need > self.num_free_blocks:
            return None
        new = self._pop_free_many(max(need, 0))
        self._tables.setdefault(req.id, []).extend(new)
        return new

    def reserve_received(self, req: Request, num_tokens: int) -> int | None:
        """P/D decode side: blocks for `req`'s first `num_tokens` tokens, whose KV another engine computed. vLLM
        asks its own prefix cache first and the connector pulls only the blocks past that hit. Returns the hit
        (tokens not sent), or None when the pool is short; leaves `req.num_computed_tokens` at `num_tokens`."""
        req.num_computed_tokens = hit = self.lookup(req)
        new = self.allocate(req, num_tokens - hit, admitting=True, watermark=False)
        req.num_computed_tokens = num_tokens
        return None if new is None else hit

    def free(self, req: Request, keep_uncached: bool = True) -> None:
        """Give back every block of `req` (head block first: without caching the order only decides reuse).
        `keep_uncached=False` (SGLang's retraction): a radix cache does not insert what it had not yet cached."""
        self._release(self._tables.pop(req.id, []))

    # ---- pool internals, overridden by prefix caching --------------------------------------------
    def _fits(self, need: int, reserve: int, hit: list[int]) -> bool:
        """Whether `need` more blocks and `reserve` spare remain once the `hit` blocks are taken out of the pool."""
        return need + reserve + self._evictable_among(hit) <= self.num_free_blocks

    def _hit_blocks(self, req: Request) -> list[int]:
        return []

    def _evictable_among(self, blocks: list[int]) -> int:
        return 0

    def _touch(self, blocks: list[int]) -> None:
        """Reference cached blocks for a new user."""

    def _pop_free(self) -> int:
        return self._free.popleft()

    def _pop_free_many(self, count: int) -> list[int]:
        popleft = self._free.popleft  # a prompt takes a block per 16 tokens: no method call per block
        return [popleft() for _ in range(count)]

    def _release(self, blocks: list[int]) -> None:
        self._free.extend(blocks)

    def check_invariants(self) -> None:
        """Every block is either free or in exactly one table; nothing leaked or double-freed."""
        held = [b for table in self._tables.values() for b in table]
        assert len(held) == len(set(held)), "a block is in two tables"
        assert not set(held) & set(self._free), "a block is both free and held"
        assert len(held) + len(self._free) == self.num_blocks, "blocks leaked"
