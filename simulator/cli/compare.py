"""`servesim compare`: the simulator against measured benchmark runs."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from servesim.hardware.errors import SpecError
from servesim.simulator.cli.app import GpuFiles, app, clean_errors, console, print_json, print_table


GROUPS = {
    "model": lambda run: run.model,
    "gpu": lambda run: run.gpu,
    "engine": lambda run: run.engine,
    "moe": lambda run: "MoE models" if run.is_moe else "dense models",
}


@app.command()
@clean_errors
def compare(
    runs_file: Path,
    model: str | None = typer.Option(
        None, "--model", help="A benchmark result's model (preset, config.json or HF id)"
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="A benchmark result's GPU (catalog name)"),
    tp: int = typer.Option(1, "--tp", min=1, help="A benchmark result's tensor-parallel size"),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="A benchmark result's other setup: field=value "
        "(weight_dtype=fp8, engine_args.max_model_len=4096, input_len=1024...)",
    ),
    profile: list[str] = typer.Option(
        [],
        "--profile",
        help="Calibration profile name or YAML path "
        "(default: the cost model's documented defaults); repeat it to set "
        "profiles side by side",
    ),
    split: list[str] = typer.Option(
        [],
        "--split",
        help="Also each profile's error on the runs its fitted "
        "numbers never saw: leave one source out (source) or one GPU out (gpu); "
        "repeatable",
    ),
    match: str | None = typer.Option(
        None,
        "--match",
        help="Only runs whose label matches this regular expression (plain text: contains it)",
    ),
    by: str | None = typer.Option(
        None, "--by", help="Also one error table per model, gpu, engine or moe (MoE vs dense models)"
    ),
    html: Path | None = typer.Option(None, "--html", help="Write a plotly report here"),
    gpu_file: list[Path] = GpuFiles,
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="Processes replaying runs side by side (default: all cores)"
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Simulate measured benchmark runs and report the error of every figure they give: a YAML list like
    benchmarks/published_runs.yaml, one `vllm bench serve --save-result` JSON, a GuideLLM report JSON (a run per
    benchmark) or an SGLang `bench_serving` JSONL (a run per line), these three with --model and --gpu."""
    from servesim.hardware.profile import load_profile
    from servesim.simulator.compare.holdout import SPLITS, holdout_rows
    from servesim.simulator.compare.measured import (
        distinct_files,
        RESULT_SUFFIXES,
        replay_run,
        runs_from_file,
        select,
        with_gpu_files,
    )
    from servesim.simulator.compare.measured_report import write_html
    from servesim.simulator.planning.executors import run_jobs
    from servesim.simulator.progress import progress_bar
    from servesim.simulator.atomic import check_output_file

    if html is not None:
        check_output_file(html, "--html")
    if runs_file.suffix not in RESULT_SUFFIXES and (model or gpu or set_ or tp != 1):
        raise SpecError(
            f"{runs_file}: --model, --gpu, --tp and --set describe a benchmark result file; a runs file "
            "names each run's setup itself"
        )
    runs = runs_from_file(runs_file, model, gpu, tp, set_)
    runs = with_gpu_files(select(runs, match), gpu_file)
    if by is not None and by not in GROUPS:
        raise SpecError(f"--by {by!r}: choose from {', '.join(GROUPS)}")
    if not runs:
        raise SpecError(f"{runs_file}: no run's label matches {match!r}")
    unknown = sorted(set(split) - set(SPLITS))
    if unknown:
        raise SpecError(f"--split {unknown[0]!r}: choose from {', '.join(SPLITS)}")
    files = tuple(distinct_files([f for run in runs for f in run.gpu_files]))
    names = list(dict.fromkeys(profile)) or ["default"]
    profiles = {name: load_profile(None if name == "default" else name, files) for name in names}
    pairs = [(name, run) for name in names for run in runs]
    jobs = [(run, None if name == "default" else name) for name, run in pairs]
    replays: list = [None] * len(jobs)
    with progress_bar("simulating runs", console, every=1) as advance:
        advance.total(len(jobs))
        for done, (index, replayed) in enumerate(run_jobs(replay_run, jobs, workers=workers), 1):
            replays[index] = replayed
            advance(done)
    by_profile: dict[str, list] = {name: [] for name in names}
    preempted: dict[str, dict[str, int]] = {name: {} for name in names}
    for (name, run), replayed in zip(pairs, replays):
        by_profile[name].append((run, replayed.errors))
        preempted[name][run.label()] = replayed.preemptions
    if as_json:
        print_json(
            [
                {
                    "run": run.label(),
                    "source": run.source,
                    "profile": name,
                    "simulated_preemptions": preempted[name][run.label()],
                    "figures": [
                        {
                            "metric": e.metric,
                            "measured": e.measured,
                            "predicted": e.predicted,
                            "error_pct": e.error_pct,
                        }
                        for e in errors
                    ],
                }
                for name, results in by_profile.items()
                for run, errors in results
            ]
        )
    else:
        for name, results in by_profile.items():
            _print_profile(runs_file, name, results, preempted[name], by, len(names) > 1)
        for way in split:
            print_table(
                f"held out by {way} (leave one {way} out): median (p90) |error| over the figures of runs "
                "no fitted number of the profile saw",
                ["family", *names],
                holdout_rows(by_profile, profiles, way),
            )
            if len(names) > 1:
                shared = holdout_rows(by_profile, profiles, way, shared=True)
                title = f"held out by {way} from every profile: the same figures in each column"
                if shared:
                    print_table(title, ["family", *names], shared)
                else:
                    console.print(f"{title}: none (no run is out of every profile's sample)")
    results = by_profile[names[0]]
    if html is not None:
        written = f"report: {write_html(results, html, f'servesim vs measured runs: {runs_file.name}')}"
        if as_json:  # stdout holds the JSON alone
            print(written, file=sys.stderr)
        else:
            console.print(written)


def _print_profile(
    runs_file: Path, name: str, results: list, preempted: dict[str, int], by: str | None, several: bool
) -> None:
    """One profile's every-figure and per-family tables, its preempting twins and its `--by` tables."""
    from servesim.simulator.compare.measured_report import (
        ERROR_COLUMNS,
        FAMILY_COLUMNS,
        error_rows,
        family_rows,
    )

    label = "default profile" if name == "default" else name
    suffix = f" ({label})" if several else ""
    print_table(f"{runs_file}: every figure{suffix}", ERROR_COLUMNS, error_rows(results))
    print_table(f"error per family ({label})", FAMILY_COLUMNS, family_rows(results))
    if any(preempted.values()):
        print_table(
            f"runs whose simulated engine preempted (its KV ran out){suffix}",
            ["run", "preemptions"],
            [[run, n] for run, n in preempted.items() if n],
        )
    if by is not None:
        groups: dict[str, list] = {}
        for run, errors in results:
            groups.setdefault(GROUPS[by](run), []).append((run, errors))
        for key, members in groups.items():
            title = key if by == "moe" else f"{by} = {key}"
            print_table(f"{title}: {len(members)} run(s){suffix}", FAMILY_COLUMNS, family_rows(members))
