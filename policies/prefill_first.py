"""SGLang's scheduler (0.5.x, `scheduler.py` / `schedule_policy.py`): prefill first, admission by estimated memory.

Each step, as SGLang's `get_next_batch_to_run`:
1. try a prefill batch: the request being prefilled in chunks continues first, then waiting requests in queue
   order (fcfs keeps arrival order with retracted requests at the back; lpm re-sorts by cached prefix). A
   request is admitted only if its uncached prompt plus its remaining output (clipped at 4096 tokens) fits in
   the free and evictable KV, less what the running requests are expected to still need: their remaining
   outputs (clipped) times `new_token_ratio`. One prefill batch takes at most `max_num_batched_tokens`
   (SGLang's chunked_prefill_size; the first request that does not fit whole is cut to what is left and
   prefilled in chunks) and `max_prefill_tokens` of prompt. Running requests do not decode in a prefill step
   unless `enable_mixed_chunk`.
2. otherwise decode every running request one token. If the pool cannot hold one more token each, requests are
   retracted (fewest outputs first, then the longest prompt) until it can: their uncached KV is freed, and
   they go to the back of the queue to be prefilled again, outputs so far included. `new_token_ratio` then
   becomes (outputs so far + 20 per request) / max outputs of those left; otherwise it decays from 0.7 by
   (0.7 - 0.098) / 600 per decode step to 0.098 (both times `schedule_conservativeness`), and is back at 0.7
   when the engine idles.

A prefill that finds no memory marks the batch full (SGLang's `batch_is_full`): no admission is tried again
until a running request finishes or is retracted. `max_new_tokens` is the request's own output length (the
oracle length of an ignore-eos benchmark), and KV is counted in the KV manager's pages. Two departures keep
the simulation from hanging where SGLang would: an idle engine admits its head request without the estimate
(one whose prompt and output fill the pool would wait forever), and a prompt whose chunks stalled may be
retracted like a running request.
"""

from __future__ import annotations

import itertools

from policies.config import EngineConfig
from policies.kv_blocks import BlockManager
from policies.ordering import OrderKey
from policies.registry import schedulers
from policies.step import PlanBuilder, StepPlan, TokenLog, feed_plan, release_finished
from policies.waiting import WaitingQueue
from workloads.request import Phase, Request

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO, times schedule_conservativeness (at most 1)
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS


