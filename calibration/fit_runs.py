"""Fit a profile to measured benchmark runs: the figures `vllm bench` prints, not per-step times.

Someone with a few `vllm bench serve` results (or the published ones in benchmarks/published_runs.yaml) has no
step times, only each run's TTFT, TPOT, ITL, E2E and throughput figures. The fit searches the profile's
efficiencies (constant in tokens; routed experts apart from dense GEMMs) and overheads for the values whose full replays (`simulator.compare.measured.replay`)
come closest to those figures: robust least squares on log(predicted / measured), each run weighted equally
however many figures it quotes, with the simulation as a black box differentiated by finite steps in log
space. Runs held out of the fit measure how well the fitted profile predicts runs it has not seen. A fit for one GPU
(`gpu=`) starts from a base profile and writes what it finds into the base's section for that GPU, the shared
values untouched: the same kernels reach different fractions of different GPUs' peaks.
"""

from __future__ import annotations

import math
import multiprocessing
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares, minimize

from servesim.hardware.errors import SpecError
from servesim.hardware.model import WEIGHT_DTYPE_BYTES
from servesim.hardware.profile import MOE_KERNEL_FIELDS, EfficiencyCurve, FitRecord, Profile
from servesim.simulator.compare.measured import MeasuredRun, MetricError, replay

EFFICIENCIES = (
    "gemm_compute",
    "gemm_memory",
    "attn_compute",
    "attn_memory",
    "moe_compute",
    "moe_memory",
    "comm",
)
OVERHEADS = {"step_overhead_s": (1e-6, 0.02), "layer_overhead_s": (1e-7, 5e-4)}  # bounds, seconds
# the fused-MoE kernel's fixed costs per layer and per expert run: fitted only when named (--only), bounds (s)
MOE_TERMS = {"moe_layer_s": (1e-7, 5e-4), "moe_expert_s": (1e-9, 2e-5)}
# the API server's time per request, per prompt token and its latency: fitted only when named (--only), bounds (s)
API_TERMS = {"api_request_s": (1e-5, 0.05), "api_token_s": (1e-8, 5e-5), "api_latency_s": (1e-5, 0.05)}
# the host's launch time per layer of a step run outside CUDA graphs: fitted only when named (--only), bounds (s)
HOST_TERMS = {"eager_layer_s": (1e-6, 3e-3)}
# where a zero default starts: at its lower bound no finite step would move it
ZERO_STARTS = {
    "layer_overhead_s": 1e-5,
    "moe_layer_s": 2e-5,
    "moe_expert_s": 5e-7,
    "api_request_s": 1e-3,
    "api_token_s": 1e-6,
    "api_latency_s": 1e-3,
    "eager_layer_s": 1e-3,  # a floor below every step's GPU time would not move: start above them
}
EFF_BOUNDS = (0.05, 1.0)
F_SCALE = 0.1  # soft-L1 scale in log(predicted / measured): misses beyond ~10% count linearly


class _Budget(Exception):
    """The replays the fit may spend are spent."""


def fitted_names(runs: list[MeasuredRun]) -> list[str]:
    """What the runs can tell apart: routed-expert kernels only if some run serves an MoE model (and then the
    GEMM curves only if some other run serves a dense one), link efficiency only if some run spans GPUs."""
    moe = [run.is_moe for run in runs]
    skip = set()
    if not any(moe):
        skip |= {"moe_compute", "moe_memory"}
    elif all(moe):
        skip |= {"gemm_compute", "gemm_memory"}  # dense layers of MoE models are too small a share to tell
    if not any(run.tp > 1 for run in runs):
        skip.add("comm")
    return [n for n in EFFICIENCIES if n not in skip] + list(OVERHEADS)


def _through_api(runs: list[MeasuredRun]) -> bool:
    """Whether some run's requests pass an API server (a `serve` benchmark; the others hand over token ids)."""
    return any(run.benchmark == "serve" for run in runs)


