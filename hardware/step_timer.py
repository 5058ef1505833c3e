"""Step times for the simulator's hot path, bit-for-bit equal to `step_cost(...).total_s`.

A step's cost splits into attention (depends on every request's context) and everything else
(depends only on how many tokens, requests and logits the step has, whether it prefills, and whether
it attends decodes beside prefill chunks). The second part is cached by that shape. For a stretch of
decode-only steps, where every request adds one token per step, the attention part of all steps is
computed at once with numpy, using the same operations in the same order as a single step, so
fast-forwarded and stepped simulations give identical times.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import cached_property

import numpy as np

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import (
    SMALL_BATCH,
    CostOptions,
    FixedParts,
    Parallelism,
    attention_seconds,
    decode_stretch_attention_s,
    decode_stretch_pricer,
    eager_floor_s,
    fixed_seconds,
    rank_peaks,
    shrinking_stretch_pricer,
    small_attention_pricer,
    stage_attention_seconds,
    stage_fixed_seconds,
)
from servesim.hardware.gpu import GpuSpec
from servesim.hardware.model import ModelSpec, pipeline_stages, resolve_weight_dtype
from servesim.hardware.profile import Profile


# shapes kept per cache before it starts over: MLA prefill keys (per DP rank) rarely repeat
CACHE_ENTRIES = 1 << 17


class StepTimer:
    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        parallelism: Parallelism = Parallelism(),
        profile: Profile = Profile(),
        options: CostOptions = CostOptions(),
    ):
        self.model, self.gpu, self.parallelism = model, gpu, parallelism
        # as it prices this GPU and these experts
        self.profile = profile.for_gpu(gpu.name).for_experts(
            resolve_weight_dtype(model, options.weight_dtype)
        )
        self.options = options
        # the cost functions' leading arguments, in their order
        self.args = (model, gpu, parallelism, self.profile, options)
        self._fixed_s: dict[tuple, float] = {}
        self._stage_fixed_s: dict[tuple, list[float]] = {}
        self.stage_layers = pipeline_stages(model.num_layers, parallelism.pp)
        # (small_attention_pricer, decode_stretch_pricer, shrinking_stretch_pricer), built on first use
        self._lean: tuple | None = None
        # the fixed part from parts cached by what each reads, where that applies
        self._parts = FixedParts(*self.args) if FixedParts.applies(model, parallelism, options) else None
        # a step run outside CUDA graphs lasts at least as long as the host takes to launch it (`eager_layer_s`)
        self.eager_floor_s = self.profile.eager_layer_s * model.num_layers

    def _floor_s(self, num_tokens: int, prefills: bool) -> float:
        """`eager_floor_s` of a step of `num_tokens` tokens (checked first against a profile without a floor)."""
        if not self.eager_floor_s:
            return 0.0
        return eager_floor_s(self.model, self.profile, self.options, num_tokens, prefills)

    def _floored(self, seconds, num_tokens: int, prefills: bool):
        """`seconds` (a step's, or a stretch's array of them) held at `_floor_s`."""
        floor = self._floor_s(num_tokens, prefills)
        if not floor:
            return seconds
        return np.maximum(seconds, floor) if isinstance(seconds, np.ndarray) else max(seconds, floor)

    def _decode_floor_s(self, num_requests: int) -> float:
        """`_floor_s` of a decode step of `num_requests` requests."""
        return self._floor_s(num_requests * self.options.decode_query_len, False)

    def _step_shape(self, batch: StepBatch) -> tuple:
        """What the non-attention operators depend on (MLA's expansion also on prefill contexts): the step's own
        shape, and for labelled DP ranks their peaks (an unlabelled deal's are its rank's)."""
        peaks = rank_peaks(batch) if self.parallelism.dp_attention else None
        return self._own_shape(batch) + peaks if peaks else self._own_shape(batch)

    def _rank_key(self, step: tuple, rank: StepBatch) -> tuple:
        """`step` (`_step_shape`) with, under DP attention, the shape of `rank`, the requests one GPU attends for."""
        return step + self._own_shape(rank) if self.parallelism.dp_attention else step

    def _own_shape(self, batch: StepBatch) -> tuple:
        decode_query_len = self.options.decode_query_len
        key = (
            batch.num_tokens,
            batch.num_requests,
            batch.num_logits,
            batch.max_query_len > 1,
            batch.is_mixed(decode_query_len),
        )
        if self.model.mla is not None:
            prefill = batch.num_new > decode_query_len
            # decode queries' tokens: 1 + k each when verifying
            key += (
                int((batch.num_new[prefill] + batch.num_context[prefill]).sum()),
                int((~prefill).sum()),
                int(batch.num_new[~prefill].sum()),
            )
        return key

    def _decode_shape(self, num_requests: int) -> tuple:
        """`_shape` of a decode step of `num_requests` requests, without building the batch (its busiest DP rank
        holds ceil(n / tp) of them)."""

        def own(n: int) -> tuple:
            return (n, n, n, False, False) + ((0, n, n) if self.model.mla is not None else ())

        if self.parallelism.dp_attention:
            return own(num_requests) + own(-(-num_requests // self.parallelism.attention_ranks))
        return own(num_requests)

    def fixed_s(self, batch: StepBatch, rank: StepBatch | None = None) -> float:
        """`step_cost(batch, rank=rank).fixed_s`; `rank` None: its busiest."""
        if rank is None:
            rank = self._busiest(batch)
        return self._fixed(self._step_shape(batch), batch, rank)

    def _fixed(self, step: tuple, batch: StepBatch, rank: StepBatch) -> float:
        """`fixed_s` given the step's shape (`_step_shape(batch)`), which a DP step's ranks share."""
        key = self._rank_key(step, rank)
        fixed = self._fixed_s.get(key)
        if fixed is None:
            if len(self._fixed_s) >= CACHE_ENTRIES:
                self._fixed_s.clear()
            parts = self._parts
            fixed = self._fixed_s[key] = (
                parts(batch)
                if parts is not None and rank is batch
                else fixed_seconds(batch, *self.args, rank)
            )
        return fixed

    def decode_fixed_s(self, num_requests: int, num_context: np.ndarray) -> float:
        """`fixed_s` of a decode step of `num_requests` requests (the key needs no batch, only a miss does)."""
        fixed = self._fixed_s.get(self._decode_shape(num_requests))
        if fixed is None:
            fixed = self.fixed_s(StepBatch.of(np.ones(num_requests, np.int64), num_context))
        return fixed

    def lists_s(
        self, num_new: Sequence[int], num_context: Sequence[int], needs_logits: Sequence[bool]
    ) -> float:
        """`self(StepBatch.of(num_new, num_context, needs_logits))`, without building the batch when it is small and
        `small_attention_pricer` can price it (the common step of a simulation)."""
        small_attention_s = self._lean_pricers()[0]
        if small_attention_s is None or not 0 < len(num_new) <= SMALL_BATCH:
            return self(StepBatch.of(num_new, num_context, needs_logits))
        top = max(num_new)
        decode_query_len = self.options.decode_query_len
        # `_own_shape`'s key
        key = (sum(num_new), len(num_new), sum(needs_logits), top > 1, min(num_new) <= decode_query_len < top)
        fixed = self._fixed_s.get(key)
        if fixed is None:
            batch = StepBatch.of(num_new, num_context, needs_logits)
            fixed = self._fixed(key, batch, batch)
        return self._floored(fixed + small_attention_s(num_new, num_context), key[0], top > decode_query_len)

    @cached_property
    def chunk_step_pricer(self) -> Callable[[int, int, int, int, bool], float] | None:
        """`lists_s` of a step of `decodes` one-token decodes, whose contexts plus one sum to `decode_keys`, beside a
        prompt chunk of `chunk` tokens after `fed` that samples if `last`, from those sums alone (the step a chunked
        prefill's fast-forward prices again and again); None where attention needs more than the batch's sums (sliding
        windows, DP attention, MLA, fast prefill). Built on first use."""
        attention = self._lean_pricers()[0]
        if attention is None or not attention.windowless:
            return None
        fixed_s, decode_query_len, floored = self._fixed_s, self.options.decode_query_len, self._floored

        def price(decodes: int, decode_keys: int, chunk: int, fed: int, last: bool) -> float:
            top, low = (max(chunk, 1), min(chunk, 1)) if decodes else (chunk, chunk)
            # `_own_shape`'s key
            key = (decodes + chunk, decodes + 1, decodes + last, top > 1, low <= decode_query_len < top)
            fixed = fixed_s.get(key)
            if fixed is None:  # the fixed part depends on the shape alone: any contexts give it
                batch = StepBatch.of(
                    [1] * decodes + [chunk], [0] * decodes + [fed], [True] * decodes + [last]
                )
                fixed = self._fixed(key, batch, batch)
            seconds = fixed + attention.from_sums(decodes, decode_keys, chunk, fed)
            return floored(seconds, decodes + chunk, chunk > decode_query_len)

        return price

    def _lean_pricers(self) -> tuple:
        """The cost model's pricers that skip building a batch (`small_attention_pricer`, `decode_stretch_pricer`,
        `shrinking_stretch_pricer`), each None where it does not apply; built on first use, so a bad configuration
        fails where it always did."""
        if self._lean is None:
            self._lean = (
                small_attention_pricer(*self.args),
                decode_stretch_pricer(*self.args),
                shrinking_stretch_pricer(*self.args),
            )
        return self._lean

    @property
    def attention_pricer(self):
        """`small_attention_pricer` of this timer's setup, or None: what a compiled engine may price attention
        with."""
        return self._lean_pricers()[0]

    def __call__(self, batch: StepBatch) -> float:
        """Seconds of one step of `batch`: of its DP-attention ranks' steps, the longest."""
        seconds = max(self._rank_steps(batch, self.parallelism.rank_batches(batch)))
        return self._floored(seconds, batch.num_tokens, batch.max_query_len > self.options.decode_query_len)

    def _rank_steps(self, batch: StepBatch, candidates: list[StepBatch]) -> list[float]:
        """Seconds of the step with each of `candidates` as the requests one GPU attends for."""
        step = self._step_shape(batch)
        return [
            self._fixed(step, batch, rank) + attention_seconds(batch, *self.args, rank) for rank in candidates
        ]

    def _busiest(self, batch: StepBatch) -> StepBatch:
        """`busiest_rank` from the cached fixed parts: the candidate whose step lasts longest (the first of equals)."""
        candidates = self.parallelism.rank_batches(batch)
        if len(candidates) == 1:
            return candidates[0]
        totals = self._rank_steps(batch, candidates)
        return candidates[totals.index(max(totals))]

    def stage_s(self, batch: StepBatch, extra_s: float = 0.0) -> list[float]:
        """Seconds of one step of `batch` on each pipeline stage (`stage_seconds`, its non-attention part cached
        by shape), with `extra_s` (swaps, drafts) spread over the stages by their layers. Under DP attention each
        stage lasts as long as its slowest rank there."""
        step, layers = self._step_shape(batch), sum(self.stage_layers)
        ranks = [self._rank_stage_s(batch, step, rank) for rank in self.parallelism.rank_batches(batch)]
        floor = self._floor_s(batch.num_tokens, batch.max_query_len > self.options.decode_query_len)
        return [
            max(max(times), floor * count / layers) + extra_s * count / layers
            for times, count in zip(zip(*ranks), self.stage_layers)
        ]

    def _rank_stage_s(self, batch: StepBatch, step: tuple, rank: StepBatch) -> list[float]:
        """Each stage's seconds with `rank` as the requests one GPU attends for (`step`: `_step_shape(batch)`)."""
        key = self._rank_key(step, rank)
        fixed = self._stage_fixed_s.get(key)
        if fixed is None:
            if len(self._stage_fixed_s) >= CACHE_ENTRIES:
                self._stage_fixed_s.clear()
            fixed = self._stage_fixed_s[key] = stage_fixed_seconds(batch, *self.args, rank)
        return [
            fixed_s + attention_s
            for fixed_s, attention_s in zip(fixed, stage_attention_seconds(batch, *self.args, rank))
        ]

    def decode_stretch_s(self, num_context: np.ndarray, num_steps: int) -> np.ndarray:
        """Seconds of `num_steps` consecutive decode steps of the same requests, whose contexts start at
        `num_context` and grow by one token per step."""
        stretch_attention_s = self._lean_pricers()[1]
        if stretch_attention_s is None:
            attention = decode_stretch_attention_s(num_context, num_steps, *self.args)
        else:
            attention = stretch_attention_s(num_context, num_steps)
        seconds = self.decode_fixed_s(len(num_context), num_context) + (0 + attention)
        return self._floored(seconds, len(num_context) * self.options.decode_query_len, False)

    def shrinking_stretch_s(self, num_context: np.ndarray, finish: np.ndarray, num_steps: int) -> np.ndarray:
        """Seconds of `num_steps` decode steps in which request j (context `num_context[j]` before the first) decodes
        up to step `finish[j]`: the batch shrinks after each finishing step. Each step as `decode_stretch_s` prices
        the steps of its requests, in one pass where the roofline prices attention."""
        pricer, finishes = self._lean_pricers()[2], sorted(finish.tolist())
        bounds = [f + 1 for f in sorted(set(finishes)) if f < num_steps - 1] + [num_steps]
        if len(bounds) == 1:  # nobody leaves: one size throughout
            return self.decode_stretch_s(num_context, num_steps)
        if pricer is None:
            parts, start = [], 0
            for end in bounds:
                parts.append(self.decode_stretch_s(num_context[finish >= start] + start, end - start))
                start = end
            return np.concatenate(parts)
        fixed, floors, start = [], [], 0
        for end in bounds:  # each size's fixed part, from the batch a stepped step of that size would price
            size = len(finishes) - bisect_left(finishes, start)  # requests decoding from `start` on
            fixed_s = self._fixed_s.get(self._decode_shape(size))
            if fixed_s is None:
                fixed_s = self.decode_fixed_s(size, num_context[finish >= start] + start)
            fixed += [fixed_s] * (end - start)
            floors += [self._decode_floor_s(size)] * (end - start)
            start = end
        seconds = np.array(fixed) + (0 + pricer(num_context, finish, num_steps))
        return np.maximum(seconds, floors) if self.eager_floor_s else seconds
