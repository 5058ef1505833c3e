"""Planning a chunked prefill's fused steps: each step priced from its lists against from its sums.

Runs Vidur's workload (`benchmarks/vidur_llama2_70b_a100.yaml`: 512-token chunks beside a few decodes) and plans
every chunk stretch it meets twice in this one process, once with `StepTimer.lists_s` per step and once with
`StepTimer.chunk_step_pricer`, alternating which goes first; checks the two plans agree on every call and prints the
time per call of each. Timing both on the same calls in one process is how a change of a few per cent shows on a
shared machine, where whole runs swing by more from hour to hour.
Run: python benchmarks/bench_chunk_stretch_planning.py [--requests 10000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench_simulate import ROOT
from servesim.simulator.scenario import load_scenario
from servesim.simulator.world import engine
from servesim.simulator.world.run import World


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args()
    original = engine.plan_chunk_stretch
    seconds, calls = {"lists": 0.0, "sums": 0.0}, [0]

    def both(*plan_args):
        by_lists = (*plan_args[:-1], None)  # the last argument: the sums pricer
        order = [("lists", by_lists), ("sums", plan_args)]
        plans = {}
        for name, variant in order if calls[0] % 2 else order[::-1]:
            start = time.perf_counter()
            plans[name] = original(*variant)
            seconds[name] += time.perf_counter() - start
        calls[0] += 1
        a, b = plans["lists"], plans["sums"]
        assert (a is None) == (b is None), "the two plans disagree"
        if a is not None:
            assert np.array_equal(a.ends_s, b.ends_s) and a.chunks == b.chunks, "the two plans disagree"
        return plans["sums"]

    scenario, base = load_scenario(
        ROOT / "benchmarks" / "vidur_llama2_70b_a100.yaml",
        [f"workload.num_requests={args.requests}", "engine.prefix_caching=none"],
    )
    engine.plan_chunk_stretch = both
    try:
        World(scenario, base).run()
    finally:
        engine.plan_chunk_stretch = original
    n = calls[0]
    print(
        f"{n:,} chunk stretches planned both ways, every plan identical: from lists "
        f"{seconds['lists'] / n * 1e6:.1f} us a call, from sums {seconds['sums'] / n * 1e6:.1f} us "
        f"({seconds['lists']:.2f} s -> {seconds['sums']:.2f} s in all)"
    )


if __name__ == "__main__":
    main()
