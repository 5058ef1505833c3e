"""Application caches in front of the engines: a hit is answered after the lookup latency and never
reaches an engine. Answers are stored when a request completes on an engine.

- `exact`: the whole prompt (its exact token runs) must match a completed request's prompt.
- `semantic`: requests carry an embedding cluster (`Request.semantic_cluster`, from the workload).
  A request whose cluster already has a stored answer draws the similarity of its embedding to that
  answer's query from Beta(alpha, beta) (paraphrases are close, not identical) and hits when it
  reaches the threshold. A hit is wrong (another question's answer) with probability
  `false_hit_rate`, as similar-but-different questions ("delete a file" vs "a folder") do.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from servesim.hardware.spec_model import SpecModel

from servesim.policies.token_ids import pieces
from servesim.workloads.request import Request


class AppCacheConfig(SpecModel):
    kind: Literal["none", "exact", "semantic"] = Field("none", description="Cache in front of the engines")
    lookup_latency_s: float = Field(0.002, ge=0, description="Seconds to look up (embed + search) a request")
    threshold: float = Field(0.85, gt=0, le=1, description="semantic: cosine similarity needed for a hit")
    similarity_alpha: float = Field(
        8.0,
        gt=0,
        description="semantic: Beta(alpha, beta) similarity to the cached query of the same cluster",
    )
    similarity_beta: float = Field(2.0, gt=0, description="semantic: see similarity_alpha")
    false_hit_rate: float = Field(0.02, ge=0, le=1, description="semantic: share of hits that answer wrongly")


class AppCache:
    """Decides hits at arrival and learns answers at completion. Deterministic given its rng."""

    def __init__(self, cfg: AppCacheConfig, rng: np.random.Generator):
        self.cfg, self.rng = cfg, rng
        self._answered: set = set()

    def lookup(self, req: Request) -> bool:
        """Whether the cache answers `req`; marks a wrong semantic answer in `req.false_hit`."""
        key = self._key(req)
        if key is None or key not in self._answered:
            return False
        if self.cfg.kind == "exact":
            return True
        similarity = self.rng.beta(self.cfg.similarity_alpha, self.cfg.similarity_beta)
        if similarity < self.cfg.threshold:
            return False
        req.false_hit = bool(self.rng.random() < self.cfg.false_hit_rate)
        return True

    def store(self, req: Request) -> None:
        key = self._key(req)
        if key is not None:
            self._answered.add(key)

    def _key(self, req: Request):
        if self.cfg.kind == "exact":
            return pieces(list(req.segments()), 0, req.num_prompt_tokens)
        if self.cfg.kind == "semantic":
            return req.semantic_cluster
        return None
