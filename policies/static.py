"""Static batching, the pre-Orca baseline: a batch is formed once, padded, and run until its longest member ends.

The batch takes up to `max_num_seqs` waiting requests in queue order, pads every prompt to the
longest one, and reserves KV for the padded prompt plus the longest output up front (as servers
without paging did). Finished members keep computing (their padding is priced) and hold their
slot until the whole batch ends; only then are the blocks freed and the next batch formed.
"""

from __future__ import annotations

import heapq

from servesim.policies.config import EngineConfig
from servesim.policies.kv_blocks import BlockManager, blocks_for
from servesim.policies.ordering import OrderKey
from servesim.policies.step import SchedulerDefaults, StepPlan, TokenLog
from servesim.policies.registry import schedulers
from servesim.workloads.request import Phase, Request


@schedulers.register("static")
class StaticScheduler(SchedulerDefaults):
    supports_prefix_caching = False

    def __init__(
        self, kv: BlockManager, cfg: EngineConfig, order: OrderKey, log: TokenLog, host_blocks: int = 0
    ):
        self.kv, self.cfg, self.order, self.log = kv, cfg, order, log
        self.max_num_seqs = cfg.batch_limits()[1]
        self._waiting: list[tuple[tuple, Request]] = []
        self.batch: list[Request] = []
        self.pad_tokens = 0  # padded prompt length of the current batch
        self.steps_done = 0

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.batch)

    def add(self, req: Request, now: float) -> None:
        heapq.heappush(self._waiting, (self.order(req), req))

    def schedule(self, now: float) -> StepPlan:
        if not self.batch and not self._form_batch():
            return StepPlan((), (), (), ())
        members = tuple(self.batch)
        if self.steps_done == 0:  # one padded prefill of every member
            return StepPlan(
                members, (self.pad_tokens,) * len(members), (0,) * len(members), (True,) * len(members)
            )
        context = self.pad_tokens + self.steps_done - 1
        return StepPlan(members, (1,) * len(members), (context,) * len(members), (True,) * len(members))

    def commit(self, plan: StepPlan, now: float) -> list[Request]:
        finished = []
        for req in self.batch:
            if req.is_done:
                continue  # padding: computed, but it holds a slot and produces nothing
            self.log.feed(req, req.num_pending_tokens, now)
            if req.is_done:
                req.finish_s = now
                finished.append(req)
        self.steps_done += 1
        if all(req.is_done for req in self.batch):
            for req in self.batch:
                req.phase = Phase.FINISHED
                self.kv.free(req)
            self.batch, self.steps_done = [], 0
        return finished

    def _form_batch(self) -> bool:
        candidates = [
            heapq.heappop(self._waiting)[1] for _ in range(min(self.max_num_seqs, len(self._waiting)))
        ]
        while candidates and not self._fits(candidates):
            heapq.heappush(self._waiting, (self.order(candidates[-1]), candidates[-1]))
            candidates.pop()
        if not candidates:
            return False
        self.pad_tokens = max(r.num_prompt_tokens for r in candidates)
        longest = max(r.num_output_tokens for r in candidates)
        for req in candidates:
            self.kv.reserve(req, self.pad_tokens + longest - 1)
            req.phase = Phase.RUNNING
        self.batch = candidates
        return True

    def _fits(self, candidates: list[Request]) -> bool:
        pad = max(r.num_prompt_tokens for r in candidates)
        longest = max(r.num_output_tokens for r in candidates)
        return len(candidates) * blocks_for(pad + longest - 1, self.kv.block_size) <= self.kv.num_free_blocks
