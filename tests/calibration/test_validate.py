"""The closed loop on this CPU: calibrate the executor, serve a trace for real, replay it in the simulator."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibration.device import time_call_s
from calibration.executor import Executor, StepInput
from calibration.pipeline import Setup, TraceSpec, load_setup, run_calibration, run_validation
from calibration.scaled import scale_model
from calibration.validate import compare
from hardware.batch import StepBatch
from hardware.model import get_model
from hardware.profile import load_profile

DEFAULT_SCALE = dict(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=768, vocab=2048)


def frame(ttft_s, tpot_s, e2el_s) -> pd.DataFrame:
    return pd.DataFrame(
        {"request_id": range(len(ttft_s)), "ttft_s": ttft_s, "tpot_s": tpot_s, "e2el_s": e2el_s}
    )


def test_compare_reports_per_request_and_median_errors():
    measured = frame([1.0, 2.0, 4.0], [0.10, 0.20, np.nan], [2.0, 3.0, 5.0])
    simulated = frame([1.1, 1.8, 4.0], [0.10, 0.25, np.nan], [2.0, 3.0, 5.5])
    table = compare(measured, simulated, {"output_throughput": 100.0}, {"output_throughput": 90.0}).set_index(
        "metric"
    )
    assert table.loc["ttft", "median_abs_pct_err"] == pytest.approx(10.0)  # errors 10, 10, 0 %
    assert table.loc["ttft", "median_pct_err"] == pytest.approx(10.0)  # median 2.0 s vs 1.8 s
    assert table.loc["tpot", "requests"] == 2  # a one-token answer has no TPOT
    assert table.loc["tpot", "median_abs_pct_err"] == pytest.approx(12.5)  # errors 0 and 25 %
    assert table.loc["e2el", "p90_abs_pct_err"] == pytest.approx(8.0)  # 90th percentile of 0, 0, 10 %
    assert table.loc["output_throughput", "median_pct_err"] == pytest.approx(10.0)
    steps = pd.DataFrame({"execute_s": [1.0, 2.0], "predicted_s": [1.5, 2.0]})
    with_steps = compare(measured, simulated, {"output_throughput": 1.0}, {"output_throughput": 1.0}, steps)
    # 50, 0
    assert with_steps.set_index("metric").loc["step_time", "median_abs_pct_err"] == pytest.approx(25.0)


def _probe_s() -> float:
    """Median seconds of one fixed serving-like step (8 decodes over 256 tokens) on the test's model."""
    ex = Executor(scale_model(get_model("llama-3.1-8b"), **DEFAULT_SCALE), 160, 16, "cpu")
    batch = StepBatch.uniform(8, 256)
    inp = StepInput.from_batch(
        batch, [list(range(i * 17, i * 17 + 17)) for i in range(8)], 2048, np.random.default_rng(0)
    )
    return float(np.median(time_call_s(lambda: ex.execute(inp), "cpu", warmup=3, repeats=25)))


def _machine_drift(folder, steps: pd.DataFrame, probes_s: list[float]) -> float:
    """How much this shared machine changed under the test, as a fraction (0 = steady): other processes
    taking the core (wall time above the thread's CPU time, in the grid or while serving), or slowing it
    through shared caches and memory (the same fixed step timed before, between and after the runs)."""
    grid = pd.read_csv(folder / "grid.csv")
    stolen = max(
        float((grid["time_s"] / grid["cpu_time_s"]).median()) - 1.0,
        float(1.0 - steps["execute_cpu_s"].sum() / steps["execute_s"].sum()),
    )
    return max(stolen, max(probes_s) / min(probes_s) - 1.0)


#: 150 requests, a third of them behind one of 4 shared prefixes of 128 tokens (8 blocks), served with
#: chunked prefill and vLLM's automatic prefix caching.
TRACE = TraceSpec(
    num_requests=150,
    max_num_batched_tokens=256,
    prompt_median=120,
    prefix_caching="vllm",
    num_prefixes=4,
    prefix_tokens=128,
    prefix_share=0.5,
)


def test_calibrated_simulator_predicts_served_latencies(tmp_path):
    """Issue 7's target: on a few hundred requests with chunked prefill and prefix reuse, the simulator with
    the fitted profile gets median per-request TPOT within 10% and TTFT within 15% of the measured run.

    Wall-clock timing on a CPU shared with other jobs can miss for reasons outside the code; then (and
    only then: the machine measurably changed speed) the bounds double, so a clear regression still fails."""
    probes_s = [_probe_s()]
    setup = Setup("llama-3.1-8b", DEFAULT_SCALE, "cpu", "", (), threads=1)
    report, setup = run_calibration(setup, tmp_path, repeats=3)  # the full grid, each shape timed 3 times
    probes_s.append(_probe_s())
    assert load_profile(tmp_path / "profile.yaml").fit_mape == pytest.approx(
        report.mape["test_fitted"], abs=1e-3
    )
    assert load_setup(tmp_path)[0] == setup
    v = run_validation(tmp_path, TRACE)
    probes_s.append(_probe_s())
    steps, table = v.measured_steps, v.table.set_index("metric")
    chunks = [
        n > 1 and c > 0
        for new, ctx in zip(steps["num_new"], steps["num_context"])
        for n, c in zip(json.loads(new), json.loads(ctx))
    ]
    assert any(chunks), "no prompt was split across steps"  # chunked prefill happened
    assert steps["num_tokens"].max() <= 256
    assert v.measured["finish_s"].notna().all() and (tmp_path / "validation.html").exists()
    # prefix reuse happened, the same in both runs, and the executor really skipped the cached tokens
    hit_rate = v.measured_summary["prefix_cache_hit_rate"]
    assert hit_rate > 0 and v.simulated_summary["prefix_cache_hit_rate"] > 0
    cached = v.measured.set_index("request_id")["cached_tokens"]
    # re-admissions after preemption may hit again
    assert steps["prefix_hit_tokens"].sum() >= cached.sum() > 0
    if not v.measured["preemptions"].any():
        assert steps["prefix_hit_tokens"].sum() == cached.sum()
        fed_back = (v.measured["output_tokens"] - 1).sum()  # every output but the last runs as a decode
        assert steps["num_tokens"].sum() == v.measured["prompt_tokens"].sum() - cached.sum() + fed_back
    drift = _machine_drift(tmp_path, steps, probes_s)
    slack = 2.0 if drift > 0.03 else 1.0
    assert report.mape["test_fitted"] < 15.0 * slack < report.mape["test_default"] * slack, report.mape
    checks = {
        "median TPOT error": ("tpot", "median_abs_pct_err", 10.0),
        "median TTFT error": ("ttft", "median_abs_pct_err", 15.0),
        "throughput error": ("output_throughput", "median_pct_err", 5.0),
    }
    failed = [
        f"{name} > {bound * slack:g}%"
        for name, (metric, column, bound) in checks.items()
        if not table.loc[metric, column] <= bound * slack
    ]
    summary = (
        f"{failed}; machine drift {drift:.1%}; fit MAPE {report.mape}; prefix hit rate {hit_rate:.3f}\n"
        f"{table.round(1).to_string()}"
    )
    print(summary)
    assert not failed, summary
