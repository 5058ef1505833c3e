"""Simulator speed: requests and engine steps simulated per second of wall time.

Workload: the Azure LLM inference 2023 conversation trace (19,366 requests), tiled end to end in
time as often as needed, at its own arrival rate; Llama-3.1-8B on one H100 SXM, vLLM scheduler
(`scenarios/quickstart.yaml`), or the model, GPU, parallelism and engine of another scenario (`--scenario`, e.g.
scenarios/deepseek_v3_8xh200.yaml, whose DP-attention ranks step one step at a time).
Run: python benchmarks/bench_simulate.py [--requests 10000 100000] [--engine compiled simpy] [--no-fast-forward]
[--prefix-caching vllm none]
[--async-scheduling on off] [--scenario PATH] [--profile scenario measured]
(prefix caching is on by default, as in vLLM; its block hashing and eviction bookkeeping cost time per block
even when, as here, no prompt is shared: `none` shows the engine alone. Async scheduling, vLLM's default too,
fuses fewer decode steps: a finish must be stepped, since its slot frees a step late; `--profile measured` prices
steps from the measured kernel tables, whose attention lookups cost time per step: compare it with `scenario`)
`--own-workload` runs the scenario's own workload (its first N requests) instead of the tiled Azure trace, e.g.
`--scenario benchmarks/vidur_llama2_70b_a100.yaml --own-workload --requests 10000` for Vidur's workload.
Each run is a fresh process, so its peak RSS is its own; the time per request shows how cost grows with N.
`--write-to DIR` also writes each run's folder there (as `servesim simulate` does: a long run's step log streamed
from disk into steps.parquet) and prints how long that took and the peak RSS after it.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import resource
import time
from pathlib import Path

import numpy as np

from servesim.simulator.world.output import write_run
from servesim.simulator.world.run import World
from servesim.simulator.scenario import load_scenario
from servesim.workloads.generate import Workload
from servesim.workloads.request import Request
from servesim.workloads.traces import load_azure

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"


def tiled_azure_conv(num_requests: int) -> Workload:
    """The conversation trace repeated back to back (each copy starts one mean gap after the last ends)."""
    table = load_azure(TRACE)
    arrival, prompt, output = (
        table[c].to_numpy() for c in ("arrival_s", "num_prompt_tokens", "num_output_tokens")
    )
    span = arrival[-1] + (arrival[-1] - arrival[0]) / (len(arrival) - 1)
    requests = []
    for i in range(num_requests):
        copy, row = divmod(i, len(table))
        requests.append(Request(i, float(arrival[row] + copy * span), int(prompt[row]), int(output[row])))
    return Workload(requests)


def bench(
    num_requests: int,
    engine: str,
    fast_forward: bool,
    prefix_caching: str,
    ahead: str,
    path: Path,
    profile: str,
    own_workload: bool = False,
    write_to: Path | None = None,
) -> None:
    overrides = [
        f"simulation.fast_forward={str(fast_forward).lower()}",
        f"simulation.compiled={str(engine == 'compiled').lower()}",
        f"engine.prefix_caching={prefix_caching}",
        f"engine.async_scheduling={str(ahead == 'on').lower()}",
    ]
    if profile != "scenario":
        overrides.append(f"hardware.profile={profile}")
    if own_workload:
        overrides.append(f"workload.num_requests={num_requests}")
    scenario, base = load_scenario(path, overrides)
    workload = None if own_workload else tiled_azure_conv(num_requests)
    start = time.perf_counter()
    # the simulation and its tables, as `simulate` does
    result = World(scenario, base, workload=workload).run()
    wall = time.perf_counter() - start
    steps = result.summary["num_steps"]
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    print(
        f"{path.stem}  {num_requests:>7} requests  {engine:8}  fast_forward={fast_forward!s:5}  "
        f"prefix_caching={prefix_caching:5} "
        f"async={ahead:3} profile={profile:9} "
        f"wall {wall:7.2f} s  {wall / num_requests * 1e6:6.0f} us/req  "
        f"{num_requests / wall:9,.0f} req/s  {steps:>9,} steps  {steps / wall:9,.0f} steps/s  peak RSS {peak_mib:6,.0f} MiB  "
        f"simulated {result.summary['duration_s']:,.0f} s, mean TTFT {result.summary['mean_ttft_ms']:.1f} ms",
        flush=True,
    )
    if write_to is not None:
        start = time.perf_counter()
        folder = write_run(result, write_to / f"{path.stem}-{num_requests}-{prefix_caching}", base)
        print(
            f"  wrote {folder} in {time.perf_counter() - start:.1f} s ({len(result.step_table):,} steps, spilled to "
            f"disk: {result.step_table.spilled}); peak RSS "
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB",
            flush=True,
        )


def _bench_in_child(*args) -> None:
    np.seterr(all="raise")
    bench(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--no-fast-forward", action="store_true")
    parser.add_argument(
        "--engine",
        nargs="+",
        choices=["compiled", "simpy"],
        default=["compiled"],
        help="the compiled replica loop where the scenario allows it, or the SimPy engine throughout",
    )
    parser.add_argument("--prefix-caching", nargs="+", default=["none", "vllm"])
    parser.add_argument("--async-scheduling", nargs="+", choices=["on", "off"], default=["on"])
    parser.add_argument(
        "--scenario",
        type=Path,
        default=ROOT / "scenarios" / "quickstart.yaml",
        help="model, GPU, parallelism and engine to run the tiled trace on",
    )
    parser.add_argument(
        "--profile",
        nargs="+",
        default=["scenario"],
        help="calibration profiles to time (scenario: the scenario's own)",
    )
    parser.add_argument(
        "--own-workload",
        action="store_true",
        help="the scenario's own workload (first N requests) instead of the tiled Azure trace",
    )
    parser.add_argument("--write-to", type=Path, help="write each run's folder under this folder, timed")
    args = parser.parse_args()
    spawn = multiprocessing.get_context("spawn")  # a fresh process per run: its peak RSS is that run's
    for n, engine in itertools.product(args.requests, args.engine):
        for caching in args.prefix_caching:
            for ahead in args.async_scheduling:
                for profile in args.profile:
                    child = spawn.Process(
                        target=_bench_in_child,
                        args=(
                            n,
                            engine,
                            not args.no_fast_forward,
                            caching,
                            ahead,
                            args.scenario,
                            profile,
                            args.own_workload,
                            args.write_to,
                        ),
                    )
                    child.start()
                    child.join()


if __name__ == "__main__":
    main()
