"""`servesim calibrate`, `validate` and `fit`: time the torch executor, fit a profile, close the loop; or fit one to
measured benchmark runs.

torch is imported only inside the commands (through `calibration.pipeline`), so `--help` and every
other command work without it.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.kernel_tables import FRAMEWORKS
from servesim.hardware.model import get_model
from servesim.hardware.profile import FIXED_COSTS, Profile, load_profile
from servesim.simulator.cli.app import GpuFiles, app, clean_errors, console, print_table

DEFAULT_SCALE = "layers=4,hidden=256,heads=4,kv_heads=2,intermediate=768,vocab=2048"
CURVES = ("gemm_compute", "gemm_memory", "attn_compute", "attn_memory", "comm")


def _curve_text(profile: Profile, name: str) -> str:
    return " ".join(f"{tokens:g}:{eff:.3f}" for tokens, eff in getattr(profile, name).points)


def profile_rows(fitted: Profile, default: Profile = Profile()) -> list[list[str]]:
    """[parameter, fitted, default] rows (default: what the fit started from): curves as tokens:efficiency pairs,
    overheads in microseconds."""
    rows = [[name, _curve_text(fitted, name), _curve_text(default, name)] for name in CURVES]
    for name in ("moe_compute", "moe_memory"):  # None: as the GEMM curves (executor fits)
        rows.append(
            [
                name,
                *(
                    _curve_text(p, name) if getattr(p, name) is not None else "as gemm"
                    for p in (fitted, default)
                ),
            ]
        )
    for name in (*FIXED_COSTS, "moe_layer_s", "moe_expert_s"):
        rows.append(
            [
                name.replace("_s", "_us"),
                f"{getattr(fitted, name) * 1e6:.3g}",
                f"{getattr(default, name) * 1e6:.3g}",
            ]
        )
    return rows


@app.command()
@clean_errors
def calibrate(
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    model: str = typer.Option("llama-3.1-8b", "--model", help="Model preset to build the executor from"),
    scale: str = typer.Option(DEFAULT_SCALE, "--scale", help="scale_model arguments k=v,...; '' = full size"),
    gpu: str | None = typer.Option(None, "--gpu", help="cuda only: the catalog GPU this device is (h200)"),
    out: Path = typer.Option(
        Path("calibration_out"), "--out", help="Output folder, or the profile's .yaml path inside it"
    ),
    quick: bool = typer.Option(False, "--quick", help="Smaller grid, 3 repeats"),
    threads: int | None = typer.Option(
        None, "--threads", min=1, help="torch CPU threads (default: torch's own)"
    ),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Time the executor on a grid of batch shapes, fit a profile, write it with grid.csv (and device.yaml)."""
    from servesim.calibration.pipeline import Setup, run_calibration
    from servesim.calibration.scaled import parse_scale

    if device not in ("cpu", "cuda"):
        raise SpecError(f"--device {device!r}: choose cpu or cuda")
    folder, name = (out.parent, out.name) if out.suffix in (".yaml", ".yml") else (out, "profile.yaml")
    if folder.exists() and not folder.is_dir():
        raise SpecError(f"--out {folder}: is a file; the output is a folder")
    get_model(model)  # an unknown preset fails here, before the output folder is made
    setup = Setup(model, parse_scale(scale), device, "", (), seed=seed, threads=threads)
    report, setup = run_calibration(setup, folder, gpu, quick, profile_name=name, console=console)
    print_table(
        escape(f"profile for {model} [{scale or 'full size'}] on {setup.gpu}"),
        ["parameter", "fitted", "default"],
        profile_rows(report.profile),
    )
    print_table(
        "step-time MAPE % (test = shapes held out of the fit)",
        ["split", "rows", "default profile", "fitted profile"],
        report.table(),
    )
    if report.num_beating_roofline:
        console.print(
            escape(
                f"warning: {report.num_beating_roofline} measured steps beat the roofline; "
                f"check the device peaks of {setup.gpu!r}"
            )
        )
    console.print(escape(f"profile in {folder / name}; measurements in {folder / 'grid.csv'}"))


