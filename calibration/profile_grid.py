"""Measure the executor's step time over a grid of batch shapes and return one row per shape.

Shapes: single prefills, a batch of equal prefills, prefill chunks over a cached context, decode
batches x contexts (equal and spread), and mixed steps of decodes plus one prefill chunk (a whole
prompt, or a prompt's second chunk over its first; from a single decode, the step a serving loop runs
most when a prompt arrives, which alone shows what attending decodes beside a chunk costs); for models
with trailing KV-sharing layers every shape runs with YOCO fast prefill off and on. Each shape gets
distinct KV blocks while the pool has room (reading the same blocks again would flatter the cache); a
hybrid-KV executor (sliding-window models) gets the request's table once per KV cache group, so it
builds every group's metadata as a served step does.

Timing (STYLE E20): a warm-up pass over all shapes, then `repeats` rounds that each time every shape
once, synchronised around each call; a shape's `time_s` is the median of its rounds. Interleaving
rounds spreads slow periods of a shared machine over all shapes instead of biasing one. Each timed
call follows `warm` untimed calls of the same shape: a served step mostly follows steps like it, while
a shape timed right after a different, larger one pays for refilling the caches with its weights and
KV (on the 2-core development CPU, a 4-layer scaled Llama decode of one token: 2.0 ms back-to-back,
3.0 ms after a 256-token chunk, 3.6 ms after a 2048-token prefill; it settles over ~3 steps, and a
10 ms prefill still shows it). `warm_calls(device)` is 3 on a CPU and 1 on a GPU, whose weights stream
from HBM every step anyway.
`cpu_time_s` is the calling thread's CPU time (median): with one torch thread on CPU, `time_s` well
above it means other processes took the core (the measurement is then not the device's own speed).
The row columns rebuild the StepBatch (`num_new`, `num_context`, `needs_logits` as JSON lists) and the
model (`model` preset, `scale` JSON), and record device, dtype, torch version and thread count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from servesim.calibration.device import device_name, synchronize
from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import fast_prefill_layers
from servesim.policies.kv_blocks import blocks_for


@dataclass(frozen=True)
class GridSpec:
    """Which shapes to measure; token counts and contexts are per request."""

    prefill_tokens: tuple[int, ...] = (8, 32, 128, 256, 512, 1024, 2048)
    decode_batches: tuple[int, ...] = (1, 4, 16, 48)
    decode_contexts: tuple[int, ...] = (16, 256, 1024, 3072)
    chunk_tokens: int = 256
    chunk_contexts: tuple[int, ...] = (512, 1536)
    mixed_decodes: tuple[int, ...] = (1, 4, 16, 32)
    mixed_chunks: tuple[int, ...] = (64, 512)
    mixed_context: int = 512

    @classmethod
    def quick(cls) -> GridSpec:
        return cls(
            prefill_tokens=(16, 128, 512, 1024),
            decode_batches=(1, 8, 32),
            decode_contexts=(64, 1024),
            chunk_contexts=(512,),
            mixed_decodes=(1, 8, 32),
            mixed_chunks=(128,),
        )

    @classmethod
    def gpu(cls, quick: bool = False) -> GridSpec:
        """Shapes a GPU engine runs (budget 2048 tokens, up to 128 decodes); `quick` keeps a third of them."""
        if quick:
            return cls(
                prefill_tokens=(128, 2048),
                decode_batches=(8, 128),
                decode_contexts=(256, 4096),
                chunk_tokens=2048,
                chunk_contexts=(4096,),
                mixed_decodes=(1, 64),
                mixed_chunks=(512,),
                mixed_context=1024,
            )
        return cls(
            prefill_tokens=(32, 128, 512, 2048, 8192),
            decode_batches=(1, 8, 32, 128),
            decode_contexts=(256, 1024, 4096),
            chunk_tokens=2048,
            chunk_contexts=(2048, 8192),
            mixed_decodes=(1, 16, 64, 128),
            mixed_chunks=(256, 2048),
            mixed_context=1024,
        )

    @classmethod
    def for_device(cls, device: str, quick: bool = False) -> GridSpec:
        if str(device).startswith("cuda"):
            return cls.gpu(quick)
        return cls.quick() if quick else cls()


def grid_shapes(grid: GridSpec, seed: int = 0) -> list[tuple[str, StepBatch]]:
    """(label, batch) per shape, in a fixed order."""
    rng = np.random.default_rng(seed)
    shapes = [(f"prefill {n}", StepBatch.uniform(1, 0, n)) for n in grid.prefill_tokens]
    shapes.append(("prefill 4x128", StepBatch.uniform(4, 0, 128)))
    shapes += [
        (f"chunk {grid.chunk_tokens}@{c}", StepBatch.of([grid.chunk_tokens], [c], [i % 2 == 0]))
        for i, c in enumerate(grid.chunk_contexts)
    ]
    shapes += [
        (f"decode {b}x{c}", StepBatch.uniform(b, c))
        for b in grid.decode_batches
        for c in grid.decode_contexts
    ]
    spread = max(grid.decode_contexts)
    shapes += [
        (f"decode {b} spread", StepBatch.of([1] * b, np.sort(rng.integers(16, spread, b))))
        for b in grid.decode_batches
        if b > 1
    ]
    shapes += [
        (f"mixed {b}+{n}", StepBatch.of([1] * b + [n], [grid.mixed_context] * b + [0]))
        for b in grid.mixed_decodes
        for n in grid.mixed_chunks
    ]
    # what chunked prefill serves most: decodes riding along with the next chunk of a prompt already begun
    shapes += [
        (
            f"mixed {b}+{n}@{n}",
            StepBatch.of([1] * b + [n], [grid.mixed_context] * b + [n], [True] * b + [False]),
        )
        for b in grid.mixed_decodes
        for n in grid.mixed_chunks
    ]
    return shapes


def blocks_for_batch(batch: StepBatch, block_size: int) -> int:
    return sum(blocks_for(int(n + c), block_size) for n, c in zip(batch.num_new, batch.num_context))


def _tables(batch: StepBatch, block_size: int, num_blocks: int) -> list[list[int]]:
    """Consecutive distinct blocks per request, wrapping around when the pool is smaller than the batch."""
    tables, nxt = [], 0
    for n, c in zip(batch.num_new, batch.num_context):
        need = blocks_for(int(n + c), block_size)
        tables.append([(nxt + i) % num_blocks for i in range(need)])
        nxt += need
    return tables


def profile_grid(
    ex,
    shapes: list[tuple[str, StepBatch]],
    model: str,
    scale: dict,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    warm: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """Median step time of `ex` (a calibration Executor) for every shape; one DataFrame row per
    (shape, fast prefill on/off). `model` and `scale` are recorded to rebuild the ModelSpec.
    `progress(rounds_done)` runs after each of the `warmup + repeats` rounds, outside the timed calls."""
    import torch

    from servesim.calibration.executor import StepInput

    rng = np.random.default_rng(seed)
    modes = (False, True) if fast_prefill_layers(ex.spec) else (False,)
    cases = [
        (
            label,
            batch,
            fast,
            StepInput.from_batch(
                batch, _tables(batch, ex.block_size, ex.num_blocks), ex.spec.vocab_size, rng, ex.num_kv_groups
            ),
        )
        for label, batch in shapes
        for fast in modes
    ]
    device = str(ex.device)
    warm = warm_calls(device) if warm is None else warm
    progress = progress or (lambda done: None)
    for w in range(warmup):
        for _, _, fast, inp in cases:
            ex.fast_prefill = fast
            ex.execute(inp)
        progress(w + 1)
    times, cpu_times = np.empty((repeats, len(cases))), np.empty((repeats, len(cases)))
    for r in range(repeats):
        for i, (_, _, fast, inp) in enumerate(cases):
            ex.fast_prefill = fast
            for _ in range(warm):
                ex.execute(inp)
            synchronize(device)
            start, cpu_start = time.perf_counter(), time.thread_time()
            ex.execute(inp)
            synchronize(device)
            times[r, i], cpu_times[r, i] = time.perf_counter() - start, time.thread_time() - cpu_start
        progress(warmup + r + 1)
    rows = [
        _row(label, batch, fast, times[:, i]) | {"cpu_time_s": float(np.median(cpu_times[:, i]))}
        for i, (label, batch, fast, _) in enumerate(cases)
    ]
    df = pd.DataFrame(rows)
    meta = {
        "model": model,
        "scale": json.dumps(scale, sort_keys=True),
        "num_layers": ex.spec.num_layers,
        "block_size": ex.block_size,
        "device": device,
        "device_name": device_name(device),
        "dtype": str(ex.dtype).removeprefix("torch."),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    return df.assign(**meta)


def warm_calls(device: str) -> int:
    """Untimed calls of a shape before each timed one (see the module docstring)."""
    return 1 if str(device).startswith("cuda") else 3


def _row(label: str, batch: StepBatch, fast: bool, times: np.ndarray) -> dict:
    return {
        "shape": label,
        "kind": label.split()[0],
        "fast_prefill": fast,
        "num_requests": batch.num_requests,
        "num_tokens": batch.num_tokens,
        "num_logits": batch.num_logits,
        "max_query_len": batch.max_query_len,
        "sum_context": int(batch.num_context.sum()),
        "num_new": json.dumps(batch.num_new.tolist()),
        "num_context": json.dumps(batch.num_context.tolist()),
        "needs_logits": json.dumps(batch.needs_logits.tolist()),
        "time_s": float(np.median(times)),
        "time_min_s": float(times.min()),
        "time_max_s": float(times.max()),
        "repeats": len(times),
    }
