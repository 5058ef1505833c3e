"""Run a World's single replica through the compiled loop (simulator/world/compiled_engine.py) when the scenario
is one it reproduces exactly, and leave the tables as the SimPy engine would.

It covers what most capacity questions run: one vLLM-style engine (the `vllm` or `sarathi` scheduler, async
scheduling or not, chunked prefill or not), with no prefix cache or vLLM's over prompts no two requests share,
full-attention layers priced by the roofline or the kernel tables, fed by open-loop arrivals through the API server
or straight.
`compiled_reason` names what keeps any other scenario in SimPy; `simulation.compiled: false` keeps every one there.
"""

from __future__ import annotations

import math
import sys
import threading
from operator import attrgetter
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import ACT_BYTES, PathAttention
from servesim.policies.kv_blocks import BlockManager, blocks_for
from servesim.policies.ordering import by_arrival
from servesim.policies.prefix_blocks import PrefixCachingBlockManager
from servesim.policies.step import StepPlan
from servesim.policies.token_budget import SarathiScheduler, TokenBudgetScheduler
from servesim.simulator.world import compiled_engine as ce
from servesim.simulator.world.engine import Replica
from servesim.workloads.request import Phase

ROWS = 1 << 16  # step-log rows handed to the step log at a time
GAPS = 1 << 20  # finished requests' inter-token gaps handed to the token log at a time
ARENA = 1 << 22  # gaps of requests still producing tokens, to start with (compacted, grown as needed)
TABLES = 4  # prefix caching: block-table room for so many plans' admissions, to start with (compacted, grown)
COMPILE_NOTICE_S = 5.0  # a process's first call to the loop still running after this long is compiling it
_PHASES = {ce.WAITING: Phase.WAITING, ce.RUNNING: Phase.RUNNING, ce.FINISHED: Phase.FINISHED}


def compiled_reason(world) -> str | None:
    """Why `world` runs in SimPy, or None when the compiled loop reproduces it."""
    s = world.scenario
    if not s.simulation.compiled:
        return "simulation.compiled is off"
    if world.handoff is not None or len(world.pools) != 1:
        return "prefill/decode disaggregation"
    pool = world.pools[0]
    if pool.groups or len(pool.replicas) != 1 or type(pool.replicas[0]) is not Replica:
        return "more than one replica or data-parallel rank"
    if world.app_cache is not None or world.watch is not None:
        return "an application cache or an SLO watch"
    if world.traffic.reacts_to_finishes:
        return "closed-loop clients or multi-turn sessions"
    replica = pool.replicas[0]
    scheduler = replica.scheduler
    if replica.pipeline is not None:
        return "pipeline parallelism"
    if type(scheduler) not in (TokenBudgetScheduler, SarathiScheduler):
        ranks = s.parallelism.spec(s.engine.scheduler).attention_ranks
        return "data-parallel attention ranks" if ranks > 1 else f"the {s.engine.scheduler} scheduler"
    if scheduler.speculator is not None or scheduler.pipelined or scheduler.reserve_output:
        return "speculative decoding"
    if scheduler.cfg.preemption_mode != "recompute" or scheduler.order is not by_arrival:
        return "preemption by swapping or a queue order other than FCFS"
    kv = scheduler.kv  # (SGLang's longest-prefix-match queue orders by another key: not FCFS, above)
    if type(kv) not in (BlockManager, PrefixCachingBlockManager) or kv.windows != (None,):
        return "a radix cache or sliding-window layers"
    if type(kv) is PrefixCachingBlockManager and (
        kv.eagle_hits or not all(req.private_prefix for req in world.workload.requests)
    ):
        return "a prefix cache with prompts that share a prefix"
    timer = pool.timer
    attention = timer.attention_pricer
    if attention is None or not attention.windowless:
        return "MLA, DP attention or fast prefill"
    if timer.options.decode_query_len != 1:
        return "verify steps"
    if not (
        isinstance(attention.kv_values, int)
        and isinstance(attention.kvbytes, float)
        and isinstance(attention.heads, float)
        and all(isinstance(p[3], int) and isinstance(p[5], int) for p in attention.paths)
    ):
        return "attention factors of other types"
    if scheduler.budget >= 1 << 24 or scheduler.max_num_seqs >= ce.SHAPE_FIELD:
        return "a token budget or batch size too large to key"
    return None


