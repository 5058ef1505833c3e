"""A GuideLLM report's benchmarks as `vllm bench serve`-style results: load, per-request lengths and figures.

The figures are recomputed from the benchmark's successful requests as `vllm bench serve` computes its own
(np.percentile over requests), because GuideLLM's summaries differ from vLLM's: its TPOT includes the first
token, and since 0.4 its ITL distribution weighs each request by its token count. A request's own
`inter_token_latency_ms`, (last token - first token) / (tokens - 1), is vLLM's per-request TPOT.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from servesim.hardware.errors import SpecError
from servesim.workloads.guidellm import GuidellmBenchmark, read_guidellm

STRATEGIES = ("synchronous", "concurrent", "throughput", "constant", "poisson")
STATS = {
    "mean": np.mean,
    "median": np.median,
    "p90": lambda v: np.percentile(v, 90),
    "p99": lambda v: np.percentile(v, 99),
}


def _load(b: GuidellmBenchmark) -> dict[str, Any]:
    """MeasuredRun's load fields for a GuideLLM strategy (its rate clients are not paced)."""
    kind, strategy = b.strategy.get("type_"), b.strategy
    if kind == "synchronous":
        return {"max_concurrency": 1}
    if kind == "concurrent":
        return {"max_concurrency": strategy.get("streams")}
    if kind == "throughput":  # all at once, or as many as its cap lets run
        return {"max_concurrency": strategy.get("max_concurrency")}
    if kind in ("constant", "poisson"):
        if strategy.get("max_concurrency"):
            raise SpecError(f"{b.source}: a {kind} rate capped at max_concurrency is not modelled")
        # constant: gaps of CV 0, a gamma process of infinite shape
        return {"request_rate": strategy.get("rate"), "burstiness": math.inf if kind == "constant" else 1.0}
    raise SpecError(f"{b.source}: strategy {kind!r} is not one of {', '.join(STRATEGIES)}")


def _figures(b: GuidellmBenchmark) -> dict[str, float]:
    """vLLM's figures: TTFT, TPOT (requests of 2+ tokens), end to end, and throughputs over the duration (a
    sample's tokens scaled to the total it stands for)."""
    outputs, prompts = b.column("output_tokens"), b.column("prompt_tokens")
    # GuideLLM 0.4+ gives a one-token answer no inter-token latency (None), earlier ones 0
    tpot = b.column("inter_token_latency_ms", [n > 1 for n in outputs])
    e2el = [s * 1e3 for s in b.column("request_latency")]
    scale = b.total / len(b.requests)
    figures = {
        "duration_s": b.duration_s,
        "request_throughput": b.total / b.duration_s,
        "output_throughput": sum(outputs) * scale / b.duration_s,
        "total_token_throughput": (sum(outputs) + sum(prompts)) * scale / b.duration_s,
    }
    for metric, values in (("ttft", b.column("time_to_first_token_ms")), ("tpot", tpot), ("e2el", e2el)):
        if values:
            figures |= {f"{stat}_{metric}_ms": float(fn(values)) for stat, fn in STATS.items()}
    return figures


def guidellm_results(path: Path) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(source, result, load) per benchmark: `result` holds vLLM's result keys (per-request lengths in send
    order, repeated to the total when the report kept a sample, and the figures), `load` MeasuredRun's load."""
    out = []
    for b in read_guidellm(path):
        if b.errored:
            raise SpecError(
                f"{b.source}: {b.errored} request(s) failed, and the figures cover only the others"
            )
        if b.incomplete:
            raise SpecError(
                f"{b.source}: {b.incomplete} request(s) were cut off in flight (request_totals.incomplete: a "
                "time limit ended the benchmark), and its duration counts the time they held; a replay of the "
                "completed ones would overstate its throughput"
            )
        lengths = {
            key: [int(n) for n in b.column(field)]
            for key, field in (("input_lens", "prompt_tokens"), ("output_lens", "output_tokens"))
        }
        if b.sampled:
            lengths = {
                key: (lens * math.ceil(b.total / len(lens)))[: b.total] for key, lens in lengths.items()
            }
        load = _load(b) | {"num_prompts": b.total, "client": "guidellm"}
        if b.sampled:
            load["notes"] = (
                f"GuideLLM kept {len(b.requests)} of its {b.total} requests: their lengths repeat and their "
                "latencies stand for all"
            )
        out.append((b.source, lengths | _figures(b), load))
    return out
