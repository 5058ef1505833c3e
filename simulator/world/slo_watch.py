"""Stop a run once its TTFT or TPOT SLO is certainly lost: a failing rate in a capacity search or plan needs no more.

A request is a certain TTFT violator once it has waited longer than the limit without a first token, or its first
token came later than that: no later event gives it an earlier one (a step commits its tokens when it ends, and a
fused decode stretch records them ahead, never behind). It is a TPOT violator once it has finished with a TPOT
over the limit. The p-th percentile of n values (numpy's linear interpolation) exceeds a limit once the values
from index floor((n - 1) p / 100) up all do, i.e. once k >= n - floor((n - 1) p / 100) of them violate. That
bound grows with n, so counting against every request the metric could cover is safe for the run's full
population and for the requests the stopped run judges alike: the run stopped here gets the same failing verdict.
"""

from __future__ import annotations

import math

from servesim.workloads.request import Request

_SLACK = 1e-9  # relative: a value this close to its limit is left to the full run's judge, not decided here


def violators_needed(total: int, percentile: float) -> int:
    """Violators among `total` values that put their `percentile`-th above the limit (with slack in the index, so
    that numpy's floating-point index cannot round the other way)."""
    return total - max(0, math.floor((total - 1) * percentile / 100 - 1e-6))


class SloWatch:
    """Counts certain violators of a TTFT and/or TPOT limit (seconds; None: not watched) among `requests` (open
    loop: arrival times fixed in advance) as simulated time passes and requests finish."""

    def __init__(
        self,
        requests: list[Request],
        ttft_limit_s: float | None,
        tpot_limit_s: float | None,
        percentile: float,
    ):
        self.order = sorted(requests, key=lambda r: r.arrival_s) if ttft_limit_s is not None else []
        self.ttft_limit_s = ttft_limit_s * (1 + _SLACK) if ttft_limit_s is not None else math.inf
        self.tpot_limit_s = tpot_limit_s * (1 + _SLACK) if tpot_limit_s is not None else math.inf
        self.ttft_needed = violators_needed(len(self.order), percentile) if self.order else math.inf
        # TPOT's population: more than one output token
        multi = sum(r.num_output_tokens > 1 for r in requests)
        self.tpot_needed = (
            violators_needed(multi, percentile) if tpot_limit_s is not None and multi else math.inf
        )
        self.next = 0  # requests before it (by arrival) have been decided for TTFT
        self.ttft_violators = self.tpot_violators = 0

    def finished(self, req: Request) -> None:
        """`req` was answered (its finish time may lie ahead of now: a fused stretch records it early)."""
        if (
            req.reject_reason is None
            and req.finish_s is not None
            and req.num_generated > 1
            and (req.finish_s - req.first_token_s) / (req.num_generated - 1) > self.tpot_limit_s
        ):
            self.tpot_violators += 1

    def lost(self, now: float) -> bool:
        """Whether an SLO percentile is lost at `now`; decides every request whose TTFT limit has passed."""
        order, limit = self.order, self.ttft_limit_s
        while self.next < len(order) and order[self.next].arrival_s + limit < now:
            req = order[self.next]
            self.next += 1
            if req.reject_reason is None and (
                req.first_token_s is None or req.first_token_s - req.arrival_s > limit
            ):
                self.ttft_violators += 1
        return self.ttft_violators >= self.ttft_needed or self.tpot_violators >= self.tpot_needed
