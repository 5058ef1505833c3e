"""A long run's step log and inter-token gaps move to disk in chunks (simulator/world/spill.py, step_table.py); what
comes back must be what memory would have held: the same tables, the same percentiles, sums equal up to rounding."""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.simulator.scenario import load_scenario
from servesim.simulator.world import run as run_module
from servesim.simulator.world import spill, step_table
from servesim.simulator.world.metrics import _stats
from servesim.simulator.world.output import read_table, write_run
from servesim.simulator.world.run import World
from servesim.simulator.world.step_table import StepFigures, StepLog

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
ROUNDED = {"mean_itl_ms", "std_itl_ms", "kv_cache_usage_mean", "gpu_time_saved_s"}  # sums of chunk sums


def _chunked(values: np.ndarray, size: int):
    return lambda: (values[i : i + size].copy() for i in range(0, len(values), size))


def _tallied(values: np.ndarray, size: int):
    """Chunks as a spilled log holds them: each chunk's distinct values and their counts."""
    return lambda: (spill.tally(chunk) for chunk in _chunked(values, size)())


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.sampled_from([0.001, 0.002, 0.0035, 0.0, -0.5, np.nan]),
            st.floats(-1e3, 1e3, allow_nan=False),
        ),
        max_size=300,
    ),
    chunk=st.integers(1, 40),
    sort_below=st.integers(0, 30),
)
def test_spilled_stats_are_numpys_over_all_the_values(values, chunk, sort_below):
    """Percentiles and median exactly as numpy's over one array, through every radix pass (sort_below 0: all four)."""
    values = np.array(values, float)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spill, "SORT_VALUES", sort_below)
        got = spill.spilled_stats("itl", _tallied(values, chunk))
    want = _stats("itl", values)
    assert got.keys() == want.keys()
    for key, value in want.items():
        if np.isnan(value):
            assert np.isnan(got[key]), key
        elif key in ROUNDED:
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
        else:
            assert got[key] == value, key


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.floats(0.0, 1e3, allow_nan=False), min_size=1, max_size=200),
    chunk=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_spilled_sums_do_not_depend_on_the_order_values_came_in(values, chunk, seed):
    """A fused run logs gaps and steps in another order than a stepped one: the spilled figures must not see it."""
    values = np.array(values)
    shuffled = np.random.default_rng(seed).permutation(values)
    assert spill.spilled_stats("x", _tallied(values, chunk)) == spill.spilled_stats(
        "x", _tallied(shuffled, 7)
    )
    frames = [
        pd.DataFrame({"duration_s": v, "kv_usage": v / 1e3, "prefill_tokens": 1, "replica": 0})
        for v in (values, shuffled)
    ]
    got = [
        StepFigures.over((f[i : i + size] for i in range(0, len(f), size)), {0: 2})
        for f, size in zip(frames, (chunk, 7))
    ]
    assert got[0] == got[1]


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.floats(-1e-300, 1e-300),  # subnormals among them
            st.sampled_from([0.0, -0.0, 1e16, -1e16, 1.0, 5e-324]),
        ),
        max_size=80,
    ),
    chunk=st.integers(1, 30),
)
def test_exact_sums_are_the_correctly_rounded_sum_of_every_value(values, chunk):
    """`ExactSum` is the exact sum rounded once, as `math.fsum` gives it (where fsum's partials do not overflow),
    whatever the chunking; numpy's sum where that sum is out of a float's range."""
    exact = sum(map(Fraction, values), Fraction(0))
    try:
        want = float(exact)
    except OverflowError:
        want = float(sum(np.sum(c) for c in _chunked(np.array(values, float), chunk)()))
    if values and not exact and all(math.copysign(1, v) < 0 and v == 0 for v in values):
        want = -0.0  # fsum keeps the sign of zeros only when every value is -0.0
    got = spill.exact_sum(_chunked(np.array(values, float), chunk))
    assert got == want or (np.isnan(got) and np.isnan(want))
    assert math.copysign(1, got) == math.copysign(1, want) or np.isnan(want)
    try:
        assert got == math.fsum(values)
    except OverflowError:  # fsum gives up when its partial sums overflow, though the sum may not
        pass


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.sampled_from([0.0, -0.0, 0.1, 1e16, 5e-324, -2.5]),
        ),
        max_size=40,
    ),
    weights=st.lists(st.integers(0, 2**40), min_size=40, max_size=40),
    slice_weight=st.integers(2**40 + 1, 2**44),
)
def test_weighted_exact_sums_are_the_correctly_rounded_sum_of_each_value_repeated(
    values, weights, slice_weight
):
    """A value of weight w counts as w copies, exactly, across the weight slices that keep int64 sums exact."""
    weights = weights[: len(values)]
    exact = sum((Fraction(v) * w for v, w in zip(values, weights)), Fraction(0))
    total = spill.ExactSum()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spill, "_SUM_WEIGHT", slice_weight)
        total.add(np.array(values, float), np.array(weights, np.int64))
    try:
        want = float(exact)
    except OverflowError:
        return  # numpy's sum then, as unweighted sums (above)
    assert total.value() == want


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.sampled_from([0.0, -0.0, 0.25, 0.5, 1e-9, np.nan, np.inf]), max_size=60),
    block=st.integers(1, 9),
)
def test_a_tally_holds_every_value_by_its_bits_and_how_often_it_came(values, block):
    values = np.array(values, float)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spill, "TALLY_VALUES", block)
        distinct, counts = spill.tally(values)
    assert counts.sum() == len(values) and (counts > 0).all()
    within = [set(values[i : i + block].view(np.uint64).tolist()) for i in range(0, len(values), block)]
    assert len(distinct) == sum(len(bits) for bits in within)  # each block's distinct bit patterns, once
    got = np.sort(np.repeat(distinct, counts).view(np.uint64))
    assert got.tolist() == np.sort(values.view(np.uint64)).tolist()