@app.command()
@clean_errors
def validate(
    calibration_dir: Path = typer.Argument(..., help="Folder written by `servesim calibrate`"),
    requests: int = typer.Option(300, "--requests", min=1, help="Requests in the trace"),
    load: float = typer.Option(0.6, "--load", min=0.01, help="Arrival rate as a fraction of saturation"),
    prompt_median: float = typer.Option(160, "--prompt-median", help="Median prompt tokens (lognormal)"),
    output_max: int = typer.Option(64, "--output-max", help="Output tokens uniform in [8, this]"),
    max_num_batched_tokens: int = typer.Option(256, "--max-num-batched-tokens"),
    max_num_seqs: int = typer.Option(32, "--max-num-seqs"),
    num_blocks: int = typer.Option(1024, "--num-blocks", help="KV blocks of the executor's pool"),
    fast_prefill: bool = typer.Option(False, "--fast-prefill", help="YOCO fast prefill (KV-sharing models)"),
    prefix_caching: str = typer.Option(
        "vllm", "--prefix-caching", help="KV manager of both runs: vllm or none"
    ),
    num_prefixes: int = typer.Option(0, "--num-prefixes", min=0, help="Shared prompt prefixes in the trace"),
    prefix_tokens: int = typer.Option(0, "--prefix-tokens", min=0, help="Tokens of each shared prefix"),
    prefix_share: float = typer.Option(
        1.0, "--prefix-share", min=0, max=1, help="Fraction of prompts that start with a shared prefix"
    ),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: the calibration one)"),
) -> None:
    """Serve a trace on the executor and replay it in the simulator; print per-request TTFT/TPOT/E2E errors."""
    from servesim.calibration.pipeline import TraceSpec, run_validation

    trace = TraceSpec(
        requests,
        prompt_median,
        8,
        output_max,
        load,
        max_num_batched_tokens,
        max_num_seqs,
        num_blocks,
        fast_prefill,
        prefix_caching,
        num_prefixes,
        prefix_tokens,
        prefix_share,
    )
    v = run_validation(calibration_dir, trace, out)
    rows = [
        [
            r.metric,
            r.requests,
            f"{r.median_abs_pct_err:.1f}",
            f"{r.p90_abs_pct_err:.1f}",
            f"{r.measured_median_ms:.2f}",
            f"{r.simulated_median_ms:.2f}",
            f"{r.median_pct_err:.1f}",
        ]
        for r in v.table.itertuples()
    ]
    print_table(
        "simulated vs measured (per-request absolute % error; throughput in tokens/s; step_time: per step)",
        [
            "metric",
            "requests",
            "median err %",
            "p90 err %",
            "measured median",
            "simulated median",
            "err of median %",
        ],
        rows,
    )
    console.print(escape(f"report in {(out or calibration_dir) / 'validation.html'}"))


