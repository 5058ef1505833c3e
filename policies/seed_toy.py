"""The teaching engine of the seed post ("A toy vLLM"), kept as a reference policy to check the KV manager against.

Each step, as `continuous_batch()` in kv-cache-batching-paged-radix-speculative.txt does it:
1. admit waiting requests while a slot is free and `blocks(tokens + 1)` blocks are free; each
   prefills its whole prompt (prompt + outputs so far after a preemption) and samples a token;
2. while more running requests are about to open a new block than there are free blocks,
   preempt the newest (its KV is dropped and recomputed when it is readmitted at the queue front);
3. every running request that is not done decodes one token (prefill and first decode of a newly
   admitted request share the step, unlike vLLM, where the first decode comes a step later);
4. finished requests leave and their blocks go back to the free list.
"""

from __future__ import annotations

from collections import deque

from servesim.policies.config import EngineConfig
from servesim.policies.kv_blocks import BlockManager, blocks_for
from servesim.policies.ordering import OrderKey
from servesim.policies.registry import schedulers
from servesim.policies.step import SchedulerDefaults, StepPlan, TokenLog
from servesim.workloads.request import Phase, Request


@schedulers.register("seed_toy")
class SeedToyScheduler(SchedulerDefaults):
    supports_prefix_caching = False

    def __init__(
        self, kv: BlockManager, cfg: EngineConfig, order: OrderKey, log: TokenLog, host_blocks: int = 0
    ):
        self.kv, self.max_running, self.log = kv, cfg.batch_limits()[1], log
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._prefilled: set[Request] = set()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def add(self, req: Request, now: float) -> None:
        self.waiting.append(req)

    def schedule(self, now: float) -> StepPlan:
        self._prefilled = set()
        while (
            self.waiting
            and len(self.running) < self.max_running
            and blocks_for(self.waiting[0].num_tokens + 1, self.kv.block_size) <= self.kv.num_free_blocks
        ):
            req = self.waiting.popleft()
            self.kv.allocate(req, req.num_tokens)
            req.phase = Phase.RUNNING
            self.running.append(req)
            self._prefilled.add(req)
        preempted = self._preempt_until_room()
        new, context = [], []
        for req in self.running:
            prefill = req.num_tokens if req in self._prefilled else 0
            decode = 0 if req.num_generated + (prefill > 0) >= req.num_output_tokens else 1
            if decode:
                self.kv.allocate(req, prefill + 1)
            new.append(prefill + decode)
            context.append(req.num_computed_tokens)
        return StepPlan(tuple(self.running), tuple(new), tuple(context), (True,) * len(new), tuple(preempted))

    def commit(self, plan: StepPlan, now: float) -> list[Request]:
        for req, n in zip(plan.requests, plan.num_new):
            if req in self._prefilled:
                prompt = req.num_tokens
                self.log.feed(req, prompt, now)  # the prefill samples the first token
                n -= prompt
            if n:
                self.log.feed(req, 1, now)
        finished = [req for req in self.running if req.is_done]
        for req in finished:
            req.phase, req.finish_s = Phase.FINISHED, now
            self.kv.free(req)
            self.running.remove(req)
        return finished

    def _preempt_until_room(self) -> list[Request]:
        preempted = []
        while self.running and self._opening_blocks() > self.kv.num_free_blocks:
            victim = self.running.pop()
            self.kv.free(victim)
            victim.num_computed_tokens = 0
            victim.num_preemptions += 1
            victim.phase = Phase.WAITING
            self._prefilled.discard(victim)
            self.waiting.appendleft(victim)
            preempted.append(victim)
        return preempted

    def _opening_blocks(self) -> int:
        """Running requests whose next token starts a new block (the seed counts every running one)."""
        size = self.kv.block_size
        return sum(
            (r.num_tokens if r in self._prefilled else r.num_computed_tokens) % size == 0
            for r in self.running
        )
