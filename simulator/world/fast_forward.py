"""Fast-forward over stretches of decode-only steps, with results identical to stepping one by one.

A stretch may be fused when the scheduler says the step is a plain decode of every running request
(`Scheduler.decode_stretch`), and it ends before anything could change the next decisions:
- the step before any request's last token (a finish frees blocks and a slot), unless nothing waits
  for them and no closed-loop client reacts: then requests finish inside it and the batch shrinks;
- at the last step that starts before the next outside event (an arrival: a new request may be
  admitted and routers read replica load; in a closed loop, any event); a step that starts earlier
  was decided without it, so it may end later, but not exactly at the event (tie order) nor at the
  stop time. Under async scheduling the step after it was planned before the event was seen too, so it is
  fused as well (`lag_steps`) where nothing at the event can see its blocks taken early (engine.FastForward);
- while the blocks the stretch opens still fit in the free pool (no preemption can occur), handed
  out in the same order stepping would; admissions blocked now stay blocked, as free blocks only shrink;
- in a hybrid KV pool (sliding-window groups free a block every block_size steps), at the first step
  after which a window frees a block, if a request waits with a batch slot free: the block could admit it.
Step times come from `StepTimer.shrinking_stretch_s`, bit-for-bit the stepped ones, and are summed in
the same order SimPy would, so every timestamp matches.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from itertools import accumulate
from dataclasses import dataclass

import numpy as np
import simpy

from servesim.hardware.step_timer import StepTimer
from servesim.policies.kv_blocks import BlockManager, blocks_for
from servesim.policies.step import TokenLog
from servesim.workloads.request import Request


@dataclass(frozen=True, slots=True)
class Stretch:
    """`len(ends_s)` fused decode steps: their durations and end times, and the step in which each request
    finishes (a large number for those that run past the stretch). With `prefill`, a request prefills beside the
    decodes, `chunks[i]` of its prompt tokens in step i (simulator/world/chunk_stretch.py)."""

    durations_s: np.ndarray
    ends_s: np.ndarray
    finish_step: np.ndarray
    prefill: Request | None = None
    chunks: tuple[int, ...] = ()
    lagged: int = 0  # its last steps planned before the next event was seen (`plan_stretch`'s lag_steps)


def wait_until(env: simpy.Environment, target: float):
    """Wait until `target` exactly, where stepping lands (SimPy adds a delay to `now`, and plain subtraction may
    round). Some targets no delay reaches from `now`; then wait until the last float below it first, whence
    `target - now` is exact (the two are within a factor of two) and so is the sum."""
    now, delay = env.now, target - env.now
    while now + delay < target:
        delay = math.nextafter(delay, math.inf)
    while now + delay > target:
        delay = math.nextafter(delay, -math.inf)
    if now + delay < target:
        yield env.timeout(delay)
        delay = target - env.now
    yield env.timeout(delay)


def _window_free_steps(context: np.ndarray, window: int, block_size: int) -> np.ndarray:
    """Per request, the first fused step after which a sliding group of `window` frees a block; then every
    block_size steps. After step i a request has c + i + 1 tokens and the group skips
    (c + i + 2 - window) // block_size leading blocks (hardware.kv_groups.skipped_blocks)."""
    lo = np.maximum(0, block_size + window - 2 - context)
    return lo + ((window - 2 - context) % block_size - lo) % block_size