@app.command("fit")
@clean_errors
def fit_runs(
    runs_files: list[Path] = typer.Argument(
        ...,
        help="Measured runs (YAML lists, as benchmarks/published_runs.yaml; one or more), or a benchmark result "
        "file (vllm bench serve JSON, GuideLLM report, SGLang bench_serving JSONL) with --model and --gpu",
    ),
    model: str | None = typer.Option(
        None, "--model", help="A benchmark result's model (preset, config.json or HF id)"
    ),
    tp: int = typer.Option(1, "--tp", min=1, help="A benchmark result's tensor-parallel size"),
    set_: list[str] = typer.Option([], "--set", help="A benchmark result's other setup: field=value"),
    match: str | None = typer.Option(
        None,
        "--match",
        help="Only runs whose label matches this regular expression (plain text: contains it)",
    ),
    holdout_every: int = typer.Option(
        3, "--holdout-every", min=0, help="Hold every n-th run (n >= 2) out of the fit to test it (0: none)"
    ),
    out: Path = typer.Option(Path("fit_out"), "--out", help="Folder for profile.yaml and figures.csv"),
    name: str | None = typer.Option(
        None, "--name", help=("The profile's name (default: the base's with --base, else fitted-runs)")
    ),
    max_evaluations: int = typer.Option(
        200, "--max-evaluations", min=1, help="Replays of all train runs the search may spend"
    ),
    prior: float = typer.Option(
        0.0,
        "--prior",
        min=0.0,
        help=(
            "Pull toward the base profile: residual prior * log(value / base value) per parameter (0: none; "
            "~0.05 keeps parameters the runs cannot tell apart near the base)"
        ),
    ),
    only: str | None = typer.Option(
        None,
        "--only",
        help=(
            "Fit just these parameters, comma-separated (e.g. moe_compute,moe_memory); the others keep "
            "the base profile's values. The API server's api_request_s, api_token_s, api_latency_s only when named"
        ),
    ),
    base: str | None = typer.Option(
        None,
        "--base",
        help=(
            "Start from this profile (name or YAML path; default: the documented defaults): it keeps what the "
            "fit does not move, and its errors are the ones the fit is compared with"
        ),
    ),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help=(
            "Fit only the runs on this GPU (catalog name) into the base profile's `gpus.<GPU>` section: the "
            "shared values, and every other GPU's, stay as they are (a benchmark result's GPU: it was served on it)"
        ),
    ),
    experts: str | None = typer.Option(
        None,
        "--experts",
        help=(
            "Fit the routed experts' numbers into the profile's `moe_kernels` entry for this expert weight dtype "
            "(mxfp4, fp8, ...): every run must serve experts of that dtype, and other dtypes keep theirs"
        ),
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        help=(
            "Fit only the runs of this engine (vllm, sglang, trtllm) into the base profile's `engines.<engine>` "
            "section, as --gpu does a GPU's: the engine's own kernels; with --gpu, into that section's own section "
            "for the GPU (`engines.<engine>.gpus.<gpu>`)"
        ),
    ),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Processes (default: all cores)"),
    gpu_file: list[Path] = GpuFiles,
) -> None:
    """Fit a profile's efficiencies and overheads to measured runs' figures (no executor, no step times), and
    report the base profile's and the fitted one's errors on the runs fitted and the runs held out; --gpu fits one
    GPU's section of a profile, --engine one engine's, both the engine's section for that GPU."""
    import pandas as pd

    try:
        from servesim.calibration.fit_runs import figure_rows, fit_to_runs, split
    except ImportError as err:  # scipy is an extra: the simulator itself runs without it
        raise SpecError(f"servesim fit needs {err.name}: pip install -e '.[calibrate]'") from None
    from servesim.calibration.calibrate import save_profile
    from servesim.simulator.atomic import atomic_dir, check_replaceable
    from servesim.simulator.planning.executors import default_workers
    from servesim.simulator.compare.measured import (
        RESULT_SUFFIXES,
        distinct_files,
        runs_from_file,
        select,
        with_gpu_files,
    )
    from servesim.simulator.compare.measured_report import FAMILY_COLUMNS, family_rows
    from servesim.simulator.progress import progress_bar

    check_replaceable(out)  # before the fit, not after it
    results = [f for f in runs_files if f.suffix in RESULT_SUFFIXES]
    if results and len(runs_files) > 1:
        raise SpecError(
            f"{results[0]}: a benchmark result file is fitted alone (its --model and --gpu are its own)"
        )
    if not results and (model or set_ or tp != 1):
        raise SpecError(
            f"{runs_files[0]}: --model, --tp and --set describe a benchmark result file; a runs file names each "
            "run's setup itself"
        )
    loaded = [run for f in runs_files for run in runs_from_file(f, model, gpu, tp, set_)]
    runs = with_gpu_files(select(loaded, match), gpu_file)
    names = " + ".join(f.name for f in runs_files)
    files = tuple(distinct_files([*gpu_file, *(f for run in runs for f in run.gpu_files)]))
    start = load_profile(base, files)
    if gpu is not None:
        get_gpu(gpu, files)  # a misspelt name fails here, with the catalog's names
        runs = [run for run in runs if run.gpu == gpu]
    if engine is not None:
        if engine not in FRAMEWORKS:
            raise SpecError(f"--engine {engine}: not an engine; allowed: {', '.join(FRAMEWORKS)}")
        runs = [run for run in runs if run.engine == engine]
    scope = (f" on {gpu}" if gpu else "") + (f" of {engine}" if engine else "")
    if len(runs) < 2:
        raise SpecError(f"{names}: {len(runs)} run(s) match{scope}; a fit needs at least 2")
    train, test = split(runs, holdout_every)
    what = (
        f"{len(train)} runs of {names}"
        + (f" matching {match!r}" if match else "")
        + f"{scope}, {len(test)} held out"
    )
    with progress_bar(f"fitting to {len(train)} runs: replays", console, every=1) as advance:
        advance.total(max_evaluations)
        result = fit_to_runs(
            train,
            test,
            start,
            workers=workers or default_workers(),
            max_evaluations=max_evaluations,
            prior=prior,
            only=[p.strip() for p in only.split(",")] if only else None,
            gpu=gpu,
            experts=experts,
            engine=engine,
            name=name or (start.name if base not in (None, "default") else "fitted-runs"),
            on_evaluation=advance,
        )
    stated = (
        start.provenance.rstrip(". ")
        if "provenance" in start.model_fields_set or base in (None, "default")
        else f"profile {base}"
    )
    provenance = (
        f"servesim fit: {what}"
        if base is None and gpu is None and experts is None and engine is None
        else (
            f"{stated}; then "
            + (f"gpus.{gpu} " if gpu else "")
            + (f"engines.{engine} " if engine else "")
            + (f"moe_kernels.{experts} " if experts else "")
            + f"fitted from it by servesim fit "
            f"--base {base or 'default'}: {what} ({fit_score(result.mape, len(test))})"
        )
    )
    fitted = result.profile.model_copy(update={"provenance": provenance})
    rows = []
    labels = {"base": "default" if base is None else f"base ({start.name})", "fitted": "fitted"}
    with atomic_dir(out) as folder:
        save_profile(
            fitted,
            folder / "profile.yaml",
            {"runs": " ".join(map(str, runs_files)), "evaluations": result.evaluations},
        )
        for i, (part, members) in enumerate((("train", train), ("test", test))):
            by_profile = {key: result.split_errors(key)[i] for key in labels}
            rows += figure_rows(members, by_profile, part)
            for key, errors in by_profile.items():
                if members:
                    print_table(
                        f"{part} runs ({len(members)}), {labels[key]} profile",
                        FAMILY_COLUMNS,
                        family_rows(list(zip(members, errors))),
                    )
        pd.DataFrame(rows).to_csv(folder / "figures.csv", index=False)
    shown = tuple(
        (p.for_engine(engine) if engine else p).for_gpu(gpu or "").for_experts(experts or "")
        for p in (fitted, start)
    )
    print_table(
        "fitted profile" + scope + (f" for {experts} experts" if experts else ""),
        ["parameter", "fitted", labels["base"]],
        profile_rows(*shown),
    )
    console.print(
        escape(
            f"profile in {out / 'profile.yaml'} ({fit_score(result.mape, len(test))}); "
            f"every figure in {out / 'figures.csv'}"
        )
    )


def fit_score(mape: float, num_held_out: int) -> str:
    """What `fit_mape` measures: the held-out runs' error, or with none held out the error on the runs fitted."""
    if num_held_out:
        return f"held-out MAPE {mape:.1f}% over {num_held_out} runs"
    return f"training MAPE {mape:.1f}%: no run was held out"
