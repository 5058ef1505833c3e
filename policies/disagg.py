"""Prefill/decode disaggregation (DistServe, Splitwise, Mooncake, Dynamo, llm-d): the two halves of an engine.

As vLLM's KV connectors and their proxy run it: the prefill replica serves the request with
max_tokens=1, then keeps the KV blocks until the decode side holds a copy (`release`); the token it
sampled is not passed on. A decode replica reserves blocks for an incoming request in its next schedule,
*before* its KV is sent (so a full decode pool pushes back on the prefill pool instead of dropping work): its own cached
prefix first, fresh blocks for the rest, which is all the connector pulls. When the transfer lands
(`accept`) the request waits for a batch slot with all but its last prompt token computed: its first
step there recomputes that token and samples the first output token (vLLM's
`_update_waiting_for_remote_kv`). Both are the vLLM scheduler otherwise.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from servesim.policies.registry import schedulers
from servesim.policies.step import StepPlan
from servesim.policies.token_budget import TokenBudgetScheduler
from servesim.workloads.request import Phase, Request


@schedulers.register("vllm_prefill", internal=True)
class PrefillScheduler(TokenBudgetScheduler):
    """Hands a request off after its first token; requests that want only that token finish here."""

    hands_off_first_token = True
    schedules_ahead = False

    def schedule(self, now: float) -> StepPlan:
        plan = super().schedule(now)
        for req in plan.requests:
            req.extra.setdefault("prefill_start_s", now)
        return plan

    def commit(self, plan: StepPlan, now: float) -> list[Request]:
        """Requests whose prompt is now computed leave: a one-token request with its answer, the others to be
        handed off (they keep their blocks until the decode side has the KV; the token sampled here is dropped,
        so none is counted)."""
        done = []
        landed = self._landed(plan)
        self._note_in_flight((req, n) for req, n, _ in landed)
        for req, n, last_chunk in landed:
            if not self.pipelined:  # a pipelined step's tokens counted when it was scheduled
                req.num_computed_tokens += n
            self.kv.cache(req)
            if last_chunk:
                done.append(req)
        for req in done:
            if req.num_output_tokens == 1:
                self.log.sample(req, now)
                self.retire(req, now)
            else:
                req.extra["prefill_end_s"] = now
                self.running.remove(req)
        return done

    def decode_stretch(self, plan: StepPlan) -> None:
        return None  # prefill replicas never decode

    def chunk_stretch(self, plan: StepPlan) -> None:
        return None  # nor prefill beside decodes

    def release(self, req: Request) -> None:
        """The decode side holds the KV now: free it here (cached first, for later prefix hits)."""
        self.kv.cache(req)
        self.kv.free(req)


@schedulers.register("vllm_decode", internal=True)
class DecodeScheduler(TokenBudgetScheduler):
    """Reserves blocks for handed-off requests in arrival order, then decodes them like any other."""

    schedules_ahead = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.offers: deque[tuple[Request, Callable[[Request], None]]] = deque()
        self.in_flight = 0  # reserved, KV on the wire

    @property
    def num_waiting(self) -> int:
        return super().num_waiting + len(self.offers) + self.in_flight

    @property
    def admission_waits_for_blocks(self) -> bool:
        return bool(self.offers) or super().admission_waits_for_blocks  # offers reserve blocks, not slots

    def chunk_stretch(self, plan: StepPlan) -> None:
        return None  # every step grants offers (`schedule`), which a fused stretch would skip

    def offer(self, req: Request, on_reserved: Callable[[Request], None]) -> None:
        """Queue a prefilled request; `on_reserved(req)` runs once its blocks are reserved here, which vLLM's
        scheduler does in its next `schedule` (its connector starts the pull in that step's forward)."""
        self.offers.append((req, on_reserved))

    def grant_offers(self) -> None:
        """Reserve blocks for queued offers, first come first served, while the pool allows and the batch has a
        free slot (vLLM's waiting loop stops at max_num_seqs running). A request of its own that lost its KV to
        preemption and must recompute goes first: offers wait until it is back in."""
        if any(not self.kv.table(r) for r in self._waiting.requests()):
            return
        while self.offers and len(self.running) < self.max_num_seqs:
            req, on_reserved = self.offers[0]
            hit = self.kv.reserve_received(req, req.num_tokens)
            if hit is None:
                return
            req.extra["decode_hit_tokens"] = hit
            self.offers.popleft()
            self.in_flight += 1
            on_reserved(req)

    def accept(self, req: Request, now: float) -> None:
        """The KV has arrived: the request waits for a batch slot with its blocks in place, its last prompt token
        to compute again."""
        self.in_flight -= 1
        req.num_computed_tokens = req.num_tokens - 1
        self.kv.cache(req)  # vLLM registers the received blocks right away: later offers may hit them
        req.phase = Phase.WAITING
        self._waiting.push(req)

    def schedule(self, now: float) -> StepPlan:
        self.grant_offers()
        return super().schedule(now)

    def _admit_waiting(self, step) -> None:
        """Requests whose KV already sits in their reserved blocks need at most one more block: they pass a
        head of the queue that waits for memory (else reserved blocks could never be used: a deadlock)."""
        ready = self._waiting.take(lambda r: bool(self.kv.table(r)))
        for i, req in enumerate(ready):
            n = min(req.num_pending_tokens, step.budget)
            if not n or len(self.running) >= self.max_num_seqs or self.kv.allocate(req, n) is None:
                for rest in ready[i:]:
                    self._waiting.push(rest)
                break
            req.phase = Phase.RUNNING
            self.running.append(req)
            step.add(req, n)
        super()._admit_waiting(step)

    def retire(self, req: Request, now: float) -> None:
        super().retire(req, now)
        self.grant_offers()
