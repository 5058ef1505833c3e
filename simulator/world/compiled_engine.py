"""One vLLM-style replica's event loop compiled with numba: the SimPy world of `World.run` for the plain case, step
by step, with every decision and every float operation of the Python engine in the same order, so its tables are
the same to the bit (tests/simulator/test_compiled_run.py runs both).

It replaces, for one replica fed by open-loop arrivals (simulator/world/compiled_run.py says which scenarios):
SimPy's event queue (events ordered by time, then creation, as SimPy orders them), the arrival process, the API
server's FIFO hand-over, `TokenBudgetScheduler` with `OneStepAhead` over its KV blocks (below), `StepTimer.lists_s`
(attention from each step's sums, by the kernel tables' grids or the roofline; the rest of a step's time from a
table keyed by its shape, which the caller fills from the cost model on a miss), `TokenLog`'s inter-token gaps and
the step log's rows.

The loop stops and returns to its caller whenever it needs Python: a step shape or token count not priced yet, or
full output buffers. Everything it needs to go on is in its arrays, so the caller fills the gap and calls again.

All of it is in this one module: numba's disk cache knows a compiled function is stale only when its own file changes,
and the loop is compiled with its helpers and constants inside it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

#: the loop's helpers: compiled once and cached on disk, without reference counting (see `Loop`)
helper = njit(cache=True, _nrt=False)

# what the loop returns
# (NEED_ARENA, NEED_TABLES: the gap arena or the tables arena needs `S_NEED` slots past its live regions: compacted,
# grown if need be)
DONE, NEED_FIXED, NEED_DENOMINATORS, FLUSH, GROW_GAPS, NEED_ARENA, NEED_TABLES = range(7)

# per-request integer fields (columns of `ri`: a request's fields side by side)
(
    PROMPT,
    OUTPUT,
    COMPUTED,
    GENERATED,
    IN_FLIGHT,
    HELD,  # KV blocks in its table
    PHASE,
    PREEMPTIONS,
    GAP_OFF,  # its region of the gap arena (-1: none), and the gaps there
    GAP_N,
    ID,
    EID,  # its hand-over's creation order (events at one time run in that order)
    FLAGS,
    TABLE_OFF,  # prefix caching: its block table's region of the tables arena (-1: none), and the region's size
    TABLE_CAP,
    CACHED_N,  # its leading blocks registered in the cache (`_num_cached`)
    CACHED_TOKENS,  # prompt tokens its first admission found cached
    LIVE_BEFORE,  # one step ahead: running requests ahead of it when it finished (`_live_before`)
) = range(18)
RI_FIELDS = 18
# per-request float fields (columns of `rf`)
ARRIVAL, ENTERS, HAND_OVER, SCHEDULED, FIRST_TOKEN, LAST_TOKEN, FINISH = range(7)
RF_FIELDS = 7
# FLAGS bits: it entered (its arrival happened), reached the engine, is refused at arrival, waits for a timeout to
# enter (the arrival process yields one when its time is ahead)
ENTERED, HANDED_OVER, REFUSED, TIMED = 1, 2, 4, 8
# and for the prefix cache: no other request shares its prompt (`Request.private_prefix`), it wants prompt logprobs
# (it never reads the cache), its blocks were left unhashed while private (`_unhashed`)
PRIVATE, NO_HITS, UNHASHED = 16, 32, 64
# phases, as workloads.request.Phase
WAITING, RUNNING, FINISHED, REJECTED = range(4)

# integer parameters (`pi`)
(
    P_NUM_BLOCKS,
    P_BLOCK_SIZE,
    P_WATERMARK,
    P_BUDGET,
    P_MAX_SEQS,
    P_CHUNKED,
    P_GATED,
    P_LONG_PREFILL,
    P_AHEAD,
    P_FRONTEND,
    P_NUM_REQUESTS,
    P_KV_VALUES,
    P_PREFIX,  # vLLM's prefix cache: blocks by id, a free queue and the hashes they hold
    P_MAX_TABLE,  # the largest block table a request can hold
    P_GRAPHED_TOKENS,  # the most tokens a step runs in a CUDA graph (0: none does)
    P_GRAPH_PREFILLS,  # whether a step that prefills runs in one
) = range(16)
PI_FIELDS = 16
# float parameters (`pf`)
F_UNTIL, F_EMPTY_STEP, F_HEADS, F_KV_BYTES, F_ACT_BYTES, F_EAGER_FLOOR, F_BANDWIDTH = range(7)
PF_FIELDS = 7

# integer state (`si`)
(
    S_STAGE,
    S_ENGINE,
    S_ENGINE_EID,
    S_EID,
    S_NEXT,  # the request the arrival process enters next
    S_NEXT_EID,  # its timeout's creation order (-1: the process's start)
    S_HO_HEAD,  # hand-overs: a FIFO of requests in the API server
    S_HO_TAIL,
    S_FREE,
    S_RUNNING,
    S_WAITING,
    S_INBOX_HEAD,
    S_INBOX_TAIL,
    S_RETIRING,
    S_PLAN_N,
    S_PREEMPTED,
    S_ROWS,
    S_GAPS,
    S_ARENA_TOP,
    S_COMPLETED,
    S_MISS_KEY,
    S_MISS_TOKENS,
    S_NEED,
    S_CURSOR,
    S_BUDGET_LEFT,
    S_QUEUE_HEAD,  # prefix caching: the free queue's first and last blocks (-1: empty)
    S_QUEUE_TAIL,
    S_TABLES_TOP,
    # the plan's sums, kept as requests join it: tokens, logits, the longest and shortest query, decodes (one token,
    # having sampled), the decode and prefill paths' tokens, requests, causal keys and KV read (`_paired_stats`),
    # and the gap arena and gap buffer slots committing it may take
    S_TOKENS,
    S_LOGITS,
    S_TOP,
    S_LOW,
    S_DECODES,
    S_D_TOKENS,
    S_D_REQUESTS,
    S_D_KEYS,
    S_D_READ,
    S_P_TOKENS,
    S_P_REQUESTS,
    S_P_KEYS,
    S_P_READ,
    S_FIRST_GAPS,
    S_LAST_GAPS,
    S_FREED_FINISHED,  # the plan took a finished request's blocks back (`PlanBuilder.freed_finished`)
) = range(44)
SI_FIELDS = 44
# float state (`sf`)
T_NOW, T_ENGINE, T_NEXT, T_IN_FLIGHT_SINCE, T_DURATION = range(5)
SF_FIELDS = 5

# the loop's stage and the engine process's state
STAGE_SCHEDULE, STAGE_PRICE, STAGE_EVENTS = range(3)
E_WAITING, E_WOKEN, E_STEP, E_PREEMPTED_ONLY = range(4)

# step-log columns (rows of `rows_i` / `rows_f`): as simulator.world.step_table.STEP_COLUMNS, less the replica
R_REQUESTS, R_PREFILL, R_DECODE, R_RUNNING, R_WAITING, R_USED, R_PREEMPTED = range(7)
R_TIME, R_DURATION, R_USAGE = range(3)

# a block's fields (columns of `blocks`, prefix caching): its neighbours in the free queue (-1: none), its reference
# count, and the hash it holds as the request and block index whose tokens it holds (-1: none; a private request's
# blocks hold tokens no other request has)
NEXT, PREV, REFS, OWNER, INDEX = range(5)


class Loop(NamedTuple):
    """Everything the loop reads and writes, as numpy arrays. Numba passes the tuple whole, and would count a
    reference to each of its arrays on every call: the helpers are compiled without reference counting (`_nrt=False`;
    they allocate nothing), which makes them as cheap as passing each the arrays it reads."""

    pi: np.ndarray  # integer parameters (P_*)
    pf: np.ndarray  # float parameters (F_*)
    si: np.ndarray  # integer state (S_*)
    sf: np.ndarray  # float state (T_*)
    ri: np.ndarray  # per-request integer fields (requests x RI_FIELDS)
    rf: np.ndarray  # per-request float fields (requests x RF_FIELDS)
    running: np.ndarray  # running requests in admission order
    heap: np.ndarray  # the waiting queue: a binary heap in FCFS order
    inbox: np.ndarray  # one step ahead: requests handed over that no plan has seen yet (FIFO)
    inbox_t: np.ndarray  # when each reached the engine
    retiring: np.ndarray  # one step ahead: finished requests still holding their slots and blocks
    ho_queue: np.ndarray  # requests in the API server, in hand-over order
    plan_req: np.ndarray  # the step planned: its requests, new tokens, contexts and whether each samples
    plan_new: np.ndarray
    plan_ctx: np.ndarray
    plan_samples: np.ndarray
    finished: np.ndarray  # scratch: the requests a step finishes
    fixed_keys: np.ndarray  # the fixed part of each step shape priced so far (an open-addressing table)
    fixed_values: np.ndarray
    # attention paths: decode?, owns KV?, layers, head dims, kernel table (-1: the roofline)
    paths_i: np.ndarray
    paths_f: np.ndarray  # and their FLOPs per key
    # kernel tables: each one's logs of batch sizes and of lengths (tables x 2 x values), how many values each
    # axis holds (tables x 2), log seconds over (batch, length), NaN where not measured (tables x batches x lengths)
    table_axes: np.ndarray
    table_sizes: np.ndarray
    table_log_t: np.ndarray
    denominators: np.ndarray  # compute and memory denominators per step tokens (NaN: not priced yet)
    blocks: np.ndarray  # prefix caching: each block's fields (blocks x NEXT..INDEX)
    tables: np.ndarray  # prefix caching: block tables, a region per request
    arena: np.ndarray  # inter-token gaps of requests still producing tokens
    gaps: np.ndarray  # gaps of finished requests, in the order they finished, for the token log
    rows_i: np.ndarray  # step-log rows for the step log
    rows_f: np.ndarray


@helper
def blocks_for(tokens, size):
    """Blocks that hold `tokens` tokens (policies.kv_blocks.blocks_for)."""
    return -(-tokens // size)


# ---- the KV block pool ----------------------------------------------------------------------------------------
#
# `BlockManager`'s block counts, or vLLM's prefix cache
# (`PrefixCachingBlockManager` over `RefCountedPool`) for requests whose prompts no other request shares.
#
# Without a prefix cache only counts matter. With one, blocks have ids: a free queue (allocation takes from the front,
# a released block joins the back with the hash it holds, so it can be hit until it is taken again, or the front if it
# holds none), reference counts
# and block tables, as policies/prefix_blocks.py keeps them. A private request's blocks hold tokens no other request
# has, so a block's hash is told by the request and block index it holds, and the only hits are a preempted request's
# own blocks: hashed when it is freed unfinished, found again from its old table while nothing has evicted them. Such a
# request's hits run from its first block on (its blocks are evicted tail first), so no hash is ever held twice.


@helper
def _unlink(e, b):
    """Take block `b` out of the free queue."""
    after, before = e.blocks[b, NEXT], e.blocks[b, PREV]
    if before >= 0:
        e.blocks[before, NEXT] = after
    else:
        e.si[S_QUEUE_HEAD] = after
    if after >= 0:
        e.blocks[after, PREV] = before
    else:
        e.si[S_QUEUE_TAIL] = before
    e.si[S_FREE] -= 1


@helper
def _release(e, b, front):
    """One user fewer: at none, `b` joins the free queue with its contents: at the back, or at the `front` where it
    holds no hash (spent first)."""
    e.blocks[b, REFS] -= 1
    if e.blocks[b, REFS]:
        return
    # at the back b's PREV is the old tail and the old tail's NEXT is b; at the front the same, mirrored
    end, other_end, to_queue, to_b = (
        (S_QUEUE_HEAD, S_QUEUE_TAIL, NEXT, PREV) if front else (S_QUEUE_TAIL, S_QUEUE_HEAD, PREV, NEXT)
    )
    neighbour = e.si[end]
    e.blocks[b, to_queue], e.blocks[b, to_b] = neighbour, -1
    if neighbour >= 0:
        e.blocks[neighbour, to_b] = b
    else:
        e.si[other_end] = b
    e.si[end] = b
    e.si[S_FREE] += 1


@helper
def take_blocks(e, r, need):
    """`_pop_free_many`: `need` blocks from the front of the free queue onto `r`'s table, their contents evicted."""
    if e.pi[P_PREFIX]:
        base = e.ri[r, TABLE_OFF] + e.ri[r, HELD]
        for j in range(need):
            b = e.si[S_QUEUE_HEAD]
            _unlink(e, b)
            e.blocks[b, OWNER] = -1
            e.blocks[b, REFS] = 1
            e.tables[base + j] = b
    else:
        e.si[S_FREE] -= need
    e.ri[r, HELD] += need


