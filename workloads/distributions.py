"""Sampling the `Dist` models of workloads/config.py with an injected numpy Generator.

`sample_values` gives raw floats (seconds for think times); `sample_lengths` turns them into token
counts: nearest integer, then at least 1. `draw_outputs` gives extra output lengths for requests a
workload adds (parallel samples, later session turns).
"""

from __future__ import annotations

import math

from pathlib import Path

import numpy as np
import pandas as pd

from servesim.workloads.config import (
    Dist,
    EmpiricalDist,
    FixedDist,
    LognormalDist,
    SequenceDist,
    NormalDist,
    UniformDist,
    WorkloadConfig,
)
from servesim.workloads.dist_config import MAX_VALUE
from servesim.workloads.traces import load_source


def sample_values(dist: Dist, n: int, rng: np.random.Generator, base_dir: Path = Path(".")) -> np.ndarray:
    """`n` float64 samples of `dist`; `base_dir` resolves an empirical trace's relative path."""
    match dist:
        case FixedDist():
            return np.full(n, dist.value, dtype=np.float64)
        case UniformDist():
            return rng.uniform(dist.low, dist.high, size=n)
        case NormalDist():
            return _truncated_normal(dist, n, rng)
        case LognormalDist():
            return rng.lognormal(np.log(dist.median), dist.sigma, size=n)
        case EmpiricalDist():
            return rng.choice(_empirical_column(dist, base_dir), size=n, replace=True).astype(np.float64)
        case SequenceDist():
            return np.resize(np.asarray(dist.values, dtype=np.float64), n)
    raise TypeError(f"unknown distribution {dist!r}")


def sample_lengths(dist: Dist, n: int, rng: np.random.Generator, base_dir: Path = Path(".")) -> np.ndarray:
    """`n` counts (int64, >= 1): samples rounded to the nearest integer, then clipped up to 1. A uniform takes
    every integer in [low, high] equally often (rounding a continuous draw gives the two ends half as many: 1-6
    turns would be 1 or 6 a tenth of the time each instead of a sixth)."""
    low = max(1, math.ceil(dist.low)) if dist.kind == "uniform" else 0
    if dist.kind == "uniform" and low <= math.floor(dist.high):
        values = rng.integers(low, math.floor(dist.high), size=n, endpoint=True)
    else:
        values = np.rint(sample_values(dist, n, rng, base_dir))
    return np.clip(values, 1, MAX_VALUE).astype(np.int64)  # a far tail stays a count int64 holds


def draw_outputs(
    cfg: WorkloadConfig, table: pd.DataFrame, n: int, rng: np.random.Generator, base_dir: Path = Path(".")
) -> np.ndarray:
    """`n` output lengths (int64 tokens) drawn like the workload's others: from `lengths.output`, or
    resampled with replacement from the trace rows in `table`. Draws nothing when n == 0."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if cfg.lengths is not None:
        return sample_lengths(cfg.lengths.output, n, rng, base_dir)
    return rng.choice(table["num_output_tokens"].to_numpy(np.int64), size=n, replace=True)


def _truncated_normal(dist: NormalDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """Exact truncation by resampling out-of-bounds draws; config guarantees enough mass in bounds."""
    lo = -np.inf if dist.min is None else dist.min
    hi = np.inf if dist.max is None else dist.max
    out = rng.normal(dist.mean, dist.std, size=n)
    bad = (out < lo) | (out > hi)
    while bad.any():
        out[bad] = rng.normal(dist.mean, dist.std, size=int(bad.sum()))
        bad = (out < lo) | (out > hi)
    return out


def _empirical_column(dist: EmpiricalDist, base_dir: Path) -> np.ndarray:
    column = "num_prompt_tokens" if dist.column == "prompt" else "num_output_tokens"
    values = load_source(dist.trace, base_dir)[column].to_numpy()
    if values.size == 0:
        raise ValueError(f"{dist.trace.path}: empirical distribution over an empty trace")
    return values
