"""Routers: which replica a new request goes to. A router sees read-only load views of the replicas."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from policies.registry import routers
from workloads.request import Request


class ReplicaView(Protocol):
    """What a router may read about a replica."""

    index: int

    @property
    def num_outstanding(self) -> int:
        """Requests queued or running there."""

    @property
    def kv_usage(self) -> float:
        """Fraction of its KV blocks in use."""


@routers.register("round_robin")
class RoundRobinRouter:
    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas, self._next = replicas, 0

    def route(self, req: Request) -> ReplicaView:
        replica = self.replicas[self._next]
        self._next = (self._next + 1) % len(self.replicas)
        return replica


@routers.register("random")
class RandomRouter:
    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas, self.rng = replicas, rng

    def route(self, req: Request) -> ReplicaView:
        return self.replicas[int(self.rng.integers(len(self.replicas)))]


@routers.register("least_outstanding")
class LeastOutstandingRouter:
    """Fewest queued + running requests; ties go to the lowest index."""

    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas = replicas

    def route(self, req: Request) -> ReplicaView:
        return min(self.replicas, key=lambda r: (r.num_outstanding, r.index))
