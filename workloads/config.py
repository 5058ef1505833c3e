"""The `workload:` section of a scenario YAML, as frozen pydantic models.

Units: times in seconds, rates in requests per second, lengths in tokens. Validation reads no
files: a trace that is missing or malformed is reported when the workload is built. Trace sources and
distributions live in workloads/dist_config.py, the sharing sections (shared prefixes, sessions,
parallel sampling, semantic clusters) in workloads/sharing_config.py; all are re-exported here.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self, Union

from pydantic import Field, model_validator

from servesim.workloads.dist_config import (
    MIN_NORMAL_MASS,
    UNTIMED_FORMATS,
    Dist,
    EmpiricalDist,
    FixedDist,
    LognormalDist,
    SequenceDist,
    NormalDist,
    TraceFormat,
    TraceSource,
    UniformDist,
    SpecModel,
    seconds_problem,
    tokens_problem,
    upper_bound,
)
from servesim.workloads.sharing_config import (
    ParallelSamplingConfig,
    SemanticClustersConfig,
    SessionsConfig,
    SharedPrefixConfig,
)

__all__ = [
    "MIN_NORMAL_MASS",
    "SYNTHETIC_KINDS",
    "UNTIMED_FORMATS",
    "AllAtOnceArrivals",
    "ArrivalConfig",
    "ClosedLoopConfig",
    "ConstantArrivals",
    "Dist",
    "EmpiricalDist",
    "FixedDist",
    "GammaArrivals",
    "LengthsConfig",
    "LognormalDist",
    "SequenceDist",
    "NormalDist",
    "ParallelSamplingConfig",
    "PoissonArrivals",
    "SemanticClustersConfig",
    "SessionsConfig",
    "SharedPrefixConfig",
    "TraceArrivals",
    "TraceFormat",
    "TraceSource",
    "UniformDist",
    "WorkloadConfig",
    "seconds_problem",
    "tokens_problem",
    "upper_bound",
]


class LengthsConfig(SpecModel):
    """Synthetic lengths. Samples are rounded to the nearest integer and raised to at least 1 token
    (a clip at 1: the only bound not named in the distribution itself)."""

    prompt: Dist = Field(description="Prompt length distribution (tokens).")
    output: Dist = Field(description="Output length distribution (tokens generated).")

    @model_validator(mode="after")
    def _can_reach_one(self) -> Self:
        for name in ("prompt", "output"):
            if problem := tokens_problem(getattr(self, name), f"lengths.{name}"):
                raise ValueError(problem)
        return self


Paced = Annotated[
    bool,
    Field(
        description=(
            "Scale the times so the last of num_requests arrives at exactly num_requests / rate_per_s, the first after "
            "its own gap, as `vllm bench serve` does since v0.10.1. Needs num_requests and no duration_s."
        )
    ),
]


class PoissonArrivals(SpecModel):
    """Poisson process: exponential inter-arrival times (CV 1)."""

    kind: Literal["poisson"]
    rate_per_s: float = Field(
        gt=0,
        description=(
            "Mean arrival rate (requests/s; with parallel_sampling prompts/s, with sessions sessions started/s)."
        ),
    )
    paced: Paced = False


class GammaArrivals(SpecModel):
    """Gamma renewal process: bursty (cv > 1) or smooth (cv < 1) traffic; cv = 1 is Poisson."""

    kind: Literal["gamma"]
    rate_per_s: float = Field(
        gt=0,
        description=(
            "Mean arrival rate (requests/s; with parallel_sampling prompts/s, with sessions sessions started/s)."
        ),
    )
    cv: float = Field(
        gt=0, le=100, description="Coefficient of variation of inter-arrival times (dimensionless)."
    )
    paced: Paced = False


class ConstantArrivals(SpecModel):
    """Evenly spaced arrivals, 1/rate_per_s apart."""

    kind: Literal["constant"]
    rate_per_s: float = Field(
        gt=0,
        description=(
            "Arrival rate (requests/s; with parallel_sampling prompts/s, with sessions sessions started/s)."
        ),
    )
    paced: Paced = False


class AllAtOnceArrivals(SpecModel):
    """Every request arrives at t = 0 (offline throughput runs)."""

    kind: Literal["all_at_once"]


class TraceArrivals(SpecModel):
    """The trace's own timestamps, shifted to start at 0 and optionally rescaled."""

    kind: Literal["trace"]
    rate_per_s: float | None = Field(
        None, gt=0, description="Rescale time so the mean rate, (n - 1) / span, equals this (requests/s)."
    )
    time_scale: float | None = Field(
        None, gt=0, description="Multiply every timestamp by this (dimensionless; 2 = half the rate)."
    )

    @model_validator(mode="after")
    def _one_rescale(self) -> Self:
        if self.rate_per_s is not None and self.time_scale is not None:
            raise ValueError("arrivals: set at most one of rate_per_s and time_scale")
        return self


ArrivalConfig = Annotated[
    Union[PoissonArrivals, GammaArrivals, ConstantArrivals, AllAtOnceArrivals, TraceArrivals],
    Field(discriminator="kind"),
]
SYNTHETIC_KINDS = frozenset({"poisson", "gamma", "constant"})
#: The most requests one run takes (parallel samples and session turns included), checked before anything is
#: drawn: a count past it is a typo or a fuzz, and would be allocated as arrays of that length.
MAX_REQUESTS = 100_000_000


