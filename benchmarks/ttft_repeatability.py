"""How far measured TTFTs repeat: runs whose setups differ only in the weights' format, side by side.

At large TP a prompt's GPU time hardly depends on the checkpoint's format (a 1k-token prefill of Llama 3.3 70B at
TP 8 on a B200 is a few ms in FP8 or NVFP4), so such twins should show about the same TTFT; the replay says how far
apart servesim puts them. Where the measured twins sit further apart than that, no model of the engine can come
within the difference of both: it bounds what a per-run TTFT check can ask of these records.

Run: python benchmarks/ttft_repeatability.py benchmarks/inferencemax_runs.yaml [--min-tp 8] [--profile measured]
[--max-concurrency 16]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from itertools import combinations
from pathlib import Path

from servesim.simulator.compare.measured import MeasuredRun, load_measured_runs, replay

# what tells twins apart besides the weights' format (the checkpoint's max_model_len differs by a few tokens)
IGNORED = {"source", "id", "quote", "notes", "measured", "weight_dtype"}


def setup_key(run: MeasuredRun) -> str:
    """The run's setup without its weights' format and its provenance."""
    fields = run.model_dump(mode="json", exclude=IGNORED)
    fields["engine_args"].pop("max_model_len", None)
    return json.dumps(fields, sort_keys=True)


def twins(runs: list[MeasuredRun]) -> list[tuple[MeasuredRun, MeasuredRun]]:
    """Pairs of runs with the same setup but for the weights' format."""
    groups: dict[str, list[MeasuredRun]] = defaultdict(list)
    for run in runs:
        groups[setup_key(run)].append(run)
    return [
        (a, b)
        for group in groups.values()
        for a, b in combinations(sorted(group, key=lambda r: r.weight_dtype), 2)
        if a.weight_dtype != b.weight_dtype
    ]


def median_ttft(run: MeasuredRun, profile: str) -> float:
    return next(e.predicted for e in replay(run, profile) if e.metric == "median_ttft_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--min-tp", type=int, default=8, help="only twins at this TP or more")
    parser.add_argument(
        "--max-concurrency", type=int, default=16, help="only closed-loop runs up to this many clients"
    )
    parser.add_argument("--profile", default="measured")
    parser.add_argument(
        "--apart", type=float, default=20.0, help="count twins whose medians differ by more, %%"
    )
    args = parser.parse_args()
    runs = [
        r
        for path in args.runs
        for r in load_measured_runs(path)
        if r.tp >= args.min_tp
        and r.max_concurrency
        and r.max_concurrency <= args.max_concurrency
        and r.measured.get("median_ttft_ms")
    ]
    pairs = twins(runs)
    measured_apart = predicted_apart = 0
    for a, b in pairs:
        ma, mb = a.measured["median_ttft_ms"], b.measured["median_ttft_ms"]
        pa, pb = median_ttft(a, args.profile), median_ttft(b, args.profile)
        m_gap, p_gap = 100 * abs(ma - mb) / min(ma, mb), 100 * abs(pa - pb) / min(pa, pb)
        measured_apart += m_gap > args.apart
        predicted_apart += p_gap > args.apart
        print(
            f"{a.label():62s} median TTFT {ma:6.1f} ms, {b.weight_dtype}: {mb:6.1f} ({m_gap:5.1f}% apart); "
            f"predicted {pa:6.1f} and {pb:6.1f} ({p_gap:4.1f}% apart)",
            flush=True,
        )
    print(
        f"{len(pairs)} twins at TP >= {args.min_tp}: {measured_apart} measured more than {args.apart:g}% apart, "
        f"{predicted_apart} predicted so"
    )


if __name__ == "__main__":
    main()
