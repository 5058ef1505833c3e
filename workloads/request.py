"""The request record that flows from a workload through the router into an engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto


class Phase(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()
    REJECTED = auto()


@dataclass(slots=True, eq=False)  # identity equality: two requests are never "equal"
class Request:
    """One request. Workloads fill the first block of fields; engines update the counters and times.

    Prefix identity: `prompt_segments` is the prompt as a sequence of (segment id, tokens) runs; two
    prompts share exactly their common leading segments (a system prompt, earlier turns, a Mooncake
    512-token block). Empty means the whole prompt is unique. Times are simulated seconds.
    """

    id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int  # tokens it will generate (the oracle length, like `ignore_eos` benchmarks)
    prompt_segments: tuple[tuple[int, int], ...] = ()
    session_id: int | None = None
    priority: int = 0  # lower runs first under the `priority` order, as in vLLM
    prompt_logprobs: bool = False

    # engine state
    phase: Phase = Phase.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache (prompt and fed-back outputs)
    num_generated: int = 0  # output tokens sampled so far
    num_cached_tokens: int = 0  # prompt tokens served from a prefix cache at (last) admission
    num_preemptions: int = 0
    replica: int | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    reject_reason: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what a recompute after preemption must prefill again."""
        return self.num_prompt_tokens + self.num_generated

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to feed before the next sample: the (rest of the) prompt, all tokens after a recompute, or 1."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_done(self) -> bool:
        return self.num_generated >= self.num_output_tokens
