"""The `servesim` command line: thin commands that load, call a library function and print or write."""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, Parallelism, step_cost
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu, gpu_catalog
from servesim.hardware.memory import plan_memory
from servesim.hardware.model import KV_DTYPE_BYTES, WEIGHT_DTYPE_CHOICES, get_model, preset_names
from servesim.hardware.profile import load_profile
from servesim.hardware.spec_model import MAX_PARALLEL, MAX_TOKENS

from servesim.policies.config import MAX_BUDGET, MAX_SEQS, EngineConfig
from servesim.policies.families import EngineFamily, families
from servesim.simulator.cli.app import (
    GpuFiles,
    app,
    clean_errors,
    console,
    hardware_app,
    models_app,
    print_json,
    print_table,
)

LONG_RUN_REQUESTS = 50_000
MAX_BATCH = 2**20  # sequences in one roofline step: far past any engine's max_num_seqs
WeightDtype = typer.Option(
    "auto",
    help=f"Weights: {', '.join(WEIGHT_DTYPE_CHOICES)} (auto: the checkpoint's own; "
    "mxfp4: MoE experts only; nvfp4/mxfp8 on FP4/FP8 tensor cores where the GPU has them)",
)


class Terminated(BaseException):
    """SIGTERM (a job scheduler stopping servesim, `timeout`), unwound as Ctrl-C is: a write in progress is
    removed, a sweep's table rewritten."""


def _terminate(signum: int, frame: Any) -> None:
    """servesim's worker processes start afresh (forkserver, Dask), so only the command itself runs this."""
    raise Terminated


def main() -> None:
    """The console script. Typer draws a usage error (an unknown option, a value out of range) as a box of many
    lines; here it is one line and a hint, as every other error is."""
    if threading.current_thread() is not threading.main_thread():
        return _main()
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        _main()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main() -> None:
    # click's base error, wherever this typer takes click from (its own copy since 0.2x, click before)
    click_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        code = app(standalone_mode=False)
    except click_error as err:
        command = err.ctx.command_path if getattr(err, "ctx", None) is not None else "servesim"
        print(f"error: {err.format_message()}\n(see {command} --help)", file=sys.stderr)
        sys.exit(err.exit_code)
    except (typer.Abort, KeyboardInterrupt):  # click turns Ctrl-C into Abort; results are written atomically
        print("aborted: nothing is left half-written", file=sys.stderr)
        sys.exit(130)
    except Terminated:
        print("terminated: nothing is left half-written", file=sys.stderr)
        sys.exit(143)
    except BrokenPipeError:  # `servesim ... | head`: the reader left; say nothing more
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (replaces the closed pipe until exit)
        sys.exit(1)
    except OSError as err:  # the machine's: a full disk, a permission taken away mid-run
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except Exception as err:  # noqa: BLE001 (bad input is a SpecError, caught per command: this is a bug)
        from servesim.simulator.crash import report_bug

        print(f"error: {report_bug(err)}", file=sys.stderr)
        sys.exit(70)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)


@hardware_app.command("list")
@clean_errors
def hardware_list(gpu_file: list[Path] = GpuFiles) -> None:
    """List the GPUs: memory (datasheet, and as the driver reports it), bandwidth, bf16 peak and price."""
    rows = [
        [
            g.name,
            f"{g.memory_bytes / 1e9:.0f}",
            f"{g.reported_memory_bytes / (1 << 30):.2f}",
            f"{g.memory_bytes_per_s / 1e12:.2f}",
            f"{g.peak_for('bf16') / 1e12:.0f}",
            g.intra_node_link,
            f"{g.price_per_gpu_hour_usd:.2f}",
        ]
        for g in gpu_catalog(tuple(gpu_file)).values()
    ]
    print_table(
        "GPUs",
        ["name", "memory GB", "reported GiB", "TB/s", "bf16 TFLOP/s", "intra-node link", "$/GPU-h"],
        rows,
    )


@hardware_app.command("show")
@clean_errors
def hardware_show(
    name: str, gpu_file: list[Path] = GpuFiles, as_json: bool = typer.Option(False, "--json")
) -> None:
    """Show one GPU's full spec with its sources."""
    spec = get_gpu(name, tuple(gpu_file))
    data = spec.model_dump() | {"ridge_point_bf16_flop_per_byte": spec.ridge_point("bf16")}
    if as_json:
        print_json(data)
    else:
        print_table(name, ["field", "value"], [[k, v] for k, v in data.items()])


