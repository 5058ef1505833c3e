"""SGLang's hybrid sliding-window KV cache (gpt-oss under `sglang`): two token pools under one radix tree.

SGLang (0.5.x: SWATokenToKVPoolAllocator, SWARadixCache) keeps the full-attention layers' KV and the sliding
layers' KV in two pools (hardware.memory.swa_pools sizes them). Every token takes a page in both; a page's
sliding-window slot is found through the full page (SGLang's full_to_swa_index_mapping) and can be freed first.

Tree nodes own full pages and are either live (every page still has its sliding slot) or tombstones (the sliding
slots freed, the full KV kept):
- a prefix is reusable only up to a node boundary where no tombstone lies above, or where at least one window of
  live tokens follows the last tombstone (match_prefix);
- a request locks its whole path for the full pool and, for the sliding pool, only its deepest nodes covering one
  window (inc_lock_ref), so the tree may tombstone its older tokens while it runs;
- short of pages, the tree first evicts unlocked leaves least recently used first (both pools; a tombstone left
  childless goes with its child), then, short of sliding slots, tombstones the least recently used live nodes
  outside every window (an unlocked leaf is evicted whole instead);
- a running request frees the sliding slots of its own tokens (those past what the tree holds) once a window of
  them lies out of its window: SGLang does so every window's worth of decode steps, keeping the last window (fused
  decode stretches do it as each step opens its page, as a stepped decode's allocation does); when the request
  ends, those tokens join the tree as a tombstone and the rest as a live leaf. A tombstone whose tokens a request
  computed again with live slots takes them over (it is live again).

`caching=False` is SGLang's SWAChunkCache (--disable-radix-cache): nothing is shared, and a request frees its
out-of-window sliding slots as each prompt chunk is allocated too (under overlap scheduling SGLang frees only up
to a chunk more behind, the chunk before still running: there a prompt holds up to a chunk more than here).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from servesim.policies.radix import Node, RadixCache, _split_pieces
from servesim.policies.token_ids import Piece
from servesim.workloads.request import Request


class SWARadixCache(RadixCache):
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        watermark: float,
        window: int,
        swa_blocks: int,
        caching: bool = True,
    ):
        super().__init__(num_blocks, block_size, watermark)
        if swa_blocks < 1 or window < 1:
            raise ValueError(f"need a window and >= 1 sliding-window page, got {window} and {swa_blocks}")
        self.swa_window, self.swa_blocks, self.caching = window, swa_blocks, caching
        self._swa_free: deque[int] = deque(range(swa_blocks))
        self._swa_of: list[int | None] = [None] * num_blocks  # full page -> its sliding-window page
        self._swa_evictable = 0  # sliding pages of live nodes no window reaches into
        # (last_access, tiebreak, node): tombstoning candidates
        self._swa_heap: list[tuple[int, int, Node]] = []
        # request id -> tokens its sliding-window lock covers, deepest node up
        self._swa_span: dict[int, int] = {}
        # request id -> its leading tokens whose own sliding slots it freed
        self._swa_done: dict[int, int] = {}

    # ---- what is free ----------------------------------------------------------------------------
    @property
    def full_free_blocks(self) -> int:
        return len(self._free) + self._evictable_pages

    @property
    def swa_free_blocks(self) -> int:
        return len(self._swa_free) + self._swa_evictable

    @property
    def num_free_blocks(self) -> int:
        """Pages an allocation can take: each takes one in both pools."""
        return min(self.full_free_blocks, self.swa_free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.full_free_blocks

    @property
    def usage(self) -> float:
        """The fuller pool's share held by requests."""
        return max(self.num_used_blocks / self.num_blocks, 1 - self.swa_free_blocks / self.swa_blocks)

    # ---- matching and locks ----------------------------------------------------------------------
    def match(self, key: tuple[Piece, ...]) -> tuple[int, list[Node]]:
        """The longest cached prefix that ends where the sliding layers have a window of live tokens (or no
        tombstone lies above it)."""
        _, path = super().match(key)
        usable, live = 0, math.inf  # nodes of the usable prefix; live tokens since the last tombstone
        for i, node in enumerate(path):
            if node.tombstone:
                usable = i if live >= self.swa_window else usable
                live = 0
            else:
                live += node.num_tokens
        path = path if live >= self.swa_window else path[:usable]
        return sum(node.num_tokens for node in path), path

    def _set_lock(self, req: Request, node: Node, num_tokens: int) -> None:
        span = self._swa_lock(node, +1, self.swa_window)
        super()._set_lock(req, node, num_tokens)  # which unlocks the old path, its window's span too
        self._swa_span[req.id] = span

    def _unlock(self, req: Request, node: Node) -> None:
        self._swa_lock(node, -1, self._swa_span.pop(req.id))
        super()._unlock(req, node)

    def _swa_lock(self, node: Node, delta: int, span: int) -> int:
        """(Un)lock the sliding pool for the nodes from `node` up until they cover `span` tokens (whole nodes; a
        lock stops short at a tombstone); returns the tokens covered. A node split since it was locked is covered
        by both halves, as its tokens are, and locked nodes are never tombstoned: an unlock meets what was locked."""
        covered = 0
        while covered < span and node is not self.root and not (delta > 0 and node.tombstone):
            if node.swa_lock_ref == 0 and delta > 0:
                self._swa_evictable -= len(node.pages)
            node.swa_lock_ref += delta
            if node.swa_lock_ref == 0:
                self._swa_evictable += len(node.pages)
                self._push_swa(node)
            covered += node.num_tokens
            node = node.parent
        return covered

    def _stamp(self, node: Node, stamp: int) -> None:
        super()._stamp(node, stamp)
        if not node.tombstone and node.swa_lock_ref == 0:
            self._push_swa(node)

    def _push_swa(self, node: Node) -> None:
        self._lazy_push(self._swa_heap, node, self._swa_evictable, self._swa_candidate)

    def _swa_candidate(self, entry: tuple[int, int, Node]) -> bool:
        """Whether a heap entry is its node's current stamp and the node's sliding slots can be freed."""
        stamp, _, node = entry
        return (
            stamp == node.last_access
            and not node.tombstone
            and node.swa_lock_ref == 0
            and self._attached(node)
        )

    # ---- a request's own pages -------------------------------------------------------------------
    def _fits(self, need: int, reserve: int, hit: list[int]) -> bool:
        """Both pools hold `need` more pages (and the full one `reserve` spare) once the matched path is locked (its
        full pages, and its last window's sliding slots, stop being evictable)."""
        path = self._pending[1] if self._pending is not None and hit else []
        full_locked = sum(len(node.pages) for node in path if node.lock_ref == 0)
        return (
            need + reserve + full_locked <= self.full_free_blocks
            and need + self._window_locked(path) <= self.swa_free_blocks
        )

    def _window_locked(self, path: list[Node]) -> int:
        """Sliding pages of a matched path that are evictable now and that locking its last window takes out."""
        taken, covered = 0, 0
        for node in reversed(path):
            if covered >= self.swa_window or node.tombstone:
                break
            taken += len(node.pages) if node.swa_lock_ref == 0 else 0
            covered += node.num_tokens
        return taken

    def swa_evictable_hit(self, req: Request) -> int:
        """Sliding pages that admitting `req` with its prefix hit (the caller has set `req.num_computed_tokens` to
        it) takes out of the evictable ones: its window's lock (SGLang checks the sliding room again once locked)."""
        self._hit_blocks(req)
        return self._window_locked(self._pending[1]) if self._pending is not None else 0

    def allocate(
        self, req: Request, num_new_tokens: int, admitting: bool = False, watermark: bool = True
    ) -> list[int] | None:
        if not admitting and req.id in self._tables:
            self._free_out_of_window(req, req.num_computed_tokens)
        return super().allocate(req, num_new_tokens, admitting, watermark)

    def open_decode_blocks(self, req: Request, num_tokens: int) -> list[int]:
        """A fused decode step (simulator/world/fast_forward.py) brings `req` to `num_tokens`: as `allocate` would, free
        its out-of-window slots first. Those frees only add room, which the stretch does not count (the safe side),
        and the SGLang scheduler fuses only while no admission is tried."""
        self._free_out_of_window(req, num_tokens - 1)
        return self.reserve(req, num_tokens)

    def _free_out_of_window(self, req: Request, computed: int) -> None:
        """Free the sliding slots of `req`'s own tokens before its window: in decode once a window of them has
        gathered (SGLang frees every window's decode steps, from the second: under overlap the prompt joins the
        tree after the first), and without a tree (SWAChunkCache) at each prompt chunk too."""
        end = self._extend_end.get(req.id, req.num_prompt_tokens)
        if computed == end or (computed < end and self.caching):  # a first decode; a chunk the tree holds
            return
        start = max(self._swa_done.get(req.id, 0), self._in_tree.get(req.id, 0))
        cut = computed - self.swa_window
        cut -= cut % self.block_size
        if cut - start < (1 if computed < end else self.swa_window):
            return
        for page in self._tables[req.id][start // self.block_size : cut // self.block_size]:
            self._free_swa(page)
        self._swa_done[req.id] = cut

    def _pop_free_many(self, count: int) -> list[int]:
        """Pages in both pools; short of either, SGLang's tree evicts the shortfall in each (full first)."""
        while len(self._free) < count and self._evictable_pages:
            self._evict_one()
        while len(self._swa_free) < count and self._swa_evictable:
            self._tombstone_one()
        pages = [self._free.popleft() for _ in range(count)]
        for page in pages:
            self._swa_of[page] = self._swa_free.popleft()
        return pages

    def _release(self, blocks: list[int]) -> None:
        for page in blocks:
            self._free_swa(page)
        super()._release(blocks)

    def _free_swa(self, page: int) -> None:
        if self._swa_of[page] is not None:
            self._swa_free.append(self._swa_of[page])
            self._swa_of[page] = None

    def free(self, req: Request, keep_uncached: bool = True) -> None:
        super().free(req, keep_uncached)
        self._swa_done.pop(req.id, None)

    # ---- the tree --------------------------------------------------------------------------------
    def _insert(self, req: Request, num_tokens: int) -> None:
        if self.caching:
            super()._insert(req, num_tokens)

    def _add_leaf(self, parent: Node, key: tuple[Piece, ...], pages: list[int]) -> Node:
        """Tokens whose sliding slots the request freed join as a tombstone, the rest as a live leaf below it."""
        dead = next((i for i, page in enumerate(pages) if self._swa_of[page] is not None), len(pages))
        assert dead < len(pages), "a request's last window has no sliding slots"
        if dead:
            head, key = _split_pieces(key, dead * self.block_size)
            parent = super()._add_leaf(parent, head, pages[:dead])
            parent.tombstone = True
            pages = pages[dead:]
        leaf = super()._add_leaf(parent, key, pages)
        self._swa_evictable += len(pages)
        return leaf

    def _adopt(self, node: Node, own: list[int], whole: bool) -> None:
        """A tombstone the request computed again whole, with live slots, takes them over."""
        if node.tombstone and whole and all(self._swa_of[page] is not None for page in own):
            for tree_page, page in zip(node.pages, own):
                self._swa_of[tree_page], self._swa_of[page] = self._swa_of[page], None
            node.tombstone = False
            if node.swa_lock_ref == 0:
                self._swa_evictable += len(node.pages)
                self._push_swa(node)
        super()._adopt(node, own, whole)

    def _delete(self, leaf: Node) -> int:
        """Evict a leaf (both pools), then its parent too if that is a tombstone left childless and unlocked."""
        if not leaf.tombstone and leaf.swa_lock_ref == 0:
            self._swa_evictable -= len(leaf.pages)
        parent, freed = leaf.parent, super()._delete(leaf)
        if parent.tombstone and not parent.children and parent.lock_ref == 0:
            freed += self._delete(parent)
        return freed

    def _tombstone_one(self) -> None:
        """Free the sliding slots of the least recently used live node no window reaches into (a parent before
        its children): an unlocked leaf is evicted whole, any other node becomes a tombstone."""
        while self._swa_heap:
            entry = heapq.heappop(self._swa_heap)
            if not self._swa_candidate(entry):
                continue
            node = entry[2]
            if not node.children and node.lock_ref == 0:
                self._delete(node)
                return
            for page in node.pages:
                self._free_swa(page)
            node.tombstone = True
            self._swa_evictable -= len(node.pages)
            return
        # callers check num_free_blocks first
        raise RuntimeError("sliding-window pool: nothing left to evict")

    def check_invariants(self) -> None:
        """Beyond the radix cache's: every sliding slot is free or behind exactly one full page; live nodes have all
        their slots, tombstones none; a request's own pages have theirs past what it freed; counts match."""
        super().check_invariants()
        mapped = [slot for slot in self._swa_of if slot is not None]
        assert sorted(mapped + list(self._swa_free)) == list(range(self.swa_blocks)), "sliding slots leaked"
        stack, evictable = list(self.root.children.values()), 0
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            assert all((self._swa_of[page] is None) == node.tombstone for page in node.pages), (
                "node half live"
            )
            evictable += len(node.pages) if not node.tombstone and node.swa_lock_ref == 0 else 0
            assert node.swa_lock_ref <= node.lock_ref
        assert evictable == self._swa_evictable, "sliding evictable count drifted"
        for rid, table in self._tables.items():
            own = self._in_tree.get(rid, 0) // self.block_size
            freed = max(self._swa_done.get(rid, 0) // self.block_size, own)
            assert all(self._swa_of[page] is None for page in table[own:freed]), "freed slot still held"
            assert all(self._swa_of[page] is not None for page in table[freed:]), "a page lost its slot"