def run_compiled(world, until: float | None) -> dict[str, list | np.ndarray] | None:
    """Run `world` to `until` through the compiled loop if it can, leaving its requests, step log and token log as
    the SimPy engine would, and return the requests table's columns (`metrics.request_columns` of its requests
    sorted by id); None (nothing done) where it cannot."""
    if compiled_reason(world) is not None:
        return None
    replica = _CompiledReplica(world, math.inf if until is None else float(until))
    replica.run()
    return replica.request_columns()


def run_loop(loop: ce.Loop) -> int:
    """`ce.run_replica(loop)`. The first call in a process compiles the loop when numba's disk cache lacks it (the
    first run after an install, ~40 s): if that call is still running after `COMPILE_NOTICE_S`, a terminal is told
    why the run stands still."""
    if ce.run_replica.signatures:
        return ce.run_replica(loop)
    notice = threading.Timer(COMPILE_NOTICE_S, _say_compiling)
    notice.daemon = True
    notice.start()
    try:
        return ce.run_replica(loop)
    finally:
        notice.cancel()


def _say_compiling() -> None:
    if sys.stderr.isatty():
        print("compiling the simulation loop (once per install, ~40 s)...", file=sys.stderr, flush=True)


def warm_up() -> None:
    """Compile the loop now, or load it from numba's disk cache (the first run after an install compiles it, ~40 s):
    a few requests through it."""
    from servesim.simulator.scenario import Scenario
    from servesim.simulator.world.run import World

    s = Scenario.model_validate(
        {
            "name": "warm-up",
            "model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm"},
            "workload": {
                "lengths": {
                    "prompt": {"kind": "fixed", "value": 64},
                    "output": {"kind": "fixed", "value": 4},
                },
                "arrivals": {"kind": "poisson", "rate_per_s": 10},
                "num_requests": 4,
            },
        }
    )
    world = World(s, Path("."))
    if run_compiled(world, None) is None:
        raise AssertionError(f"the warm-up scenario runs in SimPy: {compiled_reason(world)}")


