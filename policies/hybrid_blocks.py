"""vLLM v1's hybrid KV cache manager: one block pool shared by KV cache groups, sliding groups freeing early.

The groups come from `hardware.kv_groups` (full-attention groups first). A request holds, per group, a
table indexed by token block: a full-attention group every block of its tokens; a sliding group only
the blocks its next queries can see. Before each allocation, and after each step, a sliding group's
blocks wholly before `processed - window + 1` go back to the pool (vLLM's `remove_skipped_blocks`), where
`processed` leaves out the tokens of steps still in flight when vLLM plans the next (async scheduling: the
step just run; pipeline parallel: every step not yet landed), whose queries still read blocks below; their
table entries become None (vLLM's null block). One allocation takes, for every group, the blocks up to
the step's last token, so a long prefill chunk needs its whole chunk even in a sliding group.

With prefix caching (`HybridPrefixCachingBlockManager`), a full block is registered under its hash in
its group when a step is scheduled to fill it (as `PrefixCachingBlockManager` does), freed blocks keep
their hash until evicted (least recently freed first, a request's tail before its head, group by group),
and a new request's hit is, as vLLM's HybridKVCacheCoordinator finds it: the longest run of leading
blocks cached in every full-attention group, then cut back to the last position where every sliding
group of a window w has the cdiv(w - 1, block_size) blocks before it cached (scanning right to left;
short of such a run, the cached run from block 0). A block filled again under a hash its group already holds
is registered too (`BlockHashMap`), as vLLM keeps both.
"""

from __future__ import annotations

from servesim.hardware.errors import SpecError
from servesim.hardware.kv_groups import admission_blocks, cdiv, skipped_blocks
from servesim.policies.block_pool import BlockHashMap, RefCountedPool
from servesim.policies.config import EngineConfig
from servesim.policies.families import family_of
from servesim.policies.kv_blocks import BlockManager, blocks_for
from servesim.policies.spec_decode import EAGLE_METHODS
from servesim.policies.swa_radix import SWARadixCache
from servesim.policies.token_ids import block_hashes
from servesim.workloads.request import Request


def _processed(req: Request) -> int:
    """The tokens below which a sliding window may free blocks: those whose step's outputs vLLM has processed
    (the steps in flight still read the blocks below their own window)."""
    return req.num_computed_tokens - req.num_in_flight_tokens


def _ids(hit: dict[int, list[int | None]]) -> list[int]:
    """The block ids of a per-group prefix hit (skipped sliding blocks are None)."""
    return [b for blocks in hit.values() for b in blocks if b is not None]


