"""Serve requests for real, in wall-clock time, with the simulator's own policy objects.

The loop is the simulator's engine loop with real time: requests join the scheduler when the clock
passes their `arrival_s`; `plan = scheduler.schedule(now)`; the executor runs the plan's tokens over
the block tables the scheduler's `BlockManager` assigned; `scheduler.commit(plan, now)` records the
sampled tokens at the time the step really ended. When nothing can run, the loop sleeps until the
next arrival. The scheduler, block manager, token log and queue order are the ones
`servesim simulate` builds (`policies.catalog`), so measured and simulated runs differ only in
where step durations come from.

Times are seconds since the loop started (`time.perf_counter`), so `arrival_s` of the requests is
honoured as an offset from that start. A step is timed from the host building its input to its
sampled tokens being back on the host (`Executor.execute` ends in `.tolist()`, which waits for the
device), so on a GPU no step is charged for work queued by another. Each step also records the loop
thread's CPU time (`execute_cpu_s`): on a CPU run with one torch thread, wall time well above it means
the machine was shared while serving. Per-request records use `simulator.metrics.request_frame`,
whose TTFT/TPOT/E2E definitions are the simulator's. Python's cyclic GC is paused while serving so a
collection does not land inside a timed step.

No prefix cache yet: the block manager is the plain one, so every prompt is prefilled in full (the
executor itself already reuses a prefix's blocks when a block table starts with them).
"""

from __future__ import annotations

import gc
import json
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibration.executor import Executor, StepInput
from policies.catalog import orderings, schedulers
from policies.config import EngineConfig
from policies.kv_blocks import BlockManager
from policies.step import StepPlan, TokenLog
from policies.token_budget import max_blocks_of
from simulator.metrics import request_frame, summarize
from workloads.request import Phase, Request


@dataclass(frozen=True)
class ServeResult:
    """Per-request records (simulator columns), one row per executed step, the run's summary, and each
    request's token ids: its (random) prompt followed by the greedy outputs."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    tokens: dict[int, list[int]]


def _reject_reason(req: Request, engine: EngineConfig, num_blocks: int) -> str | None:
    total = req.num_prompt_tokens + req.num_output_tokens
    if engine.max_model_len is not None and total > engine.max_model_len:
        return f"prompt + output tokens ({total}) exceed max_model_len ({engine.max_model_len})"
    if max_blocks_of(req, engine.block_size) > num_blocks:
        return f"needs {max_blocks_of(req, engine.block_size)} KV blocks at full length; the pool has {num_blocks}"
    return None


def _step_input(plan: StepPlan, tokens: dict[int, list[int]], kv: BlockManager) -> StepInput:
    ids = tuple(tuple(tokens[r.id][c:c + n]) for r, n, c in zip(plan.requests, plan.num_new, plan.num_context))
    return StepInput(ids, plan.num_context, tuple(tuple(kv.table(r)) for r in plan.requests), plan.samples)


class _StepRecorder:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def record(self, plan: StepPlan, start_s: float, run_s: float, cpu_s: float, end_s: float, sched,
               kv: BlockManager) -> None:
        decode = plan.num_decode_tokens
        self.rows.append({
            "start_s": start_s, "end_s": end_s, "execute_s": run_s, "execute_cpu_s": cpu_s,
            "num_requests": len(plan.requests),
            "num_tokens": plan.num_tokens, "prefill_tokens": plan.num_tokens - decode, "decode_tokens": decode,
            "num_running": sched.num_running, "num_waiting": sched.num_waiting, "kv_blocks_used": kv.num_used_blocks,
            "num_preempted": len(plan.preempted), "num_new": json.dumps(list(plan.num_new)),
            "num_context": json.dumps(list(plan.num_context)), "needs_logits": json.dumps(list(plan.samples))})


def serve(ex: Executor, requests: list[Request], engine: EngineConfig, seed: int = 0) -> ServeResult:
    """Serve `requests` (mutated: counters and times, as the simulator does) on `ex` until all finish."""
    if engine.block_size != ex.block_size:
        raise ValueError(f"engine.block_size {engine.block_size} != executor block_size {ex.block_size}")
    if getattr(engine, "prefix_caching", "none") != "none":
        raise ValueError("serve() has no prefix cache yet: set engine.prefix_caching to 'none'")
    kv = BlockManager(ex.num_blocks, engine.block_size, engine.watermark)
    log = TokenLog()
    sched = schedulers.get(engine.scheduler)(kv, engine, orderings.get(engine.queue_order), log)
    pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.id)))
    tokens: dict[int, list[int]] = {}
    steps = _StepRecorder()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        while True:
            now = time.perf_counter() - start
            while pending and pending[0].arrival_s <= now:
                _arrive(pending.popleft(), sched, engine, ex, tokens, now, seed)
            plan = sched.schedule(now)
            if plan.is_empty:
                if not pending:
                    if sched.num_waiting:
                        raise RuntimeError(f"{sched.num_waiting} requests wait but none can be scheduled")
                    break
                time.sleep(max(0.0, pending[0].arrival_s - (time.perf_counter() - start)))
                continue
            _run_step(ex, plan, tokens, kv, sched, steps, start, now)
    finally:
        gc.enable()
    frame = request_frame(requests)
    step_frame = pd.DataFrame(steps.rows)
    itl = np.frombuffer(log.itl_s, dtype=float) if log.itl_s else np.array([])
    summary = summarize(frame, step_frame.assign(duration_s=step_frame["end_s"] - step_frame["start_s"],
                                                 kv_usage=step_frame["kv_blocks_used"] / kv.num_blocks), itl)
    return ServeResult(frame, step_frame, summary, tokens)


def _arrive(req: Request, sched, engine: EngineConfig, ex: Executor, tokens: dict[int, list[int]], now: float,
            seed: int) -> None:
    reason = _reject_reason(req, engine, ex.num_blocks)
    if reason:
        req.phase, req.reject_reason = Phase.REJECTED, reason
        return
    rng = np.random.default_rng([seed, req.id])  # the prompt's ids: random, the same in every run
    tokens[req.id] = rng.integers(0, ex.spec.vocab_size, req.num_prompt_tokens).tolist()
    sched.add(req, now)


def _run_step(ex: Executor, plan: StepPlan, tokens: dict[int, list[int]], kv: BlockManager, sched,
              steps: _StepRecorder, start: float, step_start_s: float) -> None:
    run_start, cpu_start = time.perf_counter(), time.thread_time()
    sampled = iter(ex.execute(_step_input(plan, tokens, kv)))
    end, cpu_s = time.perf_counter(), time.thread_time() - cpu_start
    for req, samples in zip(plan.requests, plan.samples):
        if samples:
            tokens[req.id].append(next(sampled))
    sched.commit(plan, end - start)
    steps.record(plan, step_start_s, end - run_start, cpu_s, end - start, sched, kv)
