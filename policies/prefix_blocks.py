"""vLLM's automatic prefix caching on the paged block pool (`prefix_caching: vllm`).

- Every full block is identified by a hash of its tokens chained with its parent block's hash
  (`token_ids.block_hashes`); only full blocks are ever reused.
- A new request walks its block hashes from the start and reuses cached blocks until the first
  miss, at most up to its last token (which is always recomputed to produce logits, as vLLM does).
- A block is registered when a step is scheduled to fill it (vLLM v1 caches blocks in
  `allocate_slots`), not when the step ends: a request admitted later in the same step hits blocks
  another request computes in that very forward pass, which is correct because every layer writes
  the step's KV before it attends. n samples of one prompt thus prefill it once. Blocks registered
  for tokens that were then not computed (their request preempted in the same step) are forgotten.
- Blocks are reference-counted (policies/block_pool.py). A finished (or preempted) request releases
  its blocks tail first; at reference count 0 they join the back of the free queue *with their
  contents and hash*, so they can still be hit, and allocation evicts from the front: least recently
  freed first, and within one request its tail before its head. Its blocks past the full computed ones
  (a partly filled tail) hold no hash and join the front: spent first.
- A referenced block is never in the free queue, so it is never evicted.
"""

from __future__ import annotations

from servesim.policies.block_pool import BlockHashMap, RefCountedPool
from servesim.policies.kv_blocks import BlockManager
from servesim.policies.token_ids import block_hashes
from servesim.workloads.request import Request


def _private(req: Request) -> bool:
    """A request no other can hit (`Request.private_prefix`) that has not been preempted: nothing of it is cached,
    and what it fills need not be hashed until it is freed unfinished (`free` registers it then)."""
    return req.private_prefix and not req.num_preemptions


class PrefixCachingBlockManager(RefCountedPool, BlockManager):
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        super().__init__(num_blocks, block_size, watermark)
        self._init_pool(num_blocks)
        self._hash_of: list[int | None] = [None] * num_blocks
        self._cached = BlockHashMap()
        self._num_cached: dict[int, int] = {}  # request id -> how many of its leading blocks are registered
        # private requests whose blocks registration skipped (`free` catches up)
        self._unhashed: set[int] = set()

    # ---- lookup and registration --------------------------------------------------------------
    def lookup(self, req: Request) -> int:
        return len(self._match(req)) * self.block_size

    def _match(self, req: Request) -> list[int]:
        """Cached blocks for the longest run of leading full-block hash hits (never the last token); none for a
        request wanting prompt logprobs, which must compute every prompt token (vLLM skips reading the cache)."""
        blocks = []
        if req.prompt_logprobs or _private(req):
            return blocks
        hashes = block_hashes(req, req.num_tokens - 1, self.block_size)
        cached = self._cached
        for block_hash in hashes[: (req.num_tokens - 1) // self.block_size]:
            block = cached.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        if self.eagle_hits and blocks:
            blocks.pop()
        return blocks

    def _hit_blocks(self, req: Request) -> list[int]:
        if req.id in self._tables:
            return []
        if not req.num_computed_tokens:  # no hit (now): forget one an earlier, failed admission recorded
            self._num_cached.pop(req.id, None)
            return []
        blocks = self._match(req)[: req.num_computed_tokens // self.block_size]
        self._num_cached[req.id] = len(blocks)
        return blocks

    def cache(self, req: Request) -> None:
        if _private(req):
            self._unhashed.add(req.id)
            return
        # else nothing new is full
        if req.num_computed_tokens // self.block_size > self._num_cached.get(req.id, 0):
            self._register(req, req.num_computed_tokens)

    def cache_scheduled(self, req: Request, num_tokens: int) -> None:
        if _private(req):
            self._unhashed.add(req.id)
            return
        # draft guesses are not its tokens yet
        num_tokens = min(num_tokens, req.num_prompt_tokens + req.num_generated)
        if num_tokens // self.block_size > self._num_cached.get(req.id, 0):
            self._register(req, num_tokens)

    def _register(self, req: Request, num_tokens: int) -> None:
        """Make the full blocks among `req`'s first `num_tokens` tokens findable by their hashes."""
        table = self._tables.get(req.id)
        if not table:
            return
        done = self._num_cached.get(req.id, 0)
        full = num_tokens // self.block_size
        if full <= done:
            return
        hashes = block_hashes(req, num_tokens, self.block_size)
        hash_of, cached = self._hash_of, self._cached
        for index in range(done, full):
            block, block_hash = table[index], hashes[index]
            if hash_of[block] is None:
                hash_of[block] = block_hash
                cached.add(block_hash, block)
        self._num_cached[req.id] = full

    # ---- pool ---------------------------------------------------------------------------------
    def _pop_free_many(self, count: int) -> list[int]:
        """`_pop_free` `count` times, inlined: a prefill takes a block per 16 tokens, so this runs per block."""
        popitem, hash_of, refs, cached = self._free_queue.popitem, self._hash_of, self._refs, self._cached
        blocks = [popitem(last=False)[0] for _ in range(count)]
        for block in blocks:
            block_hash = hash_of[block]
            if block_hash is not None:  # evict: its contents are about to be overwritten
                hash_of[block] = None
                cached.remove(block_hash, block)
            refs[block] = 1
        return blocks

    def _forget(self, block: int) -> None:
        """Take `block` out of the hash map (no-op for an unregistered block)."""
        block_hash = self._hash_of[block]
        if block_hash is None:
            return
        self._hash_of[block] = None
        self._cached.remove(block_hash, block)

    def free(self, req: Request, keep_uncached: bool = True) -> None:
        if req.id in self._unhashed:
            self._unhashed.discard(req.id)
            # preempted or handed off: what it computed is findable again, as if registered
            if not req.is_done:
                self._register(req, req.num_computed_tokens)
        table = self._tables.pop(req.id, [])
        registered = self._num_cached.pop(req.id, 0)
        for block in table[req.num_computed_tokens // self.block_size : registered]:
            if self._refs[block] == 1:  # registered for this step, never computed: nobody may hit it
                self._forget(block)
        # tail first: the tail is evicted before the head; blocks past the computed full ones hold no hash in vLLM
        # (a private request's full blocks would hold one there: they go to the back too)
        self._release(table[::-1], len(table) - min(req.num_computed_tokens // self.block_size, len(table)))

    def check_invariants(self) -> None:
        """Refs match the tables; free blocks are exactly the unreferenced ones; the hash map is consistent."""
        self._check_refs([block for table in self._tables.values() for block in table])
        for block_hash, block in self._cached.items():
            assert self._hash_of[block] == block_hash, "stale cache entry"
        assert sum(h is not None for h in self._hash_of) == len(self._cached), "hashed block not findable"
