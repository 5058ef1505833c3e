"""Shared prefixes and semantic clusters, drawn with Zipf popularity from an injected Generator, and the
unique rest of a prompt. Segment id rules: workloads/request.py."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.workloads.distributions import sample_lengths
from servesim.workloads.request import Request
from servesim.workloads.sharing_config import SemanticClustersConfig, SharedPrefixConfig

Segments = tuple[tuple[int, int], ...]


def zipf_probs(num_items: int, s: float) -> np.ndarray:
    """Probability of item k = 0..num_items-1, proportional to 1 / (k + 1)**s (s = 0: uniform)."""
    weights = np.arange(1, num_items + 1, dtype=np.float64) ** -s
    return weights / weights.sum()


def zipf_draws(num_items: int, s: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` item indices (int64) drawn independently with `zipf_probs(num_items, s)`."""
    return rng.choice(num_items, size=n, p=zipf_probs(num_items, s))


def with_unique_rest(shared: Segments, num_prompt_tokens: int, owner_id: int) -> Segments:
    """`shared` runs, then the rest of the prompt as the unique run of request `owner_id`, -(owner_id + 1)."""
    rest = num_prompt_tokens - sum(n for _, n in shared)
    if rest < 0:
        raise ValueError(
            f"request {owner_id}: shared runs {shared} are longer than its prompt "
            f"({num_prompt_tokens} tokens)"
        )
    return tuple(shared) + (((-(owner_id + 1), rest),) if rest else ())


def add_shared_prefixes(
    table: pd.DataFrame, cfg: SharedPrefixConfig | None, rng: np.random.Generator, base_dir: Path = Path(".")
) -> pd.DataFrame:
    """`table` (workloads/generate.py's build_table) with a shared prefix put before the prompts that use one.

    Draws, in order: the length of every prefix (unless fixed), one uniform per row (the row uses a prefix
    when it is below `share`), one Zipf prefix index per row. A row that uses prefix k gets
    shared_segments ((k, length_k),) and num_prompt_tokens + length_k. Without `cfg`, `table` as is.
    """
    if cfg is None:
        return table
    if table["shared_segments"].map(len).any():
        raise ValueError(
            "shared_prefix: the trace's rows already carry prefix identity (Mooncake hash_ids or "
            "servesim prefix_id), whose ids would collide with prefix ids 0..num_prefixes-1; "
            "remove shared_prefix, or replace the trace's lengths with `lengths`"
        )
    lengths = _prefix_lengths(cfg, rng, base_dir)
    uses = rng.random(len(table)) < cfg.share
    which = zipf_draws(cfg.num_prefixes, cfg.zipf_s, len(table), rng)
    out = table.copy()
    out["shared_segments"] = pd.Series(
        [((int(k), int(lengths[k])),) if u else () for u, k in zip(uses, which)],
        dtype=object,
        index=table.index,
    )
    out["num_prompt_tokens"] = table["num_prompt_tokens"].to_numpy() + np.where(uses, lengths[which], 0)
    return out


def assign_semantic_clusters(
    requests: Iterable[Request], cfg: SemanticClustersConfig, rng: np.random.Generator
) -> None:
    """Set every request's `semantic_cluster`: one Zipf draw per distinct prompt (identical prompt
    segments, e.g. parallel samples, share it), distinct prompts taken in id order of first appearance."""
    ordered = sorted(requests, key=lambda r: r.id)
    groups: dict[Segments, int] = {}
    group_of = [groups.setdefault(r.segments(), len(groups)) for r in ordered]
    clusters = zipf_draws(cfg.num_clusters, cfg.zipf_s, len(groups), rng)
    for req, group in zip(ordered, group_of):
        req.semantic_cluster = int(clusters[group])


def _prefix_lengths(cfg: SharedPrefixConfig, rng: np.random.Generator, base_dir: Path) -> np.ndarray:
    """Length of each prefix (int64 tokens, >= 1), indexed by prefix id."""
    if isinstance(cfg.prefix_tokens, int):
        return np.full(cfg.num_prefixes, cfg.prefix_tokens, dtype=np.int64)
    return sample_lengths(cfg.prefix_tokens, cfg.num_prefixes, rng, base_dir)
