"""Drive a scheduler step by step without SimPy, recording what each step did."""

from __future__ import annotations

from dataclasses import dataclass

from servesim.policies.catalog import orderings, schedulers
from servesim.policies.config import EngineConfig
from servesim.policies.hybrid_blocks import make_kv_manager
from servesim.policies.step import TokenLog
from servesim.workloads.request import Phase, Request


@dataclass
class StepRecord:
    batch: list[int]
    num_new: list[int]
    free_blocks: int
    tables: dict[int, list[int]]
    preempted: list[int]


def make_requests(prompts: list[int], outputs: list[int]) -> list[Request]:
    return [Request(i, 0.0, p, o) for i, (p, o) in enumerate(zip(prompts, outputs))]


def make_scheduler(name: str, num_blocks: int, block_size: int, **knobs):
    """A scheduler over a fresh KV manager (`prefix_caching` knob: none by default here, to test paging alone)."""
    host_blocks = knobs.pop("host_blocks", 0)
    swa = knobs.pop("swa", None)  # (window, pages): SGLang's separate sliding-window pool
    knobs.setdefault("prefix_caching", "none")
    # batch limits a scenario would take from vLLM's defaults for its GPU
    knobs.setdefault("max_num_seqs", 256)
    knobs.setdefault("max_num_batched_tokens", 8192)
    cfg = EngineConfig(scheduler=name, block_size=block_size, **knobs)
    kv = make_kv_manager(cfg, num_blocks, block_size, swa=swa)
    log = TokenLog()
    return schedulers.get(name)(kv, cfg, orderings.get(cfg.queue_order), log, host_blocks), log


def step(sched, now: float = 0.0):
    """Plan one step at `now` and commit it 1 s later (KV invariants checked); returns the plan."""
    plan = sched.schedule(now)
    sched.commit(plan, now + 1.0)
    sched.kv.check_invariants()
    return plan


def scheduled(plan) -> list[tuple[int, int]]:
    """(request id, tokens) of each request a plan runs."""
    return [(r.id, n) for r, n in zip(plan.requests, plan.num_new)]


def drive(
    sched,
    requests: list[Request],
    max_steps: int = 10_000,
    step_s: float = 1.0,
    arrivals: list[float] | None = None,
) -> list[StepRecord]:
    """Run until every request finished; step i ends at time i * step_s. Checks KV invariants after every step.
    `arrivals`: when each request reaches the engine (default: all at 0); one arriving during a step is added
    as it ends, with its own arrival time, and an idle engine waits for the next."""
    times = arrivals if arrivals is not None else [0.0] * len(requests)
    pending = sorted(zip(times, range(len(requests))))
    records, now = [], 0.0
    while any(not r.is_done for r in requests):
        assert len(records) < max_steps, "no progress"
        while pending and pending[0][0] <= now:
            t, i = pending.pop(0)
            sched.add(requests[i], t)
        plan = sched.schedule(now)
        if plan.is_empty and not plan.preempted and pending and not sched.num_running:
            now = max(now, pending[0][0])  # idle until the next arrival
            continue
        # a lone preemption: the
        assert not plan.is_empty or plan.preempted, "requests left but nothing scheduled"
        # engine schedules again at once (vLLM ends the running pass when a request preempts itself)
        records.append(
            StepRecord(
                [r.id for r in plan.requests],
                list(plan.num_new),
                sched.kv.num_free_blocks,
                {r.id: list(sched.kv.table(r)) for r in plan.requests},
                [r.id for r in plan.preempted],
            )
        )
        now += step_s
        sched.commit(plan, now)
        sched.kv.check_invariants()
    for _ in range(2):  # the idle engine's last looks: planning ahead frees the last finishes (after, under
        plan = sched.schedule(now)  # SGLang's overlap scheduler, one more decode of them for nothing)
        if plan.is_empty:
            break
        assert all(r.phase is Phase.FINISHED for r in plan.requests)
        now += step_s
        sched.commit(plan, now)
    assert plan.is_empty
    assert sched.kv.num_used_blocks == 0, "blocks still held after every request finished"
    if getattr(sched.kv, "swa_window", None):  # (not on DP ranks' pools)
        assert sched.kv.swa_free_blocks == sched.kv.swa_blocks, "sliding-window slots still held"
    return records


def assert_every_token_served(requests: list[Request], log: TokenLog) -> None:
    """Every request generated all its outputs, its first token no later than its finish, and the log holds one
    inter-token gap per token after each first."""
    assert all(r.num_generated == r.num_output_tokens for r in requests)
    assert all(r.first_token_s is not None and r.finish_s >= r.first_token_s for r in requests)
    assert len(log.itl_s) == sum(r.num_output_tokens - 1 for r in requests)