@dataclass(frozen=True)
class Section:
    """Where a fit writes: a profile's section of one GPU (`gpus`) or one engine (`engines`), or with `gpu` the
    engine section's own section for that GPU."""

    kind: str
    name: str
    gpu: str | None = None

    def of(self, profile: Profile) -> dict:
        section = getattr(profile, self.kind).get(self.name, {})
        return section.get("gpus", {}).get(self.gpu, {}) if self.gpu is not None else section

    def resolve(self, profile: Profile) -> Profile:
        """`profile` as it prices what the section covers."""
        if self.kind == "gpus":
            return profile.for_gpu(self.name)
        engine = profile.for_engine(self.name)
        return engine.for_gpu(self.gpu) if self.gpu is not None else engine

    @property
    def prefix(self) -> str:
        """How a fit record names the section's fields: they price its runs only."""
        return f"{self.kind}.{self.name}." + (f"gpus.{self.gpu}." if self.gpu is not None else "")


def _hiding_sections(
    base: Profile, runs: list[MeasuredRun], names: list[str], experts: str | None, section: Section | None
) -> list[str]:
    """The sections of `base` that price some of `runs` with their own values of what the fit moves (with `experts`,
    that dtype's moe_kernels entry), so the fit's values would not reach them: a GPU's, over a shared or an engine
    section's fit; an engine's, over a shared fit (a GPU's section applies over an engine's)."""

    def hides(values: dict) -> bool:
        return (
            experts in values.get("moe_kernels", {})
            if experts is not None
            else bool(set(names) & set(values))
        )

    found = []
    if section is None or (section.kind == "engines" and section.gpu is None):
        found += [gpu for gpu in sorted({run.gpu for run in runs}) if hides(base.gpus.get(gpu, {}))]
    if section is None:
        found += [
            f"engine {e}" for e in sorted({run.engine for run in runs}) if hides(base.engines.get(e, {}))
        ]
    if section is None or section.gpu is None:  # an engine's own section for a GPU applies over every other
        found += [
            f"engine {e} on {gpu}"
            for e, gpu in sorted({(run.engine, run.gpu) for run in runs})
            if hides(base.engines.get(e, {}).get("gpus", {}).get(gpu, {}))
        ]
    return found


def profile_of(
    x: np.ndarray,
    names: list[str],
    base: Profile,
    section: Section | None = None,
    experts: str | None = None,
    **fields,
) -> Profile:
    """`base` with the fitted parameters (log values `x`, in `names` order), in `section` when given, the
    routed experts' in the `moe_kernels` entry of dtype `experts` when given, and `fields`."""
    values = {n: min(v, 1.0) if n in EFFICIENCIES else v for n, v in zip(names, np.exp(x).tolist())}
    if experts is not None:
        own = {n: values.pop(n) for n in MOE_KERNEL_FIELDS if n in values}
        shared = base.model_dump()["moe_kernels"]
        held = section.of(base).get("moe_kernels", {}) if section is not None else shared
        # a section's entry replaces the shared one whole: it starts from the entry the fit started from
        values["moe_kernels"] = held | {experts: held.get(experts, shared.get(experts, {})) | own}
    if section is not None:
        return base.with_section(section.kind, section.name, values, section.gpu).model_copy(update=fields)
    if experts is not None:  # validated, as a section is
        return Profile.model_validate(base.model_dump() | values).model_copy(update=fields)
    update = {n: EfficiencyCurve.constant(v) if n in EFFICIENCIES else v for n, v in values.items()}
    return base.model_copy(update=update | fields)


