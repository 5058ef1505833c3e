"""Calibration speed: wall time of `servesim calibrate --quick` on this machine's CPU, each run a fresh process.

What a user runs first: the CLI's default scaled Llama-3.1-8B, the quick grid, the served calibration trace and
the fit. Prints each run's wall time and the fitted profile's held-out step-time MAPE (the grid.csv rows
held out of the fit), so a faster calibration that fits worse shows as such.
Run: python benchmarks/bench_calibrate.py [--runs 3] [--threads 1] [--full]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def one_run(threads: int | None, quick: bool) -> tuple[float, float]:
    """(wall seconds, held-out MAPE %) of one calibration in a fresh process."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-c", "from simulator.cli.main import main; main()", "calibrate", "--out", out]
        cmd += ["--quick"] * quick + (["--threads", str(threads)] if threads else [])
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - start
        return wall, float(yaml.safe_load((Path(out) / "profile.yaml").read_text())["fit_mape"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's own)")
    parser.add_argument("--full", action="store_true", help="the full grid instead of --quick")
    args = parser.parse_args()
    walls = []
    for i in range(args.runs):
        wall, mape = one_run(args.threads or None, not args.full)
        walls.append(wall)
        print(f"run {i + 1}: {wall:.1f} s, held-out step-time MAPE {mape:.1f}%", flush=True)
    kind = "full" if args.full else "--quick"
    print(f"calibrate {kind}: median {statistics.median(walls):.1f} s over {args.runs} runs")


if __name__ == "__main__":
    main()
