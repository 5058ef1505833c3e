"""The `workload:` section of a scenario YAML, as frozen pydantic models.

Units: times in seconds, rates in requests per second, lengths in tokens. Validation reads no
files: a trace that is missing or malformed is reported when the workload is built.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal, Self, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

TraceFormat = Literal["azure", "mooncake", "sharegpt", "arxiv", "burstgpt", "servegen", "servesim"]
UNTIMED_FORMATS = frozenset({"sharegpt", "arxiv"})  # length tables without arrival times
MIN_NORMAL_MASS = 1e-3  # below this, a truncated normal is mostly rejection loops, not a normal


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TraceSource(_Model):
    """A trace file (or ServeGen folder) and how to read it."""

    format: TraceFormat = Field(description="File format; see workloads/traces.py for the columns of each.")
    path: Path = Field(description="Trace file (a folder for servegen); relative paths resolve against "
                                   "the scenario file's folder.")
    clients: tuple[int, ...] | None = Field(None, description="servegen only: client ids to keep (None = all "
                                                              "clients that have a dataset file).")
    burstgpt_model: str | None = Field(None, description="burstgpt only: keep rows whose `Model` column equals "
                                                         "this (e.g. 'ChatGPT', 'GPT-4').")
    drop_failed: bool = Field(True, description="burstgpt only: drop failed requests (0 response tokens); "
                                                "if False they are kept as 1-output-token requests.")

    @model_validator(mode="after")
    def _options_match_format(self) -> Self:
        if self.clients is not None and self.format != "servegen":
            raise ValueError(f"trace.clients is a servegen option, but format is {self.format!r}; remove it")
        burst_only = {"burstgpt_model", "drop_failed"} & self.model_fields_set
        if burst_only and self.format != "burstgpt":
            raise ValueError(f"trace.{sorted(burst_only)[0]} is a burstgpt option, but format is "
                             f"{self.format!r}; remove it")
        return self


class FixedDist(_Model):
    """Always `value`."""

    kind: Literal["fixed"]
    value: float = Field(ge=0, description="The value (tokens, or seconds for think times).")


class UniformDist(_Model):
    """Uniform on [low, high]."""

    kind: Literal["uniform"]
    low: float = Field(ge=0, description="Lower bound, inclusive (tokens or seconds).")
    high: float = Field(ge=0, description="Upper bound (tokens or seconds); >= low.")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.high < self.low:
            raise ValueError(f"uniform: high ({self.high}) < low ({self.low}); swap them")
        return self


class NormalDist(_Model):
    """Normal(mean, std), truncated to [min, max] by *resampling* (an exact truncated normal, no pile-up
    at the bounds). Without min/max nothing is removed."""

    kind: Literal["normal"]
    mean: float = Field(description="Mean before truncation (tokens or seconds).")
    std: float = Field(gt=0, description="Standard deviation before truncation (tokens or seconds).")
    min: float | None = Field(None, description="Lower truncation bound, inclusive (None = no bound).")
    max: float | None = Field(None, description="Upper truncation bound, inclusive (None = no bound).")

    @model_validator(mode="after")
    def _bounds_hold_mass(self) -> Self:
        lo, hi = _or_inf(self.min, -1), _or_inf(self.max, 1)
        if lo >= hi:
            raise ValueError(f"normal: min ({self.min}) must be < max ({self.max})")
        if self.mass() < MIN_NORMAL_MASS:
            raise ValueError(f"normal(mean={self.mean}, std={self.std}) puts only {self.mass():.2g} of its mass "
                             f"in [min={self.min}, max={self.max}]; move the mean or widen the bounds")
        return self

    def mass(self) -> float:
        """Probability that an untruncated sample falls in [min, max]."""
        def cdf(x: float) -> float:
            return 0.5 * (1 + math.erf((x - self.mean) / (self.std * math.sqrt(2))))
        return cdf(_or_inf(self.max, 1)) - cdf(_or_inf(self.min, -1))


class LognormalDist(_Model):
    """exp(Normal(ln(median), sigma)): `median` is the median, `sigma` the std of the log. Mean =
    median * exp(sigma**2 / 2)."""

    kind: Literal["lognormal"]
    median: float = Field(gt=0, description="Median (tokens or seconds).")
    sigma: float = Field(ge=0, description="Standard deviation of ln(x) (dimensionless); 0 = always median.")


class EmpiricalDist(_Model):
    """Sampled with replacement from one length column of a trace."""

    kind: Literal["empirical"]
    trace: TraceSource = Field(description="Trace whose column is resampled (not servegen).")
    column: Literal["prompt", "output"] = Field(description="Which length column (tokens).")

    @model_validator(mode="after")
    def _not_servegen(self) -> Self:
        if self.trace.format == "servegen":
            raise ValueError("empirical: servegen is a workload model, not a length table; use it as "
                             "`workload.trace` instead")
        return self


Dist = Annotated[Union[FixedDist, UniformDist, NormalDist, LognormalDist, EmpiricalDist],
                 Field(discriminator="kind")]


def upper_bound(dist: Dist) -> float:
    """Largest value `dist` can produce (inf when unbounded or empirical)."""
    match dist:
        case FixedDist(value=v) | UniformDist(high=v):
            return v
        case NormalDist(max=v) if v is not None:
            return v
    return math.inf


def _or_inf(x: float | None, sign: int) -> float:
    return sign * math.inf if x is None else x


class LengthsConfig(_Model):
    """Synthetic lengths. Samples are rounded to the nearest integer and raised to at least 1 token
    (a clip at 1: the only bound not named in the distribution itself)."""

    prompt: Dist = Field(description="Prompt length distribution (tokens).")
    output: Dist = Field(description="Output length distribution (tokens generated).")

    @model_validator(mode="after")
    def _can_reach_one(self) -> Self:
        for name in ("prompt", "output"):
            if upper_bound(getattr(self, name)) < 1:
                raise ValueError(f"lengths.{name}: every sample is below 1 token (upper bound "
                                 f"{upper_bound(getattr(self, name))}); raise it to >= 1")
        return self


class PoissonArrivals(_Model):
    """Poisson process: exponential inter-arrival times (CV 1)."""

    kind: Literal["poisson"]
    rate_per_s: float = Field(gt=0, description="Mean arrival rate (requests/s).")


class GammaArrivals(_Model):
    """Gamma renewal process: bursty (cv > 1) or smooth (cv < 1) traffic; cv = 1 is Poisson."""

    kind: Literal["gamma"]
    rate_per_s: float = Field(gt=0, description="Mean arrival rate (requests/s).")
    cv: float = Field(gt=0, description="Coefficient of variation of inter-arrival times (dimensionless).")


class ConstantArrivals(_Model):
    """Evenly spaced arrivals, 1/rate_per_s apart."""

    kind: Literal["constant"]
    rate_per_s: float = Field(gt=0, description="Arrival rate (requests/s).")


class AllAtOnceArrivals(_Model):
    """Every request arrives at t = 0 (offline throughput runs)."""

    kind: Literal["all_at_once"]


class TraceArrivals(_Model):
    """The trace's own timestamps, shifted to start at 0 and optionally rescaled."""

    kind: Literal["trace"]
    rate_per_s: float | None = Field(None, gt=0, description="Rescale time so the mean rate, (n - 1) / span, "
                                                             "equals this (requests/s).")
    time_scale: float | None = Field(None, gt=0, description="Multiply every timestamp by this "
                                                             "(dimensionless; 2 = half the rate).")

    @model_validator(mode="after")
    def _one_rescale(self) -> Self:
        if self.rate_per_s is not None and self.time_scale is not None:
            raise ValueError("arrivals: set at most one of rate_per_s and time_scale")
        return self


