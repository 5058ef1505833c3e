"""The batch of one engine step, as data: what the scheduler decided and what the cost model prices."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class StepBatch:
    """Per scheduled request: new tokens this step, context tokens already in the KV cache, whether it needs logits.

    Decode is `num_new=1` over its context; a prefill chunk is `num_new=n` over the tokens before it
    (cached prefix or earlier chunks). The simulator and the calibration executor build the same value.
    `rank` (DP attention, optional): the data-parallel attention rank each request lives on; without it the cost
    model deals the requests over the ranks itself (`busiest_rank`).
    """

    num_new: np.ndarray
    num_context: np.ndarray
    needs_logits: np.ndarray
    rank: np.ndarray | None = None
    # sums the cost model reads many times a step, taken once (the arrays are never changed in place)
    num_tokens: int = field(init=False, repr=False)
    num_logits: int = field(init=False, repr=False)
    max_query_len: int = field(init=False, repr=False)
    min_query_len: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (len(self.num_new) == len(self.num_context) == len(self.needs_logits)):
            raise ValueError("num_new, num_context and needs_logits must have one entry per request")
        if self.rank is not None and len(self.rank) != len(self.num_new):
            raise ValueError("rank must have one entry per request")
        shortest = int(self.num_new.min()) if len(self.num_new) else 0
        if len(self.num_new) and (shortest < 1 or self.num_context.min() < 0):
            raise ValueError("every request needs >= 1 new token and >= 0 context tokens")
        set_ = object.__setattr__  # frozen
        set_(self, "num_tokens", int(self.num_new.sum()))
        set_(self, "num_logits", int(self.needs_logits.sum()))
        set_(self, "max_query_len", int(self.num_new.max()) if len(self.num_new) else 0)
        set_(self, "min_query_len", shortest)

    @classmethod
    def of(
        cls,
        num_new: list[int] | np.ndarray,
        num_context: list[int] | np.ndarray,
        needs_logits: list[bool] | np.ndarray | None = None,
    ) -> StepBatch:
        new = np.asarray(num_new, dtype=np.int64)
        logits = np.ones(len(new), bool) if needs_logits is None else np.asarray(needs_logits, dtype=bool)
        return cls(new, np.asarray(num_context, dtype=np.int64), logits)

    @classmethod
    def uniform(cls, batch: int, context: int, new_tokens: int = 1) -> StepBatch:
        """`batch` requests, each adding `new_tokens` over `context` cached tokens (decode when new_tokens=1)."""
        return cls.of([new_tokens] * batch, [context] * batch)

    @property
    def num_requests(self) -> int:
        return len(self.num_new)

    def is_mixed(self, decode_query_len: int = 1) -> bool:
        """Decode queries (up to `decode_query_len` tokens) beside longer ones (prefill chunks): attention runs
        both paths."""
        return bool(len(self.num_new)) and self.min_query_len <= decode_query_len < self.max_query_len

    def by_rank(self) -> list[StepBatch]:
        """Each labelled rank's requests, by rank number (ranks with none left out); unlabelled: the batch."""
        if self.rank is None or not self.num_requests:
            return [self]
        return [self._pick(self.rank == r) for r in np.unique(self.rank)]

    def _pick(self, picked: np.ndarray) -> StepBatch:
        return StepBatch(self.num_new[picked], self.num_context[picked], self.needs_logits[picked])

    def busiest_rank(self, ranks: int) -> StepBatch:
        """The requests of the busiest of `ranks` data-parallel attention ranks, each request whole on one of
        them: dealt round-robin largest first (by new tokens, then context), the first rank holds the largest
        request and, place by place, none smaller than another rank's, so at least 1/ranks of the step's tokens
        and its largest request: a lone prompt runs on one GPU, not 1/ranks of it on each. A simple deal, not
        the engines' own (they keep a request on its rank for life) nor the most even one."""
        if ranks == 1 or self.num_requests <= 1:
            return self
        return self._pick(np.lexsort((-self.num_context, -self.num_new))[::ranks])

    def last_token_only(self) -> StepBatch:
        """Each request reduced to its last new token (YOCO fast prefill for KV-sharing layers)."""
        return StepBatch(
            np.ones_like(self.num_new), self.num_context + self.num_new - 1, self.needs_logits, self.rank
        )
