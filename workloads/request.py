"""The request record that flows from a workload through the router into an engine.

Prefix identity (the KV caches in policies/ rely on these rules):
- A prompt is a sequence of (segment id, tokens) runs, `Request.segments()`. Token k of run (s, n) is the
  token (s, k), so two prompts share exactly their common leading runs.
- Segment ids are ints. Shared text (a prefix or system prompt, a document, a Mooncake 512-token block) has an
  id >= 0. A request's own unique text has id -(request.id + 1). A generator that needs more than one unique
  run per request takes further negative ids from a per-workload counter that starts below
  -(num_requests + 1), so they never collide with -(id + 1).
- The tokens a request generates are the run (output_segment_id(request.id), num_output_tokens). A multi-turn
  follow-up prompt therefore holds the previous turn's answer as the run
  (output_segment_id(prev.id), prev.num_output_tokens).
- Empty `prompt_segments` means one unique run of num_prompt_tokens, ((-(id + 1), num_prompt_tokens),);
  workloads/generate.py always fills it. The run lengths sum to num_prompt_tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum, auto


OUTPUT_SEGMENT_BASE = 1 << 48  # above any trace block id, so generated tokens never match prompt text


def output_segment_id(request_id: int) -> int:
    """Segment id of the tokens request `request_id` generates (see the module docstring)."""
    return OUTPUT_SEGMENT_BASE + request_id


class Phase(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()
    REJECTED = auto()


@dataclass(slots=True, eq=False)  # identity equality: two requests are never "equal"
class Request:
    """One request. Workloads fill the first block of fields; engines update the counters and times.

    `prompt_segments` is the prompt as (segment id, tokens) runs (module docstring; empty = unique).
    Sessions: `session_id` groups the turns of one conversation; turn `turn` (0 = first) is sent
    `think_time_s` after the previous turn finishes, and its `arrival_s` is NaN until the simulator sends
    it (`Workload.followups`). Times are simulated seconds.
    """

    id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int  # tokens it will generate (the oracle length, like `ignore_eos` benchmarks)
    prompt_segments: tuple[tuple[int, int], ...] = ()
    session_id: int | None = None
    priority: int = 0  # lower runs first under the `priority` order, as in vLLM
    prompt_logprobs: bool = False
    turn: int = 0  # position in its session (0 = first turn, or no session)
    think_time_s: float = 0.0  # delay from the previous turn's finish to this turn's send (s)
    semantic_cluster: int | None = None  # requests asking "the same thing", for semantic response caches
    # no other request's prompt shares its first block (mark_private_prefixes): a prefix cache need not hash it
    # unless it is preempted and may come back to its own blocks
    private_prefix: bool = False

    # engine state
    phase: Phase = Phase.WAITING
    num_computed_tokens: int = 0  # tokens whose KV is in the cache (prompt and fed-back outputs)
    num_in_flight_tokens: int = (
        0  # of those, the ones whose step's outputs vLLM has not processed when it plans
    )
    # the next (async scheduling, pipeline parallel): sliding windows keep the blocks that step's queries read
    num_generated: int = 0  # output tokens sampled so far
    num_cached_tokens: int = 0  # prompt tokens served from a prefix cache at (last) admission
    num_preemptions: int = 0
    replica: int | None = None
    scheduled_s: float | None = None  # when a step first scheduled it: its queue wait ends
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    reject_reason: str | None = None
    served_by: str | None = None  # "engine", or the application cache that answered it
    false_hit: bool = False  # a semantic-cache hit that returned another question's answer
    extra: dict = field(default_factory=dict)

    def segments(self) -> tuple[tuple[int, int], ...]:
        """The prompt's (segment id, tokens) runs: `prompt_segments`, or one unique run when it is empty."""
        return self.prompt_segments or ((-(self.id + 1), self.num_prompt_tokens),)

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


def mark_private_prefixes(requests: list[Request]) -> None:
    """Flag the requests whose first prompt run no other request begins with and that belong to no session (a
    later turn starts with its prompt): no block of theirs can be another request's hit, since a block's hash
    chains every token before it."""
    firsts = [r.prompt_segments[0] if r.prompt_segments else r.segments()[0] for r in requests]
    counts = Counter(firsts)
    for r, first in zip(requests, firsts):
        r.private_prefix = r.session_id is None and first[1] > 0 and first[0] < 0 and counts[first] == 1