class HybridBlockManager(BlockManager):
    """`prefix_caching: none` over KV cache groups (`windows`: one per group, None = full attention)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        watermark: float = 0.0,
        windows: tuple[int | None, ...] = (None,),
    ):
        super().__init__(num_blocks, block_size, watermark)
        self.windows = tuple(windows)
        self._groups: dict[int, list[list[int | None]]] = {}  # request id -> per group: block id or None
        self._freed_upto: dict[int, list[int]] = {}  # request id -> per group: leading entries already freed

    def table(self, req: Request) -> list[int]:
        """Every block `req` holds, all groups (its length is what a swap moves)."""
        groups = self._groups.get(req.id)
        return [b for blocks in groups for b in blocks if b is not None] if groups else []

    def group_tables(self, req: Request) -> tuple[tuple[int, ...], ...]:
        """Per group, `req`'s table by token block, freed entries as 0 (vLLM's null block; never read)."""
        groups = self._groups.get(req.id) or [[] for _ in self.windows]
        return tuple(tuple(0 if b is None else b for b in blocks) for blocks in groups)

    def _start(self, window: int | None, computed: int) -> int:
        return 0 if window is None else skipped_blocks(computed, window, self.block_size)

    def _need(self, req: Request, computed: int, total: int) -> int:
        groups, full = self._groups.get(req.id), blocks_for(total, self.block_size)
        return sum(
            max(full - max(len(groups[g]) if groups else 0, self._start(w, computed)), 0)
            for g, w in enumerate(self.windows)
        )

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        computed = req.num_computed_tokens
        return self._need(req, computed, computed + num_new_tokens)

    def allocate(
        self, req: Request, num_new_tokens: int, admitting: bool = False, watermark: bool = True
    ) -> list[int] | None:
        computed = req.num_computed_tokens
        self._free_skipped(req, _processed(req))
        hit = self._hit_blocks(req) if admitting else {}
        reserve = self.watermark_blocks if admitting and watermark else 0
        return self._grow(req, computed, computed + num_new_tokens, reserve, hit)

    def fits_whole(self, req: Request, num_tokens: int, step_tokens: int, watermark: bool = True) -> bool:
        """Per group, the blocks of `num_tokens` tokens beyond those held, hit or skipped; a sliding group of
        window w needs at most cdiv(w - 1 + step_tokens, block_size) + 1 at any time (vLLM's admission cap)."""
        computed, groups, hit = req.num_computed_tokens, self._groups.get(req.id), self._hit_blocks(req)
        need = 0
        for g, w in enumerate(self.windows):
            required = admission_blocks(w, num_tokens, self.block_size, step_tokens)
            have = (len(groups[g]) if groups else 0) + len(hit.get(g, ()))
            need += max(required - max(have, self._start(w, computed)), 0)
        return (
            need + self._evictable_among(_ids(hit)) + self.watermark_blocks * watermark
            <= self.num_free_blocks
        )

    def evictable_hit(self, req: Request) -> int:
        return self._evictable_among(_ids(self._hit_blocks(req)))

    def reserve(self, req: Request, num_tokens: int) -> list[int] | None:
        self._free_skipped(req, _processed(req))
        return self._grow(req, req.num_computed_tokens, num_tokens, 0, {})

    def reserve_received(self, req: Request, num_tokens: int) -> int | None:
        """As BlockManager's, with a sliding group holding only the window of `num_tokens` (vLLM counts the
        pulled tokens as computed when it skips blocks): its hit blocks before that stay in the cache unused."""
        req.num_computed_tokens = hit = self.lookup(req)
        held = {
            g: [b if i >= self._start(self.windows[g], num_tokens) else None for i, b in enumerate(blocks)]
            for g, blocks in self._hit_blocks(req).items()
        }
        req.num_computed_tokens = num_tokens
        return None if self._grow(req, num_tokens, num_tokens, 0, held) is None else hit

    def _grow(
        self, req: Request, computed: int, total: int, reserve: int, hit: dict[int, list[int | None]]
    ) -> list[int] | None:
        """Per group: cached `hit` blocks first (admission), then new blocks up to `total` tokens."""
        held = sum(b is not None for blocks in hit.values() for b in blocks)
        need = self._need(req, computed, total) - held
        if need + reserve + self._evictable_among(_ids(hit)) > self.num_free_blocks:
            return None
        groups = self._groups.setdefault(req.id, [[] for _ in self.windows])
        if hit:
            self._touch([b for blocks in hit.values() for b in blocks if b is not None])
        full, new = blocks_for(total, self.block_size), []
        for g, w in enumerate(self.windows):
            blocks = groups[g]
            blocks.extend(hit.get(g, ()))
            start = self._start(w, computed)
            blocks.extend([None] * (start - len(blocks)))  # out of the window before they were ever needed
            while len(blocks) < full:
                blocks.append(self._pop_free())
                new.append(blocks[-1])
        self._freed_upto.setdefault(req.id, [0] * len(self.windows))
        return new

    def cache(self, req: Request) -> None:
        """After a step: free what fell out of every window (vLLM frees it before the next allocation)."""
        self._free_skipped(req, _processed(req))

    def decode_table_len(self, req: Request) -> int:
        groups = self._groups.get(req.id)
        return len(groups[0]) if groups else 0

    def open_decode_blocks(self, req: Request, num_tokens: int) -> list[int]:
        return self._grow(req, num_tokens - 1, num_tokens, 0, {})

    def end_decode_step(self, req: Request, computed: int) -> int:
        return self._free_skipped(req, computed - req.num_in_flight_tokens)

    def _free_skipped(self, req: Request, computed: int) -> int:
        """Free the blocks before each sliding window's first visible token; returns how many."""
        groups = self._groups.get(req.id)
        if groups is None:
            return 0
        done, freed = self._freed_upto[req.id], 0
        for g, w in enumerate(self.windows):
            if w is None:
                continue
            blocks = groups[g]
            upto = min(self._start(w, computed), len(blocks))
            for i in range(upto - 1, done[g] - 1, -1):  # highest first, as vLLM frees them
                if blocks[i] is not None:
                    self._release([blocks[i]])
                    blocks[i] = None
                    freed += 1
            done[g] = max(done[g], upto)
        return freed

    def free(self, req: Request, keep_uncached: bool = True) -> None:
        groups = self._groups.pop(req.id, None)
        self._freed_upto.pop(req.id, None)
        for blocks in groups or ():
            self._release([b for b in reversed(blocks) if b is not None])  # group by group, tail first

    def _hit_blocks(self, req: Request) -> dict[int, list[int | None]]:
        return {}

    def _held(self) -> list[int]:
        return [b for groups in self._groups.values() for blocks in groups for b in blocks if b is not None]

    def check_invariants(self) -> None:
        held = self._held()
        assert len(held) == len(set(held)), "a block is in two tables"
        assert not set(held) & set(self._free), "a block is both free and held"
        assert len(held) + len(self._free) == self.num_blocks, "blocks leaked"


class HybridPrefixCachingBlockManager(RefCountedPool, HybridBlockManager):
    """`prefix_caching: vllm` over KV cache groups (see the module docstring)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        watermark: float = 0.0,
        windows: tuple[int | None, ...] = (None,),
    ):
        super().__init__(num_blocks, block_size, watermark, windows)
        self._init_pool(num_blocks)
        self._hash_of: list[int | None] = [None] * num_blocks
        self._group_of = [0] * num_blocks
        self._cached = [BlockHashMap() for _ in self.windows]  # per group
        self._registered: dict[int, int] = {}  # request id -> leading token blocks registered (all groups)

    # ---- lookup ---------------------------------------------------------------------------------
    def lookup(self, req: Request) -> int:
        return self._match(req) * self.block_size

    def _cached_in(self, groups: list[int], block_hash: int) -> bool:
        return all(block_hash in self._cached[g] for g in groups)

    def _match(self, req: Request) -> int:
        """Token blocks of the longest hit (never the last token), full-attention groups first; with `eagle_hits`,
        one block fewer (a sliding group's run one block longer first, as vLLM's use_eagle); none for a request
        wanting prompt logprobs (vLLM skips reading the cache for it)."""
        if req.prompt_logprobs:
            return 0
        limit = (req.num_tokens - 1) // self.block_size
        hashes = block_hashes(req, limit * self.block_size, self.block_size)
        full = [g for g, w in enumerate(self.windows) if w is None]
        hit = 0
        while hit < limit and self._cached_in(full, hashes[hit]):
            hit += 1
        if not full:
            hit = limit
        while True:
            before = hit
            for window in sorted({w for w in self.windows if w is not None}):
                groups = [g for g, w in enumerate(self.windows) if w == window]
                hit = self._sliding_hit(
                    hashes, hit, groups, cdiv(window - 1, self.block_size) + self.eagle_hits
                )
            if hit == before:
                return hit - 1 if self.eagle_hits and hit else hit

    def _sliding_hit(self, hashes: list[int], limit: int, groups: list[int], need: int) -> int:
        if need == 0:  # a window of one token sees nothing before it
            return limit
        run = 0
        for i in range(limit - 1, -1, -1):
            if self._cached_in(groups, hashes[i]):
                run += 1
                if run >= need:
                    return i + run
            else:
                run = 0
        return run  # fewer than `need` cached blocks in a row: the run from block 0

    def _hit_blocks(self, req: Request) -> dict[int, list[int | None]]:
        if req.id in self._groups:
            return {}
        if not req.num_computed_tokens:  # no hit (now): forget one an earlier, failed admission recorded
            self._registered.pop(req.id, None)
            return {}
        hit = req.num_computed_tokens // self.block_size
        hashes = block_hashes(req, hit * self.block_size, self.block_size)
        out = {}
        for g, w in enumerate(self.windows):
            start = self._start(w, req.num_computed_tokens)
            out[g] = [None] * start + [self._cached[g].get(h) for h in hashes[start:hit]]
        self._registered[req.id] = hit
        return out

    # ---- registration ---------------------------------------------------------------------------
    def cache(self, req: Request) -> None:
        self._register(req, req.num_computed_tokens)
        self._free_skipped(req, _processed(req))

    def cache_scheduled(self, req: Request, num_tokens: int) -> None:
        self._register(req, min(num_tokens, req.num_tokens))

    def _register(self, req: Request, num_tokens: int) -> None:
        groups = self._groups.get(req.id)
        done, full = self._registered.get(req.id, 0), num_tokens // self.block_size
        if not groups or full <= done:
            return
        hashes = block_hashes(req, num_tokens, self.block_size)
        for g, blocks in enumerate(groups):
            cached = self._cached[g]
            for index in range(done, min(full, len(blocks))):
                block = blocks[index]
                if block is not None and self._hash_of[block] is None:
                    self._hash_of[block], self._group_of[block] = hashes[index], g
                    cached.add(hashes[index], block)
        self._registered[req.id] = full

    def _forget(self, block: int) -> None:
        block_hash = self._hash_of[block]
        if block_hash is not None:
            self._cached[self._group_of[block]].remove(block_hash, block)
            self._hash_of[block] = None

    def free(self, req: Request, keep_uncached: bool = True) -> None:
        """Group by group, tail first; blocks past the full computed ones hold no hash and go to the free queue's
        front (`RefCountedPool._release`)."""
        groups = self._groups.pop(req.id, None)
        self._freed_upto.pop(req.id, None)
        registered = self._registered.pop(req.id, 0)
        full = req.num_computed_tokens // self.block_size
        for blocks in groups or ():
            for block in blocks[full:registered]:  # registered for a step that never ran: nobody may hit them
                if block is not None and self._refs[block] == 1:
                    self._forget(block)
            tail = [b for b in reversed(blocks[full:]) if b is not None]
            self._release(tail + [b for b in reversed(blocks[:full]) if b is not None], len(tail))

    def check_invariants(self) -> None:
        self._check_refs(self._held())
        for g, cached in enumerate(self._cached):
            for block_hash, block in cached.items():
                assert self._hash_of[block] == block_hash and self._group_of[block] == g, "stale cache entry"
        assert sum(h is not None for h in self._hash_of) == sum(map(len, self._cached)), (
            "hashed block not findable"
        )


def usable_pages(engine: EngineConfig, num_pages: int) -> int:
    """Pages of a planned pool that requests can hold. vLLM's BlockPool takes block 0 as its null block (the
    placeholder of skipped sliding-window blocks) before any request runs, and its KV usage counts the rest;
    SGLang's pool pads its dummy slot beyond the planned tokens."""
    return num_pages - (family_of(engine.scheduler).null_block and engine.prefix_caching != "radix")


