"""What one engine step does (`StepPlan`), the scheduler interface, and the token bookkeeping all schedulers share."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from collections.abc import Callable
from typing import Protocol

import numpy as np

from servesim.hardware.batch import StepBatch
from servesim.policies.families import GENERIC, EngineFamily
from servesim.policies.kv_blocks import BlockManager
from servesim.policies.spec_decode import Speculator
from servesim.policies.token_ids import forget_block_hashes
from servesim.workloads.request import Phase, Request


@dataclass(frozen=True, slots=True, eq=False)
class StepPlan:
    """One step: per scheduled request its new tokens and context before the step, plus what left the batch.

    `samples[i]` is whether request i has fed all its pending tokens after this step and so samples
    a token (a decode, or the last chunk of a prefill). Swap counts are KV blocks moved over PCIe
    (host <-> GPU) before the step runs.

    Speculative decoding (policies/spec_decode.py): `num_draft[i]` of request i's `num_new[i]` tokens are
    draft guesses the target verifies (empty: the step drafts nothing); `fed_to_draft[i]`: request i is fed to the
    draft model or head in this step (empty: none runs in it).

    `rank[i]` (DP attention, policies/data_parallel.py): the attention rank request i lives on (empty: one rank);
    `rank_swap_blocks`: the most blocks one rank swaps (each over its own GPU's PCIe link, its blocks whole there).
    """

    requests: tuple[Request, ...]
    num_new: tuple[int, ...]
    num_context: tuple[int, ...]
    samples: tuple[bool, ...]
    preempted: tuple[Request, ...] = ()
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    num_draft: tuple[int, ...] = ()
    fed_to_draft: tuple[bool, ...] = ()
    rank: tuple[int, ...] = ()
    rank_swap_blocks: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.requests

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    @property
    def num_decode_tokens(self) -> int:
        """Tokens of decoding requests: 1 each, plus their draft guesses when speculating."""
        if self.num_draft:
            return sum(
                n
                for n, d, r in zip(self.num_new, self.num_draft, self.requests)
                if n - d == 1 and r.num_generated > 0
            )
        return sum(n for n, r in zip(self.num_new, self.requests) if n == 1 and r.num_generated > 0)

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens

    def mark_scheduled(self, now: float) -> None:
        """Stamp the requests this step is the first to schedule: their queue wait ends at `now`."""
        for req in self.requests:
            if req.scheduled_s is None:
                req.scheduled_s = now

    def batch(self) -> StepBatch:
        """The target model's batch. A verify pass needs logits at every position it checks, so when the step
        drafts, `needs_logits` holds logit counts (1 + guesses) instead of flags; the cost model only sums it."""
        n = len(self.num_new)
        logits = np.fromiter(self.samples, bool, n)
        if self.num_draft:
            logits = logits + np.fromiter(self.num_draft, np.int64, n)
        return StepBatch(
            np.fromiter(self.num_new, np.int64, n),
            np.fromiter(self.num_context, np.int64, n),
            logits,
            np.fromiter(self.rank, np.int64, n) if self.rank else None,
        )


class PlanBuilder:
    """A step's plan while a scheduler builds it: scheduled requests in order, their token counts, and preemption
    outcomes."""

    def __init__(self, budget: int):
        self.budget = budget
        self.tokens: dict[Request, int] = {}
        self.context: dict[Request, int] = {}
        self.drafts: dict[Request, int] = {}  # draft guesses among a request's tokens (speculative decoding)
        self.preempted: list[Request] = []
        self.freed_finished = False  # a finished request's blocks taken back to make room (`_pop_finished`)
        self.swap_out = self.swap_in = 0

    def add(self, req: Request, n: int) -> None:
        self.tokens[req] = n
        self.context[req] = req.num_computed_tokens
        self.budget -= n

    def drop(self, req: Request) -> None:
        if req in self.tokens:
            self.budget += self.tokens.pop(req)
            del self.context[req]
            self.drafts.pop(req, None)

    def plan(self, speculator: Speculator | None = None, drafting: bool = False) -> StepPlan:
        reqs, new, context = tuple(self.tokens), tuple(self.tokens.values()), tuple(self.context.values())
        if speculator is None:
            samples = tuple(
                c + n == r.num_prompt_tokens + r.num_generated for r, n, c in zip(reqs, new, context)
            )
            return StepPlan(reqs, new, context, samples, tuple(self.preempted), self.swap_out, self.swap_in)
        drafts = tuple(self.drafts.get(r, 0) for r in reqs)
        samples = tuple(
            c + n - d == r.num_prompt_tokens + r.num_generated
            for r, n, c, d in zip(reqs, new, context, drafts)
        )
        fed = (
            tuple(speculator.speculates(r) for r in reqs) if drafting and speculator.runs_draft_model else ()
        )
        return StepPlan(
            reqs,
            new,
            context,
            samples,
            tuple(self.preempted),
            self.swap_out,
            self.swap_in,
            drafts if drafting else (),
            fed,
        )


#: What a scheduler offers fast-forward for a chunked prefill beside decodes: the decoding requests, the one being
#: prefilled, and `(pending, decodes) -> (its tokens, budget left for admissions)` for a step with that many decodes.
ChunkStretch = tuple[list[Request], Request, Callable[[int, int], tuple[int, int]]]


class Scheduler(Protocol):
    """Decides each step's batch; the engine only spends the step's time and calls `commit`. Every member the
    engine loop, fast-forward and the admission check use is declared here; `SchedulerDefaults` gives the
    answers of a scheduler without the capability."""

    kv: BlockManager
    family: EngineFamily  # the engine it imitates: defaults, memory plan and rules (policies/families.py)
    hands_off_first_token: bool  # a P/D prefill engine: a request leaves with its first token (max_tokens=1)
    schedules_ahead: bool  # may plan a step while the one before runs (engine.async_scheduling)
    speculates: bool  # can run speculative decoding's draft-and-verify steps
    batch_queue: (
        bool  # runs a pipeline-parallel replica with a queue of its steps (`pipeline`), as vLLM V1 does
    )
    supports_prefix_caching: bool  # honours engine.prefix_caching (shares KV blocks between requests)
    pipelined: bool  # runs its steps as a pipeline of micro-batches, each committed on its own
    reads_at_intervals: bool  # honours engine.scheduler_recv_interval (SGLang's recv skipper)
    waits_to_batch: bool  # honours engine.batch_wait_* (TensorRT-LLM holds prompts back for a fuller batch)
    rounds_chunks_to_blocks: bool  # a chunk the budget cuts runs whole blocks (TensorRT-LLM's chunk unit)
    holds_finished: bool  # finished requests keep their blocks until `release_retired` (async scheduling)
    finishes_fuse: bool  # a fused decode stretch may run through requests finishing
    decode_tokens_in_flight: int  # decode tokens scheduled but not yet committed (async scheduling)
    admission_waits_for_blocks: bool  # a waiting request is held back by blocks, so freed ones end a stretch
    #: steps planned before an arrival is seen: under async scheduling the step after the one it arrives in was
    #: planned without it, so a fused stretch may run that step too
    arrival_lag_steps: int
    #: (tokens, sliding windows, block size) -> the blocks a request needs to run; None: all of its tokens'
    blocks_to_run: Callable[[int, tuple[int | None, ...], int], int] | None

    def add(self, req: Request, now: float) -> None:
        """Queue a newly arrived request."""

    def schedule(self, now: float) -> StepPlan:
        """The next step's batch (empty when there is nothing to run). Allocates KV; may preempt."""

    def commit(self, plan: StepPlan, now: float) -> list[Request]:
        """Apply a finished step at time `now`: tokens computed and sampled; returns requests that finished."""

    def decode_stretch(self, plan: StepPlan) -> list[Request] | None:
        """The requests of `plan` if it is a plain decode step that fast-forward may fuse with the next ones."""

    def chunk_stretch(self, plan: StepPlan) -> ChunkStretch | None:
        """(decodes, prefill, chunk sizer) if `plan` decodes all running requests but one, fed a prompt chunk, that
        fast-forward may fuse with the next steps."""

    def fused_decode_steps(self, num_steps: int, last_start_s: float) -> None:
        """Fast-forward ran `num_steps` steps past the one scheduled, the last of them planned at `last_start_s`
        (for state that moves per step)."""

    def pipeline(self, depth: int) -> None:
        """Schedule a pipeline-parallel replica's `depth` steps in flight (a scheduler with `batch_queue`)."""

    def share_pool(self, peers: list[Scheduler]) -> None:
        """`peers` schedule the other micro-batches of this one's pipeline over the same KV pool."""

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...


class SchedulerDefaults:
    """The `Scheduler` members a scheduler without the capability answers with: no prefix sharing, no pipeline,
    no async scheduling, no speculation, no fast-forward; vLLM's defaults without vLLM's rules (GENERIC)."""

    family: EngineFamily = GENERIC
    hands_off_first_token = False
    schedules_ahead = False
    speculates = False
    batch_queue = False
    supports_prefix_caching = False
    pipelined = False
    reads_at_intervals = False
    waits_to_batch = False
    rounds_chunks_to_blocks = False
    holds_finished = False
    finishes_fuse = True
    decode_tokens_in_flight = 0
    arrival_lag_steps = 0
    blocks_to_run = None

    @property
    def admission_waits_for_blocks(self) -> bool:
        return self.num_waiting > 0

    def decode_stretch(self, plan: StepPlan) -> list[Request] | None:
        return None

    def chunk_stretch(self, plan: StepPlan) -> ChunkStretch | None:
        return None

    def fused_decode_steps(self, num_steps: int, last_start_s: float) -> None:
        pass

    def pipeline(self, depth: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no batch queue (batch_queue is false)")

    def share_pool(self, peers: list[Scheduler]) -> None:
        pass


class TokenLog:
    """Per-token timing shared by schedulers: first-token time, last-token time and the inter-token gaps (ITL).

    A step that yields several tokens of one request at once (a speculative round) adds one gap, as a
    streamed chunk does in vLLM's benchmark; TPOT, (E2E - TTFT) / (tokens - 1), still counts every token.
    `itl_s` holds the gaps of requests that produced their last token, as vLLM's benchmark counts only
    successful requests' ITLs; a request's gaps wait in `_open` until then (a run's stop leaves some there).
    `spill(itl_s)`, if given, is called when `itl_s` holds `spill_at` gaps or more, to move them out of memory
    (`record_finished` may pass it a numpy array of gaps instead, to move them too).
    """

    def __init__(self, spill: Callable[[array | np.ndarray], None] | None = None, spill_at: int = 0) -> None:
        self.itl_s = array("d")
        self._open: dict[int, array] = {}  # request id -> gaps so far, while it has tokens to come
        self._spill, self._spill_at = spill, spill_at

    def record(self, req: Request, gap: float, more: array | tuple = (), done: bool = False) -> None:
        """Gaps of `req`'s latest tokens, `gap` then `more` (an array: a fused stretch's gaps are copied, not
        iterated); `done`: the last of them was its last token."""
        if not done:
            held = self._open.get(req.id)
            if held is None:
                held = self._open[req.id] = array("d")
            held.append(gap)
            held.extend(more)
            return
        self.itl_s.extend(self._open.pop(req.id, ()))
        self.itl_s.append(gap)
        self.itl_s.extend(more)
        if self._spill is not None and len(self.itl_s) >= self._spill_at:
            self._spill(self.itl_s)

    def record_finished(self, gaps: np.ndarray) -> None:
        """Gaps of requests that produced their last token, in the order they finished (a compiled engine's,
        simulator/world/compiled_run.py)."""
        gaps = np.ascontiguousarray(gaps, float)
        if self._spill is not None and len(self.itl_s) + len(gaps) >= self._spill_at:
            if self.itl_s:
                self._spill(self.itl_s)
            self._spill(gaps)  # straight from the caller's buffer: a million-request run logs ~200 M gaps
            return
        self.itl_s.frombytes(memoryview(gaps).cast("B"))

    def feed(self, req: Request, num_new: int, now: float, num_sampled: int = 1) -> bool:
        """Count `num_new` computed tokens; if the request has no pending token left, it samples `num_sampled`
        (1, or accepted guesses + 1 after a verify pass). Returns whether it sampled."""
        req.num_computed_tokens += num_new
        if req.num_computed_tokens < req.num_tokens:
            return False  # a prefill chunk that is not the last
        self.sample(req, now, num_sampled)
        return True

    def sample(self, req: Request, now: float, num_tokens: int = 1) -> None:
        req.num_generated += num_tokens
        if req.first_token_s is None:
            req.first_token_s = now
        elif req.num_generated < req.num_output_tokens:
            held = self._open.get(req.id)
            if held is None:
                self._open[req.id] = array("d", (now - req.last_token_s,))
            else:
                held.append(now - req.last_token_s)
        else:
            self.record(req, now - req.last_token_s, done=True)
        req.last_token_s = now


def feed_plan(
    plan: StepPlan,
    log: TokenLog,
    kv: BlockManager,
    now: float,
    cache: Callable[[Request], None] | None = None,
) -> list[Request]:
    """Apply a finished step without drafts: every request's tokens counted and cached (by `cache`, default
    `kv.cache`); returns those done."""
    cache = cache or kv.cache
    finished = []
    finished_phase, sample = Phase.FINISHED, log.sample
    for req, n in zip(plan.requests, plan.num_new):
        if req.phase is finished_phase:  # SGLang's overlap scheduling decoded it once more, for nothing
            continue
        req.num_computed_tokens += n  # TokenLog.feed, inlined: this loop runs once per request and step
        if req.num_computed_tokens >= req.num_prompt_tokens + req.num_generated:
            sample(req, now)
            if req.num_generated >= req.num_output_tokens:
                finished.append(req)
        cache(req)
    return finished


def release_finished(req: Request, kv: BlockManager, now: float) -> None:
    """`req` produced its last token at `now`: it is finished and its blocks go back, cached first."""
    req.phase, req.finish_s = Phase.FINISHED, now
    kv.cache(req)
    kv.free(req)
    forget_block_hashes(req)  # ~3 KB a request that a long run would otherwise hold to its end