def _max_steps_fitting(
    context: np.ndarray,
    last: np.ndarray,
    held: np.ndarray,
    free: int,
    block_size: int,
    upper: int,
    groups: int = 1,
) -> int:
    """Largest m <= upper whose new blocks fit in `free` (each request grows until step m or its finish, in
    each of `groups` KV cache groups; blocks freed by finishes or windows are not counted: the safe side)."""

    def need(m: int) -> int:
        grown = context + np.minimum(m, last + 1)
        return groups * int(np.maximum(blocks_for(grown, block_size) - held, 0).sum())

    if need(upper) <= free:  # the common case: the pool is far from full
        return upper
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_stretch(
    requests: list[Request],
    kv: BlockManager,
    timer: StepTimer,
    now: float,
    next_event_s: float,
    stop_s: float = math.inf,
    finishes_allowed: bool = False,
    max_steps: int = 4096,
    waiting: bool = False,
    in_flight: int = 0,
    lag_steps: int = 0,
) -> Stretch | None:
    """The fusable decode steps starting now (step 0 is already scheduled and allocated), or None if < 2.

    `finishes_allowed`: nobody waits for a freed slot and no client reacts to a finish, so requests may
    finish inside the stretch (never in its last step, which may span an outside event). `waiting`: a
    request waits for admission that a free block could let in, so blocks a sliding window frees end it.
    `in_flight`: the tokens each decode step leaves in flight when the next is planned (1 under async
    scheduling), below which windows free blocks (a request with more in flight now frees them as step 0 ends).
    `lag_steps` (0 or 1): the step after the one the next event comes in was planned before the event was seen
    (async scheduling), so it is fused too, when the step the event comes in finishes nobody.
    """
    finish = np.fromiter(
        (r.num_output_tokens - r.num_generated - 1 for r in requests), np.int64, len(requests)
    )
    upper = min(int(finish.max()) + 1 if finishes_allowed else int(finish.min()), max_steps)
    if upper < 2:
        return None
    context = np.fromiter((r.num_computed_tokens for r in requests), np.int64, len(requests))
    sliding = {w for w in kv.windows if w is not None}
    if waiting and sliding:
        # step 0 frees what a prefill chunk held
        if any(r.num_in_flight_tokens > in_flight for r in requests):
            return None
        upper = min(
            upper,
            min(int(_window_free_steps(context, w + in_flight, kv.block_size).min()) for w in sliding) + 1,
        )
        if upper < 2:
            return None
    shortest_s = timer.decode_fixed_s(1, context[:1])  # no step of the stretch is shorter
    horizon_s = min(next_event_s, stop_s)
    if now + shortest_s >= horizon_s:
        return None
    if horizon_s < math.inf:
        upper = min(upper, int((horizon_s - now) / shortest_s) + 2 + lag_steps)
    held = np.fromiter((kv.decode_table_len(r) for r in requests), np.int64, len(requests))
    steps = _max_steps_fitting(
        context, finish, held, kv.num_free_blocks, kv.block_size, upper, len(kv.windows)
    )
    durations = timer.shrinking_stretch_s(context, finish, steps)  # finishing requests leave the batch
    bounds = np.cumsum(np.concatenate(([now], durations)))  # sequential sums, as SimPy accumulates `now`
    starts, ends = bounds[:-1], bounds[1:]
    steps = int(np.searchsorted(starts, next_event_s, side="left"))  # steps starting before the next event
    finishing = set(finish.tolist())
    extended = None
    if steps and ends[steps - 1] == next_event_s:
        steps -= 1
    elif lag_steps and 0 < steps < len(starts) and steps - 1 not in finishing:
        # planned before the event was seen: the same decode, whatever the event brings
        steps = extended = steps + lag_steps
    steps = min(steps, int(np.searchsorted(ends, stop_s, side="left")))  # and ending before the stop time
    while steps and steps - 1 in finishing:  # the last fused step finishes nobody
        steps -= 1
    if steps < 2:
        return None
    return Stretch(durations[:steps], ends[:steps], finish, lagged=lag_steps if steps == extended else 0)


# What happens to a request in a fused step, in the order it happens within the step (events sort on it):
# SCHEDULED: the step is scheduled; a block opens (OPEN_BLOCK), the block it fills registers (REGISTER_FILLED), or
# the prefill gets its chunk's blocks (OPEN_CHUNK)
SCHEDULED = 0
PLANNED = 1  # the next step is planned: under async scheduling, a request finished the step before lets go
ENDED = 2  # the step ends: sliding windows free the blocks they left behind
RETIRED = 3  # then finished requests retire
OPEN_BLOCK, REGISTER_FILLED, OPEN_CHUNK = 0, 1, 2  # a SCHEDULED event's sub-kind


