"""Fast-forward over stretches of decode-only steps, with results identical to stepping one by one.

A stretch may be fused when the scheduler says the step is a plain decode of every running request
(`Scheduler.decode_stretch`), and it ends before anything could change the next decisions:
- the step before any request's last token (a finish frees blocks and a slot);
- before the next arrival (the horizon: a new request may be admitted; routers read replica load);
- while the blocks the stretch opens still fit in the free pool (no preemption can occur), handed
  out in the same order stepping would; admissions blocked now stay blocked, as free blocks only shrink.
Step times come from `StepTimer.decode_stretch_s`, bit-for-bit the stepped ones, and are summed in
the same order SimPy would, so every timestamp matches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hardware.batch import StepBatch
from hardware.step_timer import StepTimer
from policies.kv_blocks import BlockManager
from policies.step import TokenLog
from workloads.request import Request


@dataclass(frozen=True, slots=True)
class Stretch:
    """`len(ends_s)` fused decode steps: their durations and end times."""

    durations_s: np.ndarray
    ends_s: np.ndarray


def exact_delay(now: float, target: float) -> float:
    """A delay d with now + d == target exactly (SimPy adds delays to `now`; plain subtraction may round)."""
    delay = target - now
    while now + delay < target:
        delay = math.nextafter(delay, math.inf)
    while now + delay > target:
        delay = math.nextafter(delay, -math.inf)
    return delay


def _max_steps_fitting(context: np.ndarray, held: np.ndarray, free: int, block_size: int, upper: int) -> int:
    """Largest m <= upper whose blocks (every request grown by m tokens) fit in `free` more blocks."""
    def need(m: int) -> int:
        return int(np.maximum(-(-(context + m) // block_size) - held, 0).sum())
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


def plan_stretch(requests: list[Request], kv: BlockManager, timer: StepTimer, now: float, horizon_s: float,
                 max_steps: int = 4096) -> Stretch | None:
    """The fusable decode steps starting now (step 0 is already scheduled and allocated), or None if < 2."""
    remaining = min(r.num_output_tokens - r.num_generated for r in requests)
    upper = min(remaining - 1, max_steps)
    if upper < 2:
        return None
    context = np.fromiter((r.num_computed_tokens for r in requests), np.int64, len(requests))
    shortest_s = timer.fixed_s(StepBatch.of(np.ones(len(requests), np.int64), context))  # attention only adds
    if now + 2 * shortest_s >= horizon_s:
        return None
    if horizon_s < math.inf:
        upper = min(upper, int((horizon_s - now) / shortest_s) + 1)
    held = np.fromiter((len(kv.table(r)) for r in requests), np.int64, len(requests))
    steps = _max_steps_fitting(context, held, kv.num_free_blocks, kv.block_size, upper)
    durations = timer.decode_stretch_s(context, steps)
    ends = np.cumsum(np.concatenate(([now], durations)))[1:]  # sequential sums, as SimPy accumulates `now`
    steps = int(np.searchsorted(ends, horizon_s, side="left"))  # only steps ending strictly before the horizon
    if steps < 2:
        return None
    return Stretch(durations[:steps], ends[:steps])


def apply_stretch(requests: list[Request], stretch: Stretch, kv: BlockManager, log: TokenLog) -> list[int]:
    """Tokens, inter-token gaps and block allocations of the fused steps, in the order stepping makes them.

    Returns the KV blocks in use after each step (what the step log shows).
    """
    steps, size = len(stretch.ends_s), kv.block_size
    context = np.fromiter((r.num_computed_tokens for r in requests), np.int64, len(requests))
    # step i (i >= 1) grows request j to context_j + i + 1 tokens: a new block when context_j + i is a multiple
    first = (-context) % size
    first[first == 0] = size  # step 0 is already allocated
    crossings = sorted((int(i), j) for j, f in enumerate(first) for i in range(int(f), steps, size))
    opened = np.zeros(steps, np.int64)
    for i, j in crossings:
        opened[i] += len(kv.reserve(requests[j], int(context[j]) + i + 1))
    used = (kv.num_used_blocks - int(opened.sum()) + opened.cumsum()).tolist()
    ends = stretch.ends_s
    log.itl_s.extend(ends[0] - r.last_token_s for r in requests)
    gaps = np.diff(ends)
    log.itl_s.extend(np.repeat(gaps, len(requests)).tolist())
    last = float(ends[-1])
    for req in requests:
        req.num_computed_tokens += steps
        req.num_generated += steps
        req.last_token_s = last
    return used
