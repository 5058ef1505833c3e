"""The API server in front of each engine: a request is parsed and tokenized there before the engine sees it.

`vllm serve`'s API server process and SGLang's tokenizer manager handle requests one after another on one event
loop, then hand each to the engine's scheduler. That time adds to every TTFT, and it spreads requests sent together
(a closed loop's clients at start, a burst) over time, so they join the engine's steps in turn: real benchmark
clients drift apart from there, where clients reaching the engine at one instant stay in lockstep. Each routed
target (replica, or a DP group behind one API server) has its own server: a FIFO queue whose time per request is
the profile's `api_request_s + api_token_s * prompt tokens` (hardware/profile.py), and each request then takes
`api_latency_s` more on its way (network and IPC hops, the first token's way back), side by side with the others.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Protocol

import simpy

from servesim.workloads.request import Request


class Target(Protocol):
    """What an API server serves: a replica or a DP group, which counts the requests in its server as outstanding
    (a router counts a request from when it sends it, as SGLang's gateway does, not from when the engine has it)."""

    entering: int


class Frontend:
    """One FIFO API server per routed target; requests reach their target's `submit` when served."""

    def __init__(self, env: simpy.Environment, request_s: float, token_s: float, latency_s: float = 0.0):
        self.env, self.request_s, self.token_s, self.latency_s = env, request_s, token_s, latency_s
        self._free_at: dict[int, float] = {}  # per target (by identity): when its server is next idle
        self._pending: list[float] = []  # when each request in a server is handed over (a heap)

    @property
    def active(self) -> bool:
        return self.request_s > 0 or self.token_s > 0 or self.latency_s > 0

    def submit(
        self, req: Request, target: Target, hand_over: Callable[[Request], None], counted: bool = True
    ) -> None:
        """Queue `req` at `target`'s server; `hand_over(req)` once it is through (at once where no server is
        priced). `counted`: it counts among the target's `entering` (not where the target's engine already holds
        it)."""
        if not self.active:
            hand_over(req)
            return
        now = self.env.now
        served = self._served_s(req, id(target), now)
        self._free_at[id(target)] = served
        heapq.heappush(self._pending, served + self.latency_s)
        target.entering += counted
        self.env.timeout(served + self.latency_s - now).callbacks.append(
            lambda _: self._hand_over(req, target, hand_over, counted)
        )

    def service_s(self, req: Request) -> float:
        return self.request_s + self.token_s * req.num_prompt_tokens

    def _hand_over(
        self, req: Request, target: Target, hand_over: Callable[[Request], None], counted: bool
    ) -> None:
        heapq.heappop(self._pending)  # handed over in time order: the earliest is this one's (or a tie's)
        target.entering -= counted
        hand_over(req)

    def _served_s(self, req: Request, target_id: int, now: float) -> float:
        return max(now, self._free_at.get(target_id, now)) + self.service_s(req)

    def hand_over_s(self, req: Request, target: Target, enters_s: float) -> float:
        """When `req`, entering at `enters_s`, will reach `target` (a FIFO server hands requests over in arrival
        order, so none entering after it comes sooner)."""
        return self._served_s(req, id(target), enters_s) + self.latency_s

    def next_hand_over_s(self) -> float:
        """When a request in a server next reaches its engine (infinity when none is in one)."""
        return self._pending[0] if self._pending else math.inf
