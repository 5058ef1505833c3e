"""GuideLLM reports, written by hand from GuideLLM's documented schema (0.2's flat records, 0.4's nested config),
read as measured runs for `compare` and as a trace format."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from servesim.hardware.errors import SpecError
from servesim.simulator.cli.main import app
from servesim.simulator.compare.measured import runs_from_result_file, scenario_for
from servesim.workloads.traces import load_guidellm

runner = CliRunner()
SETUP = {"model": "llama-3.1-8b", "gpu": "h100-sxm"}
T0 = 1_760_000_000.0  # epoch seconds, as GuideLLM stamps them


def request(start: float, prompt: int, output: int, ttft_ms: float, itl_ms: float, *, legacy: bool = False):
    """One successful request record; GuideLLM dumps its computed fields beside the raw ones."""
    latency = ttft_ms / 1e3 + (output - 1) * (itl_ms or 0.0) / 1e3
    computed = {
        "prompt_tokens": prompt,
        "output_tokens": output,
        "request_latency": latency,
        "time_to_first_token_ms": ttft_ms,
        "inter_token_latency_ms": itl_ms if output > 1 else (0.0 if legacy else None),  # None since 0.4
        "time_per_output_token_ms": latency * 1e3 / output,  # GuideLLM's, first token included: not vLLM's
    }
    if legacy:  # 0.2: flat times
        return {
            "type_": "generative_text_response",
            "start_time": T0 + start,
            "end_time": T0 + start + latency,
        } | computed
    return {
        "type_": "generative_request_stats",
        "info": {"timings": {"request_start": T0 + start, "request_end": T0 + start + latency}},
        "request_start_time": T0 + start,
        "request_end_time": T0 + start + latency,
    } | computed


def benchmark(strategy: dict, requests: list, *, legacy: bool = False, duration: float = 4.0, **totals):
    totals = {"successful": len(requests), "errored": 0, "incomplete": 0, "total": len(requests)} | totals
    if legacy:
        return {
            "type_": "generative_benchmark",
            "args": {"strategy": strategy},
            "start_time": T0,
            "end_time": T0 + duration,
            "duration": duration,
            "request_totals": totals,
            "requests": {"successful": requests, "errored": [], "incomplete": []},
        }
    return {
        "type_": "generative_benchmark",
        "config": {"strategy": strategy},
        "start_time": T0,
        "end_time": T0 + duration,
        "duration": duration,
        "metrics": {"request_totals": totals},
        "requests": {"successful": requests, "errored": [], "incomplete": [], "total": None},
    }


# four requests listed out of send order: lengths must replay in send order
REQUESTS = [
    request(0.5, 300, 40, 50.0, 8.0),
    request(0.0, 100, 20, 40.0, 6.0),
    request(1.5, 700, 1, 70.0, 0.0),  # one token: no TPOT
    request(1.0, 500, 60, 60.0, 10.0),
]


def write(tmp_path, *benchmarks, name="report.json"):
    path = tmp_path / name
    path.write_text(
        json.dumps({"metadata": {"version": 1}, "args": {"profile": "sweep"}, "benchmarks": list(benchmarks)})
    )
    return path


def test_each_benchmark_is_a_run_with_vllms_figures_from_its_requests(tmp_path):
    path = write(
        tmp_path,
        benchmark({"type_": "concurrent", "streams": 2}, REQUESTS),
        benchmark({"type_": "poisson", "rate": 3.0, "max_concurrency": None}, REQUESTS),
    )
    closed, poisson = runs_from_result_file(path, SETUP)
    assert (closed.max_concurrency, closed.num_prompts, closed.client) == (2, 4, "guidellm")
    assert closed.input_lens == [100, 300, 500, 700] and closed.output_lens == [20, 40, 60, 1]
    ttft = closed.measured
    assert ttft["mean_ttft_ms"] == 55.0 and ttft["median_ttft_ms"] == 55.0
    assert ttft["p90_ttft_ms"] == pytest.approx(67.0) and ttft["p99_ttft_ms"] == pytest.approx(69.7)
    # TPOT over the three requests of 2+ tokens (6, 8, 10 ms), not GuideLLM's first-token-inclusive figure
    assert ttft["mean_tpot_ms"] == pytest.approx(8.0) and ttft["median_tpot_ms"] == 8.0
    assert ttft["request_throughput"] == 1.0 and ttft["output_throughput"] == pytest.approx(121 / 4)
    assert ttft["mean_e2el_ms"] == pytest.approx(np.mean([40 + 19 * 6, 50 + 39 * 8, 70, 60 + 59 * 10]))
    assert (poisson.request_rate, poisson.burstiness, poisson.max_concurrency) == (3.0, 1.0, None)
    # GuideLLM sends a renewal process from t = 0, unlike vllm bench serve since 0.10.1
    arrivals = scenario_for(poisson).workload.arrivals
    assert (arrivals.kind, arrivals.paced) == ("poisson", False)
    assert closed.label() == "llama-3.1-8b h100-sxm serve ~400/~30 c=2 x4"


def test_the_02_layout_and_the_other_strategies(tmp_path):
    legacy = [
        request(
            r["request_start_time"] - T0,
            r["prompt_tokens"],
            r["output_tokens"],
            r["time_to_first_token_ms"],
            r["inter_token_latency_ms"],
            legacy=True,
        )
        for r in REQUESTS
    ]
    path = write(
        tmp_path,
        benchmark({"type_": "synchronous"}, legacy, legacy=True),
        benchmark({"type_": "throughput", "max_concurrency": None}, legacy, legacy=True),
        benchmark({"type_": "constant", "rate": 2.0, "initial_burst": True}, legacy, legacy=True),
    )
    sync, throughput, constant = runs_from_result_file(path, SETUP)
    assert sync.max_concurrency == 1 and sync.input_lens == [100, 300, 500, 700]
    assert throughput.max_concurrency is None and math.isinf(throughput.request_rate)
    assert math.isinf(constant.burstiness)
    arrivals = scenario_for(constant).workload.arrivals
    assert (arrivals.kind, arrivals.rate_per_s) == ("constant", 2.0)


def test_a_sampled_report_stands_for_all_its_requests_and_says_so(tmp_path):
    path = write(
        tmp_path, benchmark({"type_": "concurrent", "streams": 4}, REQUESTS, successful=10, total=10)
    )
    (run,) = runs_from_result_file(path, SETUP)
    assert run.num_prompts == 10 and run.input_lens == [100, 300, 500, 700] * 2 + [100, 300]
    assert "kept 4 of its 10 requests" in run.notes
    assert run.measured["request_throughput"] == 2.5 and run.measured["output_throughput"] == pytest.approx(
        121 * 2.5 / 4
    )


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda b: b["metrics"]["request_totals"].update(errored=3), "benchmark 0: 3 request(s) failed"),
        (
            lambda b: b["metrics"]["request_totals"].update(incomplete=2),
            "benchmark 0: 2 request(s) were cut off in flight",
        ),
        (
            lambda b: b["requests"].update(incomplete=[{"prompt_tokens": 100}]),
            "benchmark 0: 1 request(s) were cut off in flight",
        ),
        (
            lambda b: b["config"]["strategy"].update(type_="sweep"),
            "strategy 'sweep' is not one of synchronous,",
        ),
        (lambda b: b["config"].pop("strategy"), "benchmark 0: no strategy (config.strategy,"),
        (lambda b: b["requests"].update(successful=[]), "no successful requests listed"),
        (
            lambda b: b["requests"]["successful"][0].pop("time_to_first_token_ms"),
            "without a number for time_to_first_token_ms",
        ),
        (lambda b: b.update(duration=0, start_time=None), "no positive duration"),
        (
            lambda b: b["config"]["strategy"].update(type_="poisson", rate=2, max_concurrency=8),
            "capped at max_concurrency",
        ),
    ],
)
def test_a_report_that_cannot_be_replayed_says_where(tmp_path, change, message):
    b = benchmark({"type_": "concurrent", "streams": 2}, [dict(r) for r in REQUESTS])
    change(b)
    with pytest.raises(SpecError, match=r"report.json: .*" + re.escape(message)):
        runs_from_result_file(write(tmp_path, b), SETUP)


def test_compare_replays_a_guidellm_report_figure_by_figure(tmp_path):
    path = write(tmp_path, benchmark({"type_": "concurrent", "streams": 2}, REQUESTS))
    result = runner.invoke(
        app, ["compare", str(path), "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--json"]
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)
    figures = {f["metric"]: f for f in run["figures"]}
    assert figures["mean_ttft_ms"]["measured"] == 55.0 and len(figures) == 16
    assert all(math.isfinite(f["error_pct"]) for f in figures.values())


def test_a_guidellm_report_is_a_trace_of_one_benchmark(tmp_path):
    later = [
        request(r["request_start_time"] - T0 + 2, 2 * r["prompt_tokens"], r["output_tokens"], 1.0, 1.0)
        for r in REQUESTS
    ]
    path = write(
        tmp_path, benchmark({"type_": "synchronous"}, REQUESTS), benchmark({"type_": "synchronous"}, later)
    )
    first, second = load_guidellm(path), load_guidellm(path, 1)
    assert first["arrival_s"].tolist() == [0.0, 0.5, 1.0, 1.5]
    assert first["num_prompt_tokens"].tolist() == [100, 300, 500, 700]
    assert second["num_prompt_tokens"].tolist() == [200, 600, 1000, 1400]
    with pytest.raises(ValueError, match="trace.benchmark 2: the report has benchmarks 0-1"):
        load_guidellm(path, 2)


def test_trace_benchmark_belongs_to_guidellm_reports():
    from servesim.workloads.config import TraceSource

    assert TraceSource(format="guidellm", path="r.json", benchmark=3).benchmark == 3
    with pytest.raises(
        ValueError, match="trace.benchmark is a guidellm and sglang_bench option, but format is 'azure'"
    ):
        TraceSource(format="azure", path="t.csv", benchmark=1)


def test_fit_takes_a_guidellm_report_served_on_one_gpu(tmp_path):
    """A sweep's benchmarks are runs enough to fit; --gpu names where they were served and the section fitted."""
    path = write(
        tmp_path,
        benchmark({"type_": "concurrent", "streams": 1}, REQUESTS),
        benchmark({"type_": "concurrent", "streams": 4}, REQUESTS),
    )
    out = tmp_path / "fit"
    args = ["fit", str(path), "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--holdout-every", "0"]
    args += ["--max-evaluations", "3"]
    result = runner.invoke(app, [*args, "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "h100-sxm" in (out / "profile.yaml").read_text()
    no_model = runner.invoke(app, ["fit", str(path), "--out", str(tmp_path / "x")])
    assert no_model.exit_code == 2 and "give --model and --gpu" in no_model.output


def test_an_sglang_bench_serving_line_is_a_trace_of_its_lengths(tmp_path):
    from servesim.workloads.traces import load_sglang_bench

    path = tmp_path / "sglang.jsonl"
    lines = [
        {"completed": 2, "input_lens": [30, 40], "output_lens": [5, 6]},
        {"completed": 1, "input_lens": [7], "output_lens": [8]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    first, second = load_sglang_bench(path), load_sglang_bench(path, 1)
    assert first["num_prompt_tokens"].tolist() == [30, 40] and second["num_output_tokens"].tolist() == [8]
    assert first["arrival_s"].isna().all()
    with pytest.raises(ValueError, match="trace.benchmark 2: the file has 2 run line"):
        load_sglang_bench(path, 2)
    path.write_text(json.dumps({"completed": 2}) + "\n")
    with pytest.raises(ValueError, match="save the run with bench_serving --output-details"):
        load_sglang_bench(path)
