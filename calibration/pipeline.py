"""The two end-to-end jobs behind `servesim calibrate` and `servesim validate`, writing into one folder.

calibrate: build the (scaled) model's executor on the device, measure the shape grid (and the quick
grid on the same model at half depth, so per-layer and per-step overheads separate), describe the
device (CPU: measured peaks -> device.yaml; CUDA: a catalog GPU), fit a profile on a train split of the
grid, serve a short calibration trace with it, refit on the grid's train split plus the served steps
(the shapes and order a serving loop really runs), fit the loop's host overhead on the same served
steps, and write profile.yaml, grid.csv (grid and served rows with default and fitted predictions) and
calibration.json (what validate needs to rebuild the same setup). Until the last phase ends, the run's files
live in a calibrate-in-progress-<host>-<pid>-*/ folder of the run's own, so a run killed halfway leaves nothing
that looks finished (the next run removes its folder) and two runs into one folder do not share their work.

validate: read calibration.json, pick an arrival rate at `load` x the saturation throughput the
fitted simulator predicts, serve the trace for real, replay it in the simulator, and write
requests_measured.csv, requests_simulated.csv, steps_measured.csv, validation.csv and validation.html.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from servesim.calibration.calibrate import FitReport, calibrate_rows, row_model, save_profile, terms_of_rows
from servesim.calibration.device import cpu_gpu_entry, device_name, measure_cpu_peaks, write_gpu_yaml
from servesim.calibration.fit import predict_table
from servesim.calibration.host_overhead import host_overhead
from servesim.calibration.profile_grid import GridSpec, blocks_for_batch, grid_shapes, profile_grid
from servesim.calibration.validate import (
    Validation,
    build_requests,
    compare,
    report_html,
    simulate_requests,
    trace_config,
)
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.kv_groups import kv_groups
from servesim.hardware.profile import load_profile
from servesim.policies.config import EngineConfig
from servesim.simulator.atomic import write_text_atomic
from servesim.simulator.progress import progress_bar

CPU_POOL_BYTES = 1 << 30
CUDA_POOL_BYTES = 40 << 30


@dataclass(frozen=True)
class Setup:
    """What identifies a calibration: model preset, scale, device, the GPU-catalog name and files."""

    model: str
    scale: dict
    device: str
    gpu: str
    gpu_files: tuple[str, ...]
    block_size: int = 16
    seed: int = 0
    threads: int | None = None

    @property
    def scale_json(self) -> str:
        return json.dumps(self.scale, sort_keys=True)


def _torch_setup(setup: Setup):
    import torch

    if setup.device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecError("--device cuda: no CUDA device is visible to torch")
    if setup.threads:
        torch.set_num_threads(setup.threads)
    return torch


def make_executor(setup: Setup, num_blocks: int, fast_prefill: bool = False):
    """The executor of `setup`'s model as an engine serves it: for sliding-window models, one block table per
    KV cache group (vLLM's hybrid KV cache manager), so grid shapes pay the same per-group metadata as served
    steps."""
    from servesim.calibration.executor import Executor

    spec = row_model(setup.model, setup.scale_json)
    groups = kv_groups(spec)
    return Executor(
        spec,
        num_blocks,
        setup.block_size,
        setup.device,
        seed=setup.seed,
        kv_sharing_fast_prefill=fast_prefill,
        kv_windows=groups.windows if groups.sliding else None,
    )


def half_depth(setup: Setup) -> Setup | None:
    """The same model with half the layers (None below 2), so the fit can tell per-layer from per-step cost."""
    full = row_model(setup.model, setup.scale_json).num_layers
    layers = full // 2
    if layers < 1:
        return None
    scale = {**setup.scale, "layers": layers}
    if scale.get("kv_shared"):  # keep the share of KV-sharing layers, leaving one that owns KV
        scale["kv_shared"] = min(max(scale["kv_shared"] * layers // full, 1), layers - 1)
    return dataclasses.replace(setup, scale=scale)


def _measure(setup: Setup, shapes: list, repeats: int, phase: Phases, label: str = "timing the grid"):
    ex = make_executor(
        setup, _pool_blocks(setup, max(blocks_for_batch(b, setup.block_size) for _, b in shapes))
    )
    with phase(f"{label} ({len(shapes)} shapes), rounds", 1 + repeats) as done:
        return profile_grid(
            ex, shapes, setup.model, setup.scale, repeats, warmup=1, seed=setup.seed, progress=done
        )


def _pool_blocks(setup: Setup, need: int) -> int:
    spec = row_model(setup.model, setup.scale_json)
    dtype_bytes = 2 if setup.device.startswith("cuda") else 4
    per_block = spec.num_kv_layers * 2 * setup.block_size * spec.num_kv_heads * spec.head_dim * dtype_bytes
    budget = CUDA_POOL_BYTES if setup.device.startswith("cuda") else CPU_POOL_BYTES
    return max(1, min(need, budget // per_block))


def describe_device(setup: Setup, folder: Path, gpu: str | None) -> Setup:
    """CPU: measure peaks and write device.yaml (name cpu-local); CUDA: the catalog GPU `gpu` (required)."""
    if setup.device.startswith("cuda"):
        if not gpu:
            raise SpecError("--device cuda needs --gpu NAME (the catalog GPU this device is, e.g. h200)")
        get_gpu(gpu)
        return dataclasses.replace(setup, gpu=gpu, gpu_files=())
    path = write_gpu_yaml(cpu_gpu_entry(measure_cpu_peaks()), Path(folder) / "device.yaml")
    return dataclasses.replace(setup, gpu="cpu-local", gpu_files=(str(path.resolve()),))


#: The subfolder of a calibration's output folder that holds a run's work until it completes.
IN_PROGRESS = "calibrate-in-progress"


class Phases:
    """One progress bar per phase of a long job (simulator.progress: none off a TTY, or without a console)."""

    def __init__(self, console: Console | None = None):
        self.console = console

    @contextmanager
    def __call__(self, label: str, total: int = 1) -> Iterator[Callable[[int], None]]:
        """A phase of `total` units; the yielded callable takes the units done (the last one is ticked on exit)."""
        if self.console is None:
            yield lambda done: None
            return
        with progress_bar(label, self.console, every=1) as advance:
            advance.total(total)
            yield advance
            advance(total)


def run_calibration(
    setup: Setup,
    folder: Path,
    gpu: str | None = None,
    quick: bool = False,
    repeats: int | None = None,
    test_fraction: float = 0.25,
    profile_name: str = "profile.yaml",
    console: Console | None = None,
    grid: GridSpec | None = None,
) -> tuple[FitReport, Setup]:
    """Measure, fit and write the profile, grid.csv, calibration.json (and device.yaml on CPU) in `folder`.
    `grid` replaces the device's grid (and the quick one timed at half depth): shapes sized to one trace.

    The run works in its own `folder`/calibrate-in-progress-* (the device's peaks, the grid-only profile that sizes
    the calibration trace), so an interrupted run leaves no file that passes for a finished one and keeps the
    folder's earlier calibration whole; the finished files are written there only once every phase is done."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    remove_abandoned_work(folder)
    work = Path(tempfile.mkdtemp(prefix=f"{IN_PROGRESS}-{socket.gethostname()}-{os.getpid()}-", dir=folder))
    try:
        report, setup, header = _calibrate(
            setup, work, gpu, quick, repeats, test_fraction, Phases(console), grid
        )
        return report, _publish(report, setup, header, folder, profile_name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def remove_abandoned_work(folder: Path) -> None:
    """Remove the work folders of runs on this host whose process is gone (killed, so their `finally` never ran);
    a live run's, or another host's, is left alone."""
    # the whole name, mkdtemp's 8-character suffix included: host "gpu" must not take host "gpu-12"'s folders
    ours = re.compile(rf"{re.escape(IN_PROGRESS)}-{re.escape(socket.gethostname())}-(\d+)-[a-z0-9_]{{8}}")
    for work in folder.iterdir():
        match = ours.fullmatch(work.name)
        if match and work.is_dir() and not _process_alive(int(match.group(1))):
            shutil.rmtree(work, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _calibrate(
    setup: Setup,
    work: Path,
    gpu: str | None,
    quick: bool,
    repeats: int | None,
    test_fraction: float,
    phase: Phases,
    grid: GridSpec | None = None,
) -> tuple[FitReport, Setup, dict]:
    """Every phase of a calibration in `work`: the fitted report, the setup (its device file in `work`), the
    profile's header."""
    torch = _torch_setup(setup)
    with phase("measuring the device"):
        setup = describe_device(setup, work, gpu)
    repeats = repeats or (3 if quick else 7)
    rows = _measure(
        setup, grid_shapes(grid or GridSpec.for_device(setup.device, quick), setup.seed), repeats, phase
    )
    shallow = None if quick else half_depth(setup)
    if shallow is not None:  # the quick grid again at half depth: separates layer from step overhead
        shapes = grid_shapes(grid or GridSpec.for_device(setup.device, quick=True), setup.seed)
        rows = pd.concat(
            [rows, _measure(shallow, shapes, repeats, phase, "timing the half-depth grid")], ignore_index=True
        )
    today = dt.date.today().isoformat()
    provenance = (
        f"fitted by servesim calibrate on {today}: {setup.device} ({device_name(setup.device)}) as "
        f"{setup.gpu!r}, {rows['dtype'][0]}, torch {torch.__version__}, {rows['threads'][0]} threads, "
        f"model {setup.model} scale {setup.scale_json}, {len(rows)} measured shapes"
    )
    gpu_spec = get_gpu(setup.gpu, tuple(Path(p) for p in setup.gpu_files))
    name = f"{setup.gpu}-{setup.model}"
    with phase("fitting the grid"):
        report = calibrate_rows(rows, gpu_spec, name, provenance, test_fraction, setup.seed)
    header = {
        "device": f"{setup.device} ({device_name(setup.device)})",
        "gpu_spec": setup.gpu,
        "torch": torch.__version__,
        "date": today,
        "model": setup.model,
        "scale": setup.scale_json,
        "dtype": rows["dtype"][0],
        "rows": len(rows),
    }
    # sizes the calibration trace
    grid_only = save_profile(report.profile, work / "grid-only-profile.yaml", header)
    with phase("serving the calibration trace, requests arrived", CALIBRATION_TRACE.num_requests) as done:
        served = serve_calibration_trace(setup, grid_only, work, done)
    with phase("refitting with the served steps"):
        report = calibrate_rows(
            rows,
            gpu_spec,
            name,
            provenance + f" and {len(served)} served steps",
            test_fraction,
            setup.seed,
            served=served_rows(served, setup),
        )
    with phase("fitting the host overhead"):
        host_step, host_request = host_overhead(served)
    profile = report.profile.model_copy(update={"host_step_s": host_step, "host_request_s": host_request})
    header |= {
        "served_steps": len(served),
        **{f"{key}_mape_pct": round(value, 2) for key, value in report.mape.items()},
        "host_overhead": "fitted on a served calibration trace",
    }
    return dataclasses.replace(report, profile=profile), setup, header


def _publish(report: FitReport, setup: Setup, header: dict, folder: Path, profile_name: str) -> Setup:
    """Move the device file beside the profile and write grid.csv, calibration.json and, last, the profile; the
    setup as written (its device file in `folder`)."""
    if setup.gpu_files:
        device = folder / "device.yaml"
        os.replace(setup.gpu_files[0], device)
        setup = dataclasses.replace(setup, gpu_files=(str(device.resolve()),))
    write_text_atomic(folder / "grid.csv", report.rows.to_csv(index=False))
    files = [os.path.relpath(p, folder.resolve()) for p in setup.gpu_files]  # the folder may move as a whole
    write_text_atomic(
        folder / "calibration.json",
        json.dumps(dataclasses.asdict(setup) | {"gpu_files": files, "profile": profile_name}, indent=2),
    )
    save_profile(report.profile, folder / profile_name, header)
    return setup


def load_setup(folder: Path) -> tuple[Setup, Path]:
    """The Setup and profile path a `run_calibration` wrote to `folder`/calibration.json."""
    path = Path(folder) / "calibration.json"
    if not path.exists():
        raise SpecError(f"{path}: not found; run `servesim calibrate --out {folder}` first")
    raw = json.loads(path.read_text())
    profile = Path(folder) / raw.pop("profile")
    files = tuple(str((Path(folder) / p).resolve()) for p in raw["gpu_files"])
    return Setup(**{**raw, "gpu_files": files}), profile


@dataclass(frozen=True)
class TraceSpec:
    """The validation trace and engine: lengths in tokens, `load` as a fraction of saturation throughput."""

    num_requests: int = 300
    prompt_median: float = 160
    output_low: int = 8
    output_high: int = 64
    load: float = 0.6
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 32
    num_blocks: int = 1024
    fast_prefill: bool = False
    prefix_caching: str = "vllm"  # the KV manager of both runs: "vllm" (automatic prefix caching) or "none"
    num_prefixes: int = 0  # shared prefixes in the trace (0: every prompt is unique)
    prefix_tokens: int = 0
    prefix_share: float = 1.0  # fraction of prompts that start with a shared prefix

    def workload(self, rate_per_s: float):
        return trace_config(
            self.num_requests,
            rate_per_s,
            self.prompt_median,
            self.output_low,
            self.output_high,
            num_prefixes=self.num_prefixes,
            prefix_tokens=self.prefix_tokens,
            prefix_share=self.prefix_share,
        )


def _engine(setup: Setup, trace: TraceSpec) -> EngineConfig:
    """vLLM's scheduler with chunked prefill and (by default) automatic prefix caching over the executor's
    pool; the served run and the simulated one use the same settings, sliding-window layers included (vLLM's
    hybrid KV cache manager). The executor's serving loop plans a step when the one before has ended, so the
    replay does too (no async scheduling)."""
    return EngineConfig(
        max_num_seqs=trace.max_num_seqs,
        max_num_batched_tokens=trace.max_num_batched_tokens,
        async_scheduling=False,
        enable_chunked_prefill=True,
        block_size=setup.block_size,
        max_model_len=4096,
        num_gpu_blocks_override=trace.num_blocks,
        kv_sharing_fast_prefill=trace.fast_prefill,
        prefix_caching=trace.prefix_caching,
    )


def saturation_rate(setup: Setup, trace: TraceSpec, profile: Path, folder: Path) -> float:
    """Requests/s the fitted simulator completes when the whole trace arrives at once."""
    burst = trace.workload(1e6)
    result = simulate_requests(
        row_model(setup.model, setup.scale_json),
        build_requests(burst, setup.seed),
        _engine(setup, trace),
        burst,
        setup.gpu,
        [Path(p) for p in setup.gpu_files],
        profile,
        Path(folder),
    )
    return result.summary["request_throughput"]


#: A short trace, unlike the validation one (its own seed), served during calibration: its steps join the
#: fit and give the serving loop's host overhead.
CALIBRATION_TRACE = TraceSpec(num_requests=80, prompt_median=120, output_low=8, output_high=48, load=0.6)


def serve_calibration_trace(
    setup: Setup, profile: Path, folder: Path, progress: Callable[[int], None] | None = None
) -> pd.DataFrame:
    """Serve CALIBRATION_TRACE on the executor at 0.6x the saturation `profile` predicts; its step rows.
    `progress(arrived)`: as in `serve`."""
    from servesim.calibration.serve import serve

    rate = CALIBRATION_TRACE.load * saturation_rate(setup, CALIBRATION_TRACE, profile, folder)
    workload = CALIBRATION_TRACE.workload(rate)
    ex = make_executor(setup, CALIBRATION_TRACE.num_blocks)
    served = serve(
        ex,
        build_requests(workload, setup.seed + 7919),
        _engine(setup, CALIBRATION_TRACE),
        setup.seed,
        progress,
    )
    return served.steps


def served_rows(steps: pd.DataFrame, setup: Setup) -> pd.DataFrame:
    """Served step rows (`serve`'s columns) as fit rows: the batch, its measured forward time, the model."""
    return pd.DataFrame(
        {
            "shape": "served",
            "kind": np.where(steps["prefill_tokens"] == 0, "decode", "mixed"),
            "fast_prefill": False,
            "num_requests": steps["num_requests"],
            "num_tokens": steps["num_tokens"],
            "num_new": steps["num_new"],
            "num_context": steps["num_context"],
            "needs_logits": steps["needs_logits"],
            "time_s": steps["execute_s"],
            "cpu_time_s": steps["execute_cpu_s"],
            "model": setup.model,
            "scale": setup.scale_json,
        }
    )


def predicted_step_s(folder: Path, steps: pd.DataFrame, fast_prefill: bool = False) -> np.ndarray:
    """What the calibration in `folder` predicts for each measured step (`steps_measured` rows), seconds.

    measured / predicted per step is the direct check of the fitted profile; its drift over the run
    shows the machine itself changing speed (other processes sharing caches or cores)."""
    setup, profile = load_setup(folder)
    rows = steps.assign(model=setup.model, scale=setup.scale_json, fast_prefill=fast_prefill)
    gpu_files = tuple(Path(p) for p in setup.gpu_files)
    gpu = get_gpu(setup.gpu, gpu_files)
    return predict_table(terms_of_rows(rows, gpu), load_profile(profile, gpu_files).for_gpu(gpu.name))


def run_validation(folder: Path, trace: TraceSpec = TraceSpec(), out: Path | None = None) -> Validation:
    """Serve a trace on the executor and in the simulator; write tables and validation.html to `out`."""
    from servesim.calibration.serve import serve

    folder = Path(folder)
    out = Path(out or folder)
    setup, profile = load_setup(folder)
    _torch_setup(setup)
    out.mkdir(parents=True, exist_ok=True)
    rate = trace.load * saturation_rate(setup, trace, profile, out)
    workload = trace.workload(rate)
    engine = _engine(setup, trace)
    ex = make_executor(setup, trace.num_blocks, trace.fast_prefill)
    measured = serve(ex, build_requests(workload, setup.seed), engine, setup.seed)
    simulated = simulate_requests(
        ex.spec,
        build_requests(workload, setup.seed),
        engine,
        workload,
        setup.gpu,
        [Path(p) for p in setup.gpu_files],
        profile,
        out,
    )
    steps = measured.steps.assign(predicted_s=predicted_step_s(folder, measured.steps, trace.fast_prefill))
    table = compare(measured.requests, simulated.requests, measured.summary, simulated.summary, steps)
    v = Validation(measured.requests, simulated.requests, table, steps, measured.summary, simulated.summary)
    for name, frame in (
        ("requests_measured", v.measured),
        ("requests_simulated", v.simulated),
        ("steps_measured", v.measured_steps),
        ("validation", v.table),
    ):
        write_text_atomic(out / f"{name}.csv", frame.to_csv(index=False))
    report_html(
        v,
        out / "validation.html",
        f"{setup.model} {setup.scale_json} on {setup.gpu}: "
        f"{trace.num_requests} requests at {rate:.2f}/s (measured vs simulated)",
    )
    return v
