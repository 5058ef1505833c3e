"""Serve requests for real, in wall-clock time, with the simulator's own policy objects.

The loop is the simulator's engine loop with real time: requests join the scheduler when the clock
passes their `arrival_s`; `plan = scheduler.schedule(now)`; the executor runs the plan's tokens over
the block tables the scheduler's `BlockManager` assigned; `scheduler.commit(plan, now)` records the
sampled tokens at the time the step really ended. When nothing can run, the loop sleeps until the
next arrival. The scheduler, block manager, token log and queue order are built as `servesim simulate` builds
them (`simulator.world.replicas.new_scheduler`), so measured and simulated runs differ only in
where step durations come from.

Times are seconds since the loop started (`time.perf_counter`), so `arrival_s` of the requests is
honoured as an offset from that start. A step is timed from the host building its input to its
sampled tokens being back on the host (`Executor.execute` ends in `.tolist()`, which waits for the
device), so on a GPU no step is charged for work queued by another. Each step also records the loop
thread's CPU time (`execute_cpu_s`): on a CPU run with one torch thread, wall time well above it means
the machine was shared while serving. Per-request records use `simulator.world.metrics.request_frame`,
whose TTFT/TPOT/E2E definitions are the simulator's. Python's cyclic GC is paused while serving so a
collection does not land inside a timed step.

Prompt token ids follow the simulator's token identity (policies/token_ids.py): token k of the prompt
run (segment, n) is `token_id(segment, k)`, a stable 64-bit mix of the two ints reduced into the vocab,
so requests whose prompts share leading runs (a shared prefix) get identical ids there, and the KV a
prefix-cache hit reuses is truly the KV of those tokens. The KV manager is the engine's
(`policies.hybrid_blocks.make_kv_manager`: `engine.prefix_caching`, over KV cache groups for sliding-window
models, whose executor then takes one block table per group), as in `simulator.world.run`: when the scheduler
admits a request with a hit, its `num_computed_tokens` (the step's context) already counts the cached
blocks at the head of its block table, so the executor prefills only the tail over them. Generated
tokens are sampled greedily and so are not the identity's ids; they never matter for sharing, since a
request's generated tokens form its own output segment (`output_segment_id`), which no other request's
block hash can contain. Each step records the prefix-hit tokens it reused (`prefix_hit_tokens`: context
of a request the executor had not run since its (re)admission).
"""

from __future__ import annotations

import gc
import math
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from servesim.calibration.executor import Executor, StepInput
from servesim.hardware.kv_groups import KVGroups, kv_groups
from servesim.policies.config import EngineConfig
from servesim.policies.hybrid_blocks import HybridBlockManager, usable_pages
from servesim.policies.kv_blocks import BlockManager
from servesim.policies.step import StepPlan, TokenLog
from servesim.simulator.world.metrics import request_frame, summarize
from servesim.simulator.world.step_table import StepFigures
from servesim.simulator.world.replicas import new_scheduler
from servesim.simulator.world.run import rejection
from servesim.workloads.request import Phase, Request


@dataclass(frozen=True)
class ServeResult:
    """Per-request records (simulator columns), one row per executed step, the run's summary, and each
    request's token ids: its prompt (`prompt_token_ids`) followed by the greedy outputs."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    tokens: dict[int, list[int]]
    # request id -> prompt tokens the executor reused from the cache at first admission
    prefix_hits: dict[int, int]


_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a stable, well-spread 64-bit hash of a 64-bit int (no Python `hash`)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _mix_array(x: np.ndarray) -> np.ndarray:
    """`_mix` elementwise on uint64 (numpy wraps modulo 2**64 as the masks above do)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def token_id(segment: int, offset: int, vocab: int, seed: int = 0) -> int:
    """The id of token `offset` of run `segment` (policies/token_ids.py's identity), in [0, vocab)."""
    return _mix(_mix((segment ^ _mix(seed)) & _MASK) ^ offset) % vocab


def prompt_token_ids(req: Request, vocab: int, seed: int = 0) -> list[int]:
    """The prompt's ids: `token_id(segment, k)` over `req.segments()`; equal runs give equal ids."""
    out = []
    for segment, length in req.segments():
        base = np.uint64(_mix((segment ^ _mix(seed)) & _MASK))
        ids = _mix_array(base ^ np.arange(length, dtype=np.uint64)) % np.uint64(vocab)
        out.extend(ids.tolist())
    return out


def _step_input(plan: StepPlan, tokens: dict[int, list[int]], kv: BlockManager) -> StepInput:
    ids = tuple(
        tuple(tokens[r.id][c : c + n]) for r, n, c in zip(plan.requests, plan.num_new, plan.num_context)
    )
    if isinstance(kv, HybridBlockManager):
        return StepInput(
            ids, plan.num_context, (), plan.samples, tuple(kv.group_tables(r) for r in plan.requests)
        )
    return StepInput(ids, plan.num_context, tuple(tuple(kv.table(r)) for r in plan.requests), plan.samples)