@helper
def _private(e, r):
    return e.ri[r, FLAGS] & PRIVATE and not e.ri[r, PREEMPTIONS]


@helper
def _register(e, r, tokens):
    """`_register`: the full blocks among `r`'s first `tokens` tokens made findable."""
    if not e.ri[r, HELD]:
        return
    full = tokens // e.pi[P_BLOCK_SIZE]
    base = e.ri[r, TABLE_OFF]
    for index in range(e.ri[r, CACHED_N], full):
        b = e.tables[base + index]
        if e.blocks[b, OWNER] < 0:
            e.blocks[b, OWNER], e.blocks[b, INDEX] = r, index
    e.ri[r, CACHED_N] = max(e.ri[r, CACHED_N], full)


@helper
def cache_scheduled(e, r, tokens):
    """`cache_scheduled`: blocks a step has allocated for `r`'s tokens up to `tokens` registered as it is scheduled
    (a private request's left unhashed)."""
    if not e.pi[P_PREFIX]:
        return
    if _private(e, r):
        e.ri[r, FLAGS] |= UNHASHED
        return
    tokens = min(tokens, e.ri[r, PROMPT] + e.ri[r, GENERATED])
    if tokens // e.pi[P_BLOCK_SIZE] > e.ri[r, CACHED_N]:
        _register(e, r, tokens)


