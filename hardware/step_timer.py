"""Step times for the simulator's hot path, bit-for-bit equal to `step_cost(...).total_s`.

A step's cost splits into attention (depends on every request's context) and everything else
(depends only on how many tokens, requests and logits the step has). The second part is cached
by that shape. For a stretch of decode-only steps, where every request adds one token per step,
the attention part of all steps is computed at once with numpy, using the same operations in the
same order as a single step, so fast-forwarded and stepped simulations give identical times.
"""

from __future__ import annotations

import numpy as np

from hardware.batch import StepBatch
from hardware.cost import (CostOptions, Parallelism, _context, _layer_groups, attention_seconds, attention_terms,
                           step_cost)
from hardware.gpu import GpuSpec
from hardware.model import ModelSpec
from hardware.profile import Profile


class StepTimer:
    def __init__(self, model: ModelSpec, gpu: GpuSpec, parallelism: Parallelism = Parallelism(),
                 profile: Profile = Profile(), options: CostOptions = CostOptions()):
        self.args = (model, gpu, parallelism, profile, options)
        self._fixed_s: dict[tuple, float] = {}

    def _shape(self, batch: StepBatch) -> tuple:
        """What the non-attention operators depend on (MLA's expansion also on prefill contexts)."""
        key = (batch.num_tokens, batch.num_requests, batch.num_logits, batch.max_query_len > 1)
        if self.args[0].mla is not None:
            prefill = batch.num_new > 1
            key += (int((batch.num_new[prefill] + batch.num_context[prefill]).sum()), int((~prefill).sum()))
        return key

    def fixed_s(self, batch: StepBatch) -> float:
        key = self._shape(batch)
        fixed = self._fixed_s.get(key)
        if fixed is None:
            fixed = self._fixed_s[key] = step_cost(batch, *self.args).fixed_s
        return fixed

    def decode_fixed_s(self, num_requests: int, num_context: np.ndarray) -> float:
        """`fixed_s` of a decode step of `num_requests` requests (the key needs no batch, only a miss does)."""
        key = (num_requests, num_requests, num_requests, False)
        if self.args[0].mla is not None:
            key += (0, num_requests)
        fixed = self._fixed_s.get(key)
        if fixed is None:
            fixed = self.fixed_s(StepBatch.of(np.ones(num_requests, np.int64), num_context))
        return fixed

    def __call__(self, batch: StepBatch) -> float:
        """Seconds of one step of `batch`."""
        return self.fixed_s(batch) + attention_seconds(batch, *self.args)

    def decode_stretch_s(self, num_context: np.ndarray, num_steps: int) -> np.ndarray:
        """Seconds of `num_steps` consecutive decode steps of the same requests, whose contexts start at
        `num_context` and grow by one token per step."""
        model = self.args[0]
        batch = StepBatch.of(np.ones(len(num_context), np.int64), num_context)
        ctx = _context(batch, *self.args)
        steps = np.arange(num_steps, dtype=np.int64)
        attention = np.zeros(num_steps)
        for group, layers in _layer_groups(model, self.args[4].kv_sharing_fast_prefill):
            keys = _decode_keys(num_context, steps, group.window)
            _, _, compute_s, memory_s = attention_terms(ctx, group.owns_kv, True, keys, keys, batch.num_tokens)
            attention += np.maximum(compute_s, memory_s) * layers
        return self.decode_fixed_s(len(num_context), num_context) + (0 + attention)


def _decode_keys(num_context: np.ndarray, steps: np.ndarray, window: int | None) -> np.ndarray:
    """Per step: keys all requests attend over when each decodes at context + step (capped by a window).

    For a decode, the keys attended and the distinct KV tokens read are both min(context + 1, window).
    """
    c = num_context.astype(np.int64)
    if window is None:
        return int(c.sum()) + len(c) * (steps + 1)
    return np.minimum(c[None, :] + 1 + steps[:, None], window).sum(axis=1)
