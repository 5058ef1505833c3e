"""Routers: which replica a new request goes to. A router sees read-only load views of the replicas, and says whether
it reads their `kv_usage` (`reads_kv_usage`; one that does not say is taken to): fast-forward may take a replica's
blocks a moment early only where no router reads it (simulator/world/engine.py FastForward)."""

from __future__ import annotations

import bisect
import hashlib
from typing import Protocol

import numpy as np

from servesim.policies.radix import TokenTrie
from servesim.policies.registry import routers
from servesim.policies.token_ids import pieces, request_runs
from servesim.workloads.request import Request


class ReplicaView(Protocol):
    """What a router may read about a replica."""

    index: int

    @property
    def num_outstanding(self) -> int:
        """Requests sent there and not finished: in its API server, queued or running."""

    @property
    def kv_usage(self) -> float:
        """Fraction of its KV blocks in use."""


@routers.register("round_robin")
class RoundRobinRouter:
    reads_kv_usage = False

    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas, self._next = replicas, 0

    def route(self, req: Request) -> ReplicaView:
        replica = self.replicas[self._next]
        self._next = (self._next + 1) % len(self.replicas)
        return replica


@routers.register("random")
class RandomRouter:
    reads_kv_usage = False

    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas, self.rng = replicas, rng

    def route(self, req: Request) -> ReplicaView:
        return self.replicas[int(self.rng.integers(len(self.replicas)))]


@routers.register("least_outstanding")
class LeastOutstandingRouter:
    """Fewest requests in flight (in the API server, queued or running); ties go to the lowest index."""

    reads_kv_usage = False

    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas = replicas

    def route(self, req: Request) -> ReplicaView:
        return min(self.replicas, key=lambda r: (r.num_outstanding, r.index))


@routers.register("least_kv")
class LeastKvRouter:
    """Lowest KV-cache usage; ties go to the lowest index. Requests routed but not yet admitted hold no blocks, so
    a burst all goes to one replica, as it does behind a router that polls the engines' usage between bursts."""

    reads_kv_usage = True

    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas = replicas

    def route(self, req: Request) -> ReplicaView:
        return min(self.replicas, key=lambda r: (r.kv_usage, r.index))


@routers.register("prefix_affinity")
class PrefixAffinityRouter:
    """SGLang's cache-aware router (sglang-router / gateway `cache_aware`, with its defaults).

    It keeps, per replica, an approximate radix tree of the prompts it routed there. If the load is
    imbalanced (busiest - idlest > 64 outstanding requests and busiest > 1.5 x idlest), the least
    loaded replica gets the request. Otherwise the replica whose tree shares the largest fraction of
    the prompt gets it, if that fraction exceeds 0.3; else the least loaded one (the gateway since
    sgl-project/sglang#14650, Dec 2025; sglang-router before it took the smallest tree).
    Every 120 s each tree drops its least recently used leaves down to `max_tree_size`; the router
    counts 2^26 characters, taken here as 2^24 tokens (about 4 characters a token).
    """

    cache_threshold, balance_abs, balance_rel = 0.3, 64, 1.5
    reads_kv_usage = False
    eviction_interval_s, max_tree_tokens = 120.0, 1 << 24

    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas = replicas
        self.trees = [TokenTrie() for _ in replicas]
        self._next_eviction_s = self.eviction_interval_s

    def route(self, req: Request) -> ReplicaView:
        if req.arrival_s >= self._next_eviction_s:  # the router's eviction thread, run at its next tick
            for tree in self.trees:
                tree.evict_to(self.max_tree_tokens)
            self._next_eviction_s = (req.arrival_s // self.eviction_interval_s + 1) * self.eviction_interval_s
        key = pieces(request_runs(req), 0, req.num_prompt_tokens)
        loads = [r.num_outstanding for r in self.replicas]
        least_loaded = min(range(len(loads)), key=lambda i: (loads[i], i))
        if max(loads) - min(loads) > self.balance_abs and max(loads) > self.balance_rel * min(loads):
            choice = least_loaded
        else:
            matches = [tree.match(key) for tree in self.trees]
            best = max(range(len(matches)), key=lambda i: (matches[i], -i))
            choice = best if matches[best] > self.cache_threshold * req.num_prompt_tokens else least_loaded
        self.trees[choice].insert(key)
        return self.replicas[choice]


@routers.register("session_affinity")
class SessionAffinityRouter:
    """Consistent hashing of the session id (100 virtual nodes per replica): a session's turns land on one
    replica, and adding a replica moves only ~1/N of the sessions. Requests without a session hash their id."""

    virtual_nodes = 100
    reads_kv_usage = False

    def __init__(self, replicas: list[ReplicaView], rng: np.random.Generator):
        self.replicas = replicas
        # points named by the replica's engine number, owned by its position here (a P/D decode pool's engines
        # are numbered after the prefill pool's)
        ring = sorted(
            (_stable_hash(f"replica-{r.index}-{v}"), position)
            for position, r in enumerate(replicas)
            for v in range(self.virtual_nodes)
        )
        self._points = [p for p, _ in ring]
        self._owners = [i for _, i in ring]

    def route(self, req: Request) -> ReplicaView:
        key = req.session_id if req.session_id is not None else f"request-{req.id}"
        position = bisect.bisect(self._points, _stable_hash(f"session-{key}")) % len(self._points)
        return self.replicas[self._owners[position]]


def _stable_hash(text: str) -> int:
    """A hash that does not change between runs (Python's str hash is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
