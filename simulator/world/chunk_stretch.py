"""Fast-forward over a chunked prefill: the steps in which one request's prompt is fed chunk by chunk while every
other running request decodes, with results identical to stepping one by one.

With chunked prefill a long prompt takes several steps (vLLM gives it the budget the decodes leave), and each is
a mixed step that the decode-only fast-forward (simulator/world/fast_forward.py) cannot fuse. Until an outside
event comes, these steps are known in advance: the decodes each add one token, the prefill takes what the
scheduler's chunk sizer gives it (`Scheduler.chunk_stretch`), and the decodes that finish leave the budget to it.
The stretch ends at the step that completes the prompt (which samples its first token); if a request waits, before
the first step that leaves budget to admit it; and by the rules of a decode stretch: it keeps to the steps
starting before the next outside event and ending before the stop, the blocks it opens fit in the free pool (so
nobody is preempted), and its last step finishes nobody. Each step is priced like a stepped one, from the same
batch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from servesim.policies.kv_blocks import BlockManager, blocks_for
from servesim.simulator.world.fast_forward import Stretch
from servesim.workloads.request import Request


def plan_chunk_stretch(
    decodes: list[Request],
    prefill: Request,
    first_chunk: int,
    kv: BlockManager,
    chunk_of: Callable[[int, int], tuple[int, int]],
    price: Callable[[list[int], list[int], list[bool]], float],
    now: float,
    next_event_s: float,
    stop_s: float = math.inf,
    finishes_allowed: bool = False,
    waiting: bool = False,
    price_sums: Callable[[int, int, int, int, bool], float] | None = None,
) -> Stretch | None:
    """The fusable steps starting now (step 0 is scheduled and allocated: the decodes, then `first_chunk` tokens of
    `prefill`), or None if < 2. `chunk_of(pending, decodes)`: the prefill's tokens in a step with that many
    decodes, and the budget left. `price(num_new, num_context, samples)`: a step's seconds (`StepTimer.lists_s`);
    `price_sums`, where given, the same from the step's sums (`StepTimer.chunk_step_pricer`), so no step builds its
    lists. `finishes_allowed`: as for `plan_stretch`. `waiting`: a request waits (or is swapped out), which a step
    with budget left would admit."""
    context = [r.num_computed_tokens for r in decodes]
    finish = [r.num_output_tokens - r.num_generated - 1 for r in decodes]
    upper = min(finish) if decodes and not finishes_allowed else math.inf
    fed, pending = prefill.num_computed_tokens, prefill.num_tokens - prefill.num_computed_tokens
    free, opened, held, size = kv.num_free_blocks, 0, kv.decode_table_len(prefill), kv.block_size
    # the decodes of the step being planned, by when they leave: their count, contexts' sum and residues mod the block
    # size (a decode opens a block in step i when its context before step 0 is -i mod the block size)
    leaving = sorted(range(len(decodes)), key=finish.__getitem__)
    gone, count, context_sum = 0, len(decodes), sum(context)
    residues = Counter(c % size for c in context)
    chunks: list[int] = []
    durations: list[float] = []
    ends: list[float] = []
    t = now
    while pending > 0 and len(chunks) < upper and t < next_event_s:
        i = len(chunks)
        while gone < len(leaving) and finish[leaving[gone]] < i:
            c = context[leaving[gone]]
            count, context_sum, gone = count - 1, context_sum - c, gone + 1
            residues[c % size] -= 1
        n, left = chunk_of(pending, count)
        if i == 0 and n != first_chunk:  # the scheduler did something else: leave it to stepping
            return None
        if n <= 0 or (i and waiting and left):
            break
        if i:  # step 0's blocks are taken already
            grown = blocks_for(fed + n, size)
            opened += residues[-i % size] + max(grown - held, 0)
            held = max(grown, held)
            if opened > free:
                break
        if price_sums is not None:
            duration = price_sums(count, context_sum + count * (i + 1), n, fed, n == pending)
        else:
            alive = [c + i for c, f in zip(context, finish) if f >= i]
            duration = price([1] * count + [n], alive + [fed], [True] * count + [n == pending])
        end = t + duration  # as SimPy adds each step's time to `now`
        if end >= stop_s:
            break
        chunks.append(n)
        durations.append(duration)
        ends.append(end)
        t, fed, pending = end, fed + n, pending - n
    steps = len(chunks)
    if steps and ends[-1] == next_event_s:  # a step ending at the event would tie with it
        steps -= 1
    finishing = set(finish)
    if prefill.num_output_tokens == 1 and pending == 0:
        finishing.add(len(chunks) - 1)  # its one token finishes it
    while steps and steps - 1 in finishing:  # the last fused step finishes nobody
        steps -= 1
    if steps < 2:
        return None
    return Stretch(
        np.array(durations[:steps]),
        np.array(ends[:steps]),
        np.array(finish, np.int64),
        prefill,
        tuple(chunks[:steps]),
    )
