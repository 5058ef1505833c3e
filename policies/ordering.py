"""Waiting-queue orders as key functions: smaller keys run first; request id breaks ties deterministically."""

from __future__ import annotations

from collections.abc import Callable

from servesim.policies.registry import Registry
from servesim.workloads.request import Request

OrderKey = Callable[[Request], tuple]
orderings: Registry[OrderKey] = Registry("queue order")


@orderings.register("fcfs")
def by_arrival(r: Request) -> tuple:
    return (r.arrival_s, r.id)


@orderings.register("priority")
def by_priority(r: Request) -> tuple:
    """vLLM's priority policy: lower `priority` value first, then arrival."""
    return (r.priority, r.arrival_s, r.id)


@orderings.register("sjf")
def by_output_length(r: Request) -> tuple:
    """Shortest job first with an oracle output length (an upper bound on what length prediction can give)."""
    return (r.num_output_tokens - r.num_generated, r.arrival_s, r.id)


@orderings.register("lpm")
def by_arrival_lpm(r: Request) -> tuple:
    """SGLang's longest prefix match: `WaitingQueue` re-sorts by cached prefix every step; this is its tie order."""
    return (r.arrival_s, r.id)
