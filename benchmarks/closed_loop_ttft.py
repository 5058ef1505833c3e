"""Closed-loop TTFT run by run: each measured run at 4-16 clients replayed under a profile, its mean TTFT error, and
how many are within 20% (issue 29's check of the client and host model).

Run: python benchmarks/closed_loop_ttft.py benchmarks/inferencemax_runs.yaml [--profile measured]
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from servesim.simulator.compare.measured import load_measured_runs, replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--profile", default="measured")
    parser.add_argument("--within", type=float, default=20.0, help="bound on the mean TTFT error, %%")
    args = parser.parse_args()
    runs = [r for r in load_measured_runs(args.runs) if r.max_concurrency and 4 <= r.max_concurrency <= 16]
    within, total = Counter(), Counter()
    for run in runs:
        error = next((e for e in replay(run, args.profile) if e.metric == "mean_ttft_ms"), None)
        if error is None:
            continue
        ok = abs(error.error_pct) <= args.within
        within[run.gpu] += ok
        total[run.gpu] += 1
        print(
            f"{run.label():70s} mean TTFT {error.measured:8.1f} ms, predicted {error.predicted:8.1f} "
            f"({error.error_pct:+6.1f}%){'' if ok else '  outside'}",
            flush=True,
        )
    by_gpu = ", ".join(f"{gpu} {within[gpu]}/{total[gpu]}" for gpu in sorted(total))
    print(f"within {args.within:g}%: {sum(within.values())} of {sum(total.values())} ({by_gpu})")


if __name__ == "__main__":
    main()
