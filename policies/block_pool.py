"""vLLM's BlockPool for the prefix caches: reference-counted blocks, one queue of free ones, the hash map.

Allocation takes from the front; a block whose last user lets go joins the back *with its contents
and hash*, so it can still be hit until it is taken again (least recently freed first); one without a hash
(a request's partly filled tail) joins the front, as nothing can hit it. A
referenced block is never in the queue, so it is never evicted. Mixed into a BlockManager ahead of
it; the manager says how a block's hash is dropped (`_forget`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator


class BlockHashMap:
    """Block hash -> the blocks holding it (vLLM's BlockHashToBlockMap). A lookup gets the first registered; a
    block filled again under a hash already held (two requests computing one prefix side by side, a preempted
    request recomputed) is kept too, so evicting one copy leaves the content findable."""

    def __init__(self) -> None:
        self._first: dict[int, int] = {}
        self._more: dict[int, list[int]] = {}  # later blocks of the same hash (rare)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._first

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockHashMap) and (self._first, self._more) == (other._first, other._more)

    def __len__(self) -> int:
        """Blocks registered (copies counted)."""
        return len(self._first) + sum(map(len, self._more.values()))

    def get(self, block_hash: int) -> int | None:
        return self._first.get(block_hash)

    def add(self, block_hash: int, block: int) -> None:
        if block_hash in self._first:
            self._more.setdefault(block_hash, []).append(block)
        else:
            self._first[block_hash] = block

    def remove(self, block_hash: int, block: int) -> None:
        more = self._more.get(block_hash)
        if self._first[block_hash] != block:
            more.remove(block)
        elif more:
            self._first[block_hash] = more.pop(0)
        else:
            del self._first[block_hash]
        if more is not None and not more:
            del self._more[block_hash]

    def items(self) -> Iterator[tuple[int, int]]:
        """(hash, block) of every registered block."""
        yield from self._first.items()
        for block_hash, blocks in self._more.items():
            for block in blocks:
                yield block_hash, block


class RefCountedPool(ABC):
    def _init_pool(self, num_blocks: int) -> None:
        self._free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    @abstractmethod
    def _forget(self, block: int) -> None:
        """Drop `block`'s hash from the manager's cache (no-op for an unregistered block)."""

    def _evictable_among(self, blocks: list[int]) -> int:
        return sum(self._refs[b] == 0 for b in blocks)

    def _touch(self, blocks: list[int]) -> None:
        for block in blocks:
            if self._refs[block] == 0:
                del self._free_queue[block]
            self._refs[block] += 1

    def _pop_free(self) -> int:
        block = self._free_queue.popitem(last=False)[0]
        self._forget(block)  # evict: its contents are about to be overwritten
        self._refs[block] = 1
        return block

    def _pop_free_many(self, count: int) -> list[int]:
        return [self._pop_free() for _ in range(count)]

    def _release(self, blocks: list[int], unhashed: int = 0) -> None:
        """Let go of `blocks` in order; those no one holds join the back of the free queue, except the first
        `unhashed`, which hold no hash and go to the front (vLLM's free_blocks prepends blocks without a hash:
        spent first, they keep cached ones longer)."""
        refs, free_queue = self._refs, self._free_queue  # a finished request returns a block per 16 tokens
        front = []
        for i, block in enumerate(blocks):
            left = refs[block] - 1
            refs[block] = left
            if not left:
                if i < unhashed:
                    front.append(block)
                else:
                    free_queue[block] = None
        for block in reversed(front):  # in their order, ahead of the queue
            free_queue[block] = None
            free_queue.move_to_end(block, last=False)

    def _check_refs(self, held: list[int]) -> None:
        refs = [0] * len(self._refs)
        for block in held:
            refs[block] += 1
        assert refs == self._refs, "reference counts disagree with the block tables"
        assert set(self._free_queue) == {b for b, r in enumerate(refs) if r == 0}, (
            "free queue != unreferenced blocks"
        )
