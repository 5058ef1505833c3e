"""Planner speed: wall time and number of simulations of `servesim plan` on a chat scenario.

Workload: the quickstart's Azure conversation trace slice (first N requests), rescaled to the target
rate; Llama-3.1-8B; SLOs p90 TTFT < 500 ms, p90 TPOT < 50 ms. Candidates: GPUs x TP sizes.
Run: python benchmarks/bench_plan.py [--requests 300] [--target-rate 40] [--gpus h100-sxm,h200,a100-80gb]
     [--tp 1,2,4] [--workers N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from servesim.simulator.planning.executors import default_workers
from servesim.simulator.planning.plan import plan
from servesim.simulator.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def bench(num_requests: int, target_rate: float, gpus: list[str], tps: list[int], workers: int) -> None:
    scenario, base = load_scenario(
        ROOT / "scenarios" / "quickstart.yaml", [f"workload.num_requests={num_requests}"]
    )
    start = time.perf_counter()
    result = plan(
        scenario, base, gpus=gpus, tps=tps, max_replicas=16, target_rate=target_rate, workers=workers
    )
    wall = time.perf_counter() - start
    rec = result.recommendation
    print(
        f"{len(result.evaluations)} candidates, {num_requests} requests each run, target {target_rate} req/s, "
        f"{workers} worker(s): {result.num_simulations} simulations in {wall:.1f} s "
        f"({wall / result.num_simulations * 1e3:.0f} ms each)"
    )
    print(
        f"recommendation: {rec.label if rec else None}"
        + (f" at ${rec.cost_per_hour_usd:.2f}/h" if rec else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--target-rate", type=float, default=40.0)
    parser.add_argument("--gpus", default="h100-sxm,h200,a100-80gb")
    parser.add_argument("--tp", default="1,2,4")
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args()
    bench(
        args.requests,
        args.target_rate,
        args.gpus.split(","),
        [int(t) for t in args.tp.split(",")],
        args.workers,
    )


if __name__ == "__main__":
    main()
