"""SGLang's scheduler (0.5.x, `scheduler.py` / `schedule_policy.py`): prefill first, admission by estimated memory.

Each step, as SGLang's `get_next_batch_to_run`:
1. try a prefill batch: the request being prefilled in chunks continues first, then waiting requests in queue
   order (fcfs keeps arrival order, a retracted request behind those waiting when it left; lpm re-sorts by
   cached prefix). A request is admitted only if its uncached prompt plus its remaining output (clipped at
   4096 tokens) fits in the free and evictable KV, less what the running requests are expected to still need:
   their remaining outputs (clipped) times `new_token_ratio`. One prefill batch takes at most
   `max_num_batched_tokens` (SGLang's chunked_prefill_size; the first request that does not fit whole is cut
   to what is left and prefilled in chunks) and `max_prefill_tokens` of prompt. Running requests do not
   decode in a prefill step unless `enable_mixed_chunk`.
2. otherwise decode every running request one token. If the pool cannot hold one more token each, requests
   are retracted (fewest outputs first, then the longest prompt) until it can or one is left (0.5's check;
   0.4 freed room for 20 more steps): their uncached KV is freed, and they queue to be prefilled again,
   outputs so far included. `new_token_ratio` then becomes (outputs so far + 20 per request) / max outputs of
   those left; otherwise it decays from 0.7 by (0.7 - 0.098) / 600 per decode step to 0.098 (both times
   `schedule_conservativeness`), and is back at 0.7 when the engine idles.

A prefill that finds no memory marks the batch full (SGLang's `batch_is_full`): no admission is tried again
until the batch shrinks, in the decode step after a finish, at a retraction, or when it empties (for a hybrid
sliding-window model SGLang clears the flag every pass, so admission is tried every pass). The pool is
read live while a batch forms, so a prefix hit's lock counts at once. `max_new_tokens` is the request's own
output length (the oracle length of an ignore-eos benchmark), and KV is counted in the KV manager's pages (in a
hybrid pool, blocks over its groups; with SGLang's separate sliding-window pool, policies/swa_radix.py, a prompt's
chunk must also leave its window a page of room there, or waits: only the prompt being chunked is cut to fit). With prefix caching off, SGLang
admits such ignore-eos requests its own way (add_one_req_ignore_eos): the batch is played out to the end, every
request to its full output, and must never run out; no new_token_ratio, no max_prefill_tokens. Departures that
keep the simulation from hanging where SGLang would: an idle engine admits its head request without the estimate
(one whose prompt and output fill the pool would wait forever); a prompt whose chunks stalled, or a lone
request, may be retracted (pipeline micro-batches share a pool, so the pages a request waits for may be a
sibling's), unless it is older than every request the siblings hold: it then waits, and they admit nothing
until it runs, so two prompts too large for the pool together never retract each other forever. With
`scheduler_recv_interval`, new requests are read only as SGLang's recv skipper lets the loop read them
(policies/recv_skipper.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

from servesim.policies.config import EngineConfig
from servesim.policies.families import SGLANG, SGLANG_MAX_RUNNING
from servesim.policies.kv_blocks import BlockManager, fits_in_last_block
from servesim.policies.one_step_ahead import OneStepAhead
from servesim.policies.ordering import OrderKey
from servesim.policies.recv_skipper import RecvSkipper
from servesim.policies.registry import schedulers
from servesim.policies.step import (
    PlanBuilder,
    Scheduler,
    SchedulerDefaults,
    StepPlan,
    TokenLog,
    feed_plan,
    release_finished,
)
from servesim.policies.waiting import WaitingQueue
from servesim.workloads.request import Phase, Request

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO, times schedule_conservativeness (at most 1)
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
IGNORE_EOS_RESERVE_TOKENS = (
    1  # schedule_policy.py: a token per request to spare when playing out ignore-eos batches
)


def default_max_running(pool_tokens: int, context_len: int) -> int:
    """SGLang's max_running_requests when unset: half the KV pool's tokens, within its request-slot pool of
    min(max(pool / context_len * 512, 2048), 4096) slots."""
    slots = min(max(int(pool_tokens / context_len * 512), 2048), 4096)
    return max(1, min(pool_tokens // 2, slots))


def max_running_requests(cfg: EngineConfig, kv: BlockManager) -> int:
    """`cfg.max_num_seqs`, or, left at SGLang's default (its slot pool's cap), that default's own limits over `kv`'s
    pool (`default_max_running`; the context length is `cfg.max_model_len`)."""
    if cfg.max_num_seqs != SGLANG_MAX_RUNNING:
        return cfg.max_num_seqs
    pool = kv_tokens(kv, kv.num_blocks)
    return default_max_running(pool, cfg.max_model_len or pool)


def _age(req: Request) -> tuple[float, int]:
    """Older first: arrival, then id."""
    return req.arrival_s, req.id


def _remaining_output(req: Request) -> int:
    """The output tokens SGLang expects `req` may still need (its max_new_tokens less its outputs, clipped)."""
    return min(max(req.num_output_tokens - req.num_generated, 0), CLIP_MAX_NEW_TOKENS)


def _admitted_output(req: Request) -> int:
    """What a prefill batch sets aside for `req`'s outputs as it admits it: PrefillAdder's _prefill_one_req takes
    the whole max_new_tokens (clipped), even for a retracted request that has decoded some, whose admission check
    used the remainder."""
    return min(req.num_output_tokens, CLIP_MAX_NEW_TOKENS)


def kv_tokens(kv: BlockManager, blocks: int) -> int:
    """Tokens `blocks` KV blocks hold for a request (a hybrid pool spends one block per KV cache group)."""
    return blocks * kv.block_size // len(kv.windows)


class _PrefillBudget:
    """What one prefill batch may still take (SGLang's PrefillAdder). The pool is read live: an admission's
    allocation, and the lock on its prefix hit, count at once (SGLang offsets the first and re-checks the second).
    `reserved`: the running requests' expected outputs (x new_token_ratio) and the admitted ones' (whole); with a
    separate sliding-window pool, `swa_reserved`: what the admitted ones' windows take beyond their allocation."""

    def __init__(self, kv: BlockManager, reserved: float, mixed: int, max_prefill: int, chunk: int | None):
        self.kv, self.page, self.mixed = kv, kv.block_size, mixed
        self.reserved = reserved + mixed
        self.swa_reserved = 0
        self.input = max_prefill - mixed
        self.chunk = None if chunk is None else chunk - mixed

    def _free_tokens(self) -> int:
        """Free and evictable KV: of the full-attention pool when the sliding layers have their own."""
        return kv_tokens(self.kv, self.kv.full_free_blocks if self.kv.swa_window else self.kv.num_free_blocks)

    @property
    def total(self) -> float:
        """SGLang's rem_total_tokens: free and evictable KV less what running and admitted requests will need."""
        return self._free_tokens() - self.reserved

    @property
    def current(self) -> int:
        """SGLang's cur_rem_tokens: free and evictable KV less this batch's decodes (its prompts are allocated)."""
        return self._free_tokens() - self.mixed

    @property
    def swa(self) -> float:
        """SGLang's rem_swa_tokens: free and evictable sliding-window slots less the admitted requests' windows
        (unbounded without a separate pool)."""
        if not self.kv.swa_window:
            return math.inf
        return self.kv.swa_free_blocks * self.page - self.swa_reserved

    def swa_limit(self, tokens: int, locked: int = 0) -> int:
        """SGLang's sliding-window check of a prompt's next `tokens`, its hit's window having locked `locked` more
        slots: they fit if the larger of them and a window, and a page, fit the sliding pool; else, chunked prefill
        on, the tokens that leave room for a window and a page (0: none)."""
        window, room = self.kv.swa_window, self.swa - locked
        if not window or max(self.paged(tokens), window) + self.page < room:
            return tokens
        if self.chunk is None:
            return 0
        return max(int(room - window - self.page) // self.page * self.page, 0)

    @property
    def exhausted(self) -> str | None:
        """SGLang's budget_state: 'memory' (NO_TOKEN), 'batch' (OTHER) or None (room left)."""
        if self.total <= 0 or self.current <= 0 or self.swa <= 0:
            return "memory"
        if self.input <= 0 or (self.chunk is not None and self.chunk <= 0):
            return "batch"
        return None

    def paged(self, tokens: int) -> int:
        return -(-tokens // self.page) * self.page

    def take(self, tokens: int, outputs: int) -> None:
        """A request's `tokens` of prompt join the batch, expecting `outputs` more (0 for a cut chunk)."""
        tokens = self.paged(tokens)
        self.reserved += outputs
        # SGLang sets aside a window and a page of sliding slots (the tokens are allocated)
        if self.kv.swa_window:
            self.swa_reserved += max(tokens, self.kv.swa_window) + self.page - tokens
        self.input -= tokens
        if self.chunk is not None:
            self.chunk -= tokens


@schedulers.register("sglang")
class PrefillFirstScheduler(SchedulerDefaults):
    family = SGLANG
    schedules_ahead = True
    supports_prefix_caching = True
    reads_at_intervals = True

    def __init__(
        self, kv: BlockManager, cfg: EngineConfig, order: OrderKey, log: TokenLog, host_blocks: int = 0
    ):
        self.kv, self.cfg, self.order, self.log = kv, cfg, order, log
        chunk, _ = cfg.batch_limits()
        self.max_running = max_running_requests(cfg, kv)
        self.chunk_tokens = chunk if cfg.enable_chunked_prefill else None
        self._mixing = cfg.enable_mixed_chunk and cfg.enable_chunked_prefill
        self.init_ratio = min(INIT_NEW_TOKEN_RATIO * cfg.schedule_conservativeness, 1.0)
        self.min_ratio = min(self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        # the ratio decays from `_ratio_from`, once a decode step
        self._ratio_from, self._decays = (
            self.init_ratio,
            0,
        )
        self.running: list[Request] = []
        self.chunked: Request | None = None  # the request whose prompt is prefilled in chunks
        self._peers: list[PrefillFirstScheduler] = []  # pipeline micro-batches over the same pool
        # our chunked request, waiting for pages younger peers' requests hold
        self.stalled: Request | None = None
        self.batch_is_full = False
        self._shrunk = False  # a running request finished: the next decode step clears batch_is_full
        self._prefilling = False  # whether the step being run prefills
        # without a tree cache SGLang runs a cache-aware policy as fcfs (SchedulePolicy._validate_and_adjust_policy)
        lpm = cfg.queue_order == "lpm" and cfg.prefix_caching != "none"
        self._fcfs = cfg.queue_order in ("fcfs", "lpm") and not lpm
        self._waiting = WaitingQueue(order, kv, lpm=lpm)
        self._back = itertools.count()
        # SGLang's overlap scheduler (its default since 0.4; async_scheduling): batch N+1 is formed while N runs
        self.ahead = OneStepAhead() if cfg.async_scheduling is True else None
        # prompts prefilled in the step that ended, not yet in the cache
        self._unprocessed: list[Request] = []
        interval = cfg.scheduler_recv_interval
        self._skipper = RecvSkipper(interval) if interval > 1 else None  # requests sent but not yet read
        self._last_prefilled = False  # whether the last plan made prefills (the skipper's weight)

    @property
    def new_token_ratio(self) -> float:
        """One formula for stepped and fused decode steps alike, so both give the same float."""
        return max(self._ratio_from - self._decays * self.ratio_decay, self.min_ratio)

    @new_token_ratio.setter
    def new_token_ratio(self, value: float) -> None:
        self._ratio_from, self._decays = value, 0

    @property
    def num_waiting(self) -> int:
        unread = len(self._skipper.socket) if self._skipper else 0
        return len(self._waiting) + unread + (len(self.ahead.inbox) if self.ahead else 0)

    @property
    def finishes_fuse(self) -> bool:
        """Whether a request may finish inside a fused decode stretch: not under overlap scheduling, where it
        decodes once more (wasted) in the step after, which the stretch's step times leave out."""
        return self.ahead is None

    @property
    def _ghosts(self) -> list[Request]:
        """Requests that finished in the step in flight: SGLang does not know yet, so they decode once more."""
        return self.ahead.retiring if self.ahead else []

    @property
    def _seats_taken(self) -> int:
        return len(self.running) + len(self._ghosts)

    @property
    def num_running(self) -> int:
        return len(self.running) + (self.chunked is not None)

    @property
    def _tries_admission(self) -> bool:
        """Whether the next pass tries to admit: someone waits and the batch is not full, or, with a sliding-window
        pool, whatever the flag (SGLang resets batch_is_full every pass for hybrid SWA models)."""
        return self.num_waiting > 0 and (not self.batch_is_full or bool(self.kv.swa_window))

    @property
    def admission_waits_for_blocks(self) -> bool:
        """Freed blocks matter to a waiting request only while admission is tried."""
        return self._tries_admission

    def add(self, req: Request, now: float) -> None:
        req.phase = Phase.WAITING
        if self.ahead is not None:
            self.ahead.arrive(req, now)
        else:
            self._send(req)

    def _send(self, req: Request) -> None:
        """`req` reaches the scheduler's socket: read at once, or when the recv skipper reads it."""
        if self._skipper is None:
            self._waiting.push(req)
        else:
            self._skipper.socket.append(req)

    def schedule(self, now: float) -> StepPlan:
        if self.ahead is None:
            return self._plan(now)
        return self.ahead.schedule(now, lambda: self._plan(now), self._send, self._free)

    def _free(self, finished: list[Request]) -> None:
        """SGLang processed the finished requests' last outputs: their KV joins the cache and their slots free,
        noticed by the next decode step (filter_batch) as without overlap."""
        for req in self._unprocessed:
            self.kv.cache(req)
        self._unprocessed = []
        for req in finished:
            release_finished(req, self.kv, req.finish_s)
        # they decoded in the prefill batch just formed, which
        if finished and self._prefilling and self._mixing:
            self._filter_batch()  # SGLang filters before its next try
        else:
            self._shrunk |= bool(finished)

    def _plan(self, now: float) -> StepPlan:
        """One pass of SGLang's loop: read the requests sent (every pass, or as the recv skipper allows), then
        form the batch."""
        skipper = self._skipper
        if skipper is None:
            return self._form(now)
        skipper.pass_after(self._last_prefilled, self._waiting.push)
        plan = self._form(now)
        if plan.is_empty and not plan.preempted and skipper.socket:
            skipper.read(self._waiting.push)  # nothing to run: the idle loop reads within microseconds
            plan = self._form(now)
        self._last_prefilled = plan.num_prefill_tokens > 0
        return plan

    def _form(self, now: float) -> StepPlan:
        """The next batch from the requests read (SGLang's get_next_batch_to_run)."""
        step = PlanBuilder(0)
        self.stalled = None
        self._prefilling = self._prefill(step)
        if self._prefilling:
            self._mix_decodes(step)
            return step.plan()
        if self.running or self._ghosts:
            self._decode(step, now)
        # its next chunk found no room and nothing of ours runs to free some: the
        elif self.chunked is not None:  # pages are a pipeline sibling's (World._pool)
            if self._yields_pages():
                self._retract(step, now)
            else:
                self.stalled = self.chunked
        # the batch emptied: SGLang clears the flag, idles a pass (resetting new_token_ratio) and admits again
        elif self.batch_is_full and self._waiting:
            self.batch_is_full = (
                False  # (with pipeline micro-batches sharing a pool, a sibling's pages may refuse
            )
            # it once more: the sibling's finish wakes this engine)
            self.new_token_ratio = self.init_ratio
            self._prefilling = self._prefill(step)
            if self._prefilling:
                return step.plan()
        if not step.tokens and not step.preempted and not (self.ahead and self.ahead.pending):
            # idle (not when the engine is about to plan again with more)
            self.new_token_ratio = self.init_ratio
        return step.plan()

    def commit(self, plan: StepPlan, now: float) -> list[Request]:
        # (a ghost decode computes a token nobody gets)
        finished = feed_plan(plan, self.log, self.kv, now, self._cache if self.ahead is not None else None)
        for req in finished:
            self.retire(req, now)
        if finished and self._prefilling and self.ahead is None:  # SGLang filters a finished prefill batch
            self._filter_batch()  # before its next try
        return finished

    def _cache(self, req: Request) -> None:
        """Overlapped, SGLang inserts a prompt it has just prefilled into the tree as it processes the step's
        results, after the next batch is formed (`_free` does it then): that batch cannot hit it yet. Only the
        chunked request's chunk is inserted as the next batch is formed, so it can."""
        if req.num_computed_tokens == req.num_prompt_tokens:
            self._unprocessed.append(req)
        else:
            self.kv.cache(req)

    def retire(self, req: Request, now: float) -> None:
        """A request produced its last token: its KV joins the cache and its slot frees. SGLang notices at the next
        decode step (filter_batch), which then clears batch_is_full; overlapped, after one more (wasted) decode."""
        self.running.remove(req)
        if self.ahead is not None:
            self.ahead.hold(req, now)
            return
        release_finished(req, self.kv, now)
        self._shrunk = True

    def _filter_batch(self) -> None:
        """SGLang's filter_batch dropped finished requests: a smaller batch is no longer full."""
        self._shrunk = self.batch_is_full = False

    def decode_stretch(self, plan: StepPlan) -> list[Request] | None:
        """The running requests, if `plan` decodes all of them and nothing could be admitted before a finish
        (nobody waits, or the batch is full): every following step is the same decode."""
        admissible = self._tries_admission
        if (
            self.chunked is not None
            or admissible
            or (self._skipper is not None and self._skipper.socket)  # read some steps on
            or (self.ahead is not None and not self.ahead.settled(admissible))
        ):
            return None
        if plan.preempted or len(plan.requests) != len(self.running) or any(n != 1 for n in plan.num_new):
            return None
        if any(r.num_generated == 0 for r in self.running):  # a one-token prompt: a prefill, not a decode
            return None
        return self.running

    @property
    def arrival_lag_steps(self) -> int:
        return self.ahead.arrival_lag_steps if self.ahead is not None else 0

    def fused_decode_steps(self, num_steps: int, last_start_s: float) -> None:
        """`num_steps` decode steps ran fused after a scheduled one: the ratio decays for each, and a finish
        among them (never in the last) was noticed by the decode step after it."""
        self._decays += num_steps
        if self._skipper is not None:
            self._skipper.decoded(num_steps)
        if self._shrunk:
            self._filter_batch()
        if self.ahead is not None:
            self.ahead.fused_until(last_start_s)

    # ---- prefill ------------------------------------------------------------------------------
    def _prefill(self, step: PlanBuilder) -> bool:
        """Build a prefill batch into `step` (SGLang's get_new_batch_prefill); whether it holds any request."""
        if self.kv.swa_window:  # SGLang resets the flag every pass for hybrid SWA models, to retry admission
            self.batch_is_full = False
        if self.chunked is None and (self.batch_is_full or not self._waiting):
            return False
        if self.chunked is None and self._seats_taken >= self.max_running:
            self.batch_is_full = True
            return False
        mixed = self._seats_taken if self._mixing else 0
        ghosts = len(self._ghosts)  # overlapped, SGLang still counts them running with a token to go
        reserved = (sum(_remaining_output(r) for r in self.running) + ghosts) * self.new_token_ratio
        budget = _PrefillBudget(self.kv, reserved, mixed, self.cfg.max_prefill_tokens, self.chunk_tokens)
        if self.chunked is not None:
            self._continue_chunk(step, budget)
        self._waiting.prepare()
        # a peer's older request waits for pages: admitting would take them
        if any(peer.stalled is not None for peer in self._peers):
            return bool(step.tokens)
        while self._waiting and self.chunked is None:
            if self._seats_taken >= self.max_running:
                self.batch_is_full = True
                break
            if not self._admit(step, budget):
                break
            exhausted = budget.exhausted
            if exhausted:
                self.batch_is_full |= exhausted == "memory"
                break
        return bool(step.tokens)

    def _continue_chunk(self, step: PlanBuilder, budget: _PrefillBudget) -> None:
        """The prompt being prefilled in chunks takes what the batch allows first (SGLang's add_chunked_req)."""
        req = self.chunked
        chunk = budget.chunk if budget.chunk is not None else req.num_pending_tokens
        limit = min(chunk, int(budget.total), budget.swa - budget.page)
        # the reserve leaves nothing: SGLang takes a whole chunk anyway, lest its pages leak (with a
        if limit <= 0:
            if self.kv.swa_window:  # sliding-window pool it leaves the request for a later batch)
                return
            limit = chunk
        n = min(req.num_pending_tokens, limit)
        if n <= 0 or self.kv.allocate(req, n) is None:
            return  # no room for it now: decodes run, and their finishes make some
        whole = n == req.num_pending_tokens
        step.add(req, n)
        budget.take(n, _admitted_output(req) if whole else 0)
        if whole:
            self.chunked = None
            self.running.append(req)

    def _admit(self, step: PlanBuilder, budget: _PrefillBudget) -> bool:
        """Admit the head of the queue, whole or as a first chunk (SGLang's add_one_req); whether to go on."""
        req = self._waiting.head()
        hit = self.kv.lookup(req)
        extend = req.num_tokens - hit
        outputs = _remaining_output(req)
        # else a request whose prompt + output fill the pool waits
        idle = not self.running and not step.tokens
        if self.cfg.prefix_caching == "none":  # forever (SGLang's would)
            if not idle and not self._fits_to_the_end(req, extend, budget):
                self.batch_is_full = True
                return False
            whole = budget.chunk is None or extend <= budget.chunk
            n = extend if whole else budget.chunk
        else:
            locked = self._locked_by(req, hit) if hit and not idle else 0
            # SGLang checks again once the hit is locked (its total_tokens carries a page of slack)
            if extend + outputs + budget.page >= budget.total - locked and not idle:
                self.batch_is_full = True
                return False
            if budget.paged(extend) >= budget.input and step.tokens:
                return False
            whole = budget.chunk is None or budget.paged(extend) <= budget.chunk
            n = extend if whole else budget.chunk // budget.page * budget.page
        if n <= 0:
            return False
        swa_locked = self._locked_by(req, hit, self.kv.swa_evictable_hit) if self.kv.swa_window and hit else 0
        # the sliding-window pool is short: SGLang refuses the request (NO_TOKEN; only the prompt it is already
        # chunking gets a smaller chunk); an idle engine takes a smaller chunk, where SGLang would wait forever
        if (room := budget.swa_limit(n, swa_locked)) < n:
            if room <= 0 or not idle:
                self.batch_is_full = True
                return False
            n, whole = room, False
        req.num_computed_tokens = hit
        room = self.kv.allocate(req, n, admitting=True)
        if room is None:
            req.num_computed_tokens = 0
            self.batch_is_full = True
            return False
        self._waiting.pop()
        self.kv.cache_scheduled(req, hit + n)
        if not req.num_preemptions:
            req.num_cached_tokens = hit
        req.phase = Phase.RUNNING
        step.add(req, n)
        budget.take(n, _admitted_output(req) if whole else 0)
        if whole:
            self.running.append(req)
        else:
            self.chunked = req
        return True

    def _locked_by(
        self, req: Request, hit: int, evictable_hit: Callable[[Request], int] | None = None
    ) -> int:
        """Tokens of free-and-evictable KV that admitting `req` with its `hit` would lock (its matched prefix; of the
        sliding-window pool with `evictable_hit` its window's)."""
        req.num_computed_tokens = hit
        try:
            return kv_tokens(self.kv, (evictable_hit or self.kv.evictable_hit)(req))
        finally:
            req.num_computed_tokens = 0

    def _fits_to_the_end(self, req: Request, extend: int, budget: _PrefillBudget) -> bool:
        """SGLang's admission of an ignore-eos request without the radix cache (add_one_req_ignore_eos): every
        request runs to its full output, so play the batch out, shortest remainder first, and require at every
        finish that what is free, plus what earlier finishes gave back, holds the rest's growth (and a token
        each to spare). Hybrid (sliding-window) pools skip that play-out, as SGLang does for SWA."""
        current = budget.current
        if budget.paged(extend) > min(current, budget.total):
            return False
        if len(self.kv.windows) > 1 or self.kv.swa_window:
            return True
        # as SGLang sees
        states = sorted(
            [
                (r.num_output_tokens - r.num_generated, r.num_prompt_tokens + r.num_generated)
                for r in (*self.running, req)
                if r.num_output_tokens > r.num_generated
            ]
            + [(1, r.num_prompt_tokens + r.num_generated - 1) for r in self._ghosts]
        )
        free, freed = current - budget.paged(extend), 0
        for i, (left, held) in enumerate(states):
            waiting_out = len(states) - i
            if free + freed - left * waiting_out <= IGNORE_EOS_RESERVE_TOKENS * waiting_out:
                return False
            freed += held
        return True

    def _mix_decodes(self, step: PlanBuilder) -> None:
        """enable_mixed_chunk (with chunked prefill on, as SGLang): the running requests decode in the prefill step
        too."""
        if not self._mixing:
            return
        admitted = set(step.tokens)
        for req in self.running:
            if req not in admitted and self._grow(req):
                step.add(req, 1)
        self._add_ghosts(step)

    def _add_ghosts(self, step: PlanBuilder) -> None:
        """Overlap scheduling: requests that finished in the step in flight decode once more, a token nobody gets
        (in KV SGLang frees with theirs, so none is allocated here)."""
        for req in self._ghosts:
            step.add(req, 1)

    # ---- decode -------------------------------------------------------------------------------
    def _decode(self, step: PlanBuilder, now: float) -> None:
        """One token for every running request, retracting some first if the pool cannot hold them (SGLang's
        update_running_batch)."""
        if self._shrunk:
            self._filter_batch()
        retracted = False
        while (
            self.running and sum(self.kv.blocks_needed(r, 1) for r in self.running) > self.kv.num_free_blocks
        ):
            if len(self.running) + (self.chunked is not None) == 1 and retracted:
                break
            self._retract(step, now)
            retracted = True
        if retracted:
            generated = sum(r.num_generated for r in self.running)
            budget = sum(r.num_output_tokens for r in self.running) + 1
            self.new_token_ratio = min(1.0, (generated + RETRACT_DECODE_STEPS * len(self.running)) / budget)
            self.batch_is_full = False
        else:
            self._decays += 1
        for req in self.running:
            if self._grow(req):
                step.add(req, 1)
        self._add_ghosts(step)

    def _grow(self, req: Request) -> bool:
        """KV for one more token of `req`."""
        return fits_in_last_block(self.kv, req, 1) or self.kv.allocate(req, 1) is not None

    def share_pool(self, peers: list[Scheduler]) -> None:
        self._peers = [p for p in peers if isinstance(p, PrefillFirstScheduler)]

    def _yields_pages(self) -> bool:
        """Whether our stalled chunked request gives its pages back rather than wait for the peers': unless it is
        older than every request they hold, it does. Were each to give way, two micro-batches over a pool too
        small for both their prompts would retract each other's forever; the oldest waiting, the younger
        retracting and admitting nothing meanwhile (`_prefill`), it gets the pages and finishes."""
        held = [_age(r) for peer in self._peers for r in (*peer.running, peer.chunked) if r is not None]
        return not held or min(held) < _age(self.chunked)

    def _retract(self, step: PlanBuilder, now: float) -> None:
        """Retract the running request with the fewest outputs (the longest prompt among equals; the last of
        those in batch order): its uncached KV is freed and it queues behind those waiting now, to be prefilled
        again with its outputs so far. A prompt whose chunks stalled is a candidate too, and so is a lone request
        (SGLang retracts only running ones, and never the last): with pipeline micro-batches sharing the pool, the
        pages it waits for may be a sibling's."""
        candidates = self.running + ([self.chunked] if self.chunked is not None else [])
        fewest = min((r.num_generated, -r.num_prompt_tokens) for r in candidates)
        victim = [r for r in candidates if (r.num_generated, -r.num_prompt_tokens) == fewest][-1]
        if victim is self.chunked:
            self.chunked = None
        else:
            self.running.remove(victim)
        step.preempted.append(victim)
        victim.num_preemptions += 1
        self.kv.free(victim, keep_uncached=False)
        victim.num_computed_tokens = 0
        victim.phase = Phase.WAITING
        # fcfs: behind everyone waiting now (SGLang appends to its list), ahead of later arrivals; overlapped, SGLang
        # formed this batch as the step before began, so what arrived since comes after the victim
        formed = self.ahead.in_flight_since if self.ahead is not None else None
        back = (now if formed is None else formed, math.inf, next(self._back)) if self._fcfs else None
        self._waiting.push(victim, key=back)