@models_app.command("list")
@clean_errors
def models_list() -> None:
    """List the model presets with their parameter counts and KV bytes per token."""
    rows = []
    for name in preset_names():
        m = get_model(name)
        rows.append(
            [
                name,
                f"{m.total_params() / 1e9:.2f}",
                f"{m.active_params() / 1e9:.2f}",
                m.num_layers,
                m.num_kv_layers,
                "MLA" if m.mla else f"{m.num_heads}/{m.num_kv_heads}",
                f"{m.kv_bytes_per_token():,.0f}",
                m.quantization,
            ]
        )
    print_table(
        "model presets",
        [
            "name",
            "params B",
            "active B",
            "layers",
            "KV layers",
            "attn heads q/kv",
            "KV B/token bf16",
            "weights",
        ],
        rows,
    )


@models_app.command("show")
@clean_errors
def models_show(name: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show one model: shapes, parameter counts and each layer's attention kind and KV bytes."""
    m = get_model(name)
    per_layer = m.kv_values_per_token_per_layer()
    layers = [
        {
            "index": layer.index,
            "attention": layer.attention,
            "window": layer.window,
            "kv_source": layer.kv_source,
            "moe": layer.is_moe,
            "kv_bytes_per_token_bf16": per_layer * 2 if layer.owns_kv else 0,
            "kv_bytes_per_token_fp8": per_layer if layer.owns_kv else 0,
        }
        for layer in m.layers
    ]
    data = {
        "name": m.name,
        "total_params": m.total_params(),
        "active_params": m.active_params(),
        "hidden_size": m.hidden_size,
        "num_layers": m.num_layers,
        "num_kv_layers": m.num_kv_layers,
        "checkpoint_weight_dtype": m.quantization,
        "num_heads": m.num_heads,
        "num_kv_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "attention": "mla" if m.mla else "gqa" if m.num_kv_heads < m.num_heads else "mha",
        "moe": None if m.moe is None else vars_of(m.moe),
        "mla": None if m.mla is None else vars_of(m.mla),
        "kv_bytes_per_token_bf16": m.kv_bytes_per_token("bf16"),
        "kv_bytes_per_token_fp8": m.kv_bytes_per_token("fp8"),
        "layers": layers,
    }
    if as_json:
        print_json(data)
        return
    print_table(name, ["field", "value"], [[k, v] for k, v in data.items() if k != "layers"])
    print_table("layers", list(layers[0]), [list(layer.values()) for layer in layers])


def vars_of(obj: Any) -> dict:
    return {slot: getattr(obj, slot) for slot in obj.__slots__}


def _groups_text(windows: tuple[int | None, ...]) -> str:
    kinds = ["full" if w is None else f"sliding {w}" for w in windows]
    return ", ".join(f"{kinds.count(k)} x {k}" for k in dict.fromkeys(kinds))


def _engine_family(engine: str) -> EngineFamily:
    """The family `--engine` names; a one-line error with the known ones otherwise."""
    if engine not in families.names():
        raise SpecError(f"--engine: unknown engine {engine!r}; choose from {', '.join(families.names())}")
    return families.get(engine)


@app.command()
@clean_errors
def memory(
    model: str,
    gpu: str = typer.Option(..., "--gpu"),
    tp: int = typer.Option(1, min=1, max=MAX_PARALLEL),
    pp: int = typer.Option(1, min=1, max=MAX_PARALLEL),
    engine: str = typer.Option(
        "vllm",
        help="vllm; sglang: its mem_fraction_static split and defaults; trtllm: TensorRT-LLM's free-memory "
        "fraction and defaults",
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None,
        help=(
            "Default: vLLM's 0.9; sglang: SGLang's mem_fraction_static formula; trtllm: the KV cache's share of the "
            "memory weights and activations leave (kv_cache_free_gpu_memory_fraction, 0.9)"
        ),
    ),
    kv_dtype: str = "bf16",
    weight_dtype: str = WeightDtype,
    max_model_len: int | None = typer.Option(None, min=1, max=MAX_TOKENS),
    block_size: int | None = typer.Option(
        None,
        min=1,
        help="Default: 16; vLLM's 64 for MLA models on Hopper and newer (FlashMLA); trtllm: 32 (tokens_per_block)",
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None, min=1, max=MAX_BUDGET, help="Default: vLLM's for the GPU"
    ),
    max_num_seqs: int | None = typer.Option(None, min=1, max=MAX_SEQS, help="Default: vLLM's for the GPU"),
    gpu_file: list[Path] = GpuFiles,
    disable_hybrid_kv_cache_manager: bool = typer.Option(
        False,
        help="Keep sliding-window layers' whole KV in one group (vLLM's flag; always so for Gemma 2/3/3n "
        "under --engine sglang, as SGLang runs them)",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Plan GPU memory like vLLM (or SGLang, TensorRT-LLM) at start-up: weights, activations, KV blocks, max
    concurrency."""
    family = _engine_family(engine)
    for flag, value, allowed in (
        ("--weight-dtype", weight_dtype, WEIGHT_DTYPE_CHOICES),
        ("--kv-dtype", kv_dtype, tuple(KV_DTYPE_BYTES)),
    ):
        if value not in allowed:
            raise SpecError(f"{flag}: unknown dtype {value!r}; choose from {', '.join(allowed)}")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise SpecError(
            f"--gpu-memory-utilization: a share of the device in (0, 1], not {gpu_memory_utilization}"
        )
    spec, gpu_spec = get_model(model), get_gpu(gpu, tuple(gpu_file))
    batch = EngineConfig(
        scheduler=family.scheduler,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
        **({} if block_size is None else {"block_size": block_size}),
        **({"disable_hybrid_kv_cache_manager": True} if disable_hybrid_kv_cache_manager else {}),
    ).with_defaults(
        gpu_spec,
        max_model_len or spec.max_position_embeddings,
        tp,
        pp,
        mla=spec.mla is not None,
        architecture=spec.architecture,
    )
    cfg = replace(
        batch.memory_config(pp), max_model_len=max_model_len, kv_dtype=kv_dtype, weight_dtype=weight_dtype
    )
    plan = plan_memory(spec, gpu_spec, Parallelism(tp, pp), cfg)
    if as_json:
        print_json(plan.as_dict())
        return
    gb = lambda b: f"{b / 1e9:.2f} GB ({b / (1 << 30):.2f} GiB)"  # noqa: E731
    print_table(
        f"{model} on {gpu} (tp={tp}, pp={pp}, {engine}), per GPU",
        ["quantity", "value"],
        [
            [
                "device memory"
                if family.share_of_free_memory
                else f"usable ({batch.gpu_memory_utilization} of the device)",
                gb(plan.usable_bytes),
            ],
            [f"weights ({plan.weight_dtype})", gb(plan.weight_bytes)],
            [
                "activation peak",
                gb(plan.activation_bytes)
                if family.activations_in_share
                else f"outside the share ({family.label})",
            ],
            ["runtime reserve", gb(plan.reserve_bytes)],
            [
                f"KV cache ({batch.gpu_memory_utilization} of the rest)"
                if family.share_of_free_memory
                else "KV cache",
                gb(plan.kv_cache_bytes),
            ],
            ["KV bytes/token", f"{plan.kv_bytes_per_token:,.0f}"],
            ["KV cache groups", _groups_text(plan.kv_windows)],
            ["KV blocks", f"{plan.num_blocks:,} x {plan.block_size} tokens of one group"],
            ["KV tokens", f"{plan.kv_cache_tokens:,}"],
            *(
                [
                    [
                        "sliding-window pool (SGLang)",
                        f"{plan.swa_tokens:,} tokens ({plan.swa_ratio} of the full layers'), "
                        f"{plan.swa_window}-token windows",
                    ]
                ]
                if plan.swa_window is not None
                else []
            ),
            [f"max concurrency at {plan.max_model_len:,} tokens", f"{plan.max_concurrency:.2f}"],
        ],
    )


@app.command()
@clean_errors
def roofline(
    model: str,
    gpu: str = typer.Option(..., "--gpu"),
    batch: int = typer.Option(1, min=1, max=MAX_BATCH),
    context: int = typer.Option(1024, min=0, max=MAX_TOKENS),
    prefill: int = typer.Option(
        1,
        min=1,
        max=MAX_TOKENS,
        help=("New tokens per sequence this step (1 = decode; more = a prefill chunk over the context)"),
    ),
    tp: int = typer.Option(1, min=1, max=MAX_PARALLEL),
    pp: int = typer.Option(1, min=1, max=MAX_PARALLEL),
    kv_dtype: str = "bf16",
    weight_dtype: str = WeightDtype,
    fast_prefill: bool = typer.Option(False, "--fast-prefill", help="kv_sharing_fast_prefill (YOCO)"),
    profile: str | None = None,
    engine: str | None = typer.Option(
        None,
        help=(
            "Price the step as this engine runs it at its defaults for the GPU: padded to its CUDA graphs, and "
            "with its kernel tables under a profile that names the engine's (vllm, sglang, trtllm); unset: eagerly"
        ),
    ),
    gpu_file: list[Path] = GpuFiles,
    as_json: bool = typer.Option(False, "--json"),
    html: Path | None = None,
) -> None:
    """Predict one step's time for `batch` sequences at `context` tokens, with a per-operator breakdown."""
    spec, gpu_spec = get_model(model), get_gpu(gpu, tuple(gpu_file))
    if html:
        from servesim.simulator.atomic import check_output_file

        check_output_file(html, "--html")
    options, priced_by = (
        CostOptions(weight_dtype, kv_dtype, fast_prefill),
        load_profile(profile, tuple(gpu_file)),
    )
    if engine is not None:
        family = _engine_family(engine)
        limits = EngineConfig(scheduler=family.scheduler).with_defaults(
            gpu_spec, spec.max_position_embeddings, tp, pp, False, spec.mla is not None, spec.architecture
        )
        options = replace(options, **family.graph_options(gpu_spec, limits, tp, False, 1))
        priced_by = priced_by.for_engine(family.kernel_tables)
    step = StepBatch.uniform(batch, context, prefill)
    cost = step_cost(step, spec, gpu_spec, Parallelism(tp, pp), priced_by, options)
    title = f"{model} on {gpu}: batch {batch} x {prefill} new over {context} context (tp={tp}, pp={pp})"
    if engine is not None:
        title += f", as {family.label} runs it ({options.graph_tokens(step)} rows through its GEMMs)"
    if html:
        from servesim.simulator.atomic import write_text_atomic
        from servesim.simulator.report.roofline_chart import roofline_figure

        write_text_atomic(html, roofline_figure(cost, gpu_spec, title).to_html(include_plotlyjs=True))
    if as_json:
        print_json(cost.as_dict())
        return
    rows = [
        [
            op.name,
            op.layers,
            f"{op.flops / 1e9:,.2f}",
            f"{op.bytes / 1e6:,.2f}",
            f"{op.intensity:,.1f}",
            f"{op.time_s * 1e3:.4f}",
            op.bound,
        ]
        for op in cost.operators
    ]
    print_table(title, ["operator", "layers", "GFLOP", "MB", "FLOP/B", "ms", "bound"], rows)
    host = cost.eager_floor_s > cost.fixed_s + cost.attention_s
    console.print(
        f"step time {cost.total_s * 1e3:.3f} ms, floor {cost.floor_s * 1e3:.3f} ms "
        f"(HBM bytes / bandwidth), {cost.bound}-bound"
        + (", held at the host's launches (eager step: the profile's eager_layer_s x layers)" if host else "")
    )


@app.command()
def schema() -> None:
    """Print the JSON Schema of scenario files, for editors to validate them."""
    from servesim.simulator.scenario import Scenario

    print_json(Scenario.model_json_schema())


SUMMARY_ROWS = (
    "completed",
    "rejected",
    "unfinished",
    "not_arrived",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
    "request_goodput",
    "slo_attainment",
    "preemptions",
    "kv_cache_usage_mean",
    "kv_cache_usage_max",
)
#: The unit of each summary figure, printed beside it.
UNITS = {
    "duration_s": "s (simulated)",
    "request_throughput": "requests/s",
    "request_goodput": "requests/s meeting every SLO",
    "output_throughput": "tokens/s",
    "total_token_throughput": "tokens/s",
    "slo_attainment": "share of requests",
    "preemptions": "times",
    "kv_cache_usage_mean": "share of the KV pool",
    "kv_cache_usage_max": "share of the KV pool",
}


def _unit(key: str) -> str:
    return UNITS.get(key, "ms" if key.endswith("_ms") else "requests")


@app.command()
@clean_errors
def simulate(
    scenario: Path,
    out: Path | None = typer.Option(None, "--out", help="Run folder (default runs/<name>)"),
    set_: list[str] = typer.Option([], "--set", help="Override a field: dotted.key=value; repeatable"),
    seed: int | None = typer.Option(None, "--seed", help="Override the scenario's seed"),
    tables: str = typer.Option(
        "auto", "--tables", help="requests/steps tables as csv, parquet, or auto (Parquet above 100,000 rows)"
    ),
) -> None:
    """Simulate a scenario and write per-request, per-step tables and summary.json to a run folder."""
    from servesim.simulator.atomic import check_replaceable
    from servesim.simulator.planning.capacity import judge
    from servesim.simulator.world.output import TABLE_FORMATS, write_run
    from servesim.simulator.progress import progress_bar
    from servesim.simulator.world.run import make_world, setting_notes
    from servesim.simulator.scenario import load_scenario

    if tables not in TABLE_FORMATS:
        raise SpecError(f"--tables {tables!r}: choose one of {', '.join(TABLE_FORMATS)}")
    spec, base_dir = load_scenario(scenario, set_, seed)
    out = out or Path("runs") / spec.name
    check_replaceable(out)  # before the run, not after it
    try:
        world = make_world(spec, base_dir)
    except SpecError as err:
        raise SpecError(f"{scenario}: {err}") from None
    count = len(world.workload.requests)
    # off a terminal, lines only for a run long enough to wonder about (~a minute and more)
    with progress_bar("simulating", console, lines=count >= LONG_RUN_REQUESTS) as advance:
        advance.total(count)
        world.on_progress = advance
        result = world.run()
    folder = write_run(result, out, base_dir, tables)
    summary = result.summary
    rows = [
        [key, f"{summary[key]:,.3f}" if isinstance(summary[key], float) else summary[key], _unit(key)]
        for key in SUMMARY_ROWS
        if key in summary and (key not in ("unfinished", "not_arrived") or summary[key])
    ]
    console.print(f"{spec.name}: {deployment_label(spec)}", soft_wrap=True)
    print_table("summary", ["metric", "value", "unit"], rows)
    verdict = judge(result, spec.slo)
    if spec.slo.as_ms():
        limits = ", ".join(f"{k.upper()} <= {v:,g} ms" for k, v in spec.slo.as_ms().items())
        missed = [d for r, d in zip(verdict.reasons, verdict.details) if r.endswith("SLO")]
        met = "met" if summary["completed"] else "not measured: no request completed"
        print(f"SLO, p{spec.slo.percentile}: {limits}: {'missed: ' + '; '.join(missed) if missed else met}")
    for warning in overload_warnings(spec, scenario, verdict, result):
        print(f"warning: {warning}", file=sys.stderr)
    for note in ((spec.note,) if spec.note else ()) + (*setting_notes(spec), *world.workload.notes):
        print(f"note: {note}", file=sys.stderr)
    console.print(f"results in {folder}/")


def overload_warnings(spec: Any, path: Path, verdict: Any, result: Any) -> list[str]:
    """What a newcomer should know before trusting the figures: a queue that grows to the end (the load is more
    than the deployment serves), and rejected requests, each with its likely cause."""
    found, summary = [], result.summary
    # a batch sent at once, or clients that wait for their answers, queue by design: no rate is too high
    batch = spec.workload.closed_loop is not None or spec.workload.arrivals.kind == "all_at_once"
    for reason, detail in zip(verdict.reasons, verdict.details):
        if reason == "unstable queue" and not batch:
            found.append(
                f"overloaded, {detail}: requests arrive faster than {deployment_label(spec)} serves them "
                f"({summary['request_throughput']:.3g} requests/s completed); lower the rate or add replicas "
                f"(servesim capacity {path} finds the highest rate it sustains)"
            )
        elif reason == "rejected" and not summary["completed"]:
            found.append(f"every request was rejected ({result.requests['reject_reason'].dropna().iloc[0]})")
        elif reason == "rejected":
            found.append(detail)
    return found


def deployment_label(spec: Any) -> str:
    """What serves the scenario, in one line: replicas x GPUs, the P/D pools, or the stages of a pipeline
    (whose TTFT and TPOT are the last stage's tokens)."""
    if spec.stages:
        stages = " -> ".join(
            f"{st.name} ({st.model or spec.model}, {st.replicas} x {st.tp} {st.gpu or spec.hardware.gpu})"
            for st in spec.stages
        )
        return f"stages {stages}; latencies are the last stage's tokens"
    if spec.disaggregation is not None:
        pools = (
            f"{name} {pool.replicas} x {pool.tp * pool.pp} {pool.gpu or spec.hardware.gpu}"
            for name, pool in (
                ("prefill", spec.disaggregation.prefill),
                ("decode", spec.disaggregation.decode),
            )
        )
        return f"{spec.model}, " + ", ".join(pools)
    return (
        f"{spec.model}, {spec.cluster.replicas} replica(s) of {spec.parallelism.tp * spec.parallelism.pp} x "
        f"{spec.hardware.gpu}"
    )


from servesim.simulator.cli import plan as _plan  # noqa: E402,F401  (registers sweep, plan, report)
from servesim.simulator.cli import calibrate as _calibrate  # noqa: E402,F401  (registers calibrate)
from servesim.simulator.cli import compare as _compare  # noqa: E402,F401  (registers compare)
