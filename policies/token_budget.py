"""Continuous batching under a per-step token budget: vLLM v1's scheduler, and Sarathi/Orca as settings of it.

Each step (vLLM v1 semantics):
1. running requests first, in admission order: each gets min(pending tokens, budget) tokens — 1 for
   a decode, a chunk for a prefill; if KV blocks run out, the lowest-priority running request
   (the newest under FCFS) is preempted until the allocation fits or the request itself is preempted,
   which ends the pass (under priority order, running requests after it wait for the next step);
2. then, only if nobody was preempted this step, waiting requests in queue order while budget,
   `max_num_seqs` and KV blocks allow; the first that does not fit blocks the rest (head of line). With
   `scheduler_reserve_full_isl` (vLLM's default since 0.19) a request fits only if the pool could hold its
   whole prompt, not just its first chunk: a long prompt no longer gets in on a chunk's worth of blocks, runs
   the pool dry halfway and is preempted to start again.

Speculative decoding (`engine.speculative`, policies/spec_decode.py): in a step that drafts, a decoding
request is scheduled with 1 + k tokens (its last sampled token and k guesses), within the budget, with KV
blocks for all of them and, with a draft model or EAGLE/MTP heads, for k lookahead slots more (vLLM's
num_lookahead_tokens, reserved for every running request). At commit it gains `accepted + 1` tokens and
`num_computed_tokens` advances by as many; the rejected positions are simply overwritten next round, and
their blocks stay with the request (vLLM v1 rolls back `num_computed_tokens` only), so nothing leaks and
the next round needs fewer.

`sarathi` is the same loop with a fixed `chunk_size` budget (stall-free batching). `orca` runs
whole prompts only and reserves KV for prompt + output at admission, as Orca's contiguous
allocation did, so it never preempts. Preemption by `swap` moves the victim's blocks to host
memory (its PCIe time is charged to the step) and resumes it before new admissions.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterable

from servesim.hardware.kv_groups import KVGroups, admission_blocks
from servesim.policies.config import EngineConfig
from servesim.policies.families import GENERIC, VLLM
from servesim.policies.kv_blocks import BlockManager, blocks_for, fits_in_last_block
from servesim.policies.one_step_ahead import OneStepAhead
from servesim.policies.ordering import OrderKey
from servesim.policies.registry import schedulers
from servesim.policies.spec_decode import Speculator
from servesim.policies.step import (
    ChunkStretch,
    PlanBuilder,
    SchedulerDefaults,
    StepPlan,
    TokenLog,
    feed_plan,
    release_finished,
)
from servesim.policies.waiting import WaitingQueue
from servesim.workloads.request import Phase, Request


@schedulers.register("vllm")
class TokenBudgetScheduler(SchedulerDefaults):
    family = VLLM
    schedules_ahead = True
    speculates = True
    batch_queue = True
    supports_prefix_caching = True
    # the token budget charges a prompt's prefix-cache hit as well (TensorRT-LLM finds hits only after it
    # schedules); vLLM charges only the tokens it computes
    budget_counts_hits = False

    def __init__(
        self, kv: BlockManager, cfg: EngineConfig, order: OrderKey, log: TokenLog, host_blocks: int = 0
    ):
        self.kv, self.cfg, self.order, self.log = kv, cfg, order, log
        self.budget, self.max_num_seqs = cfg.batch_limits()
        self.steps_in_flight = cfg.in_flight_batches()  # steps planned before the last one's outputs are in
        self.chunked = cfg.enable_chunked_prefill
        self.reserve_output = False
        self.host_blocks_free = host_blocks
        self.running: list[Request] = []
        self._cursor = 0  # index in `running` of the request being scheduled
        self.swapped: deque[tuple[Request, int]] = deque()
        self._waiting = WaitingQueue(order, kv, lpm=cfg.queue_order == "lpm")
        # the World replaces it with one seeded by the run; seed 0 serves schedulers built directly
        self.speculator = Speculator(cfg.speculative) if cfg.speculative is not None else None
        self._drafting = False  # whether the step being scheduled drafts
        # async scheduling (vLLM's default; resolved by EngineConfig.with_defaults): plans one step ahead
        self.ahead = OneStepAhead() if cfg.async_scheduling is True else None
        # pipeline parallel (`pipeline(pp)`): several steps in flight, tokens counted as computed when scheduled
        self.pipelined = False
        # id(plan) -> its requests' preemption counts when planned
        self._stamps: dict[int, tuple[int, ...]] = {}
        # async scheduling: a finished request held a step -> how many running requests were ahead of it
        self._live_before: dict[Request, int] = {}

    def pipeline(self, depth: int) -> None:
        """Schedule for a pipeline-parallel replica, as vLLM V1 does with a batch queue of `depth` (pp) steps: a
        request's tokens count as computed once scheduled, so its next prompt chunk can go into the next
        micro-batch while this one is in flight, and a request whose sampled token is not back yet has nothing to
        schedule."""
        self.pipelined = True
        self.steps_in_flight = self.cfg.in_flight_batches(depth)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self.swapped) + (len(self.ahead.inbox) if self.ahead else 0)

    @property
    def admission_window_tokens(self) -> int | None:
        """With vLLM's admission gate (`scheduler_reserve_full_isl`, chunked prompts; unchunked ones are admitted
        whole anyway, Orca's reserved): the tokens in flight a sliding window's blocks are counted for
        (`kv_groups.admission_blocks`); None without it."""
        gated = self.chunked and self.cfg.scheduler_reserve_full_isl and not self.reserve_output
        return self.budget * self.steps_in_flight if gated else None

    @property
    def holds_finished(self) -> bool:
        """Whether a finished request keeps its slot and blocks until the next step is planned (async
        scheduling): a fused decode stretch then frees them a step after the finish (`release_retired`)."""
        return self.ahead is not None

    @property
    def arrival_lag_steps(self) -> int:
        return self.ahead.arrival_lag_steps if self.ahead is not None else 0

    def fused_decode_steps(self, num_steps: int, last_start_s: float) -> None:
        if self.ahead is not None:
            self.ahead.fused_until(last_start_s)

    def release_retired(self, req: Request) -> None:
        """Free the slot and blocks of `req`, which finished in the step before the one just planned."""
        self.ahead.retiring.remove(req)
        self._free([req])

    @property
    def _seats_taken(self) -> int:
        """Batch slots in use: the running requests, and those finished whose slots are not yet freed."""
        return len(self.running) + (len(self.ahead.retiring) if self.ahead else 0)

    @property
    def admission_waits_for_blocks(self) -> bool:
        """Whether freed KV blocks could let a waiting or swapped-out request in: one waits and a batch slot is
        free (a full batch admits nobody whatever the pool holds)."""
        return self.num_waiting > 0 and self._seats_taken < self.max_num_seqs

    @property
    def num_running(self) -> int:
        return len(self.running)

    def add(self, req: Request, now: float) -> None:
        req.phase = Phase.WAITING
        if self.ahead is not None:
            self.ahead.arrive(req, now)
        else:
            self._waiting.push(req)

    def schedule(self, now: float) -> StepPlan:
        if self.ahead is None:
            return self._plan()
        return self.ahead.schedule(now, self._plan, self._waiting.push, self._free)

    def _free(self, finished: list[Request]) -> None:
        """Free the slots and blocks of requests that finished before the plan just made (async scheduling)."""
        for req in finished:
            self._live_before.pop(req, None)
            release_finished(req, self.kv, req.finish_s)

    def _plan(self) -> StepPlan:
        # the engine waited: nothing in flight
        if self.ahead is not None and self.ahead.in_flight_since is None:
            self._note_in_flight(())
        step = PlanBuilder(self.budget)
        self._drafting = self.speculator is not None and self.speculator.is_on(self.running)
        self._schedule_running(step)
        if not step.preempted and not step.freed_finished:
            self._resume_swapped(step)
            self._admit_waiting(step)
        plan = step.plan(self.speculator, self._drafting)
        if self.speculator is not None and not self._drafting:
            self.speculator.stop(plan.requests)
        if self.pipelined and plan.requests:
            self._stamps[id(plan)] = tuple(req.num_preemptions for req in plan.requests)
            for req, n in zip(plan.requests, plan.num_new):
                req.num_computed_tokens += n
                req.num_in_flight_tokens += n
        return plan

    def _landed(self, plan: StepPlan) -> list[tuple[Request, int, bool]]:
        """(request, tokens, samples) of a finished step whose tokens count now: all of them, except, when
        pipelined, requests preempted while it was in flight (their tokens were dropped with their KV); a
        pipelined step's tokens were counted when it was scheduled."""
        if not self.pipelined:
            return list(zip(plan.requests, plan.num_new, plan.samples))
        stamps, landed = self._stamps.pop(id(plan)), []
        for req, n, sample, stamp in zip(plan.requests, plan.num_new, plan.samples, stamps):
            if req.num_preemptions != stamp or req.phase is not Phase.RUNNING:
                continue
            req.num_in_flight_tokens -= n
            landed.append((req, n, sample))
        return landed

    def commit(self, plan: StepPlan, now: float) -> list[Request]:
        if plan.num_draft:
            return self._commit_speculative(plan, now)
        if self.pipelined:
            finished = []
            for req, _, sample in self._landed(plan):
                if sample:
                    self.log.sample(req, now)
                    if req.is_done:
                        finished.append(req)
                self.kv.cache(req)
        else:
            self._note_in_flight(zip(plan.requests, plan.num_new))
            finished = feed_plan(plan, self.log, self.kv, now)
        for req in finished:
            self.retire(req, now)
        return finished

    def _note_in_flight(self, advanced: Iterable[tuple[Request, int]]) -> None:
        """Under async scheduling vLLM plans the next step before it has processed this one's outputs: the tokens
        each request advanced here are in flight for that plan (`num_in_flight_tokens`), so its sliding windows
        free blocks only below them (vLLM's allocate_slots frees on the processed-token basis); requests not in
        this step have none. Synchronously, and pipelined (counted as scheduled), nothing to note."""
        if self.ahead is None:
            return
        for req in self.running:
            req.num_in_flight_tokens = 0
        for req, n in advanced:
            req.num_in_flight_tokens = n

    @property
    def earlier_tokens_in_flight(self) -> int:
        """The most tokens of earlier steps a request can have in flight when a step is planned (one budget under
        async scheduling, pp - 1 pipelined): its sliding windows keep their blocks. Orca reserves every block of
        a request at admission: none to count."""
        return 0 if self.reserve_output else self.budget * (self.steps_in_flight - 1)

    def blocks_to_run(self, total: int, windows: tuple[int | None, ...], block_size: int) -> int:
        """The most KV blocks a request of `total` tokens needs at once here: at any step (chunks of the budget, the
        earlier steps' tokens in flight), at its admission through vLLM's gate (even after a preemption), or, for
        Orca, reserved whole in every group at admission. A smaller pool could never run it."""
        if self.reserve_output:
            return len(windows) * blocks_for(total, block_size)
        need = KVGroups(windows, 0).most_blocks(
            total, block_size, self.cfg.max_num_batched_tokens, self.earlier_tokens_in_flight
        )
        gate = self.admission_window_tokens
        return (
            need
            if gate is None
            else max(need, sum(admission_blocks(w, total, block_size, gate) for w in windows))
        )

    @property
    def decode_tokens_in_flight(self) -> int:
        """What a fused decode step leaves in flight for each request when the next is planned."""
        return 1 if self.ahead is not None else 0

    def _commit_speculative(self, plan: StepPlan, now: float) -> list[Request]:
        """Verify: each guessing request gains accepted + 1 tokens."""
        finished, spec = [], self.speculator
        drafts = plan.num_draft or (0,) * len(plan.requests)
        self._note_in_flight(())
        for req, n, d in zip(plan.requests, plan.num_new, drafts):
            accepted = spec.accept(req, d) if d else 0
            if self.ahead is not None:  # rejected guesses roll back: what counts is what it gained
                req.num_in_flight_tokens = n - d + accepted
            if self.log.feed(req, n - d + accepted, now, 1 + accepted) and req.is_done:
                finished.append(req)
            self.kv.cache(req)
        for req in finished:
            self.retire(req, now)
        return finished

    def retire(self, req: Request, now: float) -> None:
        """A request produced its last token at `now`: it leaves the batch; its blocks go back (cached first), at
        once or, under async scheduling, once the next step is planned."""
        position = self.running.index(req)  # the finished ahead of it left already: running order
        del self.running[position]
        if self.speculator is not None:
            self.speculator.forget(req)
        if self.ahead is not None:
            self._live_before[req] = position
            self.ahead.hold(req, now)
        else:
            release_finished(req, self.kv, now)

    @property
    def _queue_resorts(self) -> bool:
        """Whether the next plans re-sort a waiting queue: an LPM queue is sorted by the cache as it stands every plan
        (and keeps its last order once over LPM_MAX_WAITING wait), which fused steps, evicting and filling cached
        blocks, would skip: its head may change to a request that fits."""
        return self._waiting.lpm and self.num_waiting > 0

    def decode_stretch(self, plan: StepPlan) -> list[Request] | None:
        """The running requests, if `plan` is a plain decode of all of them (nothing admitted, preempted,
        swapped or chunked): then until a finish, an arrival or a full pool, every step looks the same.
        Never with speculative decoding: its steps are random (accepted guesses), and drafting may switch on
        again as the batch shrinks."""
        if self.speculator is not None or (
            self.ahead is not None and not self.ahead.settled(self.num_waiting > 0)
        ):
            return None
        if self._queue_resorts:
            return None
        if plan.preempted or plan.swap_in_blocks or len(plan.requests) != len(self.running):
            return None
        if any(n != 1 for n in plan.num_new) or not all(plan.samples):
            return None
        if any(r.num_generated == 0 for r in self.running):  # a one-token prompt: a prefill, not a decode
            return None
        return self.running

    def chunk_stretch(self, plan: StepPlan) -> ChunkStretch | None:
        """(decodes, prefill, `prefill_chunk`) if `plan` decodes every running request but the newest, which is fed
        a chunk of its prompt: then until the prompt is done, an arrival, a full pool or (if any request waits) a
        step with budget to admit it, the steps follow from `prefill_chunk` (simulator/world/chunk_stretch.py).
        Not with speculative decoding, pipelining, sliding windows (whose blocks free as they slide) or a cache that works
        after each step (SGLang's radix tree). Unlike `decode_stretch` it needs no `ahead.settled()`: arrivals the
        next plans would see wait too, and every admission or resume needs budget, which its steps leave none of
        while anyone waits."""
        if self.speculator is not None or self.pipelined or not self.chunked:
            return None
        if self.kv.windows != (None,) or not self.kv.caches_when_scheduled:
            return None
        if plan.preempted or plan.swap_in_blocks or plan.rank or self._queue_resorts:
            return None
        if len(plan.requests) < 2 or len(plan.requests) != len(self.running):
            return None
        *decodes, prefill = plan.requests
        if prefill.num_generated or plan.samples[-1] or any(r.num_generated == 0 for r in decodes):
            return None
        if any(n != 1 for n in plan.num_new[:-1]) or not all(plan.samples[:-1]):
            return None
        return decodes, prefill, self.prefill_chunk

    def prefill_chunk(self, pending: int, num_decodes: int) -> tuple[int, int]:
        """The tokens a prefill with `pending` to go gets in a step whose `num_decodes` decodes came first, and the
        budget left for admissions."""
        room = self.budget - num_decodes
        n = self._within(self._capped(pending), room)
        return n, room - n

    # ---- the three passes ---------------------------------------------------------------------
    def _schedule_running(self, step: PlanBuilder) -> None:
        running, i, drafting, spec = self.running, 0, self._drafting, self.speculator
        kv = self.kv
        block_size = kv.block_size
        while i < len(running) and step.budget > 0:
            req = running[i]
            lookahead = spec.lookahead if spec is not None and spec.speculates(req) else 0
            computed = req.num_computed_tokens
            pending = req.num_prompt_tokens + req.num_generated - computed
            # a plain decode, the hot path: what the general
            if pending == 1 and not lookahead and not drafting:
                self._cursor = (
                    i  # case below does for one token (no cap, no guesses, a new block only at a boundary)
                )
                if computed % block_size == 0 and not self._make_room(req, 1, step):
                    return
                kv.cache_scheduled(req, computed + 1)
                step.add(req, 1)
                i = self._cursor + 1
                continue
            if pending <= 0:  # pipelined: its last step is in flight, its token not back yet
                i += 1
                continue
            want = (
                pending + self.speculator.num_drafts(req)
                if drafting and pending == 1 and req.num_generated
                else self._capped(pending)
            )
            n = self._within(want, step.budget)
            if not n or (n < pending and not self.chunked):
                i += 1
                continue
            self._cursor = i  # preemptions before it shift it left
            # vLLM caps the slots at max_model_len; the last token to come caps them too, so a request whose whole
            # sequence fits the pool never preempts itself for slots it cannot use
            extra = min(
                lookahead,
                max(
                    0,
                    min(self.cfg.max_model_len or 1 << 62, req.num_prompt_tokens + req.num_output_tokens - 1)
                    - req.num_computed_tokens
                    - n,
                ),
            )
            if self._make_room(req, n + extra, step):
                self.kv.cache_scheduled(req, req.num_computed_tokens + n)
                step.add(req, n)
                if n > pending:  # guesses, possibly fewer than k where the budget ran out
                    step.drafts[req] = n - pending
                i = self._cursor + 1
            else:  # req itself was preempted: vLLM schedules no running request after it this step
                return

    def _capped(self, pending: int) -> int:
        """A long prefill's tokens this step: at most `long_prefill_token_threshold` (vLLM V1; 0: no cap) when
        prompts are chunked, so several long prompts advance side by side instead of one taking the budget."""
        if not self.chunked:
            return pending
        limit = self.cfg.long_prefill_token_threshold
        return limit if 0 < limit < pending else pending

    def _make_room(self, req: Request, n: int, step: PlanBuilder) -> bool:
        """Allocate KV for `n` more tokens of `req`, preempting others; False if `req` itself had to go."""
        if fits_in_last_block(self.kv, req, n):
            return True
        while self.kv.allocate(req, n) is None:
            if self._pop_finished(step):
                continue
            victim = self._victim()
            self._preempt(victim, step)
            if victim is req:
                return False
        return True

    def _resume_swapped(self, step: PlanBuilder) -> None:
        while self.swapped and step.budget > 0 and self._seats_taken < self.max_num_seqs:
            req, blocks = self.swapped[0]
            n = min(req.num_pending_tokens, step.budget)  # a decode, or the rest of a prefill cut short
            if self.kv.reserve(req, req.num_computed_tokens + n) is None:
                return
            self.swapped.popleft()
            self.host_blocks_free += blocks
            step.swap_in += blocks
            req.phase = Phase.RUNNING
            self.running.append(req)
            self.kv.cache_scheduled(req, req.num_computed_tokens + n)
            step.add(req, n)

    def _admit_waiting(self, step: PlanBuilder) -> None:
        self._waiting.prepare()
        deferred = []
        while self._waiting and step.budget > 0 and self._seats_taken < self.max_num_seqs:
            req = self._waiting.head()
            hit = self._computed_on_admission(req)
            if self._defers(req, hit):
                deferred.append(self._waiting.pop())
                continue
            uncached = req.num_tokens - hit
            counted = self._capped(req.num_tokens if self.budget_counts_hits else uncached)
            if counted > step.budget and not self.chunked:
                break
            charged = self._within(counted, step.budget)
            n = min(charged, uncached)
            if not n:
                break
            req.num_computed_tokens = hit
            room = self._room_for(req, n)
            if room is None:
                req.num_computed_tokens = 0 if not self.kv.table(req) else hit
                break
            self._waiting.pop()
            self.kv.cache_scheduled(req, hit + n)
            if not req.num_preemptions:
                req.num_cached_tokens = hit  # prefix-cache hits of its first admission
            req.phase = Phase.RUNNING
            self.running.append(req)
            step.add(req, n)
            step.budget -= charged - n
        for req in deferred:
            self._waiting.push(req)

    def _within(self, want: int, room: int) -> int:
        """The tokens of the `want` a request asks for that a budget of `room` runs: all of them if they fit, else
        `room` (`rounds_chunks_to_blocks`: its whole blocks; 0 makes no progress this step)."""
        if want <= room:
            return want
        return room - room % self.kv.block_size if self.rounds_chunks_to_blocks else room

    def _defers(self, req: Request, hit: int) -> bool:
        """Whether the request at the head of the queue sits this step out for a later one (TensorRT-LLM's)."""
        return False

    def _room_for(self, req: Request, n: int) -> list[int] | None:
        """Blocks for the first `n` tokens of `req` (its prefix hit already counted as computed), or None if it
        must wait: Orca reserves the whole sequence, vLLM's gate asks for the whole prompt."""
        mark = bool(self.running)  # vLLM keeps the watermark free only while another request runs
        if self.reserve_output:
            return self.kv.reserve(req, req.num_prompt_tokens + req.num_output_tokens - 1)
        if self.admission_window_tokens is not None and not self.kv.fits_whole(
            req, req.num_tokens, self.admission_window_tokens, mark
        ):
            return None
        return self.kv.allocate(req, n, admitting=True, watermark=mark)

    def _computed_on_admission(self, req: Request) -> int:
        """Tokens whose KV is already there when `req` is admitted: a prefix-cache hit, or all its tokens but
        the last when it arrives with its KV (disaggregated decode, blocks reserved beforehand)."""
        if self.kv.table(req):
            return req.num_computed_tokens
        return 0 if self.reserve_output else self.kv.lookup(req)  # Orca allocates contiguously: no sharing

    # ---- preemption ---------------------------------------------------------------------------
    def _pop_finished(self, step: PlanBuilder) -> bool:
        """Under async scheduling vLLM's running list still holds the requests that finished in the step in flight
        (until it processes that step's outputs), and preemption pops whichever sorts last: a finished one gives
        its blocks back at once, nobody recomputes, and the step admits nobody, as after any preemption. True if
        one went."""
        if self.ahead is None or not self.ahead.retiring:
            return False
        if self._preempts_newest:  # the list's last: after every running request
            last = self.ahead.retiring[-1]
            if self._live_before[last] < len(self.running):
                return False
        else:
            last = max(self.ahead.retiring, key=self.order)
            if self.order(last) <= self.order(self._victim()):
                return False
        self.ahead.retiring.remove(last)
        self._free([last])
        step.freed_finished = True
        return True

    @property
    def _preempts_newest(self) -> bool:
        """FCFS: preemption pops the running list's last (vLLM); other orders take the request that sorts last."""
        return self.order.__name__ == "by_arrival"

    def _victim(self) -> Request:
        """FCFS preempts the newest running request (vLLM); other orders the one that sorts last."""
        if self._preempts_newest:
            return self.running[-1]
        return max(self.running, key=self.order)

    def _preempt(self, victim: Request, step: PlanBuilder) -> None:
        position = self.running.index(victim)
        del self.running[position]
        if position < self._cursor:
            self._cursor -= 1
        step.drop(victim)
        step.preempted.append(victim)
        victim.num_preemptions += 1
        if self.pipelined:  # its steps in flight are lost
            victim.num_computed_tokens -= victim.num_in_flight_tokens
        victim.num_in_flight_tokens = 0
        held = len(self.kv.table(victim))
        self.kv.free(victim)
        if self.cfg.preemption_mode == "swap" and held <= self.host_blocks_free:
            self.host_blocks_free -= held
            step.swap_out += held
            victim.phase = Phase.WAITING
            self.swapped.append((victim, held))
            return
        victim.num_computed_tokens = 0  # recompute: prompt and outputs so far are prefilled again
        victim.phase = Phase.WAITING
        self._waiting.push(victim)