class ClosedLoopConfig(SpecModel):
    """A fixed number of clients that each wait for their previous request (plus a think time) before
    sending the next, like `vllm bench serve --max-concurrency`. The simulator runs the loop."""

    clients: int = Field(ge=1, description="Concurrent clients (requests in flight at most).")
    think_time_s: Dist | None = Field(
        None, description="Seconds between a finish and that client's next request (None = 0 s)."
    )

    @model_validator(mode="after")
    def _think_time_nonnegative(self) -> Self:
        if problem := seconds_problem(self.think_time_s, "closed_loop.think_time_s"):
            raise ValueError(problem)
        return self


class WorkloadConfig(SpecModel):
    """Where requests come from: a trace, synthetic lengths, or both (trace timestamps with synthetic
    lengths), and when they arrive."""

    trace: TraceSource | None = Field(None, description="Trace giving lengths and/or timestamps.")
    lengths: LengthsConfig | None = Field(
        None,
        description="Synthetic lengths; with a trace they replace "
        "the trace's lengths and prefix segments "
        "(its timestamps, sessions, priorities stay).",
    )
    arrivals: ArrivalConfig = Field(description="Arrival process.")
    closed_loop: ClosedLoopConfig | None = Field(
        None,
        description="Closed-loop clients; the simulator then sends requests in order as clients free up.",
    )
    num_requests: int | None = Field(
        None,
        ge=1,
        le=MAX_REQUESTS,
        description=("Take at most this many requests (count; parallel samples and session turns included)."),
    )
    duration_s: float | None = Field(
        None,
        gt=0,
        description="Synthetic arrivals stop at this time (s); "
        "trace rows arriving at or after it are dropped.",
    )
    skip_requests: int = Field(
        0, ge=0, description="Skip this many leading trace rows (start later in a trace)."
    )
    shared_prefix: SharedPrefixConfig | None = Field(None, description="Shared prefixes put before prompts.")
    sessions: SessionsConfig | None = Field(
        None, description="Multi-turn sessions: every drawn request starts one."
    )
    parallel_sampling: ParallelSamplingConfig | None = Field(None, description="n requests per drawn prompt.")
    semantic_clusters: SemanticClustersConfig | None = Field(
        None, description="A Zipf-popular semantic cluster for every request."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        for problem in (
            self._length_problem(),
            self._arrival_problem(),
            self._count_problem(),
            self._sharing_problem(),
        ):
            if problem:
                raise ValueError(problem)
        return self

    def _length_problem(self) -> str | None:
        if self.trace is None and self.lengths is None:
            return "workload needs lengths: set `trace`, `lengths`, or both"
        if self.trace is not None and self.lengths is not None and self.arrivals.kind != "trace":
            return (
                "workload.trace is unused: `lengths` replaces its lengths and arrivals are "
                f"{self.arrivals.kind!r}; remove one, or use arrivals: {{kind: trace}}"
            )
        return None

    def _arrival_problem(self) -> str | None:
        if self.arrivals.kind != "trace":
            return None
        if self.trace is None:
            return "arrivals.kind 'trace' needs `workload.trace` with timestamps"
        if self.trace.format in UNTIMED_FORMATS:
            return (
                f"arrivals.kind 'trace': format {self.trace.format!r} has no timestamps; "
                "use a synthetic arrival process (poisson, gamma, constant, all_at_once)"
            )
        return None

    @property
    def rate_unit(self) -> str:
        """What `arrivals.rate_per_s` counts: requests, or prompts of n samples, or sessions (their first turns;
        later turns follow the answers)."""
        return (
            "sessions/s"
            if self.sessions is not None
            else "prompts/s"
            if self.parallel_sampling is not None
            else "req/s"
        )

    def _count_problem(self) -> str | None:
        kind, has_count = self.arrivals.kind, self.num_requests is not None
        if kind in SYNTHETIC_KINDS and not has_count and self.duration_s is None:
            return f"arrivals.kind {kind!r} needs num_requests or duration_s to know when to stop"
        if getattr(self.arrivals, "paced", False) and (not has_count or self.duration_s is not None):
            return (
                f"arrivals.paced: a paced {kind} process ends at num_requests / rate_per_s, so it needs "
                "num_requests and no duration_s"
            )
        if kind == "all_at_once" and not has_count and self.trace is None:
            return "arrivals.kind 'all_at_once' needs num_requests (or a trace to take every row of)"
        if self.closed_loop is not None and not has_count:
            return "closed_loop needs num_requests (the total number of requests its clients send)"
        if self.trace is not None and self.trace.format == "servegen" and self.duration_s is None:
            return "trace format 'servegen' generates arrivals and needs duration_s"
        if self.trace is None and self.skip_requests:
            return "skip_requests skips trace rows, but there is no trace"
        rate = getattr(self.arrivals, "rate_per_s", None)
        if kind in SYNTHETIC_KINDS and not has_count and rate * self.duration_s > MAX_REQUESTS:
            return (
                f"arrivals at {rate:g} {self.rate_unit} for duration_s {self.duration_s:g} make "
                f"~{rate * self.duration_s:.3g} of them, more than the {MAX_REQUESTS:,} requests a run takes; "
                "lower the rate or duration_s"
            )
        return None

    def _sharing_problem(self) -> str | None:
        n = 1 if self.parallel_sampling is None else self.parallel_sampling.n
        if self.num_requests is not None and self.num_requests % n:
            return (
                f"num_requests ({self.num_requests}) counts requests and must be a multiple of "
                f"parallel_sampling.n ({n}); use e.g. {self.num_requests // n * n or n}"
            )
        if self.sessions is None:
            return None
        if self.parallel_sampling is not None:
            return (
                "sessions and parallel_sampling cannot be combined (which sample would the next turn follow?)"
            )
        if self.closed_loop is not None:
            return (
                "sessions and closed_loop cannot be combined: later turns are released when the previous "
                "turn finishes, not by closed-loop clients; remove one"
            )
        return None