def _bounds(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    ranges = OVERHEADS | API_TERMS | MOE_TERMS | HOST_TERMS
    low = [EFF_BOUNDS[0] if n in EFFICIENCIES else ranges[n][0] for n in names]
    high = [EFF_BOUNDS[1] if n in EFFICIENCIES else ranges[n][1] for n in names]
    return np.log(low), np.log(high)


def _start(base: Profile, names: list[str]) -> np.ndarray:
    low, high = _bounds(names)
    moe_curves = dict(zip(("moe_compute", "moe_memory"), base.curves("moe")))
    values = [
        moe_curves[n].at(1.0)
        if n in moe_curves
        else getattr(base, n).at(1.0)
        if n in EFFICIENCIES
        else getattr(base, n)
        for n in names
    ]
    values = [ZERO_STARTS[n] if n in ZERO_STARTS and v == 0 else v for n, v in zip(names, values)]
    return np.clip(np.log(np.maximum(values, 1e-12)), low + 1e-9, high - 1e-9)


def _logs(errors: list[MetricError]) -> list[float]:
    return [math.log(e.predicted / e.measured) for e in errors]


class _Replayer:
    """Replays runs under a candidate profile written to a temporary YAML, in a pool kept for the whole fit;
    `count` counts the calls (each replays every run it is given)."""

    def __init__(self, workers: int):
        self.folder = tempfile.TemporaryDirectory(prefix="servesim-fit-")
        self.pool = (
            ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))
            if workers > 1
            else None
        )
        self.count = 0

    def __call__(self, runs: list[MeasuredRun], profile: Profile) -> list[list[MetricError]]:
        self.count += 1
        path = Path(self.folder.name) / f"candidate-{self.count}.yaml"
        path.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
        if self.pool is None:
            return [replay(run, str(path)) for run in runs]
        return list(self.pool.map(replay, runs, [str(path)] * len(runs)))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        self.folder.cleanup()


@dataclass(frozen=True)
class RunsFit:
    profile: Profile
    train: list[MeasuredRun]
    test: list[MeasuredRun]
    evaluations: int  # the search's replays of the train runs
    # "base" (where the fit started) and "fitted" -> per run of train + test, its figures' errors
    errors: dict[str, list[list[MetricError]]]
    mape: float  # the held-out runs' figures' mean absolute % error (the train runs' when none is held out)

    def split_errors(self, profile: str) -> tuple[list[list[MetricError]], list[list[MetricError]]]:
        """`profile`'s errors on the train runs and on the test runs."""
        errors = self.errors[profile]
        return errors[: len(self.train)], errors[len(self.train) :]


def split(runs: list[MeasuredRun], holdout_every: int) -> tuple[list[MeasuredRun], list[MeasuredRun]]:
    """Every `holdout_every`-th run (the 3rd, 6th, ... for 3) is held out of the fit; 0 holds none out. 1 would hold
    out every run, leaving none to fit, so it is refused rather than read as 0."""
    if holdout_every == 0:
        return list(runs), []
    if holdout_every < 2:
        raise SpecError(
            f"--holdout-every {holdout_every}: give 0 (hold no run out) or n >= 2 (every n-th run)"
        )
    held = [i % holdout_every == holdout_every - 1 for i in range(len(runs))]
    return [r for r, h in zip(runs, held) if not h], [r for r, h in zip(runs, held) if h]