def default_max_running(pool_tokens: int, context_len: int) -> int:
    """SGLang's max_running_requests when unset: half the KV pool's tokens, within its request-slot pool of
    min(max(pool / context_len * 512, 2048), 4096) slots."""
    slots = min(max(int(pool_tokens / context_len * 512), 2048), 4096)
    return max(1, min(pool_tokens // 2, slots))


def _remaining_output(req: Request) -> int:
    return min(max(req.num_output_tokens - req.num_generated, 0), CLIP_MAX_NEW_TOKENS)


@schedulers.register("sglang")
class PrefillFirstScheduler:
    supports_prefix_caching = True

    def __init__(self, kv: BlockManager, cfg: EngineConfig, order: OrderKey, log: TokenLog, host_blocks: int = 0):
        self.kv, self.cfg, self.order, self.log = kv, cfg, order, log
        chunk, max_running = cfg.batch_limits()
        context_len = cfg.max_model_len or kv.num_blocks * kv.block_size
        self.max_running = min(max_running, default_max_running(kv.num_blocks * kv.block_size, context_len))
        self.chunk_tokens = chunk if cfg.enable_chunked_prefill else None
        self.init_ratio = min(INIT_NEW_TOKEN_RATIO * cfg.schedule_conservativeness, 1.0)
        self.min_ratio = min(self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_ratio
        self.running: list[Request] = []
        self.chunked: Request | None = None  # the request whose prompt is prefilled in chunks
        self.batch_is_full = False
        self._waiting = WaitingQueue(order, kv, lpm=cfg.queue_order == "lpm")
        self._back = itertools.count()  # fcfs: retracted requests queue behind everyone

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running) + (self.chunked is not None)

    @property
    def admission_waits_for_blocks(self) -> bool:
        """Freed blocks matter to a waiting request only while admission is tried (the batch is not full)."""
        return self.num_waiting > 0 and not self.batch_is_full

    def add(self, req: Request, now: float) -> None:
        req.phase = Phase.WAITING
        self._waiting.push(req)

    def schedule(self, now: float) -> StepPlan:
        step = PlanBuilder(0)
        decoders = list(self.running)
        if self._prefill(step):
            if self.cfg.enable_mixed_chunk:
                for req in decoders:
                    if self._grow(req, step):
                        step.add(req, 1)
            return step.plan()
        if not self.running:
            self.new_token_ratio = self.init_ratio  # idle
            return step.plan()
        self._decode(step)
        return step.plan()

    def commit(self, plan: StepPlan, now: float) -> list[Request]:
        finished = feed_plan(plan, self.log, self.kv, now)
        for req in finished:
            self.retire(req, now)
        return finished

    def retire(self, req: Request, now: float) -> None:
        """A request produced its last token: its KV joins the cache, its slot frees, admission may resume."""
        release_finished(req, self.kv, now)
        self.running.remove(req)
        self.batch_is_full = False

    def decode_stretch(self, plan: StepPlan) -> list[Request] | None:
        """The running requests, if `plan` decodes all of them and nothing could be admitted before a finish
        (nobody waits, or the batch is full): every following step is the same decode."""
        if self.chunked is not None or (self.num_waiting and not self.batch_is_full):
            return None
        if plan.preempted or len(plan.requests) != len(self.running) or any(n != 1 for n in plan.num_new):
            return None
        if any(r.num_generated == 0 for r in self.running):
            return None
        return self.running

    def fused_decode_steps(self, num_steps: int) -> None:
        """`num_steps` decode steps ran fused after a scheduled one: the ratio decays for each."""
        self.new_token_ratio = max(self.new_token_ratio - num_steps * self.ratio_decay, self.min_ratio)

    # ---- prefill ------------------------------------------------------------------------------
    def _prefill(self, step: PlanBuilder) -> bool:
        """Build a prefill batch into `step` (SGLang's PrefillAdder); whether it holds any request."""
        if self.chunked is None and (self.batch_is_full or not self._waiting):
            return False
        if self.chunked is None and len(self.running) >= self.max_running:
            self.batch_is_full = True
            return False
        page = self.kv.block_size
        available = self.kv.num_free_blocks * page
        mixed = len(self.running) if self.cfg.enable_mixed_chunk else 0
        reserved = sum(_remaining_output(r) * self.new_token_ratio for r in self.running) + mixed
        taken = mixed  # tokens this batch computes (SGLang's cur_rem_token_offset)
        rem_input = self.cfg.max_prefill_tokens - mixed
        rem_chunk = None if self.chunk_tokens is None else self.chunk_tokens - mixed
        if self.chunked is not None:
            req = self.chunked
            n = min(req.num_pending_tokens, rem_chunk if rem_chunk is not None else req.num_pending_tokens,
                    int(available - reserved))
            if n > 0 and self.kv.allocate(req, n) is not None:
                step.add(req, n)
                whole = n == req.num_pending_tokens
                reserved += n + (_remaining_output(req) if whole else 0)
                taken += n
                rem_input -= n
                rem_chunk = None if rem_chunk is None else rem_chunk - n
                if whole:
                    self.chunked = None
                    req.phase = Phase.RUNNING
                    self.running.append(req)
        self._waiting.prepare()
        while self._waiting and self.chunked is None:
            if available - reserved <= 0 or available - taken <= 0:
                self.batch_is_full = True
                break
            if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                break
            if len(self.running) >= self.max_running:
                self.batch_is_full = True
                break
            req = self._waiting.head()
            hit = self.kv.lookup(req)
            extend = req.num_tokens - hit
            idle = not self.running and not step.tokens  # else a request whose prompt + output fill the pool waits
            if extend + _remaining_output(req) >= available - reserved and not idle:  # forever (SGLang's would)
                self.batch_is_full = True
                break
            if extend >= rem_input and step.tokens:
                break
            whole = rem_chunk is None or extend <= rem_chunk
            n = extend if whole else rem_chunk // page * page
            if n <= 0:
                break
            req.num_computed_tokens = hit
            if self.kv.allocate(req, n, admitting=True) is None:
                req.num_computed_tokens = 0
                self.batch_is_full = True
                break
            self._waiting.pop()
            self.kv.cache_scheduled(req, hit + n)
            if not req.num_preemptions:
                req.num_cached_tokens = hit
            step.add(req, n)
            reserved += n + (_remaining_output(req) if whole else 0)
            taken += n
            rem_input -= n
            rem_chunk = None if rem_chunk is None else rem_chunk - n
            if whole:
                req.phase = Phase.RUNNING
                self.running.append(req)
            else:
                req.phase = Phase.RUNNING
                self.chunked = req
        return bool(step.tokens)

    # ---- decode -------------------------------------------------------------------------------
    def _decode(self, step: PlanBuilder) -> None:
        """One token for every running request, retracting some first if the pool cannot hold them."""
        retracted = False
        while len(self.running) + (self.chunked is not None) > 1 and \
                sum(self.kv.blocks_needed(r, 1) for r in self.running) > self.kv.num_free_blocks:
            self._retract(step)
            retracted = True
        if retracted:
            generated = sum(r.num_generated for r in self.running)
            budget = sum(r.num_output_tokens for r in self.running) + 1
            self.new_token_ratio = min(1.0, (generated + RETRACT_DECODE_STEPS * len(self.running)) / budget)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        for req in self.running:
            if self._grow(req, step):
                step.add(req, 1)

    def _grow(self, req: Request, step: PlanBuilder) -> bool:
        """KV for one more token of `req` (a decode in a partly filled page needs none)."""
        if req.num_computed_tokens % self.kv.block_size:
            return True
        return self.kv.allocate(req, 1) is not None

    def _retract(self, step: PlanBuilder) -> None:
        """Retract the running request with the fewest outputs (the longest prompt among equals; the last of
        those in batch order): its uncached KV is freed and it queues behind everyone to be prefilled again.
        A prompt whose chunks stalled (no memory left for the next) is a candidate too (SGLang retracts only
        running requests): without it a lone decode could wait for the stalled chunk forever."""
        key = lambda r: (r.num_generated, -r.num_prompt_tokens)  # noqa: E731
        candidates = self.running + ([self.chunked] if self.chunked is not None else [])
        fewest = min(map(key, candidates))
        victim = [r for r in candidates if key(r) == fewest][-1]
        if victim is self.chunked:
            self.chunked = None
        else:
            self.running.remove(victim)
        step.preempted.append(victim)
        victim.num_preemptions += 1
        self.kv.free(victim, keep_uncached=False)
        victim.num_computed_tokens = 0
        victim.phase = Phase.WAITING
        self._waiting.push(victim, key=(float("inf"), next(self._back)) if self.cfg.queue_order == "fcfs" else None)
        self.batch_is_full = False