def _events(
    context: np.ndarray,
    last: np.ndarray,
    finish: np.ndarray,
    steps: int,
    size: int,
    windows: tuple[int | None, ...],
    late_release: bool = False,
    in_flight: int = 0,
    prefilling: bool = False,
) -> list[tuple[int, int, int, int]]:
    """(step, kind, request, sub) in stepping order. SCHEDULED: open a block, or register the block it fills (only
    in pools whose windows free blocks, which must be findable by then), or, with `prefilling`, give the prefill
    (request len(context), scheduled after the decodes) its chunk's blocks. PLANNED: with `late_release` (async
    scheduling), the blocks of requests that finished in the step before go back. ENDED: windows free blocks
    (commit order), then RETIRED: finished requests retire."""
    # step i grows request j to context_j + i + 1: a new block when context_j + i % size == 0
    first = (-context) % size
    first[first == 0] = size  # step 0 is already allocated
    events = [
        (i, SCHEDULED, j, OPEN_BLOCK)
        for j in range(len(context))
        for i in range(int(first[j]), int(last[j]) + 1, size)
    ]
    events += [(int(f), RETIRED, j, 0) for j, f in enumerate(finish.tolist()) if f < steps]
    if prefilling:
        events += [(i, SCHEDULED, len(context), OPEN_CHUNK) for i in range(1, steps)]
    if late_release:  # never past the stretch: no request finishes in its last step
        events += [(int(f) + 1, PLANNED, j, 0) for j, f in enumerate(finish.tolist()) if f < steps]
    sliding = sorted({w for w in windows if w is not None})
    if sliding:
        fills = (-(context + 1)) % size  # step i fills a block when context_j + i + 1 is a multiple of size
        events += [
            (i, SCHEDULED, j, REGISTER_FILLED)
            for j in range(len(context))
            for i in range(int(fills[j]), int(last[j]) + 1, size)
        ]
        frees = {
            (i, ENDED, j, 0)
            for w in sliding
            for j, start in enumerate(_window_free_steps(context, w + in_flight, size).tolist())
            for i in range(start, int(last[j]) + 1, size)
        }
        # what a previous step's larger in-flight part held
        frees |= {(0, ENDED, j, 0) for j in range(len(context))}
        events += frees
    return sorted(events)


