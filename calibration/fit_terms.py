"""The cost model's terms for one step at efficiency 1, so a profile fit never re-runs the cost model.

`hardware.cost.step_cost` prices every (layer group, operator) as
`max(compute_s / eff_compute(T), memory_s / eff_memory(T))` summed over groups, plus overheads, where
T is the token rows that operator processes (the step's tokens; the logits rows for the LM head; one
per request in YOCO fast-prefill layers). Those per-entry `compute_s`/`memory_s` (seconds at 100% of the device's
peaks) do not depend on the profile, so they are read once per measured step and the fit evaluates
thousands of candidate profiles with numpy alone.

They are read from `hardware.cost.operator_terms`, the public per-(group, operator) pricing that
`step_cost` itself sums, priced once with every efficiency at 1. `calibration.fit.predict_table` rebuilds
`step_cost(...).total_s` from them; tests pin that equality.
Single device only (no TP/PP communication terms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servesim.hardware import cost
from servesim.hardware.batch import StepBatch
from servesim.hardware.gpu import GpuSpec
from servesim.hardware.model import ModelSpec
from servesim.hardware.profile import EfficiencyCurve, Profile

KIND_CODES = {"gemm": 0, "attention": 1, "moe": 2}
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}


@dataclass(frozen=True)
class StepTerms:
    """Per entry (one operator of one layer group): kind code (0 gemm, 1 attention, 2 routed experts), seconds at peak
    compute and at peak memory bandwidth, how many layers it runs in, and the token rows its efficiencies
    are read at. Plus the step's shape, its layers that attend decodes beside prefill chunks and its YOCO
    cross-decoder layers and the tokens its KV-owning layers write."""

    kind: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    layers: np.ndarray
    tokens: np.ndarray
    num_layers: int
    num_requests: int
    num_tokens: int
    mixed_layers: int
    cross_layers: int
    kv_tokens: int  # tokens times the layers that write their KV


# peak seconds for routed experts too
_UNIT = Profile(
    gemm_compute=EfficiencyCurve.constant(1.0),
    attn_compute=EfficiencyCurve.constant(1.0),
    gemm_memory=EfficiencyCurve.constant(1.0),
    attn_memory=EfficiencyCurve.constant(1.0),
    moe_compute=None,
    moe_memory=None,
)


def step_terms(
    batch: StepBatch, model: ModelSpec, gpu: GpuSpec, options: cost.CostOptions = cost.CostOptions()
) -> StepTerms:
    """The profile-independent terms of one step of `batch` (see the module docstring)."""
    terms = cost.operator_terms(batch, model, gpu, cost.Parallelism(), _UNIT, options)
    for term in terms:
        if term.kind not in KIND_CODES:
            raise ValueError(
                f"operator {term.name!r} of kind {term.kind!r}: only single-device steps can be fitted"
            )
    return StepTerms(
        np.array([KIND_CODES[t.kind] for t in terms], np.int64),
        np.array([t.compute_s for t in terms]),
        np.array([t.memory_s for t in terms]),
        np.array([t.layers for t in terms], float),
        np.array([t.tokens for t in terms]),
        model.num_layers,
        batch.num_requests,
        batch.num_tokens,
        cost.mixed_attention_layers(batch, model, options),
        cost.cross_decoder_layers(batch, model, options),
        batch.num_tokens * model.num_kv_layers,
    )