class _CompiledReplica:
    """The compiled loop's arrays for one World, the Python it calls back for, and the results written back."""

    def __init__(self, world, until: float):
        self.world = world
        pool = world.pools[0]
        self.replica = pool.replicas[0]
        self.scheduler = scheduler = self.replica.scheduler
        self.timer = pool.timer
        self.attention: PathAttention = self.timer.attention_pricer
        self.requests = requests = world.workload.requests
        n = len(requests)
        kv = scheduler.kv
        frontend = world.frontend
        self.pi = np.zeros(ce.PI_FIELDS, np.int64)
        self.pi[ce.P_NUM_BLOCKS], self.pi[ce.P_BLOCK_SIZE] = kv.num_blocks, kv.block_size
        self.pi[ce.P_WATERMARK], self.pi[ce.P_BUDGET] = kv.watermark_blocks, scheduler.budget
        self.pi[ce.P_MAX_SEQS], self.pi[ce.P_CHUNKED] = scheduler.max_num_seqs, scheduler.chunked
        self.pi[ce.P_GATED] = scheduler.admission_window_tokens is not None
        self.pi[ce.P_LONG_PREFILL] = scheduler.cfg.long_prefill_token_threshold
        self.pi[ce.P_AHEAD], self.pi[ce.P_FRONTEND] = scheduler.ahead is not None, frontend.active
        self.pi[ce.P_NUM_REQUESTS], self.pi[ce.P_KV_VALUES] = n, self.attention.kv_values
        self.pi[ce.P_PREFIX] = prefix = type(kv) is PrefixCachingBlockManager
        self.pf = np.zeros(ce.PF_FIELDS)
        self.pf[ce.F_UNTIL] = until
        self.pf[ce.F_EMPTY_STEP] = self.replica.step_time(StepPlan((), (), (), ()))
        self.pf[ce.F_HEADS], self.pf[ce.F_KV_BYTES] = self.attention.heads, self.attention.kvbytes
        self.pf[ce.F_ACT_BYTES], self.pf[ce.F_BANDWIDTH] = ACT_BYTES, self.attention.bandwidth
        options = self.timer.options
        self.pf[ce.F_EAGER_FLOOR] = self.timer.eager_floor_s
        self.pi[ce.P_GRAPHED_TOKENS] = options.graph_sizes[-1] if options.graph_sizes else 0
        self.pi[ce.P_GRAPH_PREFILLS] = options.graph_prefills
        self.si = np.zeros(ce.SI_FIELDS, np.int64)
        self.si[ce.S_STAGE], self.si[ce.S_ENGINE] = ce.STAGE_EVENTS, ce.E_WAITING
        self.si[ce.S_NEXT_EID], self.si[ce.S_FREE] = -1, kv.num_free_blocks
        self.si[ce.S_QUEUE_HEAD], self.si[ce.S_QUEUE_TAIL] = 0, kv.num_blocks - 1
        self.sf = np.zeros(ce.SF_FIELDS)
        self.sf[ce.T_IN_FLIGHT_SINCE] = np.nan
        self.ri, self.rf = self._request_arrays(frontend)
        self.pi[ce.P_MAX_TABLE] = self.ri[:, ce.TABLE_CAP].max(initial=0)
        # prefix caching: blocks in a free queue in id order, none referenced or holding a hash
        self.blocks = np.full((kv.num_blocks if prefix else 1, 5), -1, np.int64)
        if prefix:
            ids = np.arange(kv.num_blocks)
            self.blocks[:, ce.NEXT], self.blocks[:, ce.PREV] = ids + 1, ids - 1
            self.blocks[-1, ce.NEXT], self.blocks[:, ce.REFS] = -1, 0
        room = TABLES * scheduler.max_num_seqs * int(self.pi[ce.P_MAX_TABLE])
        self.tables = np.full(room if prefix else 1, -1, np.int64)
        seats = scheduler.max_num_seqs + 1
        self.running, self.retiring = np.zeros(seats, np.int64), np.zeros(seats, np.int64)
        self.heap, self.inbox, self.ho_queue = (np.zeros(max(n, 1), np.int64) for _ in range(3))
        self.inbox_t = np.zeros(max(n, 1))
        self.plan_req, self.plan_new, self.plan_ctx, self.plan_samples, self.finished = (
            np.zeros(seats, np.int64) for _ in range(5)
        )
        self.fixed_keys = np.full(1 << 12, ce.EMPTY_KEY, np.int64)
        self.fixed_values = np.zeros(1 << 12)
        self.fixed_count = 0
        tables = list({id(t): t for t in self.attention.tables if t is not None}.values())
        self.paths_i = np.array(
            [
                (decode, owns_kv, layers, head_dims, -1 if table is None else tables.index(table))
                for (_, decode, owns_kv, layers, _, head_dims), table in zip(
                    self.attention.paths, self.attention.tables
                )
            ],
            np.int64,
        ).reshape(-1, 5)
        self.paths_f = np.array([p[4] for p in self.attention.paths], float)
        self.table_axes, self.table_sizes, self.table_log_t = _table_arrays([t.grid for t in tables])
        self.denominators = np.full((2, scheduler.budget + 1), np.nan)
        self.arena = np.zeros(ARENA)
        self.gaps = np.zeros(GAPS)
        self.rows_i = np.zeros((7, ROWS), np.int64)
        self.rows_f = np.zeros((3, ROWS))

    def _request_arrays(self, frontend) -> tuple[np.ndarray, np.ndarray]:
        """Each request's lengths, order key and refusal, and when it enters and reaches the engine: `Traffic`'s
        and the API server's times computed as SimPy computes them (now + delay)."""
        requests = self.requests
        n = len(requests)
        ri = np.zeros((n, ce.RI_FIELDS), np.int64)
        rf = np.full((n, ce.RF_FIELDS), np.nan)
        ri[:, ce.GAP_OFF] = ri[:, ce.TABLE_OFF] = -1
        ri[:, ce.PROMPT] = _attribute(requests, "num_prompt_tokens", np.int64)
        ri[:, ce.OUTPUT] = _attribute(requests, "num_output_tokens", np.int64)
        ri[:, ce.ID] = _attribute(requests, "id", np.int64)
        rf[:, ce.ARRIVAL] = _attribute(requests, "arrival_s", float)
        prompt, output, arrival = ri[:, ce.PROMPT], ri[:, ce.OUTPUT], rf[:, ce.ARRIVAL]
        ri[:, ce.TABLE_CAP] = blocks_for(prompt + output - 1, self.scheduler.kv.block_size)
        logprobs = _attribute(requests, "prompt_logprobs", bool)
        flags = np.where(_attribute(requests, "private_prefix", bool), ce.PRIVATE, 0) | np.where(
            logprobs, ce.NO_HITS, 0
        )
        # a refusal reads only the lengths and prompt_logprobs (`run.rejection`): asked once per distinct triple,
        # keyed as one integer (a 2-D unique sorts rows as objects: seconds for a million)
        _, prompt_rank = np.unique(prompt, return_inverse=True)
        outputs, output_rank = np.unique(output, return_inverse=True)
        triple = (prompt_rank * len(outputs) + output_rank) * 2 + logprobs
        _, first, which = np.unique(triple, return_index=True, return_inverse=True)
        reasons = [self.world._refusal(requests[i]) for i in first.tolist()]
        self._reasons = [reasons[i] for i in np.ravel(which).tolist()]
        refused = np.array([reason is not None for reason in self._reasons], bool)
        flags |= np.where(refused, ce.REFUSED, 0)
        service = frontend.request_s + frontend.token_s * prompt  # `Frontend.service_s`
        rf[:, ce.ENTERS], rf[:, ce.HAND_OVER], timed = ce.entry_times(
            arrival, refused, service, frontend.latency_s, frontend.active
        )
        ri[:, ce.FLAGS] = flags | np.where(timed, ce.TIMED, 0)
        handed = rf[:, ce.HAND_OVER][~np.isnan(rf[:, ce.HAND_OVER])]
        if np.any(np.diff(handed) < 0):
            raise AssertionError("the API server hands requests over out of order")
        return ri, rf

    def run(self) -> None:
        world, completed = self.world, 0
        while True:
            status = run_loop(self._loop())
            if status == ce.NEED_FIXED:
                self._price_shape()
            elif status == ce.NEED_DENOMINATORS:
                tokens = int(self.si[ce.S_MISS_TOKENS])
                self.denominators[:, tokens] = self.attention.denominators_at(tokens)
            elif status == ce.GROW_GAPS:
                self.gaps = np.zeros(max(2 * len(self.gaps), int(self.si[ce.S_NEED])))
            elif status == ce.NEED_TABLES:
                self.tables = self._compacted(self.tables, ce.TABLE_OFF, ce.TABLE_CAP, 0, ce.S_TABLES_TOP, -1)
            elif status == ce.NEED_ARENA:
                self.arena = self._compacted(self.arena, ce.GAP_OFF, ce.OUTPUT, -1, ce.S_ARENA_TOP, 0)
            else:
                self._flush()
            if world.on_progress and self.si[ce.S_COMPLETED] != completed:
                completed = int(self.si[ce.S_COMPLETED])
                world.on_progress(completed)
            if status == ce.DONE:
                break
        world.completed = int(self.si[ce.S_COMPLETED])
        self._write_back()

    def _compacted(self, arena, off_field, size_field, size_add, top_slot, blank) -> np.ndarray:
        """`arena` with its live regions moved to its front, or a copy twice as large (at least) if they leave
        fewer than `S_NEED` slots after them."""
        top = self.si[top_slot] = ce.compact(self.ri, arena, off_field, size_field, size_add)
        need = int(self.si[ce.S_NEED])
        if top + need <= len(arena):
            return arena
        grown = np.full(max(2 * len(arena), 2 * (top + need)), blank, arena.dtype)
        grown[:top] = arena[:top]
        return grown

    def _loop(self) -> ce.Loop:
        return ce.Loop(*(getattr(self, name) for name in ce.Loop._fields))

    def _price_shape(self) -> None:
        """The fixed part of the step shape the loop missed, from the cost model (any batch of that shape)."""
        key = int(self.si[ce.S_MISS_KEY])
        count = int(self.si[ce.S_PLAN_N])
        batch = StepBatch.of(
            self.plan_new[:count].tolist(),
            self.plan_ctx[:count].tolist(),
            self.plan_samples[:count].astype(bool).tolist(),
        )
        if 2 * (self.fixed_count + 1) > len(self.fixed_keys):  # keep the table at most half full
            keys = np.full(2 * len(self.fixed_keys), ce.EMPTY_KEY, np.int64)
            values = np.zeros(len(keys))
            ce.table_rehash(self.fixed_keys, self.fixed_values, keys, values)
            self.fixed_keys, self.fixed_values = keys, values
        ce.table_insert(self.fixed_keys, self.fixed_values, key, self.timer.fixed_s(batch))
        self.fixed_count += 1

    def _flush(self) -> None:
        """Hand the rows and gaps the loop logged to the world's step and token logs."""
        rows = int(self.si[ce.S_ROWS])
        if rows:
            i, f = self.rows_i[:, :rows], self.rows_f[:, :rows]
            self.world.steps.record_many(
                time_s=f[ce.R_TIME],
                duration_s=f[ce.R_DURATION],
                replica=np.full(rows, self.replica.index, np.int64),
                num_requests=i[ce.R_REQUESTS],
                prefill_tokens=i[ce.R_PREFILL],
                decode_tokens=i[ce.R_DECODE],
                num_running=i[ce.R_RUNNING],
                num_waiting=i[ce.R_WAITING],
                kv_blocks_used=i[ce.R_USED],
                kv_usage=f[ce.R_USAGE],
                num_preempted=i[ce.R_PREEMPTED],
            )
            self.si[ce.S_ROWS] = 0
        gaps = int(self.si[ce.S_GAPS])
        if gaps:
            self.world.tokens.record_finished(self.gaps[:gaps])
            self.si[ce.S_GAPS] = 0

    def request_columns(self) -> dict[str, list | np.ndarray]:
        """`metrics.request_columns` of the requests sorted by id, from the loop's arrays (no P/D, DP rank, session
        follow-up or cache answer here); numbers as arrays of the dtypes pandas gives their lists, not a Python object
        each."""
        requests, ri, rf = self.requests, self.ri, self.rf
        order = np.argsort(ri[:, ce.ID], kind="stable")
        ri, rf = ri[order], rf[order]
        flags = ri[:, ce.FLAGS]
        entered, refused = (flags & ce.ENTERED != 0).tolist(), (flags & ce.REFUSED != 0).tolist()
        handed = (flags & ce.HANDED_OVER != 0).tolist()
        index, n = self.replica.index, len(order)
        nothing = [None] * n
        return {
            "request_id": ri[:, ce.ID],
            "arrival_s": rf[:, ce.ARRIVAL],
            "first_token_s": rf[:, ce.FIRST_TOKEN],
            "finish_s": rf[:, ce.FINISH],
            "prompt_tokens": ri[:, ce.PROMPT],
            "output_tokens": ri[:, ce.GENERATED],
            "requested_output_tokens": ri[:, ce.OUTPUT],
            "cached_tokens": ri[:, ce.CACHED_TOKENS],
            "preemptions": ri[:, ce.PREEMPTIONS],
            "replica": [index if h else None for h in handed],
            "dp_rank": pd.array(nothing, dtype="Int64"),
            "scheduled_s": rf[:, ce.SCHEDULED],
            "session_id": [requests[i].session_id for i in order.tolist()],
            "reject_reason": [
                self._reasons[i] if r and e else None for i, r, e in zip(order.tolist(), refused, entered)
            ],
            "served_by": ["engine" if e and not r else None for e, r in zip(entered, refused)],
            "false_hit": [False] * n,
            "prefill_replica": nothing,
            "prefill_end_s": nothing,
            "decode_wait_s": nothing,
            "kv_transfer_s": nothing,
            "kv_transfer_bytes": nothing,
            "decode_hit_tokens": nothing,
            "stage_wait_s": nothing,
        }

    def _write_back(self) -> None:
        """The engine's state of every request, as the SimPy engine leaves it."""
        ri, rf, index = self.ri, self.rf, self.replica.index
        columns = {name: ri[:, field].tolist() for name, field in _INT_FIELDS.items()}
        times = {
            name: [None if math.isnan(v) else v for v in rf[:, field].tolist()]
            for name, field in _TIME_FIELDS.items()
        }
        rows = zip(self.requests, self._reasons, *columns.values(), *times.values())
        for req, reason, flags, phase, computed, in_flight, generated, preempted, cached, *at in rows:
            if not flags & ce.ENTERED:
                continue
            if flags & ce.REFUSED:
                req.phase, req.reject_reason = Phase.REJECTED, reason
                continue
            req.served_by = "engine"
            if not flags & ce.HANDED_OVER:
                continue
            req.replica, req.phase = index, _PHASES[phase]
            req.num_computed_tokens, req.num_in_flight_tokens = computed, in_flight
            req.num_generated, req.num_preemptions, req.num_cached_tokens = generated, preempted, cached
            req.scheduled_s, req.first_token_s, req.last_token_s, req.finish_s = at