@schedulers.register("sarathi")
class SarathiScheduler(TokenBudgetScheduler):
    """Sarathi-Serve stall-free batching: decodes first, then prefill chunks filling a fixed `chunk_size` budget."""

    family = GENERIC
    schedules_ahead = False

    def __init__(
        self, kv: BlockManager, cfg: EngineConfig, order: OrderKey, log: TokenLog, host_blocks: int = 0
    ):
        super().__init__(kv, cfg, order, log, host_blocks)
        self.budget, self.chunked = cfg.chunk_size, True


@schedulers.register("orca")
class OrcaScheduler(TokenBudgetScheduler):
    """Orca: iteration-level batching, whole-prompt prefills, KV reserved for prompt + output at admission."""

    family = GENERIC
    schedules_ahead = False
    supports_prefix_caching = False

    def __init__(
        self, kv: BlockManager, cfg: EngineConfig, order: OrderKey, log: TokenLog, host_blocks: int = 0
    ):
        super().__init__(kv, cfg, order, log, host_blocks)
        self.chunked, self.reserve_output = False, True
        self.budget = sys.maxsize  # no token budget: batch size and KV limit a step


def max_blocks_of(req: Request, block_size: int) -> int:
    """Blocks a request holds at its largest: prompt + all outputs but the last (never fed back)."""
    return blocks_for(req.num_prompt_tokens + req.num_output_tokens - 1, block_size)