def apply_stretch(
    requests: list[Request],
    stretch: Stretch,
    kv: BlockManager,
    log: TokenLog,
    retire: Callable[[Request, float], None],
    release: Callable[[Request], None] | None = None,
    in_flight: int = 0,
) -> tuple[np.ndarray, list[int], list[float], Callable[[], None]]:
    """Tokens, inter-token gaps, block allocations, window frees and finishes of the fused steps, in stepping
    order: within a step, blocks are opened (when it is scheduled) before windows and finished requests free
    theirs (when it ends). With `release` (async scheduling), a finished request keeps its blocks until the next
    step is planned: `retire` marks it done as it ends, `release` gives its blocks back then; each step leaves
    `in_flight` tokens of every request in flight (`plan_stretch`).

    Returns, per step, the requests decoding in it; per step but the last, the KV blocks in use after it and the
    pool's usage (what the step log shows); and what the last step does as it ends (its window frees and
    finishes), for the caller to run then: that step may span an arrival, whose router must see the pool as it is
    while the step runs (or, with `stretch.lagged`, come just after the step that spans it: its blocks are then
    taken early, which the caller allows only where no router reads KV usage).
    """
    steps, size, ends = len(stretch.ends_s), kv.block_size, stretch.ends_s
    context = np.fromiter((r.num_computed_tokens for r in requests), np.int64, len(requests))
    last = np.minimum(stretch.finish_step, steps - 1)
    prefill = stretch.prefill
    events = _events(
        context,
        last,
        stretch.finish_step,
        steps,
        size,
        kv.windows,
        release is not None,
        in_flight,
        prefill is not None,
    )
    contexts = context.tolist()
    for req in requests:  # as each step's commit leaves it
        req.num_in_flight_tokens = in_flight
    leaving = np.bincount(last, minlength=steps)  # requests whose last fused step is i
    active = len(requests) - np.concatenate(([0], np.cumsum(leaving)[:-1]))  # requests decoding in step i
    gaps, end_of = array("d", np.diff(ends).tobytes()), ends.tolist()
    for req, k in zip(requests, (last + 1).tolist()):
        first_gap = end_of[0] - req.last_token_s
        log.record(req, first_gap, gaps[: k - 1], req.num_generated + k >= req.num_output_tokens)
        req.num_computed_tokens += k
        req.num_generated += k
        req.last_token_s = end_of[k - 1]
    delta = [0] * steps  # blocks each step's events took (shared blocks free only with their last user)
    used_before = kv.num_used_blocks
    # after each step's events (a pool of two, SGLang's, is not used blocks / blocks)
    usage = [math.nan] * steps
    usage_before = kv.usage

    if prefill is not None:  # its tokens before each step
        prefilled = list(accumulate(stretch.chunks, initial=prefill.num_computed_tokens))

    def run(i: int, kind: int, j: int, sub: int) -> None:
        if sub == OPEN_CHUNK:  # as the scheduler allocates a chunk, from the tokens before it
            prefill.num_computed_tokens = prefilled[i]
            kv.allocate(prefill, stretch.chunks[i])
            kv.cache_scheduled(prefill, prefilled[i + 1])
            return
        tokens = contexts[j] + i + 1
        if kind == SCHEDULED and sub == OPEN_BLOCK:
            kv.open_decode_blocks(requests[j], tokens)
        elif kind == SCHEDULED:
            kv.cache_scheduled(requests[j], tokens)
        elif kind == PLANNED:
            release(requests[j])
        elif kind == ENDED:
            kv.end_decode_step(requests[j], tokens)
        else:
            retire(requests[j], float(ends[i]))  # registers its filled blocks, then frees them

    # the last step's ending events wait for the caller (see the docstring): the sorted events' tail
    ending = [event for event in events if event[0] == steps - 1 and event[1] >= ENDED]
    used, step = used_before, -1
    for event in events[: len(events) - len(ending)]:
        if event[0] != step:
            if step >= 0:  # the pool as the step before left it
                after = kv.num_used_blocks
                delta[step], used, usage[step] = after - used, after, kv.usage
            step = event[0]
        run(*event)
    if step >= 0:
        delta[step], usage[step] = kv.num_used_blocks - used, kv.usage
    if prefill is not None:
        prefill.num_computed_tokens = prefilled[-1]
        _prefill_done(prefill, stretch, log, in_flight)
    for i in range(steps):  # a step without events leaves the pool as it was
        if math.isnan(usage[i]):
            usage[i] = usage[i - 1] if i else usage_before

    def end_last_step() -> None:
        for event in ending:
            run(*event)
        for req, finish in zip(requests, stretch.finish_step.tolist()):
            # blocks filled with generated tokens are unique to their request, so registering
            if finish >= steps:
                # them at the end rather than step by step changes nothing (a window's are freed)
                kv.cache(req)
        if prefill is not None:
            kv.cache(prefill)

    return active, list(accumulate(delta, initial=used_before))[1:-1], usage[:-1], end_last_step


def _prefill_done(prefill: Request, stretch: Stretch, log: TokenLog, in_flight: int) -> None:
    """What the prefill's last fused step leaves: under async scheduling its chunk in flight, and its first token
    if the step finished its prompt (a stretch never runs past that step)."""
    if in_flight:
        prefill.num_in_flight_tokens = stretch.chunks[-1]
    if prefill.num_computed_tokens >= prefill.num_tokens:
        log.sample(prefill, float(stretch.ends_s[-1]))
