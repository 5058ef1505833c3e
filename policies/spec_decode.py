"""Speculative decoding: its configuration, the seed's speedup formula, and the per-engine `Speculator`.

One round (Leviathan et al. 2022; Chen et al. 2023), as vLLM v1 runs it inside one engine step:
the draft proposes k tokens, one cheap forward pass each; the target verifies the last sampled
token plus the k guesses in one (k+1)-token pass; guesses are accepted while they agree and the
target's own token is taken at the first disagreement (or a bonus token when all k agree), so a
round yields `accepted + 1` tokens. Rejected positions are cut off both KV caches: the request's
`num_computed_tokens` advances by `accepted + 1` only, and the next round overwrites them.

Acceptance is per token: Bernoulli(alpha) in sequence until the first rejection, capped at the
round's drafts, so P(accepted >= j) = alpha^j and a round yields on average
`(1 - alpha^(k+1)) / (1 - alpha)` tokens (`expected_tokens_per_round`); or P(accepted >= j) is given per
position, as vLLM logs it (acceptance usually falls with depth faster than alpha^j, so one alpha fitted at
one k misjudges another). Draws come from a generator
per request seeded by (run seed, request id): a request sees the same draws whatever it is batched
with, and the same scenario and seed give identical runs.

Draft kinds (`method`): `draft`, a smaller model with its own weights and KV cache, priced by the
cost model; `eagle` / `mtp`, heads on the target (EAGLE, Medusa, DeepSeek-V3's MTP module), priced as
one decoder layer of the target (policies/spec_cost.py); `ngram`, prompt lookup on the CPU
(`ngram_lookup_s` per step), no model and no KV, proposing only where the lookup finds a match
(`ngram_match_rate`).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from servesim.hardware.model import check_model_name
from servesim.hardware.spec_model import SpecModel
from servesim.workloads.request import Request

#: vLLM's use_eagle() methods: draft heads on the target's own hidden states. vLLM schedules ahead (async) only
#: with these, and gives up the last block of a prefix hit for them (the heads need its hidden states).
EAGLE_METHODS = ("eagle", "mtp")

_SALT = 0x5BEC  # keeps the acceptance streams apart from every other generator seeded by the run seed


class BetaAcceptance(SpecModel):
    """Per-request acceptance rate drawn from Beta(a, b) (mean a / (a + b)) when the request first speculates."""

    kind: Literal["beta"]
    a: float = Field(gt=0, description="Beta shape alpha (dimensionless)")
    b: float = Field(gt=0, description="Beta shape beta (dimensionless)")


class SpeculativeConfig(SpecModel):
    """`engine.speculative`: how an engine drafts and verifies tokens. Units in the names."""

    method: Literal["draft", "eagle", "mtp", "ngram"] = Field(
        "draft", description="draft: a smaller model; eagle / mtp: heads on the target; ngram: prompt lookup"
    )
    k: int = Field(ge=1, description="Draft tokens proposed per round (vLLM's num_speculative_tokens)")
    acceptance: float | BetaAcceptance | list[float] = Field(
        description=(
            "Per-token acceptance rate alpha in [0, 1], {kind: beta, a, b} drawn per request, or k per-position "
            "rates as vLLM logs them (position j's accepted / drafted: P(accepted >= j), non-increasing)"
        )
    )
    draft_model: str | None = Field(None, description="method draft: model preset name or config.json path")
    head_cost_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description=(
            "eagle / mtp: one head forward pass costs this fraction of the target's over the same tokens (None: "
            "priced as one decoder layer of the target with its input projection and the LM head)"
        ),
    )
    ngram_lookup_s: float = Field(
        1e-4, ge=0, description="ngram: CPU seconds of the lookup, per step that drafts"
    )
    ngram_match_rate: float = Field(
        1.0,
        ge=0,
        le=1,
        description=(
            "ngram: share of a request's decode steps whose prompt lookup finds a match and proposes k guesses; "
            "the others propose none and verify one token (vLLM's n-gram proposer); `acceptance` is per guess "
            "proposed"
        ),
    )
    disable_above_batch: int | None = Field(
        None,
        ge=1,
        description=(
            "Draft nothing in a step that starts with more running requests than this (None: never); the requests "
            "of such a step speculate no more (vLLM v0's disable_by_batch_size N, which stops at N running: N - 1 "
            "here; their draft KV fell behind)"
        ),
    )
    disable_above_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "Draft nothing in a step whose running requests have more pending tokens than this "
            "(1 per decode, the rest of the prompt for one mid-prefill; None: never); its requests speculate no more"
        ),
    )

    @model_validator(mode="after")
    def _draft_model_iff_draft(self) -> SpeculativeConfig:
        if isinstance(self.acceptance, float) and not 0 <= self.acceptance <= 1:
            raise ValueError(f"acceptance must lie in [0, 1], got {self.acceptance}")
        if isinstance(self.acceptance, list):
            rates = self.acceptance
            if len(rates) != self.k or not all(0 <= r <= 1 for r in rates):
                raise ValueError(
                    f"acceptance per position: {self.k} rates in [0, 1] (one per guess), got {rates}"
                )
            if any(b > a for a, b in zip(rates, rates[1:])):
                raise ValueError(
                    f"acceptance per position must not increase (position j's is P(accepted >= j)), got {rates}"
                )
        if self.head_cost_fraction is not None and self.method not in EAGLE_METHODS:
            raise ValueError(f"head_cost_fraction prices eagle / mtp heads, not {self.method!r}'s passes")
        if self.method != "ngram" and self.ngram_match_rate != 1.0:
            raise ValueError(f"ngram_match_rate is the n-gram lookup's, not {self.method!r}'s")
        if self.method == "draft" and self.draft_model is None:
            raise ValueError("method 'draft' needs draft_model (a preset name or a config.json path)")
        if self.draft_model is not None:
            check_model_name(self.draft_model, "draft_model")
        if self.method != "draft" and self.draft_model is not None:
            raise ValueError(f"draft_model is only used by method 'draft', not {self.method!r}")
        return self


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Mean tokens one round yields: (1 - alpha^(k+1)) / (1 - alpha); k + 1 when every guess is accepted."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speedup(alpha: float, k: int, c: float) -> float:
    """The seed's speedup over plain decoding: tokens per round / (k * c + 1), where c = draft step time /
    target step time and a verify pass is taken to cost one target step."""
    return expected_tokens_per_round(alpha, k) / (k * c + 1.0)


class Speculator:
    """One engine's speculative state: whether a step drafts, how many tokens a request drafts and has
    accepted, and which requests speculate no more."""

    def __init__(self, cfg: SpeculativeConfig, seed: int = 0):
        self.cfg, self.seed = cfg, seed
        self.runs_draft_model = cfg.method != "ngram"
        # vLLM's num_lookahead_tokens: a running request's KV is allocated k slots past what the step computes, for
        # the proposals a draft model or EAGLE/MTP head writes next (n-gram proposals need none)
        self.lookahead = cfg.k if self.runs_draft_model else 0
        self._rng: dict[int, tuple[np.random.Generator, float]] = {}  # request id -> (its draws, its alpha)
        # request id -> its n-gram lookups' hits and misses
        self._lookups: dict[int, np.random.Generator] = {}
        self._stopped: set[int] = set()  # requests that ran in a step without drafting: they draft no more

    def is_on(self, running: list[Request]) -> bool:
        """Does the step about to be scheduled draft? Decided on the running requests as it starts."""
        cfg = self.cfg
        if cfg.disable_above_batch is not None and len(running) > cfg.disable_above_batch:
            return False
        if cfg.disable_above_tokens is None:
            return True
        pending = sum(r.num_prompt_tokens + r.num_generated - r.num_computed_tokens for r in running)
        return pending <= cfg.disable_above_tokens

    def num_drafts(self, req: Request) -> int:
        """Guesses for a decoding request: k, fewer near its end (a round never yields past the last token); none
        once it has stopped speculating."""
        if req.id in self._stopped or not self._finds_match(req):
            return 0
        return max(min(self.cfg.k, req.num_output_tokens - req.num_generated - 1), 0)

    def _finds_match(self, req: Request) -> bool:
        """Whether this step's proposer has guesses for `req`: an n-gram lookup finds a match at
        `ngram_match_rate` (drawn per request and step from a stream of its own); a model always proposes."""
        rate = self.cfg.ngram_match_rate
        if rate >= 1.0:
            return True
        rng = self._lookups.get(req.id)
        if rng is None:
            rng = self._lookups[req.id] = np.random.default_rng((self.seed, _SALT, req.id, 1))
        return bool(rng.random() < rate)

    def speculates(self, req: Request) -> bool:
        return req.id not in self._stopped

    def stop(self, requests: tuple[Request, ...]) -> None:
        """`requests` ran in a step that drafted nothing: the draft model did not see their tokens, so, as vLLM
        v0 does once it skips the proposer, they speculate no more (catching the draft up later would cost a
        pass over everything they computed meanwhile)."""
        self._stopped.update(req.id for req in requests)

    def accept(self, req: Request, num_drafts: int) -> int:
        """Guesses the target accepts this round: leading Bernoulli(alpha) successes, at most `num_drafts`.

        One uniform u in (0, 1] gives floor(ln u / ln alpha) successes: P(>= j) = P(u <= alpha^j) = alpha^j; with
        rates per position, the positions j whose P(>= j) is at least u.
        """
        rng, alpha = self._stream(req)
        u = 1.0 - rng.random()
        if isinstance(self.cfg.acceptance, list):
            return sum(u <= p for p in self.cfg.acceptance[:num_drafts])
        if alpha >= 1.0:
            return num_drafts
        if alpha <= 0.0:
            return 0
        return min(int(math.log(u) / math.log(alpha)), num_drafts)

    def alpha(self, req: Request) -> float:
        """The request's acceptance rate (drawn on first use when `acceptance` is a distribution)."""
        return self._stream(req)[1]

    def _stream(self, req: Request) -> tuple[np.random.Generator, float]:
        hit = self._rng.get(req.id)
        if hit is None:
            rng = np.random.default_rng((self.seed, _SALT, req.id))
            acc = self.cfg.acceptance
            if isinstance(acc, BetaAcceptance):
                alpha = float(rng.beta(acc.a, acc.b))
            else:  # rates per position: the first one's
                alpha = float(acc[0] if isinstance(acc, list) else acc)
            hit = self._rng[req.id] = (rng, alpha)
        return hit

    def forget(self, req: Request) -> None:
        self._rng.pop(req.id, None)
        self._lookups.pop(req.id, None)
        self._stopped.discard(req.id)