@helper
def cache(e, r):
    """`cache`: after a step, `r`'s computed blocks registered."""
    if not e.pi[P_PREFIX]:
        return
    if _private(e, r):
        e.ri[r, FLAGS] |= UNHASHED
        return
    if e.ri[r, COMPUTED] // e.pi[P_BLOCK_SIZE] > e.ri[r, CACHED_N]:
        _register(e, r, e.ri[r, COMPUTED])


@helper
def free_table(e, r):
    """`free`: every block of `r` given back, tail first (a request freed unfinished after its blocks went unhashed
    registers them first; blocks registered for tokens never computed are forgotten). Its old table stays in its
    region, where a later admission finds its hits."""
    if not e.pi[P_PREFIX]:
        e.si[S_FREE] += e.ri[r, HELD]
        e.ri[r, HELD] = 0
        return
    if e.ri[r, FLAGS] & UNHASHED:
        e.ri[r, FLAGS] &= ~UNHASHED
        if e.ri[r, GENERATED] < e.ri[r, OUTPUT]:
            _register(e, r, e.ri[r, COMPUTED])
    base, held = e.ri[r, TABLE_OFF], e.ri[r, HELD]
    for index in range(e.ri[r, COMPUTED] // e.pi[P_BLOCK_SIZE], min(e.ri[r, CACHED_N], held)):
        b = e.tables[base + index]
        if e.blocks[b, REFS] == 1:
            e.blocks[b, OWNER] = -1
    e.ri[r, CACHED_N] = 0
    full = min(e.ri[r, COMPUTED] // e.pi[P_BLOCK_SIZE], held)
    for index in range(full, held):  # no hash: to the front, the tail first in the queue
        _release(e, e.tables[base + index], True)
    for index in range(full - 1, -1, -1):
        _release(e, e.tables[base + index], False)
    e.ri[r, HELD] = 0


@helper
def lookup(e, r):
    """`_match`: how many of `r`'s leading blocks the cache holds (never its last token's): a preempted request's
    own, from its old table."""
    if not e.pi[P_PREFIX] or e.ri[r, FLAGS] & NO_HITS or _private(e, r) or e.ri[r, TABLE_OFF] < 0:
        return 0
    full = min((e.ri[r, PROMPT] + e.ri[r, GENERATED] - 1) // e.pi[P_BLOCK_SIZE], e.ri[r, TABLE_CAP])
    base, hits = e.ri[r, TABLE_OFF], 0
    while hits < full:
        b = e.tables[base + hits]
        if b < 0 or e.blocks[b, OWNER] != r or e.blocks[b, INDEX] != hits:
            break
        hits += 1
    return hits


@helper
def hit_blocks(e, r):
    """`_hit_blocks`: the blocks of `r`'s hit (its computed tokens set to it) an admission takes, recorded as
    registered."""
    if not e.pi[P_PREFIX] or e.ri[r, HELD]:
        return 0
    if not e.ri[r, COMPUTED]:
        e.ri[r, CACHED_N] = 0
        return 0
    hits = min(lookup(e, r), e.ri[r, COMPUTED] // e.pi[P_BLOCK_SIZE])
    e.ri[r, CACHED_N] = hits
    return hits


@helper
def evictable_hits(e, r, hits):
    """Of `r`'s first `hits` blocks, those sitting in the free queue (an admission takes them out of it)."""
    count, base = 0, e.ri[r, TABLE_OFF]
    for index in range(hits):
        count += e.blocks[e.tables[base + index], REFS] == 0
    return count


@helper
def take_hits(e, r, hits):
    """`_touch` and the table's start: `r`'s hit blocks referenced again, out of the free queue."""
    base = e.ri[r, TABLE_OFF]
    for index in range(hits):
        b = e.tables[base + index]
        if e.blocks[b, REFS] == 0:
            _unlink(e, b)
        e.blocks[b, REFS] += 1
    e.ri[r, HELD] = hits


@helper
def open_table(e, r):
    """A region of the tables arena for `r`'s block table, once (room is made before each plan: `table_room`)."""
    if not e.pi[P_PREFIX] or e.ri[r, TABLE_OFF] >= 0:
        return
    size = e.ri[r, TABLE_CAP]
    base = e.si[S_TABLES_TOP]
    for index in range(size):
        e.tables[base + index] = -1
    e.ri[r, TABLE_OFF] = base
    e.si[S_TABLES_TOP] = base + size


@helper
def close_table(e, r):
    """A finished request's region is free for compaction."""
    e.ri[r, TABLE_OFF] = -1


@njit(cache=True)
def compact(ri, arena, off_field, size_field, size_add):
    """Move the live regions of an arena (requests with `ri[r, off_field] >= 0`, each `ri[r, size_field] + size_add`
    long) to its front, in their order there; returns the new top."""
    live = np.flatnonzero(ri[:, off_field] >= 0)
    top = 0
    for j in np.argsort(ri[live, off_field]):
        r = live[j]
        start, size = ri[r, off_field], ri[r, size_field] + size_add
        for index in range(size):
            arena[top + index] = arena[start + index]
        ri[r, off_field] = top
        top += size
    return top


@helper
def table_room(e):
    """Whether the tables arena has room for a plan's admissions; if not, what it needs (`S_NEED`)."""
    if not e.pi[P_PREFIX]:
        return True
    need = e.pi[P_MAX_SEQS] * e.pi[P_MAX_TABLE]
    e.si[S_NEED] = need
    return e.si[S_TABLES_TOP] + need <= e.tables.shape[0]


@njit(cache=True)
def entry_times(arrival, refused, service, latency, frontend):
    """When each request enters (`Traffic`: it waits for an arrival ahead of now, `now + (arrival - now)` as SimPy
    adds a delay, or enters at once), whether it waited, and when the API server (FIFO; none for the refused) hands it
    to the engine: `served + latency`, as a delay from its entry. NaN where there is no hand-over."""
    n = arrival.shape[0]
    enters, hand_over, timed = np.empty(n), np.full(n, np.nan), np.zeros(n, np.bool_)
    now, free_at = 0.0, -np.inf
    for i in range(n):
        if arrival[i] > now:
            now, timed[i] = now + (arrival[i] - now), True
        enters[i] = now
        if frontend and not refused[i]:
            served = max(now, free_at) + service[i]
            free_at = served
            hand_over[i] = now + (served + latency - now)
    return enters, hand_over, timed


# ---- the loop ------------------------------------------------------------------------------------------------

# a step shape packed as one key: tokens, requests, logits, prefill?, mixed?
SHAPE_FIELD = 1 << 16


@helper
def shape_key(tokens, requests, logits, prefill, mixed):
    return ((tokens * SHAPE_FIELD + requests) * SHAPE_FIELD + logits) * 4 + prefill * 2 + mixed


EMPTY_KEY = -1


@helper
def table_slot(keys, key):
    """The slot of `key` in an open-addressing table (linear probing; `EMPTY_KEY` marks a free slot), or of the
    free slot it would take."""
    mask = keys.shape[0] - 1
    slot = (key * 0x9E3779B97F4A7C15) >> 17 & mask
    while keys[slot] != key and keys[slot] != EMPTY_KEY:
        slot = (slot + 1) & mask
    return slot


@njit(cache=True)
def table_insert(keys, values, key, value):
    slot = table_slot(keys, key)
    keys[slot], values[slot] = key, value


@njit(cache=True)
def table_rehash(keys, values, new_keys, new_values):
    for j in range(keys.shape[0]):
        if keys[j] != EMPTY_KEY:
            table_insert(new_keys, new_values, keys[j], values[j])


@helper
def _before(e, a, b):
    """The waiting queue's FCFS order: (arrival, id)."""
    if e.rf[a, ARRIVAL] != e.rf[b, ARRIVAL]:
        return e.rf[a, ARRIVAL] < e.rf[b, ARRIVAL]
    return e.ri[a, ID] < e.ri[b, ID]


@helper
def _push(e, r):
    i = e.si[S_WAITING]
    e.heap[i] = r
    e.si[S_WAITING] = i + 1
    while i > 0:
        parent = (i - 1) // 2
        if _before(e, e.heap[i], e.heap[parent]):
            e.heap[i], e.heap[parent] = e.heap[parent], e.heap[i]
            i = parent
        else:
            break


@helper
def _pop(e):
    n = e.si[S_WAITING] - 1
    top = e.heap[0]
    e.heap[0] = e.heap[n]
    e.si[S_WAITING] = n
    i = 0
    while True:
        left, smallest = 2 * i + 1, i
        if left < n and _before(e, e.heap[left], e.heap[smallest]):
            smallest = left
        if left + 1 < n and _before(e, e.heap[left + 1], e.heap[smallest]):
            smallest = left + 1
        if smallest == i:
            return top
        e.heap[i], e.heap[smallest] = e.heap[smallest], e.heap[i]
        i = smallest


@helper
def _leave_running(e, r):
    """`running.remove(r)`: out of the batch, the requests after it moved up; returns where it was."""
    count, position = e.si[S_RUNNING], 0
    while e.running[position] != r:
        position += 1
    for j in range(position, count - 1):
        e.running[j] = e.running[j + 1]
    e.si[S_RUNNING] = count - 1
    return position


@helper
def _notify(e):
    """`Wakeup.notify`: the wake event is triggered (a new event id) whoever waits on it."""
    eid = e.si[S_EID]
    e.si[S_EID] = eid + 1
    if e.si[S_ENGINE] == E_WAITING:
        e.si[S_ENGINE], e.si[S_ENGINE_EID], e.sf[T_ENGINE] = E_WOKEN, eid, e.sf[T_NOW]


@helper
def _submit(e, r):
    """`Replica.submit`: the scheduler queues it (one step ahead: in the inbox), and the engine is woken."""
    e.ri[r, FLAGS] |= HANDED_OVER
    e.ri[r, PHASE] = WAITING
    if e.pi[P_AHEAD]:
        e.inbox[e.si[S_INBOX_TAIL]] = r
        e.inbox_t[e.si[S_INBOX_TAIL]] = e.sf[T_NOW]
        e.si[S_INBOX_TAIL] += 1
    else:
        _push(e, r)
    _notify(e)


@helper
def _num_waiting(e):
    return e.si[S_WAITING] + e.si[S_INBOX_TAIL] - e.si[S_INBOX_HEAD]


@helper
def _capped(e, pending):
    if not e.pi[P_CHUNKED]:
        return pending
    limit = e.pi[P_LONG_PREFILL]
    return limit if 0 < limit < pending else pending


@helper
def _plan_add(e, r, n):
    """`PlanBuilder.add`, and `StepPlan.samples` of it (its pending tokens all fed)."""
    k, context = e.si[S_PLAN_N], e.ri[r, COMPUTED]
    samples = context + n == e.ri[r, PROMPT] + e.ri[r, GENERATED]
    e.plan_req[k], e.plan_new[k], e.plan_ctx[k], e.plan_samples[k] = r, n, context, samples
    e.si[S_PLAN_N] = k + 1
    e.si[S_BUDGET_LEFT] -= n
    _sum_in(e, r, n, context, samples)


@helper
def _clear_sums(e):
    for slot in range(S_TOKENS, S_LAST_GAPS + 1):
        e.si[slot] = 0
    e.si[S_LOW] = 1 << 62


@helper
def _sum_in(e, r, n, context, samples):
    """Add a planned request to the plan's sums."""
    e.si[S_TOKENS] += n
    e.si[S_LOGITS] += samples
    e.si[S_TOP] = max(e.si[S_TOP], n)
    e.si[S_LOW] = min(e.si[S_LOW], n)
    path = S_D_TOKENS if n <= 1 else S_P_TOKENS  # a query of decode_query_len tokens takes the decode path
    e.si[path] += n
    e.si[path + 1] += 1
    e.si[path + 2] += n * context + n * (n + 1) // 2
    e.si[path + 3] += context + n
    e.si[S_DECODES] += n == 1 and e.ri[r, GENERATED] > 0
    if samples:
        if math.isnan(e.rf[r, FIRST_TOKEN]):
            e.si[S_FIRST_GAPS] += e.ri[r, OUTPUT] - 1
        if e.ri[r, GENERATED] + 1 >= e.ri[r, OUTPUT]:
            e.si[S_LAST_GAPS] += e.ri[r, OUTPUT]


@helper
def _preempt(e, v):
    """`TokenBudgetScheduler._preempt` by recompute: out of the batch and the plan, blocks freed, queued again."""
    if _leave_running(e, v) < e.si[S_CURSOR]:
        e.si[S_CURSOR] -= 1
    for k in range(e.si[S_PLAN_N]):  # PlanBuilder.drop
        if e.plan_req[k] == v:
            e.si[S_BUDGET_LEFT] += e.plan_new[k]
            for j in range(k, e.si[S_PLAN_N] - 1):
                e.plan_req[j], e.plan_new[j] = e.plan_req[j + 1], e.plan_new[j + 1]
                e.plan_ctx[j], e.plan_samples[j] = e.plan_ctx[j + 1], e.plan_samples[j + 1]
            e.si[S_PLAN_N] -= 1
            _clear_sums(e)
            for j in range(e.si[S_PLAN_N]):
                _sum_in(e, e.plan_req[j], e.plan_new[j], e.plan_ctx[j], e.plan_samples[j])
            break
    e.si[S_PREEMPTED] += 1
    e.ri[v, PREEMPTIONS] += 1
    e.ri[v, IN_FLIGHT] = 0
    free_table(e, v)
    e.ri[v, COMPUTED] = 0
    e.ri[v, PHASE] = WAITING
    _push(e, v)


@helper
def _pop_finished(e):
    """`TokenBudgetScheduler._pop_finished` (FCFS): the last finished request held a step, if no running request
    is after it, gives its blocks back."""
    count = e.si[S_RETIRING]
    if count == 0 or e.ri[e.retiring[count - 1], LIVE_BEFORE] < e.si[S_RUNNING]:
        return False
    _release_finished(e, e.retiring[count - 1])
    e.si[S_RETIRING] = count - 1
    e.si[S_FREED_FINISHED] = 1
    return True


@helper
def _make_room(e, r, n):
    """Blocks for `n` more tokens of `r`, preempting the newest running requests; False if `r` itself went."""
    size = e.pi[P_BLOCK_SIZE]
    if n == 1 and e.ri[r, COMPUTED] % size != 0:
        return True
    while True:
        need = max(blocks_for(e.ri[r, COMPUTED] + n, size) - e.ri[r, HELD], 0)
        if need <= e.si[S_FREE]:
            take_blocks(e, r, need)
            return True
        if _pop_finished(e):
            continue
        victim = e.running[e.si[S_RUNNING] - 1]
        _preempt(e, victim)
        if victim == r:
            return False


@helper
def _schedule_running(e):
    i = 0
    while i < e.si[S_RUNNING] and e.si[S_BUDGET_LEFT] > 0:
        r = e.running[i]
        computed = e.ri[r, COMPUTED]
        pending = e.ri[r, PROMPT] + e.ri[r, GENERATED] - computed
        if pending == 1:
            e.si[S_CURSOR] = i
            if computed % e.pi[P_BLOCK_SIZE] == 0 and not _make_room(e, r, 1):
                return
            cache_scheduled(e, r, computed + 1)
            _plan_add(e, r, 1)
            i = e.si[S_CURSOR] + 1
            continue
        if pending <= 0:
            i += 1
            continue
        want = _capped(e, pending)
        n = want if want < e.si[S_BUDGET_LEFT] else e.si[S_BUDGET_LEFT]
        if n < pending and not e.pi[P_CHUNKED]:
            i += 1
            continue
        e.si[S_CURSOR] = i
        if _make_room(e, r, n):
            cache_scheduled(e, r, e.ri[r, COMPUTED] + n)
            _plan_add(e, r, n)
            i = e.si[S_CURSOR] + 1
        else:
            return


@helper
def _admit_waiting(e):
    size, watermark = e.pi[P_BLOCK_SIZE], e.pi[P_WATERMARK]
    while (
        e.si[S_WAITING] > 0
        and e.si[S_BUDGET_LEFT] > 0
        and e.si[S_RUNNING] + e.si[S_RETIRING] < e.pi[P_MAX_SEQS]
    ):
        r = e.heap[0]
        tokens = e.ri[r, PROMPT] + e.ri[r, GENERATED]
        hit = lookup(e, r) * size
        n = _capped(e, tokens - hit)
        if n > e.si[S_BUDGET_LEFT] and not e.pi[P_CHUNKED]:
            return
        n = min(n, e.si[S_BUDGET_LEFT])
        e.ri[r, COMPUTED] = hit
        mark = e.si[S_RUNNING] > 0  # vLLM keeps the watermark free only while another request runs
        if e.pi[P_GATED]:  # the pool could hold its whole prompt
            hits = hit_blocks(e, r)
            need = max(blocks_for(tokens, size) - e.ri[r, HELD] - hits, 0)
            if need + evictable_hits(e, r, hits) + watermark * mark > e.si[S_FREE]:
                e.ri[r, COMPUTED] = 0
                return
        hits = hit_blocks(e, r)
        need = max(blocks_for(hit + n, size) - e.ri[r, HELD], 0) - hits
        if need + (watermark if mark else 0) + evictable_hits(e, r, hits) > e.si[S_FREE]:
            e.ri[r, COMPUTED] = 0
            return
        open_table(e, r)
        take_hits(e, r, hits)
        take_blocks(e, r, need)
        _pop(e)
        cache_scheduled(e, r, hit + n)
        if not e.ri[r, PREEMPTIONS]:
            e.ri[r, CACHED_TOKENS] = hit
        e.ri[r, PHASE] = RUNNING
        e.running[e.si[S_RUNNING]] = r
        e.si[S_RUNNING] += 1
        _plan_add(e, r, n)


@helper
def _release_finished(e, r):
    """`release_finished`: a finished request's blocks go back, cached first."""
    cache(e, r)
    free_table(e, r)
    close_table(e, r)


@helper
def _release_retired(e):
    """`OneStepAhead.release` then `release_finished`: the slots and blocks of requests that finished before."""
    for j in range(e.si[S_RETIRING]):
        _release_finished(e, e.retiring[j])
    e.si[S_RETIRING] = 0


@helper
def _plan(e):
    """`TokenBudgetScheduler._plan`: running requests, then (if nobody was preempted) waiting ones."""
    if e.pi[P_AHEAD] and math.isnan(e.sf[T_IN_FLIGHT_SINCE]):
        for j in range(e.si[S_RUNNING]):
            e.ri[e.running[j], IN_FLIGHT] = 0
    e.si[S_PLAN_N], e.si[S_PREEMPTED], e.si[S_BUDGET_LEFT], e.si[S_CURSOR] = 0, 0, e.pi[P_BUDGET], 0
    e.si[S_FREED_FINISHED] = 0
    _clear_sums(e)
    _schedule_running(e)
    if e.si[S_PREEMPTED] == 0 and e.si[S_FREED_FINISHED] == 0:
        _admit_waiting(e)


@helper
def _take_inbox(e, all_of_them):
    """`OneStepAhead.seen` (arrivals the step in flight's planning saw) or `take_all`, into the waiting queue."""
    cutoff = e.sf[T_IN_FLIGHT_SINCE]
    while e.si[S_INBOX_HEAD] < e.si[S_INBOX_TAIL]:
        j = e.si[S_INBOX_HEAD]
        if not all_of_them and not math.isnan(cutoff) and e.inbox_t[j] > cutoff:
            break
        _push(e, e.inbox[j])
        e.si[S_INBOX_HEAD] = j + 1


@helper
def _schedule(e):
    """`Scheduler.schedule(now)`, one step ahead (`OneStepAhead.schedule`) or not."""
    if not e.pi[P_AHEAD]:
        _plan(e)
        return
    _take_inbox(e, False)
    _plan(e)
    pending = e.si[S_INBOX_TAIL] > e.si[S_INBOX_HEAD] or e.si[S_RETIRING] > 0
    if e.si[S_PLAN_N] == 0 and e.si[S_PREEMPTED] == 0 and pending:
        # nothing to run: the engine waits for the outputs in flight, then plans again
        _release_retired(e)
        _take_inbox(e, True)
        e.sf[T_IN_FLIGHT_SINCE] = np.nan
        _plan(e)
    _release_retired(e)
    e.sf[T_IN_FLIGHT_SINCE] = np.nan if e.si[S_PLAN_N] == 0 else e.sf[T_NOW]


@helper
def _bracket(log_axis, size, x):
    """`kernel_tables._bracket` of `x` on the first `size` values of `log_axis`: (low, high, weight of high); low
    -1 above the axis."""
    lx = math.log(x) if x > 0 else -math.inf
    if lx <= log_axis[0]:
        return 0, 0, 0.0
    if lx > log_axis[size - 1]:
        return -1, -1, 0.0
    lo, hi = 0, size  # bisect_left
    while lo < hi:
        mid = (lo + hi) // 2
        if log_axis[mid] < lx:
            lo = mid + 1
        else:
            hi = mid
    if log_axis[lo] == lx:
        return lo, lo, 0.0
    return lo - 1, lo, (lx - log_axis[lo - 1]) / (log_axis[lo] - log_axis[lo - 1])


@helper
def _table_at(axes, sizes, log_t, batch, length):
    """`Grid._at2` of one kernel table (`Loop.table_*[t]`): NaN where it returns None."""
    i0, i1, wi1 = _bracket(axes[0], sizes[0], batch)
    j0, j1, wj1 = _bracket(axes[1], sizes[1], length)
    if i0 < 0 or j0 < 0:
        return np.nan
    total = 0.0
    for a in range(2):
        i, wi = (i0, 1.0 - wi1) if a == 0 else (i1, wi1)
        if wi == 0.0:
            continue
        for b in range(2):
            j, wj = (j0, 1.0 - wj1) if b == 0 else (j1, wj1)
            if wj == 0.0:
                continue
            value = log_t[i, j]
            if value != value:  # not measured
                return np.nan
            total += wi * wj * value
    return math.exp(total)


@helper
def table_s(axes, sizes, log_t, requests, length):
    """`AttentionTable.seconds` of one kernel table (`Loop.table_*[t]`): NaN where it returns None."""
    pieces = 1
    while pieces <= requests:
        time_s = _table_at(axes, sizes, log_t, requests / pieces, length)
        if not math.isnan(time_s):
            return time_s * pieces
        pieces *= 2
    return np.nan


@helper
def _attention_s(e):
    """`PathAttention.__call__` of the plan (windowless): per path, the sums of `_paired_stats`, then
    `_priced`'s terms in its order. NaN: the step's denominators are not known yet."""
    tokens = e.si[S_TOKENS]
    d_tokens, d_requests, d_keys, d_read = (
        e.si[S_D_TOKENS],
        e.si[S_D_REQUESTS],
        e.si[S_D_KEYS],
        e.si[S_D_READ],
    )
    p_tokens, p_requests, p_keys, p_read = (
        e.si[S_P_TOKENS],
        e.si[S_P_REQUESTS],
        e.si[S_P_KEYS],
        e.si[S_P_READ],
    )
    compute_d, memory_d = e.denominators[0, tokens], e.denominators[1, tokens]
    if math.isnan(compute_d):
        e.si[S_MISS_TOKENS] = tokens
        return np.nan
    kv_values, kv_bytes, heads, act = e.pi[P_KV_VALUES], e.pf[F_KV_BYTES], e.pf[F_HEADS], e.pf[F_ACT_BYTES]
    decode_s, prefill_s = 0.0, 0.0
    for j in range(e.paths_i.shape[0]):
        decode = e.paths_i[j, 0]
        if decode:
            new_tokens, requests, keys, kv_read = d_tokens, d_requests, d_keys, d_read
        else:
            new_tokens, requests, keys, kv_read = p_tokens, p_requests, p_keys, p_read
        if not requests:
            continue
        layer_s = np.nan
        written = float(new_tokens * kv_values) * kv_bytes if e.paths_i[j, 1] else 0.0
        nbytes = (
            float(kv_read * kv_values) * kv_bytes
            + written
            + float(new_tokens) * heads * float(e.paths_i[j, 3]) * act
        )
        table = e.paths_i[j, 4]
        if table >= 0:  # the kernel table's, at `_table_length` of a windowless path
            length = kv_read / requests if decode else (math.sqrt(1 + 8 * (keys / requests)) - 1) / 2
            layer_s = table_s(
                e.table_axes[table], e.table_sizes[table], e.table_log_t[table], requests, length
            )
            if not decode and not math.isnan(layer_s):  # `measured_attention`'s floor
                layer_s = max(layer_s, nbytes / e.pf[F_BANDWIDTH])
        if math.isnan(layer_s):  # the roofline's
            compute_s = e.paths_f[j] * float(keys) / compute_d
            memory_s = nbytes / memory_d
            layer_s = compute_s if compute_s > memory_s else memory_s
        layer_s *= float(e.paths_i[j, 2])
        if decode:
            decode_s += layer_s
        else:
            prefill_s += layer_s
    return decode_s + prefill_s


@helper
def _price(e):
    """`StepTimer.lists_s` of the plan: its shape's fixed part plus its attention, held at the eager floor; NaN on a
    miss (which `S_MISS_KEY` or `S_MISS_TOKENS` names)."""
    top, low = e.si[S_TOP], e.si[S_LOW]
    key = shape_key(e.si[S_TOKENS], e.si[S_PLAN_N], e.si[S_LOGITS], int(top > 1), int(low <= 1 < top))
    slot = table_slot(e.fixed_keys, key)
    if e.fixed_keys[slot] != key:
        e.si[S_MISS_KEY] = key
        return np.nan, NEED_FIXED
    attention = _attention_s(e)
    if math.isnan(attention):
        return np.nan, NEED_DENOMINATORS
    seconds = e.fixed_values[slot] + attention
    # `StepTimer._floored`: a step outside CUDA graphs lasts at least the eager floor
    floor, tokens = e.pf[F_EAGER_FLOOR], e.si[S_TOKENS]
    graphed = tokens <= e.pi[P_GRAPHED_TOKENS] and (e.pi[P_GRAPH_PREFILLS] or top <= 1)
    if floor and tokens and not graphed and floor > seconds:
        seconds = floor
    return seconds, DONE


@helper
def _record(e, duration, requests, prefill, decode, preempted):
    """`Replica._record`: one step-log row, as the replica stands now."""
    k = e.si[S_ROWS]
    used = e.pi[P_NUM_BLOCKS] - e.si[S_FREE]
    e.rows_f[R_TIME, k], e.rows_f[R_DURATION, k] = e.sf[T_NOW], duration
    e.rows_f[R_USAGE, k] = used / e.pi[P_NUM_BLOCKS]
    e.rows_i[R_REQUESTS, k], e.rows_i[R_PREFILL, k], e.rows_i[R_DECODE, k] = requests, prefill, decode
    e.rows_i[R_RUNNING, k], e.rows_i[R_WAITING, k] = e.si[S_RUNNING], _num_waiting(e)
    e.rows_i[R_USED, k], e.rows_i[R_PREEMPTED, k] = used, preempted
    e.si[S_ROWS] = k + 1


@helper
def _room_for_step(e):
    """Whether the arena and the gap buffer hold what committing the plan adds; else the status to return."""
    first, finishing = e.si[S_FIRST_GAPS], e.si[S_LAST_GAPS]
    if e.si[S_GAPS] + finishing > e.gaps.shape[0]:
        e.si[S_NEED] = finishing
        return FLUSH if e.si[S_GAPS] else GROW_GAPS
    if e.si[S_ARENA_TOP] + first > e.arena.shape[0]:
        e.si[S_NEED] = first
        return NEED_ARENA
    return DONE


@helper
def _sample(e, r):
    """`TokenLog.sample`: a token at `now`; its gap waits in the arena until the request's last token, when its
    gaps join the finished requests' (in the order they finish)."""
    now = e.sf[T_NOW]
    e.ri[r, GENERATED] += 1
    if math.isnan(e.rf[r, FIRST_TOKEN]):
        e.rf[r, FIRST_TOKEN] = now
        if e.ri[r, OUTPUT] > 1:
            e.ri[r, GAP_OFF], e.ri[r, GAP_N] = e.si[S_ARENA_TOP], 0
            e.si[S_ARENA_TOP] += e.ri[r, OUTPUT] - 1
    else:
        start = e.ri[r, GAP_OFF]
        e.arena[start + e.ri[r, GAP_N]] = now - e.rf[r, LAST_TOKEN]
        e.ri[r, GAP_N] += 1
        if e.ri[r, GENERATED] >= e.ri[r, OUTPUT]:
            out = e.si[S_GAPS]
            for g in range(e.ri[r, GAP_N]):
                e.gaps[out + g] = e.arena[start + g]
            e.si[S_GAPS] = out + e.ri[r, GAP_N]
            e.ri[r, GAP_OFF] = -1
    e.rf[r, LAST_TOKEN] = now


@helper
def _commit(e):
    """`TokenBudgetScheduler.commit` and `Replica._commit`: tokens counted, samples logged, finished requests out
    (one step ahead: holding their slots and blocks until the next plan), the step's row logged."""
    now = e.sf[T_NOW]
    if e.pi[P_AHEAD]:
        for j in range(e.si[S_RUNNING]):
            e.ri[e.running[j], IN_FLIGHT] = 0
        for k in range(e.si[S_PLAN_N]):
            e.ri[e.plan_req[k], IN_FLIGHT] = e.plan_new[k]
    count = 0
    for k in range(e.si[S_PLAN_N]):
        r = e.plan_req[k]
        e.ri[r, COMPUTED] += e.plan_new[k]
        if e.ri[r, COMPUTED] >= e.ri[r, PROMPT] + e.ri[r, GENERATED]:
            _sample(e, r)
            if e.ri[r, GENERATED] >= e.ri[r, OUTPUT]:
                e.finished[count] = r
                count += 1
        cache(e, r)
    for j in range(count):
        r = e.finished[j]
        position = _leave_running(e, r)
        e.ri[r, PHASE] = FINISHED
        e.rf[r, FINISH] = now
        if e.pi[P_AHEAD]:
            e.ri[r, LIVE_BEFORE] = position
            e.retiring[e.si[S_RETIRING]] = r
            e.si[S_RETIRING] += 1
        else:
            _release_finished(e, r)
    decode = e.si[S_DECODES]
    _record(e, e.sf[T_DURATION], e.si[S_PLAN_N], e.si[S_TOKENS] - decode, decode, e.si[S_PREEMPTED])
    e.si[S_COMPLETED] += count


@helper
def _arrive(e, r):
    """`World._arrive`: refused, or into the API server (FIFO; handed over at its precomputed time), or straight to
    the engine."""
    e.ri[r, FLAGS] |= ENTERED
    if e.ri[r, FLAGS] & REFUSED:
        e.ri[r, PHASE] = REJECTED
        e.si[S_COMPLETED] += 1
        return
    if e.pi[P_FRONTEND]:
        e.ri[r, EID] = e.si[S_EID]
        e.si[S_EID] += 1
        e.ho_queue[e.si[S_HO_TAIL]] = r
        e.si[S_HO_TAIL] += 1
    else:
        _submit(e, r)


@helper
def _enter_arrivals(e):
    """`Traffic._open_loop` from the request it waited for: enter it, then every next one already due, until one
    whose time is ahead (its timeout is created now)."""
    n = e.pi[P_NUM_REQUESTS]
    r = e.si[S_NEXT]
    if e.si[S_NEXT_EID] == -1 and r < n and e.ri[r, FLAGS] & TIMED:  # the process's start: wait for the first
        e.si[S_NEXT_EID] = e.si[S_EID]
        e.si[S_EID] += 1
        e.sf[T_NEXT] = e.rf[r, ENTERS]
        return
    while r < n:
        _arrive(e, r)
        r += 1
        e.si[S_NEXT] = r
        if r < n and e.ri[r, FLAGS] & TIMED:
            e.si[S_NEXT_EID] = e.si[S_EID]
            e.si[S_EID] += 1
            e.sf[T_NEXT] = e.rf[r, ENTERS]
            return
    e.si[S_NEXT_EID] = -2  # every request has entered


@helper
def run_replica(e):
    """Run until done (every event processed, or the stop time reached) or until Python is needed; returns the
    status. Resumes where it stopped."""
    rows_cap = e.rows_i.shape[1]
    until = e.pf[F_UNTIL]
    while True:
        stage = e.si[S_STAGE]
        if stage == STAGE_SCHEDULE:
            if e.si[S_ROWS] >= rows_cap:
                return FLUSH
            if not table_room(e):
                return NEED_TABLES
            _schedule(e)
            if e.si[S_PLAN_N] == 0:
                if e.si[S_PREEMPTED] == 0:
                    e.si[S_ENGINE] = E_WAITING
                    e.si[S_STAGE] = STAGE_EVENTS
                elif e.pf[F_EMPTY_STEP] != 0.0:  # a step that only preempted takes its time, then is logged
                    e.sf[T_DURATION] = e.pf[F_EMPTY_STEP]
                    e.si[S_ENGINE], e.si[S_ENGINE_EID] = E_PREEMPTED_ONLY, e.si[S_EID]
                    e.si[S_EID] += 1
                    e.sf[T_ENGINE] = e.sf[T_NOW] + e.pf[F_EMPTY_STEP]
                    e.si[S_STAGE] = STAGE_EVENTS
                else:
                    _record(e, 0.0, 0, 0, 0, e.si[S_PREEMPTED])
                continue
            for k in range(e.si[S_PLAN_N]):  # StepPlan.mark_scheduled
                r = e.plan_req[k]
                if math.isnan(e.rf[r, SCHEDULED]):
                    e.rf[r, SCHEDULED] = e.sf[T_NOW]
            e.si[S_STAGE] = STAGE_PRICE
            continue
        if stage == STAGE_PRICE:
            duration, status = _price(e)
            if status != DONE:
                return status
            e.sf[T_DURATION] = duration
            e.si[S_ENGINE], e.si[S_ENGINE_EID] = E_STEP, e.si[S_EID]
            e.si[S_EID] += 1
            e.sf[T_ENGINE] = e.sf[T_NOW] + duration
            e.si[S_STAGE] = STAGE_EVENTS
            continue
        # the next event, as SimPy orders them: by time, then by creation
        best, best_t, best_eid = 0, np.inf, 1 << 62
        if e.si[S_NEXT_EID] >= -1:
            best, best_t, best_eid = 1, e.sf[T_NEXT], e.si[S_NEXT_EID]
        if e.si[S_HO_HEAD] < e.si[S_HO_TAIL]:
            r = e.ho_queue[e.si[S_HO_HEAD]]
            t, eid = e.rf[r, HAND_OVER], e.ri[r, EID]
            if t < best_t or (t == best_t and eid < best_eid):
                best, best_t, best_eid = 2, t, eid
        if e.si[S_ENGINE] != E_WAITING:
            t, eid = e.sf[T_ENGINE], e.si[S_ENGINE_EID]
            if t < best_t or (t == best_t and eid < best_eid):
                best, best_t, best_eid = 3, t, eid
        if best == 0 or best_t >= until:
            return DONE
        if best == 3 and e.si[S_ENGINE] != E_WOKEN:
            if e.si[S_ROWS] >= rows_cap:
                return FLUSH
            if e.si[S_ENGINE] == E_STEP:
                status = _room_for_step(e)
                if status != DONE:
                    return status
        e.sf[T_NOW] = best_t
        if best == 1:
            _enter_arrivals(e)
        elif best == 2:
            r = e.ho_queue[e.si[S_HO_HEAD]]
            e.si[S_HO_HEAD] += 1
            _submit(e, r)
        else:
            if e.si[S_ENGINE] == E_STEP:
                _commit(e)
            elif e.si[S_ENGINE] == E_PREEMPTED_ONLY:
                _record(e, e.sf[T_DURATION], 0, 0, 0, e.si[S_PREEMPTED])
            e.si[S_ENGINE] = E_WAITING
            e.si[S_STAGE] = STAGE_SCHEDULE
