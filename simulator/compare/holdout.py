"""Out-of-sample accuracy: each profile judged only on the measured runs its fitted numbers never saw.

A profile's `fits` records name the runs each of its fitted numbers came from. Split by source (who published the
runs) or by GPU, a run is held out from a profile when no record that prices it (routed-expert numbers price MoE
models only, an expert dtype's own numbers those experts only, a GPU or engine section's that GPU's or engine's
runs only, API-server numbers `serve` runs only) drew on a run
of the same source (or GPU): leave one source out, leave one GPU out. A profile fitted to no run (the roofline
defaults' dense numbers, measured kernel tables) is held out from every run its records do not reach, so the
figures say how it extrapolates, not how well it was fitted.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import numpy as np

from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.profile import API_FIELDS, MOE_KERNEL_FIELDS, Profile
from servesim.simulator.compare.measured import MeasuredRun, MetricError
from servesim.simulator.compare.measured_report import FAMILIES, family

Results = list[tuple[MeasuredRun, list[MetricError]]]


def source_group(source: str) -> str:
    """Who published a run: a GitHub repository's owner, else the site's name (docs.gpustack.ai and
    github.com/gpustack are both `gpustack`)."""
    url = re.search(r"https?://([^/\s]+)/?([^/\s]*)", source)
    if url is None:
        return source.split()[0].lower() if source.split() else source
    host, first = url.group(1).lower(), url.group(2).lower()
    if host == "github.com" and first:
        return first
    parts = host.split(".")
    return parts[-2] if len(parts) >= 2 else host


SPLITS: dict[str, Callable[[MeasuredRun], str]] = {
    "source": lambda run: source_group(run.source),
    "gpu": lambda run: run.gpu,
}


def _placed(label: str, by_label: dict[str, MeasuredRun], split: str) -> str | None:
    """The group of the fitted run `label`: from the run itself, or for another file's run, under the GPU split,
    from the one catalog GPU its label names (a run's label or id names its GPU); None where it cannot be told."""
    run = by_label.get(label)
    if run is not None:
        return SPLITS[split](run)
    if split != "gpu":
        return None
    named = {gpu for gpu in map(_catalog_gpu, label.split()) if gpu is not None}
    return named.pop() if len(named) == 1 else None


@functools.lru_cache(maxsize=None)
def _catalog_gpu(word: str) -> str | None:
    try:
        return get_gpu(word).name
    except SpecError:
        return None


def held_out(profile: Profile, run: MeasuredRun, by_label: dict[str, MeasuredRun], split: str) -> bool:
    """Whether `run` is out of `profile`'s sample under `split`. A fitted run of another file is placed by the GPU
    its label names (if one); by source it cannot be placed and is not counted."""
    group = SPLITS[split](run)
    for record in profile.fits:
        if not any(_prices(field, run) for field in record.fields):
            continue
        if any(_placed(label, by_label, split) == group for label in record.runs):
            return False
    return True


def _prices(field: str, run: MeasuredRun) -> bool:
    """Whether a fitted number prices `run`: a `gpus.<gpu>.` one only that GPU's runs, an `engines.<engine>.` one only
    that engine's, routed-expert numbers MoE models only (a `moe_kernels.<dtype>.` one only experts of that dtype),
    API-server numbers `serve` runs only, the others every run."""
    if field.startswith(("gpus.", "engines.")):
        kind, name, rest = field.split(".", 2)
        return (run.gpu if kind == "gpus" else run.engine) == name and _prices(rest, run)
    if field.startswith("moe_kernels."):
        return run.expert_dtype == field.split(".")[1]
    if field in MOE_KERNEL_FIELDS:
        return run.is_moe
    return field not in API_FIELDS or run.benchmark == "serve"


def _cell(errors: list[float]) -> str:
    if not errors:
        return "-"
    errs = np.abs(errors)
    return f"{np.median(errs):.0f}% ({np.percentile(errs, 90):.0f}%) n={len(errs)}"


def holdout_rows(
    results: dict[str, Results], profiles: dict[str, Profile], split: str, shared: bool = False
) -> list[list[str]]:
    """Per family, each profile's median (p90) absolute % error over its held-out figures under `split`, with their
    count; "-" where every figure of that family is in its sample. `shared`: only the runs held out from every
    profile, so each column judges the same figures (profiles fitted to different runs hold out different ones)."""
    by_label = {run.label(): run for members in results.values() for run, _ in members}
    held = {
        key: {label for label, run in by_label.items() if held_out(profiles[key], run, by_label, split)}
        for key in results
    }
    if shared:
        everyone = set.intersection(*held.values()) if held else set()
        held = dict.fromkeys(held, everyone)

    rows = []
    for name in FAMILIES:
        cells = []
        for key, members in results.items():
            cells.append(
                _cell(
                    [
                        e.error_pct
                        for run, errors in members
                        if run.label() in held[key]
                        for e in errors
                        if family(e.metric) == name
                    ]
                )
            )
        if any(cell != "-" for cell in cells):
            rows.append([name, *cells])
    return rows
