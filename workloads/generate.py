"""From a `WorkloadConfig` to the requests of one run: a pure function of (config, rng, files).

Order of work (and of draws from `rng`, so a seed fixes everything):
1. the trace table, if any (servegen draws its arrivals and lengths here); `skip_requests` leading
   rows are dropped and the rest shifted to start at t = 0;
2. arrival times: the trace's (first `num_requests` rows, rescaled, then rows at or after
   `duration_s` dropped) or a synthetic process (workloads/arrivals.py), capped at the trace's row count;
3. lengths: `lengths` sampled (prompt then output), or the trace's rows in order. A trace's
   `session_id` and `priority` columns (servesim format) pass through either way.

Prefix identity (`Request.prompt_segments`):
- Mooncake rows: one segment per hash id, 512 tokens each, the last one the remainder.
- servesim rows with a `prefix_id`: `((prefix_id, prefix_tokens), (-(id + 1), rest))`. The unique
  rest gets a *negative* id (request id + 1, negated) so it never collides with a prefix id (>= 0).
- Everything else, and any trace whose lengths `lengths` replaces: `()` (fully unique prompt).
With `closed_loop`, the simulator sends the requests in this order as its clients free up and decides
their send times; the `arrival_s` computed here are then not used for issuing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.arrivals import constant_arrivals, gamma_arrivals, poisson_arrivals, rescale_times
from workloads.config import ClosedLoopConfig, WorkloadConfig
from workloads.distributions import sample_lengths
from workloads.request import Request
from workloads.traces import MOONCAKE_BLOCK_TOKENS, load_source, resolve_path

__all__ = ["Workload", "build_table", "build_workload", "constant_arrivals", "gamma_arrivals",
           "poisson_arrivals"]

Segments = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Workload:
    """The requests of one run (ids 0..n-1 in arrival order) and how the simulator should issue them."""

    requests: list[Request]
    closed_loop: ClosedLoopConfig | None = None


def build_workload(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path) -> Workload:
    """Requests for `cfg`; relative trace paths resolve against `base_dir` (the scenario's folder)."""
    table = build_table(cfg, rng, base_dir)
    requests = [Request(id=i, arrival_s=float(row.arrival_s), num_prompt_tokens=int(row.num_prompt_tokens),
                        num_output_tokens=int(row.num_output_tokens), prompt_segments=row.prompt_segments,
                        session_id=None if pd.isna(row.session_id) else int(row.session_id),
                        priority=int(row.priority))
                for i, row in enumerate(table.itertuples(index=False))]
    return Workload(requests=requests, closed_loop=cfg.closed_loop)


def build_table(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path) -> pd.DataFrame:
    """The workload as columns: arrival_s (s), num_prompt_tokens, num_output_tokens, prompt_segments,
    session_id (Int64, may be NA), priority; one row per request in arrival order."""
    rows = _trace_rows(cfg, rng, base_dir)
    arrival_s = _arrival_times(cfg, rows, rng)
    n = arrival_s.size
    src = None if rows is None else rows.iloc[:n].reset_index(drop=True)
    if cfg.lengths is not None:
        prompt = sample_lengths(cfg.lengths.prompt, n, rng, base_dir)
        output = sample_lengths(cfg.lengths.output, n, rng, base_dir)
        segments = pd.Series([()] * n, dtype=object)
    else:
        prompt, output = src["num_prompt_tokens"].to_numpy(), src["num_output_tokens"].to_numpy()
        segments = _segments(src)
    return pd.DataFrame({"arrival_s": arrival_s, "num_prompt_tokens": prompt, "num_output_tokens": output,
                         "prompt_segments": segments,
                         "session_id": _column(src, "session_id", pd.NA, "Int64", n),
                         "priority": _column(src, "priority", 0, "int64", n)})


def _column(src: pd.DataFrame | None, name: str, default: object, dtype: str, n: int) -> pd.Series:
    """A pass-through trace column, or `default` everywhere when the trace has none."""
    if src is not None and name in src:
        return src[name].astype(dtype)
    return pd.Series([default] * n, dtype=dtype)


def _trace_rows(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path) -> pd.DataFrame | None:
    """The trace table after `skip_requests`, times shifted to start at 0; None without a trace."""
    if cfg.trace is None:
        return None
    table = load_source(cfg.trace, base_dir, rng, cfg.duration_s)
    if cfg.skip_requests >= len(table):
        raise ValueError(f"{resolve_path(cfg.trace.path, base_dir)}: skip_requests ({cfg.skip_requests}) "
                         f"leaves none of its {len(table)} rows")
    rows = table.iloc[cfg.skip_requests:].reset_index(drop=True)
    rows["arrival_s"] = rows["arrival_s"] - rows["arrival_s"].iloc[0]
    return rows


def _arrival_times(cfg: WorkloadConfig, rows: pd.DataFrame | None, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s), ascending, one per request of the run."""
    arrivals, n_max = cfg.arrivals, cfg.num_requests
    if rows is not None:
        n_max = len(rows) if n_max is None else min(n_max, len(rows))
    match arrivals.kind:
        case "trace":
            return _trace_times(cfg, rows, n_max)
        case "all_at_once":
            return np.zeros(n_max)
        case "constant":
            return constant_arrivals(arrivals.rate_per_s, n_max, cfg.duration_s)
        case "poisson":
            return poisson_arrivals(arrivals.rate_per_s, rng, n_max, cfg.duration_s)
        case "gamma":
            return gamma_arrivals(arrivals.rate_per_s, arrivals.cv, rng, n_max, cfg.duration_s)
    raise ValueError(f"unknown arrival kind {arrivals.kind!r}")


def _trace_times(cfg: WorkloadConfig, rows: pd.DataFrame, n_max: int) -> np.ndarray:
    times = rows["arrival_s"].to_numpy()[:n_max]
    if np.isnan(times).any():
        raise ValueError(f"{cfg.trace.path}: arrivals.kind 'trace' but the trace has no timestamps")
    times = rescale_times(times, cfg.arrivals.rate_per_s, cfg.arrivals.time_scale)
    return times if cfg.duration_s is None else times[times < cfg.duration_s]


def _segments(rows: pd.DataFrame) -> pd.Series:
    """Prompt segments per row (see the module docstring)."""
    prompt = rows["num_prompt_tokens"].to_numpy()
    if "hash_ids" in rows:
        segs = [_block_segments(ids, int(p)) for ids, p in zip(rows["hash_ids"], prompt)]
    elif "prefix_id" in rows:
        segs = [_prefix_segments(i, pid, plen, int(p))
                for i, (pid, plen, p) in enumerate(zip(rows["prefix_id"], rows["prefix_tokens"], prompt))]
    else:
        segs = [()] * len(rows)
    return pd.Series(segs, dtype=object)


def _block_segments(hash_ids: tuple[int, ...], num_prompt_tokens: int) -> Segments:
    """Mooncake blocks: every block 512 tokens but the last, which holds the remainder."""
    last = num_prompt_tokens - MOONCAKE_BLOCK_TOKENS * (len(hash_ids) - 1)
    return tuple((int(h), MOONCAKE_BLOCK_TOKENS if k < len(hash_ids) - 1 else last)
                 for k, h in enumerate(hash_ids))


def _prefix_segments(request_id: int, prefix_id, prefix_tokens, num_prompt_tokens: int) -> Segments:
    if pd.isna(prefix_id):
        return ()
    shared = ((int(prefix_id), int(prefix_tokens)),)
    rest = num_prompt_tokens - int(prefix_tokens)
    return shared + (((-(request_id + 1), rest),) if rest > 0 else ())
