"""`servesim sweep`, `capacity`, `plan` and `report`: thin commands over simulator.planning.sweep/capacity/plan/report."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from servesim.hardware.errors import SpecError
from servesim.hardware.spec_model import MAX_PARALLEL, MAX_REPLICAS
from servesim.simulator.cli.app import app, clean_errors, console, print_json, print_table
from servesim.simulator.planning.launch import COMMANDS

if TYPE_CHECKING:
    from servesim.simulator.planning.plan import Deployment

SetOption = typer.Option([], "--set", help="Override a field: dotted.key=value; repeatable")


def _csv(text: str | None, kind: type = str) -> list | None:
    """'a,b,c' -> [a, b, c] converted by `kind`; None stays None."""
    if text is None:
        return None
    try:
        return [kind(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SpecError(f"{text!r}: expected a comma-separated list of {kind.__name__}") from None


def _sizes(text: str | None, option: str) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4], each a parallel group's GPU count, checked here as the plan section checks its own."""
    sizes = _csv(text, int)
    if sizes is not None and (not sizes or any(not 1 <= size <= MAX_PARALLEL for size in sizes)):
        raise SpecError(f"{option} {text!r}: GPU counts from 1 to {MAX_PARALLEL:,}, comma-separated")
    return sizes


def _bools(text: str, option: str) -> list[bool]:
    """'false,true' -> [False, True]."""
    values = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not values or any(value not in ("true", "false") for value in values):
        raise SpecError(f"{option} {text!r}: expected true and/or false, comma-separated")
    return [value == "true" for value in values]


def _so_far(deployment: Deployment, text: str) -> str:
    """A figure of the deployment's run, marked where the run stopped early (its requests so far)."""
    return f"{text}*" if "stopped_at_s" in deployment.verdict.metrics and text else text


def _cell(value: object) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:,.3f}"
    return "" if value is None else str(value)


@app.command()
@clean_errors
def sweep(
    scenario: Path,
    grid: list[str] = typer.Option(
        [], "--grid", help="dotted.key=v1,v2,...; repeatable; adds to `sweep.grid`"
    ),
    out: Path | None = typer.Option(None, "--out", help="Sweep folder (default runs/<name>-sweep)"),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Parallel runs (default: all cores)"),
    engine: str = typer.Option("local", "--engine", help="local (process pool) or dask"),
    dask_address: str | None = typer.Option(
        None, "--dask-address", help="Dask scheduler address (default: a local cluster)"
    ),
    set_: list[str] = SetOption,
) -> None:
    """Run a scenario over a grid of field values (resumable) into one results.csv table."""
    from servesim.simulator.progress import progress_bar
    from servesim.simulator.scenario import load_scenario
    from servesim.simulator.atomic import check_output_folder
    from servesim.simulator.crash import INTERNAL_ERROR
    from servesim.simulator.planning.sweep import SWEEP_FILES, WORKER_DIED, parse_grid, run_sweep

    if dask_address is not None and engine != "dask":
        raise SpecError("--dask-address needs --engine dask (the local engine runs on this machine's cores)")
    spec, base_dir = load_scenario(scenario, set_)
    full_grid = (spec.sweep.grid if spec.sweep else {}) | parse_grid(grid)
    if not full_grid:
        raise SpecError(
            f"{scenario}: nothing to sweep: add a `sweep: {{grid: ...}}` section or --grid key=v1,v2"
        )
    folder = out or Path("runs") / f"{spec.name}-sweep"
    check_output_folder(folder, SWEEP_FILES)
    with progress_bar("sweep points", console, every=1) as advance:
        advance.total(math.prod(len(values) for values in full_grid.values()))
        result = run_sweep(spec, base_dir, full_grid, folder, engine, workers, dask_address, on_point=advance)
    columns = [
        *full_grid,
        "point",
        "error",
        "request_throughput",
        "p90_ttft_ms",
        "p90_tpot_ms",
        "p90_e2el_ms",
    ]
    print_table(
        f"{spec.name}: {len(result.table)} points",
        columns,
        [[_cell(row.get(c)) for c in columns] for row in result.table.to_dict("records")],
    )
    console.print(
        f"{result.num_run} point(s) run, {result.num_reused} reused; results in {folder / 'results.csv'}"
    )
    errors = result.table["error"].dropna()
    crashed, lost = errors[errors.str.startswith(INTERNAL_ERROR)], errors[errors.str.startswith(WORKER_DIED)]
    for failed, what in ((crashed, "hit a servesim bug"), (lost, "lost their worker process")):
        if len(failed):
            others = " (the others ran)" if len(failed) < len(result.table) else ""
            console.print(
                f"[red]{len(failed)} point(s) {what}[/]{others}, e.g. {failed.iloc[0]}", soft_wrap=True
            )
    if len(crashed) or len(lost):
        raise typer.Exit(1)
    if len(errors) == len(result.table):
        raise SpecError(f"every point failed, e.g. {errors.iloc[0]}")


