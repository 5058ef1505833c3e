"""GuideLLM benchmark reports (`guidellm benchmark --output-path report.json`): each benchmark's strategy, its
successful requests in send order, their total and the benchmark's duration.

Read by field name from GuideLLM's report schema (vllm-project/guidellm: `benchmark/benchmark.py` in 0.2,
`benchmark/schemas/generative/` since 0.4). A benchmark's strategy sits at `config.strategy` (0.4 on),
`scheduler.strategy` (0.3) or `args.strategy` (0.2); its requests at `requests.successful`, each with
`prompt_tokens`, `output_tokens` and its start time (`request_start_time`, 0.2: `start_time`, epoch seconds).
The lists may hold a sample of the requests; `request_totals` counts them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.hardware.errors import SpecError
from servesim.hardware.files import read_json


@dataclass(frozen=True)
class GuidellmBenchmark:
    source: str  # file and benchmark index, for messages
    strategy: dict[str, Any]
    requests: list[dict[str, Any]]  # successful ones (or a sample of them), by start time
    total: int  # successful requests the benchmark made, sampled or not
    errored: int
    duration_s: float
    incomplete: int = 0  # requests cancelled in flight at the benchmark's end (--max-seconds)

    @property
    def sampled(self) -> bool:
        return len(self.requests) < self.total

    def column(self, key: str, keep: list[bool] | None = None) -> list[float]:
        """One number per request (of those `keep` marks); SpecError naming the field where a request lacks it."""
        values = [r.get(key) for r, k in zip(self.requests, keep or [True] * len(self.requests)) if k]
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
        ):
            raise SpecError(f"{self.source}: a successful request without a number for {key}")
        return [float(v) for v in values]

    def starts_s(self) -> list[float]:
        """Each request's send time (s) from the first one's."""
        starts = [_start(r) for r in self.requests]
        if not all(math.isfinite(s) for s in starts):
            raise SpecError(f"{self.source}: a successful request without request_start_time")
        return [s - starts[0] for s in starts]


def _start(request: dict[str, Any]) -> float:
    start = request.get("request_start_time", request.get("start_time"))
    return float(start) if isinstance(start, (int, float)) and not isinstance(start, bool) else math.inf


def _strategy(benchmark: dict[str, Any], source: str) -> dict[str, Any]:
    for parent in ("config", "scheduler", "args"):  # 0.4 on, 0.3, 0.2
        strategy = (
            (benchmark.get(parent) or {}).get("strategy") if isinstance(benchmark.get(parent), dict) else None
        )
        if isinstance(strategy, dict):
            return strategy
    raise SpecError(f"{source}: no strategy (config.strategy, scheduler.strategy or args.strategy)")


def _duration(benchmark: dict[str, Any], source: str) -> float:
    duration = benchmark.get("duration")
    start, end = benchmark.get("start_time"), benchmark.get("end_time")
    if (
        not isinstance(duration, (int, float))
        and isinstance(start, (int, float))
        and isinstance(end, (int, float))
    ):
        duration = end - start
    if not isinstance(duration, (int, float)) or not math.isfinite(duration) or duration <= 0:
        raise SpecError(f"{source}: no positive duration (duration, or start_time and end_time)")
    return float(duration)


def read_guidellm(path: Path) -> list[GuidellmBenchmark]:
    """Every benchmark of a GuideLLM report, in the report's order."""
    data = read_json(path, "GuideLLM report")
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        raise SpecError(f"{path}: not a GuideLLM report (no benchmarks list)")
    read = []
    for i, benchmark in enumerate(benchmarks):
        source = f"{path}: benchmark {i}"
        if not isinstance(benchmark, dict):
            raise SpecError(f"{source}: not a benchmark object")
        requests = benchmark.get("requests")
        successful = requests.get("successful") if isinstance(requests, dict) else None
        if (
            not isinstance(successful, list)
            or not successful
            or not all(isinstance(r, dict) for r in successful)
        ):
            raise SpecError(f"{source}: no successful requests listed (requests.successful)")
        metrics = benchmark.get("metrics")
        totals = benchmark.get("request_totals") or (
            metrics.get("request_totals") if isinstance(metrics, dict) else None
        )
        totals = {k: v for k, v in (totals or {}).items() if isinstance(v, int) and not isinstance(v, bool)}
        cut = requests.get("incomplete") if isinstance(requests, dict) else None
        read.append(
            GuidellmBenchmark(
                source,
                _strategy(benchmark, source),
                sorted(successful, key=_start),
                max(totals.get("successful", 0), len(successful)),
                totals.get("errored", 0),
                _duration(benchmark, source),
                max(totals.get("incomplete", 0), len(cut) if isinstance(cut, list) else 0),
            )
        )
    return read
