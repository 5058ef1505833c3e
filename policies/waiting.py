"""The waiting queue: a heap under a static order, or SGLang's longest-prefix-match order re-sorted every step.

`lpm` (SGLang's --schedule-policy lpm): waiting requests are sorted by how many prompt tokens the
cache already holds, longest first, ties in arrival order; with more than 128 waiting it falls back
to FCFS (WAITING_QUEUE_PREFIX_MATCH_MAX), which in SGLang sorts nothing: the list keeps its last LPM
order and newcomers (retracted requests too) queue behind it in the order they came. In-batch prefix
caching: among requests with at most 32 cached tokens, one that shares 32+ leading tokens with an
earlier waiting request is held back for this round, so the shared prefix is computed once and then
hit instead of computed side by side.
"""

from __future__ import annotations

import heapq

from servesim.policies.kv_blocks import BlockManager
from servesim.policies.ordering import OrderKey, by_arrival
from servesim.policies.token_ids import pieces, request_runs
from servesim.workloads.request import Request

LPM_MAX_WAITING = 128
IN_BATCH_CHECK_TOKENS = 32  # SGLang's IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD and ..._DEPRIORITIZE_THRESHOLD


class WaitingQueue:
    def __init__(self, order: OrderKey, kv: BlockManager, lpm: bool = False):
        self.order, self.kv, self.lpm = order, kv, lpm
        self._heap: list[tuple[tuple, Request]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, req: Request, key: tuple | None = None) -> None:
        """Queue `req` at its place in the order, or at `key`'s (which must compare with the order's keys); under
        lpm, behind every request the last LPM sort placed."""
        key = self.order(req) if key is None else key
        heapq.heappush(self._heap, ((1, key) if self.lpm else key, req))

    def head(self) -> Request:
        return self._heap[0][1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[1]

    def in_order(self):
        """The waiting requests in queue order, as `pop` would give them, without taking them (lazily: a caller
        that stops early pays for what it read)."""
        heap = list(self._heap)
        while heap:
            yield heapq.heappop(heap)[1]

    def requests(self) -> list[Request]:
        """The waiting requests, in no particular order."""
        return [req for _, req in self._heap]

    def take(self, wanted) -> list[Request]:
        """Remove and return, in queue order, the waiting requests for which `wanted(request)` holds."""
        taken = sorted((item for item in self._heap if wanted(item[1])), key=lambda item: item[0])
        if taken:
            ids = {id(item[1]) for item in taken}
            self._heap = [item for item in self._heap if id(item[1]) not in ids]
            heapq.heapify(self._heap)
        return [req for _, req in taken]

    def prepare(self) -> None:
        """Before admitting: under lpm, re-sort by cached prefix length (this step's cache contents)."""
        if not self.lpm or len(self._heap) > LPM_MAX_WAITING:  # too many to match: the order stays as it is
            return
        requests = sorted((r for _, r in self._heap), key=by_arrival)
        held_back, seen = set(), set()
        keys = []
        for rank, req in enumerate(requests):
            matched = self.kv.lookup(req)
            if matched <= IN_BATCH_CHECK_TOKENS and req.num_tokens >= IN_BATCH_CHECK_TOKENS:
                lead = pieces(request_runs(req), 0, IN_BATCH_CHECK_TOKENS)
                if lead in seen:
                    held_back.add(req)
                else:
                    seen.add(lead)
            keys.append(((0, req in held_back, -matched, rank), req))
        self._heap = keys
        heapq.heapify(self._heap)