def _table_arrays(grids: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel tables' (batch, length) grids as the loop reads them: axes' logs and log seconds, each padded to
    the largest (at least one table's room, so the arrays' types never change)."""
    count = max(len(grids), 1)
    batches = max((len(g.log_axes[0]) for g in grids), default=1)
    lengths = max((len(g.log_axes[1]) for g in grids), default=1)
    axes = np.full((count, 2, max(batches, lengths)), np.nan)
    sizes = np.zeros((count, 2), np.int64)
    log_t = np.full((count, batches, lengths), np.nan)
    for t, grid in enumerate(grids):
        for a, log_axis in enumerate(grid.log_axes):
            axes[t, a, : len(log_axis)], sizes[t, a] = log_axis, len(log_axis)
        log_t[t, : grid.log_t.shape[0], : grid.log_t.shape[1]] = grid.log_t
    return axes, sizes, log_t


def _attribute(requests: list, name: str, dtype) -> np.ndarray:
    return np.fromiter(map(attrgetter(name), requests), dtype, len(requests))


_INT_FIELDS = {  # in the order _write_back unpacks them
    "flags": ce.FLAGS,
    "phase": ce.PHASE,
    "computed": ce.COMPUTED,
    "in_flight": ce.IN_FLIGHT,
    "generated": ce.GENERATED,
    "preemptions": ce.PREEMPTIONS,
    "cached_tokens": ce.CACHED_TOKENS,
}
_TIME_FIELDS = {  # in the order _write_back unpacks them
    "scheduled": ce.SCHEDULED,
    "first_token": ce.FIRST_TOKEN,
    "last_token": ce.LAST_TOKEN,
    "finish": ce.FINISH,
}
