"""Simulator speed: requests and engine steps simulated per second of wall time.

Workload: the Azure LLM inference 2023 conversation trace (19,366 requests), tiled end to end in
time as often as needed, at its own arrival rate; Llama-3.1-8B on one H100 SXM, vLLM scheduler
(`scenarios/quickstart.yaml`), or the model, GPU, parallelism and engine of another scenario (`--scenario`, e.g.
scenarios/deepseek_v3_8xh200.yaml, whose DP-attention ranks step one step at a time).
Run: python benchmarks/bench_simulate.py [--requests 10000 100000] [--no-fast-forward] [--prefix-caching vllm none]
[--async-scheduling on off] [--scenario PATH] [--profile scenario measured]
(prefix caching is on by default, as in vLLM; its block hashing and eviction bookkeeping cost time per block
even when, as here, no prompt is shared: `none` shows the engine alone. Async scheduling, vLLM's default too,
fuses fewer decode steps: a finish must be stepped, since its slot frees a step late; `--profile measured` prices
steps from the measured kernel tables, whose attention lookups cost time per step: compare it with `scenario`)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from simulator.run import World
from simulator.scenario import load_scenario
from workloads.generate import Workload
from workloads.request import Request
from workloads.traces import load_azure

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def tiled_azure_conv(num_requests: int) -> Workload:
    """The conversation trace repeated back to back (each copy starts one mean gap after the last ends)."""
    table = load_azure(TRACE)
    arrival, prompt, output = (table[c].to_numpy() for c in ("arrival_s", "num_prompt_tokens", "num_output_tokens"))
    span = arrival[-1] + (arrival[-1] - arrival[0]) / (len(arrival) - 1)
    requests = []
    for i in range(num_requests):
        copy, row = divmod(i, len(table))
        requests.append(Request(i, float(arrival[row] + copy * span), int(prompt[row]), int(output[row])))
    return Workload(requests)


def bench(num_requests: int, fast_forward: bool, prefix_caching: str, ahead: str, path: Path, profile: str) -> None:
    overrides = [f"simulation.fast_forward={str(fast_forward).lower()}", f"engine.prefix_caching={prefix_caching}",
                 f"engine.async_scheduling={str(ahead == 'on').lower()}"]
    if profile != "scenario":
        overrides.append(f"hardware.profile={profile}")
    scenario, base = load_scenario(path, overrides)
    workload = tiled_azure_conv(num_requests)
    start = time.perf_counter()
    result = World(scenario, base, workload=workload).run()
    wall = time.perf_counter() - start
    steps = result.summary["num_steps"]
    print(f"{path.stem}  {num_requests:>7} requests  fast_forward={fast_forward!s:5}  prefix_caching={prefix_caching:5} "
          f"async={ahead:3} profile={profile:9} "
          f"wall {wall:7.2f} s  "
          f"{num_requests / wall:9,.0f} req/s  {steps:>9,} steps  {steps / wall:9,.0f} steps/s  "
          f"simulated {result.summary['duration_s']:,.0f} s, mean TTFT {result.summary['mean_ttft_ms']:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--no-fast-forward", action="store_true")
    parser.add_argument("--prefix-caching", nargs="+", default=["none", "vllm"])
    parser.add_argument("--async-scheduling", nargs="+", choices=["on", "off"], default=["on"])
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "quickstart.yaml",
                        help="model, GPU, parallelism and engine to run the tiled trace on")
    parser.add_argument("--profile", nargs="+", default=["scenario"],
                        help="calibration profiles to time (scenario: the scenario's own)")
    args = parser.parse_args()
    np.seterr(all="raise")
    for n in args.requests:
        for caching in args.prefix_caching:
            for ahead in args.async_scheduling:
                for profile in args.profile:
                    bench(n, not args.no_fast_forward, caching, ahead, args.scenario, profile)


if __name__ == "__main__":
    main()
