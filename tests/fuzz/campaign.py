"""The input fuzzer's campaign: `python -m tests.fuzz.campaign --cases 10000` mutates the bundled scenarios and
the files they name, runs each case through `servesim simulate` (20 s and 6 GiB at most) and prints how many were
refused cleanly, ran with sound outputs, or are findings (crashes, hangs, long messages, misleading runs). Each
finding's folder is kept with a `case.json` saying what was mutated; case N of a seed is the same on every run."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tests.fuzz.bases import bundled_bases, write_case
from tests.fuzz.mutations import Case, command_case, mutate
from tests.fuzz.verdict import OK_VERDICTS, Verdict, judge, start, wait

COMMAND_SHARE = 0.1  # cases that are a `memory` or `roofline` command line rather than a scenario


def case_for(index: int, seed: int, bases: list) -> Case:
    """Case `index` of campaign `seed`: the same mutations on every run."""
    rng = random.Random(f"{seed}:{index}")
    return command_case(rng) if rng.random() < COMMAND_SHARE else mutate(rng.choice(bases), bases, rng)


def run_campaign(
    cases: int, seed: int, workers: int, timeout_s: float, folder: Path, progress=None
) -> tuple[Counter, list[tuple[int, Case, Verdict]]]:
    """Run cases 0..cases-1, `workers` at a time; returns the verdict counts and the findings."""
    import servesim.simulator.cli.main  # noqa: F401 (imported once here, so each forked case starts warm)

    bases = bundled_bases()
    counts: Counter = Counter()
    findings: list[tuple[int, Case, Verdict]] = []
    running: dict[int, tuple[int, Case, Path]] = {}
    next_index = 0
    while next_index < cases or running:
        while next_index < cases and len(running) < workers:
            case = case_for(next_index, seed, bases)
            case_folder = folder / f"case{next_index:05d}"
            write_case(case_folder, case.text, case.files)
            running[start(case_folder, case.argv)] = (next_index, case, case_folder)
            next_index += 1
        pid = next(iter(running))
        index, case, case_folder = running.pop(pid)
        code, seconds = wait(pid, timeout_s)
        verdict = judge(case_folder, code, seconds, case.non_finite, case.trace_non_finite, case.argv is None)
        counts[verdict.kind] += 1
        if verdict.kind in OK_VERDICTS:
            shutil.rmtree(case_folder, ignore_errors=True)
        else:
            findings.append((index, case, verdict))
            (case_folder / "case.json").write_text(
                json.dumps(
                    {
                        "index": index,
                        "seed": seed,
                        "base": case.base,
                        "changes": case.changes,
                        "argv": case.argv,
                        "non_finite": case.non_finite,
                        "trace_non_finite": case.trace_non_finite,
                        "verdict": verdict.kind,
                        "detail": verdict.detail,
                    },
                    indent=1,
                )
            )
        if progress:
            progress(sum(counts.values()), counts)
    return counts, findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a case may run")
    parser.add_argument("--keep", type=Path, help="folder for the findings (default: a temporary one)")
    args = parser.parse_args(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="servesim-fuzz-"))
    began = time.monotonic()

    def progress(done: int, counts: Counter) -> None:
        if done % 100 == 0 or done == args.cases:
            print(
                f"{done}/{args.cases} cases, {time.monotonic() - began:.0f} s: {dict(counts)}",
                file=sys.stderr,
            )

    counts, findings = run_campaign(args.cases, args.seed, args.workers, args.timeout, folder, progress)
    for index, case, verdict in findings:
        print(f"case {index} ({case.base}; {'; '.join(case.changes)}): {verdict.kind}: {verdict.detail}")
    print(
        f"{sum(counts.values())} cases in {time.monotonic() - began:.0f} s: "
        + ", ".join(
            f"{kind} {counts[kind]}"
            for kind in ("refused", "ran", "crash", "hang", "long_message", "wrote_output", "misled")
        )
    )
    print(f"findings kept in {folder}" if findings else "no findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
