"""SGLang's radix cache (`prefix_caching: radix`): a radix tree over tokens, any prefix length reusable.

Edges are runs of tokens (pieces of a request's prompt/output runs); nodes own KV pages (page size
`block_size`, 1 token by default, as SGLang). A new request matches its longest cached prefix (up
to its last token), locks the matched path (`lock_ref`, as SGLang's inc_lock_ref) so it cannot be
evicted, and gets pages only for the rest. Prefilled chunks and, at the end, the whole request
are inserted into the tree; tokens another request inserted meanwhile are deduplicated (the
request's own copy is freed). When pages run out, unlocked leaves are evicted least recently used
first. A node is used when a request matches it (a waiting request's lookup too, as SGLang's
match_prefix stamps every node it walks), is inserted through, or is locked or unlocked. Recency is a
logical clock, so runs are deterministic. The eviction heap is lazy: an entry whose stamp is no longer
its node's is stale and skipped, so a leaf used again is evicted by its new stamp, not its first.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from servesim.policies.kv_blocks import BlockManager
from servesim.policies.token_ids import Piece, pieces, request_runs
from servesim.workloads.request import Request


@dataclass(eq=False)
class Node:
    key: tuple[Piece, ...]  # the edge's tokens
    pages: list[int]
    parent: Node | None
    children: dict[tuple, Node] = field(default_factory=dict)  # by first page of tokens
    lock_ref: int = 0
    last_access: int = 0
    swa_lock_ref: int = 0  # policies/swa_radix.py: requests whose sliding window reaches into the node
    tombstone: bool = (
        False  # policies/swa_radix.py: its sliding-window KV was freed, its full-attention KV kept
    )

    @property
    def num_tokens(self) -> int:
        return sum(p[2] for p in self.key)


def _first_page(key: tuple[Piece, ...], page_size: int) -> tuple:
    """Children are found by their first page of tokens (SGLang keys children by page, so that two edges that
    start alike but differ inside the first page cannot collide)."""
    if page_size == 1:
        return key[0][0], key[0][1]
    return _split_pieces(key, page_size)[0]


def _common_tokens(a: tuple[Piece, ...], b: tuple[Piece, ...]) -> int:
    """Length of the common leading tokens of two piece sequences."""
    n, i, j, ai, bj = 0, 0, 0, 0, 0  # ai/bj: tokens consumed inside a[i] / b[j]
    while i < len(a) and j < len(b):
        sa, oa, la = a[i]
        sb, ob, lb = b[j]
        if sa != sb or oa + ai != ob + bj:
            return n
        step = min(la - ai, lb - bj)
        n, ai, bj = n + step, ai + step, bj + step
        if ai == la:
            i, ai = i + 1, 0
        if bj == lb:
            j, bj = j + 1, 0
    return n


def _split_pieces(key: tuple[Piece, ...], at: int) -> tuple[tuple[Piece, ...], tuple[Piece, ...]]:
    head, tail, seen = [], [], 0
    for seg, off, length in key:
        if seen + length <= at:
            head.append((seg, off, length))
        elif seen >= at:
            tail.append((seg, off, length))
        else:
            cut = at - seen
            head.append((seg, off, cut))
            tail.append((seg, off + cut, length - cut))
        seen += length
    return tuple(head), tuple(tail)


class RadixCache(BlockManager):
    caches_when_scheduled = (
        False  # each step's `cache` inserts its chunk into the tree (cache_unfinished_req)
    )

    def __init__(self, num_blocks: int, block_size: int = 1, watermark: float = 0.0):
        super().__init__(num_blocks, block_size, watermark)
        self.root = Node((), [], None, lock_ref=1)
        self._clock = itertools.count(1)
        self._locked: dict[int, Node] = {}  # request id -> deepest node it locks
        self._in_tree: dict[int, int] = {}  # request id -> its leading tokens owned by the tree
        # request id -> its tokens when admitted: what its prefill extends to
        self._extend_end: dict[int, int] = {}
        self._evictable_pages = 0
        # (last_access, tiebreak, leaf) candidates, lazily pruned
        self._heap: list[tuple[int, int, Node]] = []
        self._tiebreak = itertools.count()
        self._pending: tuple[Request, list[Node], int] | None = None  # a matched path awaiting admission

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self._evictable_pages

    def _key(self, key: tuple[Piece, ...]) -> tuple:
        return _first_page(key, self.block_size)

    # ---- matching -------------------------------------------------------------------------------
    def match(self, key: tuple[Piece, ...]) -> tuple[int, list[Node]]:
        """Longest cached prefix of `key` (page aligned): tokens matched and the nodes on the path (splitting the
        last one where the match ends)."""
        node, matched, path = self.root, 0, []
        rest, stamp = key, next(self._clock)
        while sum(p[2] for p in rest) >= self.block_size:
            child = node.children.get(self._key(rest))
            if child is None:
                break
            common = _common_tokens(child.key, rest)
            common -= common % self.block_size
            if common == 0:
                break
            if common < child.num_tokens:
                child = self._split(child, common)
            self._stamp(child, stamp)
            path.append(child)
            matched += common
            node = child
            rest = _split_pieces(rest, common)[1]
        return matched, path

    def lookup(self, req: Request) -> int:
        runs = request_runs(req)
        return self.match(pieces(runs, 0, req.num_tokens - 1))[0]

    def _split(self, node: Node, at: int) -> Node:
        """Cut `node`'s edge after `at` tokens; returns the new upper node."""
        head_key, tail_key = _split_pieces(node.key, at)
        upper = Node(
            head_key,
            node.pages[: at // self.block_size],
            node.parent,
            lock_ref=node.lock_ref,
            last_access=node.last_access,
            swa_lock_ref=node.swa_lock_ref,
            tombstone=node.tombstone,
        )
        node.parent.children[self._key(head_key)] = upper
        node.key, node.pages, node.parent = tail_key, node.pages[at // self.block_size :], upper
        upper.children[self._key(tail_key)] = node
        return upper

    # ---- admission, growth, insertion ------------------------------------------------------------
    def _hit_blocks(self, req: Request) -> list[int]:
        self._pending = None
        if req.id in self._tables or not req.num_computed_tokens:
            return []
        matched, path = self.match(pieces(request_runs(req), 0, req.num_computed_tokens))
        assert matched == req.num_computed_tokens, "lookup and admission disagree"
        self._pending = (req, path, matched)
        return [p for node in path for p in node.pages]

    def _evictable_among(self, blocks: list[int]) -> int:
        """Pages of the matched path that are evictable now and stop being so once it is locked."""
        if self._pending is None or not blocks:  # no hit in this call: a check that failed left its path
            return 0
        return sum(len(node.pages) for node in self._pending[1] if node.lock_ref == 0)

    def _touch(self, blocks: list[int]) -> None:
        """Lock the path `_hit_blocks` just matched (its pages are `blocks`)."""
        assert self._pending is not None, "admission without a matched path"
        req, path, matched = self._pending
        self._set_lock(req, path[-1], matched)
        self._pending = None

    def allocate(
        self, req: Request, num_new_tokens: int, admitting: bool = False, watermark: bool = True
    ) -> list[int] | None:
        new = super().allocate(req, num_new_tokens, admitting, watermark)
        # what it extends to: its prompt, and its outputs after a retraction
        if admitting and new is not None:
            self._extend_end[req.id] = req.num_tokens
        return new

    def cache(self, req: Request) -> None:
        """While a request extends (its prompt, or prompt and outputs again after a retraction), insert what is
        done (SGLang's cache_unfinished_req) so others can match it; the whole request is inserted when it is
        freed."""
        if req.id in self._tables and req.num_computed_tokens <= self._extend_end.get(
            req.id, req.num_prompt_tokens
        ):
            self._insert(req, req.num_computed_tokens - req.num_computed_tokens % self.block_size)

    def _insert(self, req: Request, num_tokens: int) -> None:
        done = self._in_tree.get(req.id, 0)
        if num_tokens <= done:
            return
        table = self._tables[req.id]
        key = pieces(request_runs(req), 0, num_tokens)
        node, position, rest = self.root, 0, key
        while rest:
            child = node.children.get(self._key(rest))
            common = _common_tokens(child.key, rest) if child else 0
            common -= common % self.block_size
            if not common:
                node = self._add_leaf(
                    node, rest, table[position // self.block_size : num_tokens // self.block_size]
                )
                break
            if common < child.num_tokens:
                child = self._split(child, common)
            first, last = position // self.block_size, (position + common) // self.block_size
            if position + common > done:  # the tree already has tokens we computed ourselves: use its copy
                own = table[max(first, done // self.block_size) : last]
                table[max(first, done // self.block_size) : last] = child.pages[
                    max(0, done - position) // self.block_size :
                ]
                self._adopt(child, own, whole=done <= position)
            self._stamp(child, next(self._clock))
            node, position, rest = child, position + common, _split_pieces(rest, common)[1]
        self._set_lock(req, node, num_tokens)

    def _add_leaf(self, parent: Node, key: tuple[Piece, ...], pages: list[int]) -> Node:
        """A new leaf under `parent` holding a request's `pages` of `key` (unlocked until the request locks it)."""
        leaf = Node(key, pages, parent, last_access=next(self._clock))
        parent.children[self._key(key)] = leaf
        self._evictable_pages += len(pages)
        return leaf

    def _adopt(self, node: Node, own: list[int], whole: bool) -> None:
        """A request's `own` pages duplicate part of `node` (all of it if `whole`), which it now uses: free them."""
        self._release(own)

    def _set_lock(self, req: Request, node: Node, num_tokens: int) -> None:
        """Lock the path to `node` for `req` (and unlock its previous path)."""
        self._lock_path(node, +1)
        old = self._locked.get(req.id)
        if old is not None:
            self._unlock(req, old)
        self._locked[req.id], self._in_tree[req.id] = node, num_tokens

    def _unlock(self, req: Request, node: Node) -> None:
        """`req` no longer locks the path to `node`."""
        self._lock_path(node, -1)

    def _lock_path(self, node: Node, delta: int) -> None:
        """Lock (+1) or unlock (-1) the path from the root to `node`, all of it used now (stamped from the root
        down: among equal stamps a parent counts as used before its children)."""
        clock = next(self._clock)
        for node in reversed(self._path_to(node)):
            if node.lock_ref == 0 and delta > 0:
                self._evictable_pages -= len(node.pages)
            node.lock_ref += delta
            if node.lock_ref == 0:
                self._evictable_pages += len(node.pages)
            self._stamp(node, clock)

    def _path_to(self, node: Node) -> list[Node]:
        """`node` and its ancestors below the root, deepest first."""
        path = []
        while node is not self.root:
            path.append(node)
            node = node.parent
        return path

    def _stamp(self, node: Node, stamp: int) -> None:
        """`node` is used at `stamp`; an evictable leaf gets a heap entry at its new stamp (the old one goes stale)."""
        node.last_access = stamp
        if node.lock_ref == 0 and not node.children:
            self._push(node)

    def _push(self, leaf: Node) -> None:
        self._lazy_push(self._heap, leaf, self._evictable_pages, self._live)

    def _lazy_push(
        self,
        heap: list[tuple[int, int, Node]],
        node: Node,
        evictable: int,
        live: Callable[[tuple[int, int, Node]], bool],
    ) -> None:
        """Push `node` at its stamp onto a lazily pruned eviction heap; once the heap is mostly stale (past twice
        the `evictable` pages, and a margin), keep only the entries `live` accepts."""
        heapq.heappush(heap, (node.last_access, next(self._tiebreak), node))
        if len(heap) > 2 * evictable + 1024:
            heap[:] = [entry for entry in heap if live(entry)]
            heapq.heapify(heap)

    def _live(self, entry: tuple[int, int, Node]) -> bool:
        """Whether a heap entry is its leaf's current stamp and the leaf can be evicted."""
        stamp, _, leaf = entry
        return stamp == leaf.last_access and leaf.lock_ref == 0 and not leaf.children and self._attached(leaf)

    def _attached(self, node: Node) -> bool:
        """Whether `node` is still in the tree (an evicted or replaced node's heap entries outlive it)."""
        return node.parent is not None and node.parent.children.get(self._key(node.key)) is node

    def free(self, req: Request, keep_uncached: bool = True) -> None:
        """The request ends (or is preempted): its computed pages join the tree (unless `keep_uncached` is False:
        then only what the tree already holds stays), the rest go back to the pool."""
        table = self._tables.get(req.id)
        if table is None:
            return
        if keep_uncached:
            self._insert(req, req.num_computed_tokens - req.num_computed_tokens % self.block_size)
        in_tree = self._in_tree.pop(req.id, 0)
        self._extend_end.pop(req.id, None)
        self._release(table[in_tree // self.block_size :])
        del self._tables[req.id]
        node = self._locked.pop(req.id, None)
        if node is not None:
            self._unlock(req, node)

    # ---- pool -------------------------------------------------------------------------------------
    def _pop_free_many(self, count: int) -> list[int]:
        """SGLang's evict_from_tree_cache: short of `count` free pages, it evicts LRU leaves until it has freed
        `count` pages (or nothing is left to evict), not just the shortfall."""
        if len(self._free) < count:
            evicted = 0
            while evicted < count and self._evictable_pages:
                evicted += self._evict_one()
        return [self._free.popleft() for _ in range(count)]

    def _evict_one(self) -> int:
        """Evict the least recently used unlocked leaf; returns its pages."""
        while self._heap:
            entry = heapq.heappop(self._heap)
            if self._live(entry):
                return self._delete(entry[2])
        raise RuntimeError("radix cache: nothing left to evict")  # callers check num_free_blocks first

    def _delete(self, leaf: Node) -> int:
        """Evict an unlocked leaf: its pages go back to the pool (returns how many); its parent may be next."""
        del leaf.parent.children[self._key(leaf.key)]
        self._evictable_pages -= len(leaf.pages)
        self._release(leaf.pages)
        parent = leaf.parent
        leaf.parent = None
        if parent is not self.root and parent.lock_ref == 0 and not parent.children:
            self._push(parent)
        return len(leaf.pages)

    def check_invariants(self) -> None:
        """Pages are owned exactly once (pool, tree or a request's own tail); locks match the requests."""
        tree_pages, stack, evictable = [], list(self.root.children.values()), 0
        locks: dict[int, int] = {}
        while stack:
            node = stack.pop()
            tree_pages += node.pages
            evictable += len(node.pages) if node.lock_ref == 0 else 0
            stack.extend(node.children.values())
            assert node.lock_ref >= 0
        for node in self._locked.values():
            while node is not self.root:
                locks[id(node)] = locks.get(id(node), 0) + 1
                node = node.parent
        own = [
            p
            for rid, table in self._tables.items()
            for p in table[self._in_tree.get(rid, 0) // self.block_size :]
        ]
        everything = tree_pages + own + list(self._free)
        assert sorted(everything) == list(range(self.num_blocks)), "pages leaked or owned twice"
        assert evictable == self._evictable_pages, "evictable page count drifted"


class TokenTrie:
    """A bare radix tree of token sequences (no pages): what a router remembers it sent where. Each insert
    stamps the nodes on its path; `evict_to` drops least recently stamped leaves first."""

    def __init__(self) -> None:
        self.root = Node((), [], None)
        self.num_tokens = 0
        self._clock = 0

    def match(self, key: tuple[Piece, ...]) -> int:
        """Tokens of the longest prefix of `key` inserted before."""
        node, matched, rest = self.root, 0, key
        while rest:
            child = node.children.get(_first_page(rest, 1))
            if child is None:
                return matched
            common = _common_tokens(child.key, rest)
            matched += common
            if common < child.num_tokens:
                return matched
            node, rest = child, _split_pieces(rest, common)[1]
        return matched

    def insert(self, key: tuple[Piece, ...]) -> None:
        self._clock += 1
        node, rest = self.root, key
        while rest:
            child = node.children.get(_first_page(rest, 1))
            if child is None:
                node.children[_first_page(rest, 1)] = Node(rest, [], node, last_access=self._clock)
                self.num_tokens += sum(p[2] for p in rest)
                return
            common = _common_tokens(child.key, rest)
            if common < child.num_tokens:
                head, tail = _split_pieces(child.key, common)
                upper = Node(head, [], node)
                node.children[_first_page(head, 1)] = upper
                child.key, child.parent = tail, upper
                upper.children[_first_page(tail, 1)] = child
                child = upper
            child.last_access = self._clock
            node, rest = child, _split_pieces(rest, common)[1]

    def evict_to(self, max_tokens: int) -> None:
        """Drop least recently inserted leaves (a parent is stamped whenever a child is) until at most
        `max_tokens` tokens remain."""
        if self.num_tokens <= max_tokens:
            return
        # stamps are unique per leaf; order breaks no tie
        heap, stack, order = (
            [],
            [self.root],
            itertools.count(),
        )
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node is not self.root:
                heap.append((node.last_access, next(order), node))
        heapq.heapify(heap)
        while self.num_tokens > max_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[_first_page(leaf.key, 1)]
            self.num_tokens -= leaf.num_tokens
            if not parent.children and parent is not self.root:
                heapq.heappush(heap, (parent.last_access, next(order), parent))
