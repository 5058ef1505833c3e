"""`servesim compare`: the simulator against measured benchmark runs."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from hardware.errors import SpecError
from simulator.cli import GpuFiles, app, clean_errors, console, print_json, print_table


GROUPS = {"model": lambda run: run.model, "gpu": lambda run: run.gpu, "engine": lambda run: run.engine,
          "moe": lambda run: "MoE models" if run.is_moe else "dense models"}


@app.command()
@clean_errors
def compare(runs_file: Path,
            model: str | None = typer.Option(None, "--model", help="A vllm bench JSON's model (preset or config.json)"),
            gpu: str | None = typer.Option(None, "--gpu", help="A vllm bench JSON's GPU (catalog name)"),
            tp: int = typer.Option(1, "--tp", min=1, help="A vllm bench JSON's tensor-parallel size"),
            set_: list[str] = typer.Option([], "--set", help="A vllm bench JSON's other setup: field=value "
                                           "(weight_dtype=fp8, engine_args.max_model_len=4096, input_len=1024...)"),
            profile: str | None = typer.Option(None, "--profile", help="Calibration profile name or YAML path "
                                               "(default: the cost model's documented defaults)"),
            match: str | None = typer.Option(None, "--match", help="Only runs whose label contains this text"),
            by: str | None = typer.Option(None, "--by", help="Also one error table per model, gpu, engine or "
                                          "moe (MoE vs dense models)"),
            html: Path | None = typer.Option(None, "--html", help="Write a plotly report here"),
            gpu_file: list[Path] = GpuFiles,
            as_json: bool = typer.Option(False, "--json")) -> None:
    """Simulate measured benchmark runs and report the error of every figure they give: a YAML list like
    benchmarks/published_runs.yaml, or one `vllm bench serve --save-result` JSON with --model and --gpu."""
    from simulator.measured import load_measured_runs, replay_run, run_from_vllm_result, select, with_gpu_files
    from simulator.scenario import apply_overrides
    from simulator.measured_report import (ERROR_COLUMNS, FAMILY_COLUMNS, error_rows, family_rows,
                                           write_html)
    from simulator.progress import progress_bar
    from simulator.atomic import check_output_file

    if html is not None:
        check_output_file(html, "--html")
    if runs_file.suffix == ".json":
        if model is None or gpu is None:
            raise SpecError(f"{runs_file}: a vllm bench result does not say what served it: give --model and --gpu")
        runs = [run_from_vllm_result(runs_file, apply_overrides({"model": model, "gpu": gpu, "tp": tp}, set_))]
    elif model or gpu or set_ or tp != 1:
        raise SpecError(f"{runs_file}: --model, --gpu, --tp and --set describe a vllm bench JSON; a runs file "
                        "names each run's setup itself")
    else:
        runs = load_measured_runs(runs_file)
    runs = with_gpu_files(select(runs, match), gpu_file)
    if by is not None and by not in GROUPS:
        raise SpecError(f"--by {by!r}: choose from {', '.join(GROUPS)}")
    if not runs:
        raise SpecError(f"{runs_file}: no run's label contains {match!r}")
    results, preempted = [], {}
    with progress_bar("simulating runs", console, every=1) as advance:
        advance.total(len(runs))
        for i, run in enumerate(runs, 1):
            replayed = replay_run(run, profile)
            results.append((run, replayed.errors))
            preempted[run.label()] = replayed.preemptions
            advance(i)
    if as_json:
        print_json([{"run": run.label(), "source": run.source, "simulated_preemptions": preempted[run.label()],
                     "figures": [{"metric": e.metric, "measured": e.measured, "predicted": e.predicted,
                                  "error_pct": e.error_pct} for e in errors]} for run, errors in results])
    else:
        print_table(f"{runs_file}: every figure", ERROR_COLUMNS, error_rows(results))
        print_table(f"error per family ({profile or 'default profile'})", FAMILY_COLUMNS, family_rows(results))
        if any(preempted.values()):
            print_table("runs whose simulated engine preempted (its KV ran out)", ["run", "preemptions"],
                        [[label, n] for label, n in preempted.items() if n])
        if by is not None:
            groups: dict[str, list] = {}
            for run, errors in results:
                groups.setdefault(GROUPS[by](run), []).append((run, errors))
            for key, members in groups.items():
                title = key if by == "moe" else f"{by} = {key}"
                print_table(f"{title}: {len(members)} run(s)", FAMILY_COLUMNS, family_rows(members))
    if html is not None:
        written = f"report: {write_html(results, html, f'servesim vs measured runs: {runs_file.name}')}"
        if as_json:  # stdout holds the JSON alone
            print(written, file=sys.stderr)
        else:
            console.print(written)
