"""Where `servesim compare`'s time goes: its replays of measured runs in this one process, timed whole and by phase.

Closed-loop replays (compare, fit) run on the SimPy engine: planning and applying fused decode stretches, pricing
their steps from the kernel tables, and loading the profile for each run. Each phase is timed with perf_counter
around its function (nested ones overlap: the lookups are inside the pricing, which is inside the planning).
Run it on two checkouts back to back to compare them; whole runs on a shared machine swing by more than the change.
Run: python benchmarks/bench_compare.py [benchmarks/inferencemax_runs.yaml] [--match h200] [--profile measured]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import sys
import time
from pathlib import Path

import servesim.hardware.kernel_tables as kernel_tables
import servesim.hardware.step_timer as step_timer
import servesim.simulator.world.engine as engine
import servesim.simulator.world.replicas as replicas
import servesim.simulator.world.run as run
from servesim.simulator.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def timed(totals: dict[str, float], owner: object, name: str, label: str) -> None:
    """Replace `owner.name` by itself with its seconds added to `totals[label]`."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] = totals.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, wrapper)


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default=str(ROOT / "benchmarks" / "inferencemax_runs.yaml"))
    parser.add_argument("--match", default="h200")
    parser.add_argument("--profile", default="measured")
    args = parser.parse_args()
    labels = [
        "loading the profile",
        "planning stretches",
        "  pricing their steps",
        "    kernel-table lookups",
    ]
    totals: dict[str, float] = dict.fromkeys([*labels, "applying stretches"], 0.0)
    timed(totals, engine, "plan_stretch", "planning stretches")
    timed(totals, engine, "apply_stretch", "applying stretches")
    timed(totals, step_timer.StepTimer, "shrinking_stretch_s", "  pricing their steps")
    timed(totals, kernel_tables.Grid, "at2_along", "    kernel-table lookups")
    for module in (run, replicas):  # twice a run
        timed(totals, module, "load_profile", "loading the profile")
    sys.argv = [
        "servesim",
        "compare",
        args.runs,
        "--profile",
        args.profile,
        "--match",
        args.match,
        "--workers",
        "1",
    ]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main()
    total = time.perf_counter() - start
    print(f"servesim compare {args.runs} --profile {args.profile} --match {args.match!r}: {total:.2f} s")
    for label, seconds in totals.items():
        print(f"  {label:<28} {seconds:7.2f} s")


if __name__ == "__main__":
    main_()
