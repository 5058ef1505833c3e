"""Closed-loop TTFT run by run: each measured run at 4-16 clients replayed under a profile, its mean TTFT error, and
how many are within 20% (issue 29's check of the client and host model).

Run: python benchmarks/closed_loop_ttft.py benchmarks/inferencemax_runs.yaml [more runs files] [--profile measured]
[--match TEXT] [--async-scheduling stated|on|off]
(several files: each file's count, then all of them together.)
(`--async-scheduling` replays every run with vLLM's async scheduling on or off whatever the run states: how far a
run's TTFT sits from what its stated scheduling allows, e.g. `--match h100 --async-scheduling off`.)
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from servesim.simulator.compare.measured import MeasuredRun, load_measured_runs, replay, select

SCHEDULING = {"stated": None, "on": True, "off": False}


def with_scheduling(run: MeasuredRun, ahead: bool | None) -> MeasuredRun:
    """`run` with its engine's async scheduling set to `ahead` (None: as the run states it)."""
    if ahead is None:
        return run
    return run.model_copy(
        update={"engine_args": run.engine_args.model_copy(update={"async_scheduling": ahead})}
    )


def count(path: Path, args: argparse.Namespace) -> tuple[int, int]:
    """Print `path`'s runs at 4-16 clients one by one and how many are within the bound; (within, total)."""
    runs = [r for r in load_measured_runs(path) if r.max_concurrency and 4 <= r.max_concurrency <= 16]
    runs = [with_scheduling(r, SCHEDULING[args.async_scheduling]) for r in select(runs, args.match)]
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
    print(f"{path.name}: within {args.within:g}%: {sum(within.values())} of {sum(total.values())} ({by_gpu})")
    return sum(within.values()), sum(total.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--profile", default="measured")
    parser.add_argument("--within", type=float, default=20.0, help="bound on the mean TTFT error, %%")
    parser.add_argument("--match", help="only runs whose label matches this regular expression")
    parser.add_argument("--async-scheduling", choices=list(SCHEDULING), default="stated")
    args = parser.parse_args()
    counts = [count(path, args) for path in args.runs]
    if len(counts) > 1:
        print(f"all: within {args.within:g}%: {sum(w for w, _ in counts)} of {sum(t for _, t in counts)}")


if __name__ == "__main__":
    main()
