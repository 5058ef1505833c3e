"""The shape grid, its measured rows, and the CPU written as a GPU-catalog device."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest

from servesim.calibration.calibrate import row_batch
from servesim.calibration.device import cpu_gpu_entry, time_call_s, write_gpu_yaml
from servesim.calibration.profile_grid import (
    GridSpec,
    blocks_for_batch,
    grid_shapes,
    profile_grid,
    warm_calls,
)
from servesim.hardware.batch import StepBatch
from servesim.hardware.gpu import gpu_catalog
from tests.calibration.conftest import tiny_executor


def test_grid_covers_prefill_decode_chunks_and_mixed_steps():
    shapes = dict(grid_shapes(GridSpec.quick()))
    assert shapes["prefill 512"].num_tokens == 512 and shapes["prefill 512"].num_context.tolist() == [0]
    decode = shapes["decode 8x1024"]
    assert decode.num_new.tolist() == [1] * 8 and decode.num_context.tolist() == [1024] * 8
    mixed = shapes["mixed 8+128"]
    assert mixed.num_new.tolist() == [1] * 8 + [128] and mixed.num_context.tolist() == [512] * 8 + [0]
    assert shapes["chunk 256@512"].num_context.tolist() == [512]
    # one decode beside a chunk: the mixed cost alone
    assert shapes["mixed 1+128"].num_new.tolist() == [
        1,
        128,
    ]
    assert blocks_for_batch(StepBatch.of([1, 20], [15, 0]), 16) == 1 + 2


def test_gpu_grid_covers_a_gpu_engine_budget():
    shapes = dict(grid_shapes(GridSpec.for_device("cuda")))
    assert shapes["decode 128x4096"].num_tokens == 128 and shapes["prefill 8192"].num_tokens == 8192
    assert shapes["mixed 128+2048"].num_tokens == 128 + 2048
    assert GridSpec.for_device("cpu", quick=True) == GridSpec.quick()


def test_rows_rebuild_their_batch_and_cover_fast_prefill_both_ways():
    ex = tiny_executor("gemma3n", num_blocks=64)
    shapes = [("prefill 9", StepBatch.uniform(1, 0, 9)), ("mixed 2+5", StepBatch.of([1, 1, 5], [7, 12, 0]))]
    rows = profile_grid(ex, shapes, "gemma-3n-e2b", {"layers": 6}, repeats=2)
    assert rows["fast_prefill"].tolist() == [False, True, False, True]
    assert (rows["time_s"] > 0).all() and (rows["time_min_s"] <= rows["time_s"]).all()
    back = row_batch(rows.iloc[3])
    assert back.num_new.tolist() == [1, 1, 5] and back.num_context.tolist() == [7, 12, 0]
    assert rows["scale"][0] == json.dumps({"layers": 6}) and rows["device"][0] == "cpu"
    assert rows["dtype"][0] == "float32" and rows["threads"][0] == 1


def test_every_timed_call_follows_warm_calls_of_its_own_shape():
    """A shape is timed right after running itself, as a served step follows steps like it (CPU: 3 warm calls)."""
    ex = tiny_executor("llama", num_blocks=64)
    calls = []
    execute = ex.execute
    ex.execute = lambda inp: calls.append(tuple(inp.num_new)) or execute(inp)
    shapes = [("prefill 9", StepBatch.uniform(1, 0, 9)), ("decode 2x7", StepBatch.uniform(2, 7))]
    profile_grid(ex, shapes, "llama-3.1-8b", {}, repeats=2, warmup=1)
    assert warm_calls("cpu") == 3 and warm_calls("cuda:0") == 1
    timed = calls[len(shapes) :]  # after one warm-up pass over all shapes
    assert len(timed) == 2 * len(shapes) * (3 + 1)
    runs = [timed[i : i + 4] for i in range(0, len(timed), 4)]
    assert all(len(set(run)) == 1 for run in runs)  # 3 warm + 1 timed call of one shape, back to back
    assert [run[0] for run in runs] == [(9,), (1, 1)] * 2  # shapes still interleave round by round


def test_time_call_counts_every_repeat():
    calls = []
    times = time_call_s(lambda: calls.append(1), "cpu", warmup=2, repeats=3)
    assert len(calls) == 5 and len(times) == 3 and (times >= 0).all()


def test_cpu_entry_loads_as_a_catalog_gpu(tmp_path):
    peaks = {"fp32": 1.5e11, "bf16": 1.0e11, "bytes_per_s": 2.0e10}
    entry = cpu_gpu_entry(peaks, compute_dtype="fp32", today=dt.date(2026, 1, 2))
    spec = gpu_catalog((write_gpu_yaml(entry, tmp_path / "device.yaml"),))["cpu-local"]
    assert spec.peak_for("fp32") == 1.5e11
    assert spec.peak_for("bf16") == 1.5e11  # never below the rate the float32 executor reaches
    assert spec.memory_bytes_per_s == 2.0e10
    assert spec.sources == ["measured by servesim calibrate on 2026-01-02"]


@pytest.mark.parametrize("name", ["llama"])
def test_profiled_time_grows_with_decode_context(name):
    ex = tiny_executor(name, num_blocks=600)
    shapes = [("short", StepBatch.uniform(16, 16)), ("long", StepBatch.uniform(16, 512))]
    rows = profile_grid(ex, shapes, "llama-3.1-8b", {}, repeats=5)
    short, long = rows["time_s"].to_numpy()
    assert long > short  # 32x the KV read per request
    assert np.isfinite(rows["time_s"]).all()


def test_a_sliding_window_model_is_timed_with_a_block_table_per_kv_group():
    """The grid times the executor a served engine runs: vLLM's hybrid KV cache manager gives Gemma 3n's
    sliding and full layers a block table each, so every step builds each group's metadata."""
    from servesim.calibration.pipeline import Setup, make_executor
    from servesim.hardware.kv_groups import kv_groups

    setup = Setup(
        "gemma-3n-e2b",
        dict(layers=6, kv_shared=2, window=8, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256),
        "cpu",
        "",
        (),
    )
    ex = make_executor(setup, 64)
    groups = len(kv_groups(ex.spec).windows)
    assert groups > 1 and ex.hybrid and ex.num_kv_groups == groups
    seen = []
    execute = ex.execute
    ex.execute = lambda inp: seen.append(inp) or execute(inp)
    batch = StepBatch.of([1, 5], [20, 0])
    rows = profile_grid(ex, [("mixed 1+5", batch)], setup.model, setup.scale, repeats=1, warmup=0, warm=0)
    assert len(rows) == 2 and not seen[0].block_tables
    assert [len(tables) for tables in seen[0].group_tables] == [groups, groups]
    assert seen[0].group_tables[0][0] == tuple(range(blocks_for_batch(StepBatch.of([1], [20]), 16)))
    llama = make_executor(
        Setup(
            "llama-3.1-8b",
            dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256),
            "cpu",
            "",
            (),
        ),
        64,
    )
    assert not llama.hybrid and llama.num_kv_groups == 0