def fit_to_runs(
    train: list[MeasuredRun],
    test: list[MeasuredRun],
    base: Profile = Profile(),
    workers: int = 1,
    max_evaluations: int = 200,
    prior: float = 0.0,
    only: list[str] | None = None,
    gpu: str | None = None,
    experts: str | None = None,
    on_evaluation: Callable[[int], None] | None = None,
    engine: str | None = None,
    **fields,
) -> RunsFit:
    """The profile (efficiencies constant in tokens, overheads) whose replays best match the train runs' figures.

    `max_evaluations` bounds the replays of the train runs, the Jacobian's finite steps included (the best
    profile seen is kept when they run out). `prior` > 0 adds prior * log(value / base value) per parameter to
    the residuals: a pull toward `base` that keeps parameters the runs cannot tell apart from trading against
    each other to their bounds. `only` restricts the fit to those of its parameters (`base` keeps the others).
    `fields` go to the Profile (name, provenance); `fit_mape` is set to the held-out runs' figures' MAPE (the train
    runs' when nothing is held out). With `gpu`, every run must be on that GPU; the fit starts from `base` as it
    prices that GPU and writes its parameters into `base`'s section for it, keeping `base`'s own `fit_mape`
    (RunsFit.mape is the section's). `on_evaluation(n)` hears of each replay of the train runs (n of at most
    `max_evaluations`). With `experts` (a weight dtype), every train run's routed experts must be of that dtype, and
    the routed-expert numbers fitted go into the profile's (or the section's) `moe_kernels` entry for it. With
    `engine` (vllm, sglang, trtllm) instead of `gpu`, every run must be of that engine, and the fit goes into the
    engine's section as it would into a GPU's; with both, into the engine section's own section for that GPU
    (what differs with both). The record's fields are named under the section (`gpus.<gpu>.`, `engines.<engine>.`,
    `engines.<engine>.gpus.<gpu>.`): they price its runs only."""
    if not train:
        raise ValueError("no runs to fit")
    elsewhere = sorted({run.gpu for run in train + test} - {gpu}) if gpu is not None else []
    if elsewhere:
        raise ValueError(f"a fit for {gpu} was given runs on {', '.join(elsewhere)}")
    others = sorted({run.engine for run in train + test} - {engine}) if engine is not None else []
    if others:
        raise ValueError(f"a fit for {engine} was given runs of {', '.join(others)}")
    section = (
        Section("engines", engine, gpu)
        if engine is not None
        else Section("gpus", gpu)
        if gpu is not None
        else None
    )
    names = fitted_names(train)
    if only is not None:
        known = [*EFFICIENCIES, *OVERHEADS, *MOE_TERMS, *API_TERMS, *HOST_TERMS]
        unknown = sorted(set(only) - set(known))
        if unknown:
            raise SpecError(f"--only {', '.join(unknown)}: not a parameter; choose from {', '.join(known)}")
        names = (
            [n for n in names if n in only]
            + [n for n in MOE_TERMS if n in only and any(run.is_moe for run in train)]
            + [n for n in API_TERMS if n in only and _through_api(train)]
            + [n for n in HOST_TERMS if n in only]
        )
        if not names:
            raise SpecError(
                f"--only: the runs cannot tell {', '.join(only)} apart (they fit {', '.join(fitted_names(train))})"
            )
    if experts is not None and experts not in WEIGHT_DTYPE_BYTES:
        raise SpecError(f"--experts {experts}: not a weight dtype; allowed: {', '.join(WEIGHT_DTYPE_BYTES)}")
    entries = (section.resolve(base) if section is not None else base).moe_kernels
    moe_dtypes = {run.expert_dtype for run in train if run.is_moe}
    if experts is None and set(names) & set(MOE_KERNEL_FIELDS) and moe_dtypes and moe_dtypes <= set(entries):
        raise SpecError(
            f"--base {base.name}: its moe_kernels entries for {', '.join(sorted(moe_dtypes))} price these runs' "
            f"routed experts, so a fit outside them would move nothing; fit with --experts {min(moe_dtypes)}"
        )
    if experts is not None:
        others = sorted({run.label() for run in train if run.expert_dtype != experts})
        if others:
            raise SpecError(
                f"--experts {experts}: these runs' routed experts are not {experts}: {', '.join(others)}"
            )
        if not set(names) & set(MOE_KERNEL_FIELDS):
            raise SpecError(
                f"--experts {experts}: no routed-expert number to fit ({', '.join(MOE_KERNEL_FIELDS)})"
            )
    hiding = _hiding_sections(base, train + test, names, experts, section)
    if hiding:
        raise SpecError(
            f"--base {base.name}: its sections for {', '.join(hiding)} override the shared values on those runs, so a "
            "fit outside them cannot move them; fit a section with --gpu NAME, --engine NAME or both"
        )
    weights = [1 / math.sqrt(len(run.measured)) for run in train]
    replayer = _Replayer(workers)
    start = _start((section.resolve(base) if section is not None else base).for_experts(experts or ""), names)
    best: list = [math.inf, start]  # the lowest cost seen, and where

    def residuals(x: np.ndarray) -> np.ndarray:
        if replayer.count >= max_evaluations:
            raise _Budget
        logs = [_logs(errors) for errors in replayer(train, profile_of(x, names, base, section, experts))]
        if on_evaluation is not None:
            on_evaluation(replayer.count)
        r = np.concatenate([np.array(v) * w for v, w in zip(logs, weights)] + [prior * (x - start)])
        cost = soft_l1(r)
        if cost < best[0]:
            best[:] = [cost, np.array(x)]
        return r

    try:
        try:
            least_squares(
                residuals,
                best[1],
                bounds=_bounds(names),
                loss="soft_l1",
                f_scale=F_SCALE,
                diff_step=0.05,
                max_nfev=max_evaluations,
            )
        except _Budget:  # the Jacobian's replays count too, which max_nfev does not see
            pass
        _polish(residuals, best[1], names, max_evaluations - replayer.count)
        fitted, evaluations = profile_of(best[1], names, base, section, experts, **fields), replayer.count
        errors = {"base": replayer(train + test, base), "fitted": replayer(train + test, fitted)}
        checked = errors["fitted"][len(train) :] if test else errors["fitted"]
        mape = float(np.mean([abs(e.error_pct) for run in checked for e in run]))
        # an expert dtype's numbers are recorded under its entry: they price those experts only
        recorded = [f"moe_kernels.{experts}.{n}" if experts and n in MOE_KERNEL_FIELDS else n for n in names]
        if section is not None:  # they price that GPU's (that engine's) runs only
            recorded = [section.prefix + n for n in recorded]
        record = FitRecord(fields=tuple(recorded), runs=tuple(run.label() for run in train))
        # compare --split holds these runs out
        fitted = fitted.model_copy(update={"fits": (*base.fits, record)})
        if section is None:
            fitted = fitted.model_copy(update={"fit_mape": mape})
        return RunsFit(fitted, train, test, evaluations, errors, mape)
    finally:
        replayer.close()


