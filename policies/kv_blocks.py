"""Paged KV block manager: integer block ids, per-request block tables, allocate on demand, free at finish.

Like vLLM's BlockPool, free blocks form one queue: allocation takes from the front, freed blocks
join the back. `allocate` returns None when there is no room, and the caller decides whether to
wait or preempt. The optional watermark keeps a fraction of blocks free when admitting new requests
(vLLM v0's `watermark`), so running requests can grow without immediate preemption.
"""

from __future__ import annotations

from collections import deque

from workloads.request import Request


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens (the last one possibly partly filled)."""
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def table(self, req: Request) -> list[int]:
        return self._tables.get(req.id, [])

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """Extra blocks to hold `num_new_tokens` more tokens; the partly filled last block is used first."""
        held = len(self._tables.get(req.id, ()))
        return max(blocks_for(req.num_computed_tokens + num_new_tokens, self.block_size) - held, 0)

    def allocate(self, req: Request, num_new_tokens: int, admitting: bool = False) -> list[int] | None:
        """Grow `req`'s table for `num_new_tokens` more tokens; None if the pool (less the watermark) is short."""
        need = self.blocks_needed(req, num_new_tokens)
        reserve = self.watermark_blocks if admitting else 0
        if need + reserve > len(self._free):
            return None
        new = [self._free.popleft() for _ in range(need)]
        self._tables.setdefault(req.id, []).extend(new)
        return new

    def reserve(self, req: Request, num_tokens: int) -> list[int] | None:
        """Allocate blocks for `num_tokens` tokens at once (up-front reservation, as Orca/static batching do)."""
        need = blocks_for(num_tokens, self.block_size) - len(self._tables.get(req.id, ()))
        if need > len(self._free):
            return None
        new = [self._free.popleft() for _ in range(max(need, 0))]
        self._tables.setdefault(req.id, []).extend(new)
        return new

    def free(self, req: Request) -> None:
        """Return every block of `req` to the back of the free queue, head block first."""
        self._free.extend(self._tables.pop(req.id, ()))

    def check_invariants(self) -> None:
        """Every block is either free or in exactly one table; nothing leaked or double-freed."""
        held = [b for table in self._tables.values() for b in table]
        assert len(held) == len(set(held)), "a block is in two tables"
        assert not set(held) & set(self._free), "a block is both free and held"
        assert len(held) + len(self._free) == self.num_blocks, "blocks leaked"
