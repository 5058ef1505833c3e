"""The cost model's terms for one step at efficiency 1, so a profile fit never re-runs the cost model.

`hardware.cost.step_cost` prices every (layer group, operator) as
`max(compute_s / eff_compute(T), memory_s / eff_memory(T))` summed over groups, plus overheads, where
T is the token rows that operator processes (the step's tokens; the logits rows for the LM head; one
per request in YOCO fast-prefill layers). Those per-entry `compute_s`/`memory_s` (seconds at 100% of the device's
peaks) do not depend on the profile, so they are read once per measured step and the fit evaluates
thousands of candidate profiles with numpy alone.

They are read from `hardware.cost.operator_terms`, the public per-(group, operator) pricing that
`step_cost` itself sums, priced once with every efficiency at 1. `predict_s(terms, profile)` rebuilds
`step_cost(...).total_s`; tests pin that equality.
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

KIND_CODES = {"gemm": 0, "attention": 1, "moe": 2}
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}


@dataclass(frozen=True)
class StepTerms:
    """Per entry (one operator of one layer group): kind code (0 gemm, 1 attention, 2 routed experts), seconds at peak
    compute and at peak memory bandwidth, how many layers it runs in, and the token rows its efficiencies
    are read at. Plus the step's shape, and its layers that attend decodes beside prefill chunks."""

    kind: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    layers: np.ndarray
    tokens: np.ndarray
    num_layers: int
    num_requests: int
    num_tokens: int
    mixed_layers: int


_UNIT = Profile(gemm_compute=EfficiencyCurve.constant(1.0), attn_compute=EfficiencyCurve.constant(1.0),
                gemm_memory=EfficiencyCurve.constant(1.0), attn_memory=EfficiencyCurve.constant(1.0),
                moe_compute=None, moe_memory=None)  # peak seconds for routed experts too


def step_terms(batch: StepBatch, model: ModelSpec, gpu: GpuSpec, options: cost.CostOptions = cost.CostOptions()
               ) -> StepTerms:
    """The profile-independent terms of one step of `batch` (see the module docstring)."""
    terms = cost.operator_terms(batch, model, gpu, cost.Parallelism(), _UNIT, options)
    for term in terms:
        if term.kind not in KIND_CODES:
            raise ValueError(f"operator {term.name!r} of kind {term.kind!r}: only single-device steps can be fitted")
    return StepTerms(np.array([KIND_CODES[t.kind] for t in terms], np.int64), np.array([t.compute_s for t in terms]),
                     np.array([t.memory_s for t in terms]), np.array([t.layers for t in terms], float),
                     np.array([t.tokens for t in terms]), model.num_layers, batch.num_requests,
                     batch.num_tokens, cost.mixed_attention_layers(batch, model, options.kv_sharing_fast_prefill))


def predict_s(terms: StepTerms, profile: Profile) -> float:
    """`step_cost(...).total_s` of the step these terms describe, priced with `profile`."""
    curves = [profile.curves(KIND_NAMES[int(k)]) for k in terms.kind]
    eff_c = np.array([compute.at(t) for (compute, _), t in zip(curves, terms.tokens)])
    eff_m = np.array([memory.at(t) for (_, memory), t in zip(curves, terms.tokens)])
    ops = float((np.maximum(terms.compute_s / eff_c, terms.memory_s / eff_m) * terms.layers).sum())
    return ops + profile.step_overhead_s + profile.layer_overhead_s * terms.num_layers \
        + profile.request_overhead_s * terms.num_requests + profile.token_overhead_s * terms.num_tokens \
        + profile.mixed_layer_overhead_s * terms.mixed_layers
