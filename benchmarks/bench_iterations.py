"""Engine iterations per request: how many times each replica's loop schedules, by what it then runs.

Each iteration either steps one step (an admission, a decode, ...) or fuses a stretch of steps
(simulator/world/fast_forward.py, chunk_stretch.py); its Python cost is paid per iteration, so this count is what
fast-forward changes. Workload: the tiled Azure conversation trace of bench_simulate.py on its scenario.
Run: python benchmarks/bench_iterations.py [--requests 5000] [--prefix-caching none] [--scenario PATH]
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from bench_simulate import ROOT, tiled_azure_conv

from servesim.simulator.scenario import load_scenario
from servesim.simulator.world import engine
from servesim.simulator.world.run import World


def count_iterations(path: Path, num_requests: int, prefix_caching: str) -> Counter:
    """Iterations of the run by kind: `fused`, or a stepped step's mix (`prefill`, `decode`, `prefill+decode`)."""
    counts: Counter = Counter()
    stretch = engine.Replica._stretch

    def counting(replica, plan):
        fused = stretch(replica, plan)
        if fused is not None:
            counts["fused"] += 1
        else:
            kinds = [
                kind
                for kind, has in (("prefill", max(plan.num_new) > 1), ("decode", min(plan.num_new) == 1))
                if has
            ]
            counts["stepped " + "+".join(kinds)] += 1
        return fused

    scenario, base = load_scenario(path, [f"engine.prefix_caching={prefix_caching}"])
    engine.Replica._stretch = counting
    try:
        World(scenario, base, workload=tiled_azure_conv(num_requests)).run()
    finally:
        engine.Replica._stretch = stretch
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--prefix-caching", default="none")
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "quickstart.yaml")
    args = parser.parse_args()
    counts = count_iterations(args.scenario, args.requests, args.prefix_caching)
    total = sum(counts.values())
    print(f"{args.requests} requests: {total:,} engine iterations, {total / args.requests:.2f} per request")
    for kind, n in counts.most_common():
        print(f"  {kind:24} {n:>8,}  {n / args.requests:.2f} per request")


if __name__ == "__main__":
    main()