def make_kv_manager(
    engine: EngineConfig,
    num_blocks: int,
    block_size: int,
    windows: tuple[int | None, ...] = (None,),
    swa: tuple[int, int] | None = None,
) -> BlockManager:
    """`engine`'s KV manager over `num_blocks` usable blocks (`usable_pages`) of `block_size` tokens (its page size):
    the registered one by `prefix_caching`, or over hybrid KV cache groups when any group slides (the memory plan's
    `kv_windows`), or SGLang's two pools when `swa` (window, sliding-window pages) is given (the memory plan's
    hybrid SWA memory). EAGLE/MTP drafting makes vLLM's prefix hits one block shorter."""
    from servesim.policies.catalog import kv_managers

    prefix_caching, watermark = engine.prefix_caching, engine.watermark
    if swa is not None:
        if prefix_caching == "vllm":
            raise SpecError(
                "engine.prefix_caching: vllm under the sglang scheduler with SGLang's sliding-window pool "
                "(hybrid SWA memory): use radix (SGLang's cache) or none, or set "
                "engine.disable_hybrid_kv_cache_manager: true"
            )
        kv = SWARadixCache(num_blocks, block_size, watermark, *swa, caching=prefix_caching == "radix")
    elif all(w is None for w in windows):
        kv = kv_managers.get(prefix_caching)(num_blocks, block_size, watermark)
    elif prefix_caching == "radix":
        raise SpecError(
            "engine.prefix_caching: radix with sliding-window layers is SGLang's sliding-window radix "
            "cache, modelled over SGLang's two pools (the sglang scheduler's memory plan), not over vLLM's "
            "KV cache groups; use vllm or none, or set engine.disable_hybrid_kv_cache_manager: true"
        )
    else:
        cls = HybridPrefixCachingBlockManager if prefix_caching == "vllm" else HybridBlockManager
        kv = cls(num_blocks, block_size, watermark, windows)
    kv.eagle_hits = (
        prefix_caching == "vllm"
        and engine.speculative is not None
        and engine.speculative.method in EAGLE_METHODS
    )
    return kv