def test_sums_that_are_not_finite_are_numpys():
    values = np.array([1.0, np.inf, 2.0])
    assert spill.exact_sum(_chunked(values, 2)) == np.inf
    assert np.isnan(spill.exact_sum(_chunked(np.array([np.inf, -np.inf]), 1)))
    assert spill.exact_sum(_chunked(np.array([1e308, 1e308]), 1)) == np.inf  # out of range


def test_ranked_values_find_each_rank_of_a_large_skewed_set(monkeypatch):
    """Ties and a bucket too big to sort: each value at its rank, as a full sort gives it."""
    rng = np.random.default_rng(3)
    values = np.concatenate([np.full(5000, 0.0071), rng.exponential(0.01, 20000), -rng.random(300)])
    monkeypatch.setattr(spill, "SORT_VALUES", 100)
    ranks = [0, 1, 299, 300, 4000, 12000, len(values) - 1]
    got = spill.ranked_values(_tallied(values, 997), len(values), ranks)
    assert got == {r: float(np.sort(values)[r]) for r in ranks}


ROWS = st.lists(
    st.tuples(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), st.integers(0, 3), st.floats(0.0, 1.0)),
    max_size=120,
)


@settings(max_examples=100, deadline=None)
@given(rows=ROWS, spill_rows=st.integers(1, 20), merge_rows=st.integers(1, 8))
def test_a_spilled_step_table_is_the_one_memory_holds(rows, spill_rows, merge_rows):
    """Ties in time and replica keep the order they were logged in, across chunks and merge reads."""
    logs = {}
    for name, limit in (("memory", 1 << 30), ("spilled", spill_rows)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(step_table, "SPILL_ROWS", limit)
            patch.setattr(step_table, "MERGE_ROWS", merge_rows)
            log = StepLog()
            for n, (time_s, replica, usage) in enumerate(rows):
                log.record(time_s, 0.1 + usage, replica, n, n % 7, 1, 1, 0, n, usage, 0)
            logs[name] = log.table()
            pd.testing.assert_frame_equal(
                logs[name].frame(), pd.concat(list(logs[name].blocks()), ignore_index=True)
            )
    memory, spilled = logs["memory"], logs["spilled"]
    assert not memory.spilled and spilled.spilled == (len(rows) >= spill_rows)
    assert len(spilled) == len(rows)
    pd.testing.assert_frame_equal(spilled.frame(), memory.frame())
    got, want = spilled.figures({0: 1, 1: 2, 2: 4, 3: 8}), memory.figures({0: 1, 1: 2, 2: 4, 3: 8})
    assert (got.num_steps, got.kv_cache_usage_max, got.prefill_tokens) == (
        want.num_steps,
        want.kv_cache_usage_max,
        want.prefill_tokens,
    )
    assert got.kv_cache_usage_mean == pytest.approx(want.kv_cache_usage_mean, rel=1e-12)
    assert got.gpu_s == pytest.approx(want.gpu_s, rel=1e-12)


def test_figures_of_one_chunk_are_the_whole_columns_numpy_sums():
    frame = pd.DataFrame(
        {"duration_s": [1.0, 3.0], "kv_usage": [0.2, 0.6], "prefill_tokens": [10, 0], "replica": [0, 1]}
    )
    figures = StepFigures.of(frame, {0: 2, 1: 4})
    assert figures.kv_cache_usage_mean == np.average([0.2, 0.6], weights=[1.0, 3.0])
    assert (figures.num_steps, figures.kv_cache_usage_max, figures.prefill_tokens, figures.gpu_s) == (
        2,
        0.6,
        10,
        14.0,
    )


def _run(monkeypatch, overrides: list[str], spill_small: bool):
    s, base = load_scenario(SCENARIOS / "quickstart.yaml", overrides)
    with monkeypatch.context() as patch:
        if spill_small:
            patch.setattr(step_table, "SPILL_ROWS", 1000)
            patch.setattr(step_table, "MERGE_ROWS", 64)
            patch.setattr(run_module, "SPILL_VALUES", 3000)
        world = World(s, base)
        return world, world.run()


@pytest.mark.parametrize("overrides", [[], ["cluster.replicas=2", "cluster.router=round_robin"]])
def test_a_run_that_spills_gives_the_same_tables_and_summary(monkeypatch, tmp_path, overrides):
    """The Azure trace's first 2,000 requests, spilled every 1,000 steps and 3,000 gaps, against memory alone."""
    _, memory = _run(monkeypatch, overrides, False)
    world, spilled = _run(monkeypatch, overrides, True)
    assert spilled.step_table.spilled and world.itl_spill.count > 0
    pd.testing.assert_frame_equal(spilled.requests, memory.requests)
    pd.testing.assert_frame_equal(spilled.steps, memory.steps)
    assert spilled.summary.keys() == memory.summary.keys()
    for key, value in memory.summary.items():
        if key in ROUNDED:
            assert spilled.summary[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert spilled.summary[key] == value, key
    for fmt in ("parquet", "csv"):
        folders = [
            write_run(r, tmp_path / f"{name}-{fmt}", SCENARIOS, fmt)
            for name, r in (("m", memory), ("s", spilled))
        ]
        pd.testing.assert_frame_equal(read_table(folders[1], "steps"), read_table(folders[0], "steps"))
        assert (folders[1] / f"steps.{fmt}").is_file()


def test_spill_files_go_with_the_run(monkeypatch):
    world, result = _run(monkeypatch, ["workload.num_requests=300"], True)
    folders = {chunk.path.parent for chunk in result.step_table._chunks} | {
        world.itl_spill._dir.file("values.bin").parent
    }
    assert all(folder.is_dir() for folder in folders)
    del world, result
    gc.collect()
    assert not any(folder.exists() for folder in folders)


def test_spilled_stats_take_what_numpy_takes():
    """Infinities and sums past the largest float give numpy's answers, not an error."""
    for values in ([np.inf, -np.inf, 1.0], [1e305, 1e305], [np.inf, 2.0, 3.0]):
        array = np.array(values)
        got, want = spill.spilled_stats("x", _tallied(array, 1)), _stats("x", array)
        for key, value in want.items():
            assert got[key] == value or (np.isnan(got[key]) and np.isnan(value)), (values, key)


def test_a_spilled_table_is_written_in_row_groups_and_csv_in_utf8(monkeypatch, tmp_path):
    """Merge blocks gathered into row groups of ROW_GROUP_ROWS; a reject reason beyond ASCII survives the CSV."""
    from servesim.simulator.world import output

    monkeypatch.setattr(step_table, "SPILL_ROWS", 50)
    monkeypatch.setattr(step_table, "MERGE_ROWS", 7)
    monkeypatch.setattr(output, "ROW_GROUP_ROWS", 40)
    log = StepLog()
    for n in range(230):
        log.record(n * 0.5 % 17, 0.1, n % 3, n, 0, 1, 1, 0, n, 0.5, 0)
    table = log.table()
    output._write_table(table.blocks(), len(table), tmp_path, "steps", "parquet")
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(tmp_path / "steps.parquet").metadata
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(groups) == 230 and len(groups) > 1 and all(rows >= 40 for rows in groups[:-1])
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "steps.parquet"), table.frame())
    # in a process whose locale writes ASCII, as a C locale without Python's UTF-8 mode does
    write = (
        "import pandas as pd, sys; from pathlib import Path; from servesim.simulator.world.output import _write_table;"
        "_write_table([pd.DataFrame({'reject_reason': ['stage \\u601d\\u8003: too long', None]})], 2,"
        " Path(sys.argv[1]), 'requests', 'csv')"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "ascii"}
    subprocess.run([sys.executable, "-X", "utf8=0", "-c", write, str(tmp_path)], env=env, check=True)
    assert (tmp_path / "requests.csv").read_bytes().decode("utf-8").splitlines()[1] == "stage 思考: too long"


def test_a_chunk_keeps_each_count_column_in_the_narrowest_type_that_holds_it(monkeypatch):
    """Counts past int32 survive a spill as they were logged; small ones take a byte or two on disk."""
    monkeypatch.setattr(step_table, "SPILL_ROWS", 3)
    log = StepLog()
    rows = [(0.1, 2**31), (0.2, -(2**40)), (0.3, 7)]
    for time_s, waiting in rows:
        log.record(time_s, 0.1, 0, 300, 0, 1, 1, waiting, 0, 0.5, 0)
    table = log.table()
    assert table.spilled and table.frame()["num_waiting"].tolist() == [w for _, w in rows]
    (chunk,) = table._chunks
    dtypes = dict(zip(step_table.STEP_COLUMNS, chunk.dtypes))
    assert (dtypes["num_waiting"], dtypes["replica"], dtypes["num_requests"]) == (np.int64, np.int8, np.int16)
    assert chunk.path.stat().st_size == 3 * (3 * 8 + 8 + 1 + 2 + 5 * 1)