ArrivalConfig = Annotated[Union[PoissonArrivals, GammaArrivals, ConstantArrivals, AllAtOnceArrivals,
                                TraceArrivals], Field(discriminator="kind")]
SYNTHETIC_KINDS = frozenset({"poisson", "gamma", "constant"})


class ClosedLoopConfig(_Model):
    """A fixed number of clients that each wait for their previous request (plus a think time) before
    sending the next, like `vllm bench serve --max-concurrency`. The simulator runs the loop."""

    clients: int = Field(ge=1, description="Concurrent clients (requests in flight at most).")
    think_time_s: Dist | None = Field(None, description="Seconds between a finish and that client's next "
                                                        "request (None = 0 s).")

    @model_validator(mode="after")
    def _think_time_nonnegative(self) -> Self:
        t = self.think_time_s
        if isinstance(t, EmpiricalDist):
            raise ValueError("closed_loop.think_time_s: empirical samples token counts, not seconds")
        if isinstance(t, NormalDist) and (t.min is None or t.min < 0):
            raise ValueError("closed_loop.think_time_s: a normal think time needs min >= 0 (e.g. min: 0)")
        return self


class WorkloadConfig(_Model):
    """Where requests come from: a trace, synthetic lengths, or both (trace timestamps with synthetic
    lengths), and when they arrive."""

    trace: TraceSource | None = Field(None, description="Trace giving lengths and/or timestamps.")
    lengths: LengthsConfig | None = Field(None, description="Synthetic lengths; with a trace they replace "
                                                            "the trace's lengths and prefix segments "
                                                            "(its timestamps, sessions, priorities stay).")
    arrivals: ArrivalConfig = Field(description="Arrival process.")
    closed_loop: ClosedLoopConfig | None = Field(None, description="Closed-loop clients; the simulator then "
                                                                   "sends requests in order as clients free up.")
    num_requests: int | None = Field(None, ge=1, description="Take at most this many requests.")
    duration_s: float | None = Field(None, gt=0, description="Synthetic arrivals stop at this time (s); "
                                                             "trace rows arriving at or after it are dropped.")
    skip_requests: int = Field(0, ge=0, description="Skip this many leading trace rows (start later in a trace).")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        for problem in (self._length_problem(), self._arrival_problem(), self._count_problem()):
            if problem:
                raise ValueError(problem)
        return self

    def _length_problem(self) -> str | None:
        if self.trace is None and self.lengths is None:
            return "workload needs lengths: set `trace`, `lengths`, or both"
        if self.trace is not None and self.lengths is not None and self.arrivals.kind != "trace":
            return ("workload.trace is unused: `lengths` replaces its lengths and arrivals are "
                    f"{self.arrivals.kind!r}; remove one, or use arrivals: {{kind: trace}}")
        return None

    def _arrival_problem(self) -> str | None:
        if self.arrivals.kind != "trace":
            return None
        if self.trace is None:
            return "arrivals.kind 'trace' needs `workload.trace` with timestamps"
        if self.trace.format in UNTIMED_FORMATS:
            return (f"arrivals.kind 'trace': format {self.trace.format!r} has no timestamps; "
                    "use a synthetic arrival process (poisson, gamma, constant, all_at_once)")
        return None

    def _count_problem(self) -> str | None:
        kind, has_count = self.arrivals.kind, self.num_requests is not None
        if kind in SYNTHETIC_KINDS and not has_count and self.duration_s is None:
            return f"arrivals.kind {kind!r} needs num_requests or duration_s to know when to stop"
        if kind == "all_at_once" and not has_count and self.trace is None:
            return "arrivals.kind 'all_at_once' needs num_requests (or a trace to take every row of)"
        if self.closed_loop is not None and not has_count:
            return "closed_loop needs num_requests (the total number of requests its clients send)"
        if self.trace is not None and self.trace.format == "servegen" and self.duration_s is None:
            return "trace format 'servegen' generates arrivals and needs duration_s"
        if self.trace is None and self.skip_requests:
            return "skip_requests skips trace rows, but there is no trace"
        return None
