"""Building blocks of the `workload:` config: trace sources and value distributions (`Dist`).

Units: lengths in tokens, times in seconds. Validation reads no files. workloads/config.py
re-exports every public name here, so `from workloads.config import Dist` keeps working.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal, Self, Union

from pydantic import Field, model_validator

from servesim.hardware.spec_model import MAX_TOKENS, SpecModel

TraceFormat = Literal[
    "azure",
    "mooncake",
    "sharegpt",
    "sharegpt_json",
    "arxiv",
    "burstgpt",
    "servegen",
    "servesim",
    "vllm_bench",
    "guidellm",
    "sglang_bench",
]
# length tables without arrival times
UNTIMED_FORMATS = frozenset({"sharegpt", "sharegpt_json", "arxiv", "vllm_bench", "sglang_bench"})
MIN_NORMAL_MASS = 1e-3  # below this, a truncated normal is mostly rejection loops, not a normal
#: The largest value a length or time distribution may name or draw: past it a count overflows int64 on its way to
#: numpy, and no model or trace comes near it.
MAX_VALUE = float(MAX_TOKENS)
MAX_SEQUENCE = 1 << 24  # values a sequence may list: a run of 16M requests
MAX_LOG_SIGMA = 10.0  # a lognormal's sigma: e^10 between a median and one sigma above is already absurd


class TraceSource(SpecModel):
    """A trace file (or ServeGen folder) and how to read it."""

    format: TraceFormat = Field(description="File format; see workloads/traces.py for the columns of each.")
    path: Path = Field(
        description="Trace file (a folder for servegen); relative paths resolve against "
        "the scenario file's folder."
    )
    clients: tuple[int, ...] | None = Field(
        None, description="servegen only: client ids to keep (None = all clients that have a dataset file)."
    )
    burstgpt_model: str | None = Field(
        None,
        description="burstgpt only: keep rows whose `Model` column equals this (e.g. 'ChatGPT', 'GPT-4').",
    )
    drop_failed: bool = Field(
        True,
        description="burstgpt only: drop failed requests (0 response tokens); "
        "if False they are kept as 1-output-token requests.",
    )
    benchmark: int = Field(
        0,
        ge=0,
        description="guidellm and sglang_bench: which benchmark (report entry, JSONL line; 0 = the first) to replay.",
    )
    tokenizer: str | None = Field(
        None,
        description=(
            "sharegpt_json only: count tokens with this tokenizer (a tokenizer.json, a folder holding one, or a "
            "Hugging Face repo id; needs the tokenizers package). Unset: the model's own when its tokenizer.json "
            "is in the Hugging Face cache, else 4 characters a token"
        ),
    )

    shuffle_seed: int | None = Field(
        0,
        description=(
            "sharegpt_json only: vllm bench serve's --seed, which shuffles the conversations before they are "
            "sampled (Python's random, as vLLM does); null keeps the file's order (its --disable-shuffle)"
        ),
    )
    length_filter: bool = Field(
        True,
        description=(
            "sharegpt_json only: drop the pairs vllm bench serve drops (a prompt under 4 or over 1024 tokens, a "
            "completion under 4, both over 2048); false keeps every pair"
        ),
    )

    @model_validator(mode="after")
    def _options_match_format(self) -> Self:
        if self.clients is not None and self.format != "servegen":
            raise ValueError(f"trace.clients is a servegen option, but format is {self.format!r}; remove it")
        # compare with the defaults, not with what was set, so a dumped resolved scenario loads again
        burst_only = [
            name
            for name, default in (("burstgpt_model", None), ("drop_failed", True))
            if getattr(self, name) != default
        ]
        sharegpt_only = [
            name
            for name, default in (("tokenizer", None), ("shuffle_seed", 0), ("length_filter", True))
            if getattr(self, name) != default
        ]
        if sharegpt_only and self.format != "sharegpt_json":
            raise ValueError(
                f"trace.{sharegpt_only[0]} is a sharegpt_json option, but format is {self.format!r}; remove it"
            )
        if self.benchmark and self.format not in ("guidellm", "sglang_bench"):
            raise ValueError(
                f"trace.benchmark is a guidellm and sglang_bench option, but format is {self.format!r}; remove it"
            )
        if burst_only and self.format != "burstgpt":
            raise ValueError(
                f"trace.{sorted(burst_only)[0]} is a burstgpt option, but format is "
                f"{self.format!r}; remove it"
            )
        return self


class FixedDist(SpecModel):
    """Always `value`."""

    kind: Literal["fixed"]
    value: float = Field(ge=0, le=MAX_VALUE, description="The value (tokens, or seconds for think times).")


class UniformDist(SpecModel):
    """Uniform on [low, high]."""

    kind: Literal["uniform"]
    low: float = Field(ge=0, le=MAX_VALUE, description="Lower bound, inclusive (tokens or seconds).")
    high: float = Field(ge=0, le=MAX_VALUE, description="Upper bound (tokens or seconds); >= low.")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.high < self.low:
            raise ValueError(f"uniform: high ({self.high}) < low ({self.low}); swap them")
        return self


class NormalDist(SpecModel):
    """Normal(mean, std), truncated to [min, max] by *resampling* (an exact truncated normal, no pile-up
    at the bounds). Without min/max nothing is removed."""

    kind: Literal["normal"]
    mean: float = Field(
        ge=-MAX_VALUE, le=MAX_VALUE, description="Mean before truncation (tokens or seconds)."
    )
    std: float = Field(
        gt=0, le=MAX_VALUE, description="Standard deviation before truncation (tokens or seconds)."
    )
    min: float | None = Field(
        None,
        ge=-MAX_VALUE,
        le=MAX_VALUE,
        description=("Lower truncation bound, inclusive (None = no bound)."),
    )
    max: float | None = Field(
        None,
        ge=-MAX_VALUE,
        le=MAX_VALUE,
        description=("Upper truncation bound, inclusive (None = no bound)."),
    )

    @model_validator(mode="after")
    def _bounds_hold_mass(self) -> Self:
        lo, hi = _or_inf(self.min, -1), _or_inf(self.max, 1)
        if lo >= hi:
            raise ValueError(f"normal: min ({self.min}) must be < max ({self.max})")
        if self.mass() < MIN_NORMAL_MASS:
            raise ValueError(
                f"normal(mean={self.mean}, std={self.std}) puts only {self.mass():.2g} of its mass "
                f"in [min={self.min}, max={self.max}]; move the mean or widen the bounds"
            )
        return self

    def mass(self) -> float:
        """Probability that an untruncated sample falls in [min, max]."""

        def cdf(x: float) -> float:
            return 0.5 * (1 + math.erf((x - self.mean) / (self.std * math.sqrt(2))))

        return cdf(_or_inf(self.max, 1)) - cdf(_or_inf(self.min, -1))


class LognormalDist(SpecModel):
    """exp(Normal(ln(median), sigma)): `median` is the median, `sigma` the std of the log. Mean =
    median * exp(sigma**2 / 2)."""

    kind: Literal["lognormal"]
    median: float = Field(gt=0, le=MAX_VALUE, description="Median (tokens or seconds).")
    sigma: float = Field(
        ge=0,
        le=MAX_LOG_SIGMA,
        description=("Standard deviation of ln(x) (dimensionless); 0 = always median."),
    )


class EmpiricalDist(SpecModel):
    """Sampled with replacement from one length column of a trace."""

    kind: Literal["empirical"]
    trace: TraceSource = Field(description="Trace whose column is resampled (not servegen).")
    column: Literal["prompt", "output"] = Field(description="Which length column (tokens).")

    @model_validator(mode="after")
    def _not_servegen(self) -> Self:
        if self.trace.format == "servegen":
            raise ValueError(
                "empirical: servegen is a workload model, not a length table; use it as "
                "`workload.trace` instead"
            )
        return self


class SequenceDist(SpecModel):
    """Given values taken in order, from the first again when more are needed: a measured run's per-request
    lengths replayed as its client sent them."""

    kind: Literal["sequence"]
    values: list[Annotated[float, Field(ge=0, le=MAX_VALUE)]] = Field(
        min_length=1, max_length=MAX_SEQUENCE, description="The values, in the order requests take them."
    )


Dist = Annotated[
    Union[FixedDist, UniformDist, NormalDist, LognormalDist, EmpiricalDist, SequenceDist],
    Field(discriminator="kind"),
]


def upper_bound(dist: Dist) -> float:
    """Largest value `dist` can produce (inf when unbounded or empirical)."""
    match dist:
        case FixedDist(value=v) | UniformDist(high=v):
            return v
        case SequenceDist(values=values):
            return max(values)
        case NormalDist(max=v) if v is not None:
            return v
    return math.inf


def _or_inf(x: float | None, sign: int) -> float:
    return sign * math.inf if x is None else x


def tokens_problem(dist: Dist, where: str) -> str | None:
    """Why `dist` cannot be a token count (every sample below 1), or None when it can."""
    if upper_bound(dist) < 1:
        return f"{where}: every sample is below 1 token (upper bound {upper_bound(dist)}); raise it to >= 1"
    return None


def seconds_problem(dist: Dist | None, where: str) -> str | None:
    """Why `dist` cannot be a non-negative duration (s), or None when it can."""
    if isinstance(dist, EmpiricalDist):
        return f"{where}: empirical samples token counts, not seconds"
    if isinstance(dist, NormalDist) and (dist.min is None or dist.min < 0):
        return f"{where}: a normal time needs min >= 0 (e.g. min: 0)"
    return None
