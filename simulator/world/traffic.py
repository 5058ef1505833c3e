"""Where requests come from in simulated time: open-loop arrivals or closed-loop clients.

Open loop: each request enters at its `arrival_s`. Multi-turn sessions: the next turn of a session
(`Workload.followups`) is sent `think_time_s` after the previous turn finishes. Closed loop (how `vllm bench serve
--max-concurrency` and most published benchmarks measure): `clients` users start at t=0, and
each sends its next request, in workload order, when its previous one finishes (or is rejected)
plus a think time; the request's `arrival_s` is NaN until it is sent, then the moment it was sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import simpy

from servesim.workloads.distributions import sample_values
from servesim.workloads.generate import Workload
from servesim.workloads.request import Request


class Traffic:
    def __init__(
        self,
        env: simpy.Environment,
        workload: Workload,
        arrive: Callable[[Request], None],
        rng: np.random.Generator,
    ):
        self.env, self.workload, self.arrive, self.rng = env, workload, arrive, rng
        self.closed = workload.closed_loop
        self.followups = workload.followups
        self._next = 0
        # (index, time) of the request the arrival process waits for
        self._due: tuple[int, float] = (-1, math.nan)
        if self.closed is None:
            env.process(self._open_loop())
        else:
            for req in workload.requests:  # unsent until a client sends it, which sets its time
                req.arrival_s = math.nan
            for _ in range(min(self.closed.clients, len(workload.requests))):
                self._send_next(0.0)

    def _open_loop(self):
        for req in self.workload.requests:
            now = self.env.now
            # the time SimPy will enter it at, to the bit (now + delay), for whoever plans around it
            self._due = (self._next, now + (req.arrival_s - now) if req.arrival_s > now else now)
            if req.arrival_s > now:
                yield self.env.timeout(req.arrival_s - now)
            self._next += 1
            self.arrive(req)

    def next_arrival_s(self) -> float:
        """Open loop: when the next request enters (infinity when none is left)."""
        nxt = self.next_request()
        return nxt.arrival_s if nxt is not None else math.inf

    def next_request(self) -> Request | None:
        """Open loop: the request that enters next (None when none is left)."""
        requests = self.workload.requests
        return requests[self._next] if self._next < len(requests) else None

    def next_entry(self) -> tuple[Request, float] | None:
        """Open loop: the request that enters next and the simulated time it enters at, once the arrival process
        waits for it (None before that, or when none is left)."""
        nxt = self.next_request()
        return (nxt, self._due[1]) if nxt is not None and self._due[0] == self._next else None

    @property
    def reacts_to_finishes(self) -> bool:
        """Whether a finish can make a request arrive (closed loop, or a session's next turn)."""
        return self.closed is not None or bool(self.followups)

    def on_done(self, req: Request) -> None:
        """A request finished or was rejected: its session's next turn follows after its think time, unless this
        one was rejected (its answer, which the next prompt carries, never came: the client drops the conversation,
        as vLLM's multi-turn benchmark does); in a closed loop its client thinks, then sends the next one."""
        follow = self.followups.get(req.id)
        if follow is not None and req.reject_reason is None:
            self.env.process(self._send_after(follow, follow.think_time_s))
        if self.closed is None:
            return
        think = self.closed.think_time_s
        delay = float(sample_values(think, 1, self.rng)[0]) if think is not None else 0.0
        self._send_next(delay)

    def _send_next(self, delay_s: float) -> None:
        if self._next >= len(self.workload.requests):
            return
        req = self.workload.requests[self._next]
        self._next += 1
        self.env.process(self._send_after(req, delay_s))

    def _send_after(self, req: Request, delay_s: float):
        if delay_s > 0:
            yield self.env.timeout(delay_s)
        req.arrival_s = self.env.now
        self.arrive(req)