class _StepRecorder:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        # request id -> tokens it has run on the executor since its (re)admission
        self.held: dict[int, int] = {}
        self.first_hits: dict[int, int] = {}  # request id -> prefix-hit tokens at its first admission

    def _hits(self, plan: StepPlan) -> int:
        """Context tokens of this step's requests that the executor did not compute for them: prefix hits."""
        for req in plan.preempted:
            self.held.pop(req.id, None)
        hits = 0
        for req, n, c in zip(plan.requests, plan.num_new, plan.num_context):
            hit = max(c - self.held.get(req.id, 0), 0)
            self.first_hits.setdefault(req.id, hit)
            self.held[req.id] = c + n
            hits += hit
        return hits

    def record(
        self,
        plan: StepPlan,
        start_s: float,
        run_s: float,
        cpu_s: float,
        end_s: float,
        sched,
        kv: BlockManager,
        after_idle: bool = False,
    ) -> None:
        decode = plan.num_decode_tokens
        hits = self._hits(plan)
        self.rows.append(
            {
                "start_s": start_s,
                "end_s": end_s,
                "execute_s": run_s,
                "execute_cpu_s": cpu_s,
                "after_idle": after_idle,
                "num_requests": len(plan.requests),
                "num_tokens": plan.num_tokens,
                "prefill_tokens": plan.num_tokens - decode,
                "decode_tokens": decode,
                "num_running": sched.num_running,
                "num_waiting": sched.num_waiting,
                "kv_blocks_used": kv.num_used_blocks,
                "num_preempted": len(plan.preempted),
                "prefix_hit_tokens": hits,
                "num_new": json.dumps(list(plan.num_new)),
                "num_context": json.dumps(list(plan.num_context)),
                "needs_logits": json.dumps(list(plan.samples)),
            }
        )


def serve(
    ex: Executor,
    requests: list[Request],
    engine: EngineConfig,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> ServeResult:
    """Serve `requests` (mutated: counters and times, as the simulator does) on `ex` until all finish.
    `progress(arrived)` runs as requests arrive (they arrive in real time, so it tracks the run's clock)."""
    if engine.block_size != ex.block_size:
        raise ValueError(f"engine.block_size {engine.block_size} != executor block_size {ex.block_size}")
    if engine.speculative is not None:
        raise ValueError("serve() runs the target model only: engine.speculative must be unset")
    if engine.prefix_caching == "radix":
        raise ValueError(
            "serve() runs on the paged block pool: engine.prefix_caching must be 'none' or 'vllm'"
        )
    groups = kv_groups(ex.spec, engine.disable_hybrid_kv_cache_manager)
    if groups.sliding != ex.hybrid:
        raise ValueError(
            f"engine.disable_hybrid_kv_cache_manager={engine.disable_hybrid_kv_cache_manager} needs an "
            f"executor {'with' if groups.sliding else 'without'} kv_windows for {ex.spec.name}"
        )
    log = TokenLog()
    sched = new_scheduler(
        engine, usable_pages(engine, ex.num_blocks), engine.block_size, groups.windows, tokens=log
    )
    kv = sched.kv
    pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.id)))
    tokens: dict[int, list[int]] = {}
    steps = _StepRecorder()
    gc.collect()
    gc.disable()
    try:
        start, idle = time.perf_counter(), False
        while True:
            now = time.perf_counter() - start
            if pending and pending[0].arrival_s <= now:
                while pending and pending[0].arrival_s <= now:
                    _arrive(pending.popleft(), sched, engine, ex, groups, tokens, now, seed)
                if progress is not None:
                    progress(len(requests) - len(pending))
            plan = sched.schedule(now)
            if plan.is_empty:
                if not pending:
                    if sched.num_waiting:
                        raise RuntimeError(f"{sched.num_waiting} requests wait but none can be scheduled")
                    break
                time.sleep(max(0.0, pending[0].arrival_s - (time.perf_counter() - start)))
                idle = True
                continue
            plan.mark_scheduled(now)
            _run_step(ex, plan, tokens, kv, sched, steps, start, now, idle)
            idle = False
    finally:
        gc.enable()
    frame = request_frame(requests)
    step_frame = pd.DataFrame(steps.rows)
    itl = np.frombuffer(log.itl_s, dtype=float) if log.itl_s else np.array([])
    timed = step_frame.assign(
        duration_s=step_frame["end_s"] - step_frame["start_s"],
        kv_usage=step_frame["kv_blocks_used"] / kv.num_blocks,
    )
    summary = summarize(frame, StepFigures.of(timed), itl, start_s=0.0)  # the loop's start, as a simulation's
    served = frame[frame["reject_reason"].isna()]
    cached, prompt = int(served["cached_tokens"].sum()), int(served["prompt_tokens"].sum())
    summary |= {"prefix_cache_hit_rate": cached / prompt if prompt else 0.0, "prefill_tokens_saved": cached}
    return ServeResult(frame, step_frame, summary, tokens, steps.first_hits)


def _arrive(
    req: Request,
    sched,
    engine: EngineConfig,
    ex: Executor,
    groups: KVGroups,
    tokens: dict[int, list[int]],
    now: float,
    seed: int,
) -> None:
    reason = rejection(
        req,
        engine,
        engine.max_model_len or math.inf,
        sched.kv.num_blocks,
        engine.block_size,
        groups.windows,
        sched,
    )
    if reason:
        req.phase, req.reject_reason = Phase.REJECTED, reason
        return
    tokens[req.id] = prompt_token_ids(req, ex.spec.vocab_size, seed)
    sched.add(req, now)


def _run_step(
    ex: Executor,
    plan: StepPlan,
    tokens: dict[int, list[int]],
    kv: BlockManager,
    sched,
    steps: _StepRecorder,
    start: float,
    step_start_s: float,
    after_idle: bool,
) -> None:
    run_start, cpu_start = time.perf_counter(), time.thread_time()
    sampled = iter(ex.execute(_step_input(plan, tokens, kv)))
    end, cpu_s = time.perf_counter(), time.thread_time() - cpu_start
    for req, samples in zip(plan.requests, plan.samples):
        if samples:
            tokens[req.id].append(next(sampled))
    sched.commit(plan, end - start)
    steps.record(plan, step_start_s, end - run_start, cpu_s, end - start, sched, kv, after_idle)
