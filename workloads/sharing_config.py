"""Config of what requests share: shared prefixes, multi-turn sessions, parallel sampling, semantic
clusters (optional sections of `workload:`; see workloads/request.py for the prefix identity rules).

Units: lengths in tokens, times in seconds. Popularity is Zipf: item k (0-based) is chosen with
probability proportional to 1 / (k + 1)**zipf_s, so item 0 is the most popular and zipf_s = 0 is uniform.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from servesim.workloads.dist_config import MAX_VALUE, Dist, SpecModel, seconds_problem, tokens_problem


MAX_POPULATION = 10_000_000  # prefixes or clusters: a popularity table this long is allocated up front
MAX_ZIPF_S = 100.0  # far past where every draw is the first item already


class SharedPrefixConfig(SpecModel):
    """Shared prefixes (system prompts, documents): a request that uses one gets the run
    (prefix index, prefix length) before its own part, so num_prompt_tokens = prefix + own part, and the
    own part keeps the length from `lengths`/the trace."""

    num_prefixes: int = Field(
        ge=1, le=MAX_POPULATION, description="Distinct prefixes; their segment ids are 0..num_prefixes-1."
    )
    prefix_tokens: int | Dist = Field(
        description="Length of each prefix (tokens): a fixed count, or a distribution drawn once per prefix."
    )
    zipf_s: float = Field(
        1.0,
        ge=0,
        le=MAX_ZIPF_S,
        description="Zipf exponent of prefix popularity (dimensionless; 0 = every prefix equally likely).",
    )
    share: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Probability that a request uses a prefix (fraction of prompts, drawn independently).",
    )

    @model_validator(mode="after")
    def _prefix_can_be_one_token(self) -> Self:
        if isinstance(self.prefix_tokens, int):
            if not 1 <= self.prefix_tokens <= MAX_VALUE:
                raise ValueError(f"shared_prefix.prefix_tokens ({self.prefix_tokens}) must be 1 to 2^40")
        elif problem := tokens_problem(self.prefix_tokens, "shared_prefix.prefix_tokens"):
            raise ValueError(problem)
        return self


class SessionsConfig(SpecModel):
    """Multi-turn conversations. Every request drawn from `lengths`/the trace starts a session; turn k+1's
    prompt is turn k's prompt, then turn k's answer, then a new user message. Later turns are released
    by the simulator `think_time_s` after the previous turn finishes (`Workload.followups`)."""

    turns: Dist = Field(description="Turns per session, the first included (count, rounded, at least 1).")
    think_time_s: Dist = Field(description="Seconds from a turn's finish to the next turn's send.")
    new_message_tokens: Dist = Field(description="Length of each follow-up user message (tokens).")
    max_prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="A session ends before a turn whose prompt "
        "would exceed this (tokens; None = no cap). "
        "The first turn is always kept.",
    )

    @model_validator(mode="after")
    def _valid_dists(self) -> Self:
        problems = (
            tokens_problem(self.turns, "sessions.turns"),
            tokens_problem(self.new_message_tokens, "sessions.new_message_tokens"),
            seconds_problem(self.think_time_s, "sessions.think_time_s"),
        )
        for problem in problems:
            if problem:
                raise ValueError(problem)
        return self


class ParallelSamplingConfig(SpecModel):
    """n samples per prompt (best-of-n, GRPO rollouts): each drawn prompt becomes n requests with identical
    prompts, one arrival time, consecutive ids and independently drawn output lengths."""

    n: int = Field(
        ge=1, description="Requests per prompt (count); `num_requests` counts requests, not prompts."
    )


class SemanticClustersConfig(SpecModel):
    """A semantic cluster per request (`Request.semantic_cluster`), for semantic response caches: requests
    with one cluster ask "the same thing". Requests with identical prompts share their cluster."""

    num_clusters: int = Field(
        ge=1, le=MAX_POPULATION, description="Distinct clusters; ids 0..num_clusters-1."
    )
    zipf_s: float = Field(
        1.0,
        ge=0,
        le=MAX_ZIPF_S,
        description="Zipf exponent of cluster popularity (dimensionless; 0 = uniform).",
    )