@app.command()
@clean_errors
def capacity(
    scenario: Path,
    set_: list[str] = SetOption,
    rel_tol: float = typer.Option(0.02, "--rel-tol", min=1e-4, help="Stop when the bracket is this narrow"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Find the highest arrival rate at which the scenario meets its SLOs with a stable queue."""
    from servesim.simulator.planning.capacity import max_sustainable_rate
    from servesim.simulator.scenario import load_scenario

    spec, base_dir = load_scenario(scenario, set_)
    if not as_json and not spec.slo.as_ms() and spec.slo.goodput_fraction is None:
        console.print(
            f"[yellow]note:[/] {scenario} sets no SLO (slo.ttft_ms, tpot_ms, e2el_ms): only a growing queue "
            "limits the rate"
        )
    searching, err_console = (
        f"searching {spec.name}'s highest sustainable rate",
        Console(stderr=True, soft_wrap=True),
    )
    with console.status(searching) as status:

        def heard(verdict) -> None:  # a line per rate tried, or on a terminal the spinner's text
            text = f"{verdict.rate_per_s:.4g} {spec.workload.rate_unit}: {'ok' if verdict.ok else ', '.join(verdict.reasons)}"
            if console.is_terminal:
                status.update(f"{searching} (last tried {text})")
            else:
                err_console.print(f"tried {text}", markup=False, highlight=False)

        result = max_sustainable_rate(spec, base_dir, rel_tol=rel_tol, on_verdict=heard)
    if as_json:
        print_json(result.as_dict())
        return
    print_table(
        f"{spec.name}: verdicts by rate",
        [result.unit, "verdict", "why"],
        [
            [f"{v.rate_per_s:.3f}", "ok" if v.ok else ", ".join(v.reasons), "; ".join(v.details)]
            for v in result.verdicts
        ],
    )
    rate = f"{result.rate_per_s:.3f} {result.unit}" if result.rate_per_s else "none (no rate tried passes)"
    if result.search_limit_reached:
        rate = f"at least {rate} (the search's ceiling: every rate tried passed)"
    console.print(f"max sustainable rate {rate} ({result.num_simulations} simulations)")
    if result.short_run:
        console.print(f"[yellow]note:[/] {result.short_run}")


@app.command()
@clean_errors
def plan(
    scenario: Path,
    gpus: str | None = typer.Option(None, "--gpus", help="GPU names, comma-separated (default: plan.gpus)"),
    tp: str | None = typer.Option(
        None, "--tp", help="TP sizes, comma-separated (default: plan.tp or 1,2,4,8)"
    ),
    pp: str | None = typer.Option(
        None,
        "--pp",
        help="Pipeline-parallel sizes, comma-separated (default: plan.pp or the scenario's parallelism.pp)",
    ),
    knob: list[str] = typer.Option([], "--knob", help="Engine knob values: max_num_seqs=128,256; repeatable"),
    ep: str | None = typer.Option(
        None, "--ep", help="Expert parallel off and/or on: false,true (default: plan.ep or the scenario's)"
    ),
    dp_attention: str | None = typer.Option(
        None,
        "--dp-attention",
        help="DP attention off and/or on: false,true (default: plan.dp_attention or the scenario's)",
    ),
    max_replicas: int | None = typer.Option(None, "--max-replicas", min=1, max=MAX_REPLICAS),
    target_rate: float | None = typer.Option(
        None,
        "--target-rate",
        min=0.0,
        help="Load to sustain, in arrivals.rate_per_s's unit (default: the scenario's)",
    ),
    out: Path | None = typer.Option(None, "--out", help="Folder for plan.json (default runs/<name>-plan)"),
    workers: int | None = typer.Option(
        None, "--workers", min=1, help="Parallel candidates (default: all cores)"
    ),
    exhaustive: bool = typer.Option(
        False,
        "--exhaustive",
        help="Size and verify every candidate, those too costly to be chosen too: the whole cost/latency table",
    ),
    emit: tuple[str, Path] | None = typer.Option(
        None,
        "--emit",
        metavar="KIND DIR",
        help="Also write the recommended deployment's manifests and benchmark script to DIR: k8s (Deployment and "
        "Service), llm-d (modelservice chart values) or dynamo (DynamoGraphDeployment)",
    ),
    image: str | None = typer.Option(
        None, "--image", help="Container image for --emit (default: the engine's)"
    ),
    set_: list[str] = SetOption,
) -> None:
    """Find the cheapest deployment (GPU x TP x PP x layout x replicas x knobs) that sustains the load within the
    SLOs."""
    from servesim.simulator.atomic import check_output_folder, check_replaceable, write_text_atomic
    from servesim.simulator.planning.deploy import EMIT_KINDS
    from servesim.simulator.planning.executors import default_workers
    from servesim.simulator.world.output import json_text
    from servesim.simulator.planning.plan import plan as make_plan
    from servesim.simulator.progress import plan_progress
    from servesim.simulator.scenario import load_scenario
    from servesim.simulator.planning.sweep import parse_grid

    if target_rate is not None and not 0 < target_rate < math.inf:
        raise SpecError(f"--target-rate: a finite load of more than 0, not {target_rate}")
    spec, base_dir = load_scenario(scenario, set_)
    knobs = {k.removeprefix("engine."): v for k, v in parse_grid(knob, "--knob").items()} or None
    layouts = {
        name: _bools(values, option)
        for name, option, values in (("ep", "--ep", ep), ("dp_attention", "--dp-attention", dp_attention))
        if values is not None
    } or None
    tps, pps = _sizes(tp, "--tp"), _sizes(pp, "--pp")
    folder = out or Path("runs") / f"{spec.name}-plan"
    check_output_folder(folder, frozenset({"plan.json"}))
    if emit is not None:
        if emit[0] not in EMIT_KINDS:
            raise SpecError(f"--emit {emit[0]!r} is not one of {', '.join(EMIT_KINDS)}")
        check_replaceable(emit[1])
    with plan_progress(console) as on_progress:
        result = make_plan(
            spec,
            base_dir,
            _csv(gpus),
            tps,
            knobs,
            max_replicas,
            target_rate,
            workers=workers or default_workers(),
            pps=pps,
            layouts=layouts,
            on_progress=on_progress,
            exhaustive=exhaustive,
        )
    path = folder / "plan.json"
    write_text_atomic(path, json_text(result.as_dict(), indent=2))
    _print_plan(result)
    console.print(f"{result.num_simulations} simulations; plan in {path}")
    if emit is not None:
        _emit(result, spec, base_dir, *emit, image)


def _emit(result, spec, base_dir: Path, kind: str, folder: Path, image: str | None) -> None:
    """The recommendation's manifests and benchmark script, written as one folder."""
    from servesim.simulator.atomic import atomic_dir
    from servesim.simulator.planning.deploy import deployment_files

    if result.recommendation is None:
        raise SpecError("--emit: no deployment met the SLOs within the limits; nothing to deploy")
    chosen = result.recommendation
    s = chosen.evaluation.candidate.scenario(spec, chosen.replicas)
    files = deployment_files(
        kind, s, base_dir, chosen.evaluation.max_model_len, result.target_rate_per_s, image
    )
    with atomic_dir(folder) as tmp:
        for name, text in files.items():
            (tmp / name).write_text(text)
        (tmp / "benchmark.sh").chmod(0o755)
    console.print(escape(f"{kind} manifests in {folder}: {', '.join(files)}"))


def _print_plan(result) -> None:
    from servesim.simulator.report.run_report import number_text

    rows = [
        [
            e.candidate.label,
            e.rejection or "sized",
            f"{e.rate_per_replica:.2f}",
            _cell(e.replicas),
            f"{e.price_per_replica_hour_usd:.2f}",
            e.detail[:90],
        ]
        for e in result.evaluations
    ]
    limits = ", ".join(f"{k.upper()} <= {v:,g} ms" for k, v in _limits(result.slo).items()) or "none"
    console.print(
        f"planned against: {result.pct} {limits} at {result.target_rate_per_s:.3g} {result.unit}; "
        f"profile: {result.profile}",
        soft_wrap=True,
    )
    columns = ["candidate", "status", f"{result.unit} per replica", "replicas", "$/h per replica", "why"]
    print_table(f"candidates at {result.target_rate_per_s:.2f} {result.unit}", columns, rows)
    pct = result.pct
    frontier = {d.label for d in result.pareto(f"{pct}_ttft_ms")}
    deployments = sorted(result.deployments, key=lambda d: d.cost_per_hour_usd)
    rows = [
        [
            d.label,
            f"{d.cost_per_hour_usd:.2f}",
            _cell(d.cost_per_million_output_tokens_usd),
            _so_far(d, number_text(d.verdict.metrics[f"{pct}_ttft_ms"])),
            _so_far(d, number_text(d.verdict.metrics[f"{pct}_tpot_ms"])),
            "ok" if d.verdict.ok else ", ".join(d.verdict.reasons),
            "yes" if d.label in frontier else "",
        ]
        for d in deployments
    ]
    print_table(
        "deployments simulated whole at the target rate",
        ["deployment", "$/h", "$/M output tokens", f"{pct} TTFT ms", f"{pct} TPOT ms", "verdict", "Pareto"],
        rows,
    )
    if any("stopped_at_s" in d.verdict.metrics for d in deployments):
        console.print(
            "* the run stopped once it was certain to fail: latencies of its requests so far, not the whole run's"
        )
    rec, nxt = result.recommendation, result.next_cheaper
    if rec is None:
        console.print("[bold red]no candidate meets the SLOs at the target rate[/]")
        return
    gpus = rec.as_dict()["gpus"]
    console.print(
        f"[bold]recommendation:[/] {rec.label} ({gpus} GPU{'s' * (gpus > 1)}): ${rec.cost_per_hour_usd:.2f}/h, "
        f"${rec.cost_per_million_output_tokens_usd:.3f} per million output tokens"
    )
    if rec.thin_margin:
        console.print(f"[yellow]note:[/] {rec.thin_margin}")
    if rec.evaluation.capacity is not None and rec.evaluation.capacity.short_run:
        console.print(
            f"[yellow]note:[/] sizing {rec.evaluation.candidate.label}: {rec.evaluation.capacity.short_run}"
        )
    if nxt is not None:
        console.print(
            f"next cheaper: {nxt.label} (${nxt.cost_per_hour_usd:.2f}/h) fails: "
            f"{'; '.join(nxt.verdict.details)}"
        )
    if result.profile_check is not None:
        _print_profile_check(result)
    for family in COMMANDS:
        console.print(f"{family.label + ':':<7} {result.commands[family.name]}", soft_wrap=True)
    for note in result.commands["notes"]:
        console.print(f"note: {note}")


def _limits(slo: dict) -> dict[str, float]:
    return {k: slo[f"{k}_ms"] for k in ("ttft", "tpot", "e2el") if slo.get(f"{k}_ms") is not None}


def _print_profile_check(result) -> None:
    """Whether the other profile picks the same deployment; if not, how to plan under it."""
    check, rec, nxt = result.profile_check, result.recommendation, result.next_cheaper
    pct = result.pct
    seen = [
        f"{d.label} {'passes' if v.ok else 'fails'} ({pct} TTFT {v.metrics[f'{pct}_ttft_ms']:,.0f} ms, "
        f"TPOT {v.metrics[f'{pct}_tpot_ms']:,.1f} ms)"
        for d, v in ((rec, check.recommendation), (nxt, check.next_cheaper))
        if v is not None
    ]
    if check.agrees:
        console.print(
            f"profile check: under {check.profile} the same deployment is chosen: {'; '.join(seen)}"
        )
    else:
        console.print(
            f"[yellow]warning:[/] the answer depends on the profile: under {check.profile}, {'; '.join(seen)}; "
            f"plan under it with --set hardware.profile={check.profile}",
            soft_wrap=True,
        )


@app.command()
@clean_errors
def report(
    folder: Path,
    out: Path | None = typer.Option(None, "--out", help="HTML file (default FOLDER/report.html)"),
    plotly: str = typer.Option(
        "inline", "--plotly", help="inline: plotly.js in the file (opens offline); cdn: fetched when opened"
    ),
) -> None:
    """Write one HTML report of a run folder or a sweep folder."""
    from servesim.simulator.report.run_report import write_report

    console.print(f"report in {write_report(folder, out, plotly)}")


@app.command()
@clean_errors
def export(
    folder: Path,
    perfetto: Path = typer.Option(..., "--perfetto", help="Chrome/Perfetto trace JSON to write"),
) -> None:
    """Export a run folder's steps and requests as a trace for ui.perfetto.dev or chrome://tracing."""
    from servesim.simulator.report.perfetto import write_perfetto

    console.print(f"{write_perfetto(folder, perfetto):,} events in {perfetto}")
