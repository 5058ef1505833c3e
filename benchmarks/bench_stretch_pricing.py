"""Pricing a decode stretch in which requests finish: one batch size at a time against one pass.

Records the stretches a run prices (`StepTimer.shrinking_stretch_s` calls), then times, in this one process, pricing
each as `decode_stretch_s` per batch size (what fast-forward did before the one-pass pricer) and in one pass, and
checks the two agree on every call. Replaying the same calls in one process is how a change of a few per cent shows
on a shared machine, where whole runs swing by more from hour to hour.
Run: python benchmarks/bench_stretch_pricing.py [--workload azure vidur] [--requests 4000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench_simulate import ROOT, tiled_azure_conv
from servesim.hardware.step_timer import StepTimer
from servesim.simulator.scenario import load_scenario
from servesim.simulator.world.run import World


def recorded_calls(
    workload: str, num_requests: int
) -> tuple[StepTimer, list[tuple[np.ndarray, np.ndarray, int]]]:
    """The timer of a run and the (contexts, finishes, steps) of every stretch it priced."""
    calls: list[tuple[np.ndarray, np.ndarray, int]] = []
    timers: list[StepTimer] = []
    original = StepTimer.shrinking_stretch_s

    def recording(self: StepTimer, num_context: np.ndarray, finish: np.ndarray, num_steps: int) -> np.ndarray:
        calls.append((num_context.copy(), finish.copy(), num_steps))
        timers.append(self)
        return original(self, num_context, finish, num_steps)

    if workload == "vidur":
        path, trace = ROOT / "benchmarks" / "vidur_llama2_70b_a100.yaml", None
        overrides = [f"workload.num_requests={num_requests}"]
    else:
        path, overrides = ROOT / "scenarios" / "quickstart.yaml", ["engine.prefix_caching=none"]
        trace = tiled_azure_conv(num_requests)
    scenario, base = load_scenario(path, overrides)
    StepTimer.shrinking_stretch_s = recording
    try:
        World(scenario, base, workload=trace).run()
    finally:
        StepTimer.shrinking_stretch_s = original
    return timers[0], calls


def per_size(timer: StepTimer, num_context: np.ndarray, finish: np.ndarray, num_steps: int) -> np.ndarray:
    """Each run of steps with the same requests priced as its own decode stretch."""
    parts, start = [], 0
    for end in sorted({f for f in finish.tolist() if f < num_steps - 1} | {num_steps - 1}):
        parts.append(timer.decode_stretch_s(num_context[finish >= start] + start, end - start + 1))
        start = end + 1
    return np.concatenate(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", nargs="+", choices=["azure", "vidur"], default=["azure", "vidur"])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for workload in args.workload:
        timer, calls = recorded_calls(workload, args.requests)
        pricers = {"per size": lambda *call: per_size(timer, *call), "one pass": timer.shrinking_stretch_s}
        best = {}
        for _ in range(args.repeats):
            for name, price in pricers.items():
                start = time.perf_counter()
                for call in calls:
                    price(*call)
                best[name] = min(best.get(name, np.inf), (time.perf_counter() - start) / len(calls))
        same = all(
            per_size(timer, *call).tolist() == timer.shrinking_stretch_s(*call).tolist() for call in calls
        )
        print(
            f"{workload:6} {len(calls):6,} stretches  per size {best['per size'] * 1e6:6.1f} us  one pass "
            f"{best['one pass'] * 1e6:6.1f} us a stretch (best of {args.repeats})  identical: {same}",
            flush=True,
        )


if __name__ == "__main__":
    main()
