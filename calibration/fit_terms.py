"""The cost model's terms for one step at efficiency 1, so a profile fit never re-runs the cost model.

`hardware.cost.step_cost` prices every (layer group, operator) as
`max(compute_s / eff_compute(T), memory_s / eff_memory(T))` summed over groups, plus overheads, where
T is the step's token count. Those per-entry `compute_s`/`memory_s` (seconds at 100% of the device's
peaks) do not depend on the profile, so they are read once per measured step and the fit evaluates
thousands of candidate profiles with numpy alone.

They are read from cost.py's own per-group pricing (its private `_context`, `_layer_groups`,
`_layer_group` and `_model_level`): run once with compute efficiency EPS (every entry then reports
compute_s / EPS) and once with memory efficiency EPS. `predict_s(terms, profile)` rebuilds
`step_cost(...).total_s`; tests pin that equality, so a change in cost.py's internals fails loudly.
Single device only (no TP/PP communication terms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hardware import cost
from hardware.batch import StepBatch
from hardware.gpu import GpuSpec
from hardware.model import ModelSpec
from hardware.profile import EfficiencyCurve, Profile

EPS = 1e-6
KIND_CODES = {"gemm": 0, "attention": 1}


@dataclass(frozen=True)
class StepTerms:
    """Per entry (one operator of one layer group): kind code (0 gemm, 1 attention), seconds at peak
    compute and at peak memory bandwidth, and how many layers it runs in. Plus the step's shape."""

    kind: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    layers: np.ndarray
    step_tokens: float
    num_layers: int
    num_requests: int


class _Recorder:
    """Stands in for cost.py's accumulator and keeps every entry instead of summing by name."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, float, int]] = []

    def add(self, name: str, kind: str, flops: float, nbytes: float, timed: tuple[float, str], layers: int) -> None:
        if kind not in KIND_CODES:
            raise ValueError(f"operator {name!r} of kind {kind!r}: only single-device steps can be fitted")
        self.entries.append((kind, timed[0], layers))


def _entries(batch: StepBatch, model: ModelSpec, gpu: GpuSpec, profile: Profile,
             options: cost.CostOptions) -> list[tuple[str, float, int]]:
    ctx, rec = cost._context(batch, model, gpu, cost.Parallelism(), profile, options), _Recorder()
    for group, layers in cost._layer_groups(model, options.kv_sharing_fast_prefill):
        cost._layer_group(ctx, rec, batch, group, layers)
    cost._model_level(ctx, rec, batch)
    return rec.entries


_SLOW = EfficiencyCurve.constant(EPS)
_FULL = EfficiencyCurve.constant(1.0)
_COMPUTE_SLOW = Profile(gemm_compute=_SLOW, attn_compute=_SLOW, gemm_memory=_FULL, attn_memory=_FULL)
_MEMORY_SLOW = Profile(gemm_compute=_FULL, attn_compute=_FULL, gemm_memory=_SLOW, attn_memory=_SLOW)


def step_terms(batch: StepBatch, model: ModelSpec, gpu: GpuSpec, options: cost.CostOptions = cost.CostOptions()
               ) -> StepTerms:
    """The profile-independent terms of one step of `batch` (see the module docstring)."""
    slow_compute = _entries(batch, model, gpu, _COMPUTE_SLOW, options)
    slow_memory = _entries(batch, model, gpu, _MEMORY_SLOW, options)
    kind = np.array([KIND_CODES[k] for k, _, _ in slow_compute], np.int64)
    return StepTerms(kind, np.array([t for _, t, _ in slow_compute]) * EPS,
                     np.array([t for _, t, _ in slow_memory]) * EPS,
                     np.array([n for _, _, n in slow_compute], float), float(max(batch.num_tokens, 1)),
                     model.num_layers, batch.num_requests)


def predict_s(terms: StepTerms, profile: Profile) -> float:
    """`step_cost(...).total_s` of the step these terms describe, priced with `profile`."""
    t = terms.step_tokens
    eff_c = np.where(terms.kind == 0, profile.gemm_compute.at(t), profile.attn_compute.at(t))
    eff_m = np.where(terms.kind == 0, profile.gemm_memory.at(t), profile.attn_memory.at(t))
    ops = float((np.maximum(terms.compute_s / eff_c, terms.memory_s / eff_m) * terms.layers).sum())
    return ops + profile.step_overhead_s + profile.layer_overhead_s * terms.num_layers \
        + profile.request_overhead_s * terms.num_requests