def soft_l1(r: np.ndarray) -> float:
    """The fit's cost of residuals `r`, as least_squares scores them with loss="soft_l1"."""
    return float(np.sum(np.sqrt(1 + (r / F_SCALE) ** 2) - 1))


POLISH_STEP = 0.1  # the polish's first simplex: each parameter ~10% off the least-squares answer


def _polish(residuals, x: np.ndarray, names: list[str], budget: int) -> None:
    """Nelder-Mead from the least-squares answer on the same soft-L1 cost, with what is left of the budget (the
    best point either saw is kept by `residuals`). Replayed figures move in steps (a request crossing a step
    boundary), so the finite-difference Jacobian can stall the trust region a few percent short; the simplex,
    comparing whole costs ~10% apart, does not."""
    if budget < len(names) + 2:
        return
    low, high = _bounds(names)
    simplex = [x] + [
        np.clip(x + POLISH_STEP * np.eye(len(x))[i] * (1 if x[i] + POLISH_STEP < high[i] else -1), low, high)
        for i in range(len(x))
    ]
    try:
        minimize(
            lambda point: soft_l1(residuals(np.clip(point, low, high))),
            x,
            method="Nelder-Mead",
            bounds=list(zip(low, high)),
            options={"initial_simplex": np.array(simplex), "maxfev": budget, "xatol": 0.01, "fatol": 1e-3},
        )
    except _Budget:
        pass


def figure_rows(
    runs: list[MeasuredRun], errors_by_profile: dict[str, list[list[MetricError]]], split_name: str
) -> list[dict]:
    """One row per figure: run, split, metric, measured, and each profile's prediction."""
    rows = []
    for i, run in enumerate(runs):
        for j, metric in enumerate(run.measured):
            row = {
                "run": run.label(),
                "split": split_name,
                "metric": metric,
                "measured": run.measured[metric],
            }
            row |= {f"predicted_{name}": errors[i][j].predicted for name, errors in errors_by_profile.items()}
            rows.append(row)
    return rows
