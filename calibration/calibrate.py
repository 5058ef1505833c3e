"""From measured rows to a saved profile: rebuild each row's step, split by shape, fit, report MAPE, write YAML.

A row (from `profile_grid` or a served trace's steps) carries `model` (preset name or config.json
path), `scale` (JSON of `scale_model` arguments), `fast_prefill`, the StepBatch as JSON lists
(`num_new`, `num_context`, `needs_logits`) and the measured `time_s`. Held-out rows are whole shapes
chosen with a seeded generator, so the test MAPE is on shapes the fit never saw; it is reported for
the fitted profile and for the uncalibrated defaults, which are priced against the same device peaks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from servesim.calibration.fit import TermTable, fit_profile, mape, predict_table, stack_terms
from servesim.calibration.fit_terms import step_terms
from servesim.calibration.scaled import scale_model
from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions
from servesim.hardware.gpu import GpuSpec
from servesim.hardware.model import ModelSpec, get_model
from servesim.hardware.profile import Profile
from servesim.simulator.atomic import write_text_atomic


@cache
def row_model(model: str, scale_json: str) -> ModelSpec:
    """The ModelSpec a row was measured on (cached: the cost model memoizes per spec object)."""
    return scale_model(get_model(model), **json.loads(scale_json or "{}"))


def row_batch(row) -> StepBatch:
    return StepBatch.of(json.loads(row.num_new), json.loads(row.num_context), json.loads(row.needs_logits))


def terms_of_rows(
    rows: pd.DataFrame, gpu: GpuSpec, weight_dtype: str = "bf16", kv_dtype: str = "bf16"
) -> TermTable:
    """The cost model's efficiency-free terms of every row (see calibration.fit_terms)."""
    return stack_terms(
        [
            step_terms(
                row_batch(row),
                row_model(row.model, row.scale),
                gpu,
                CostOptions(weight_dtype, kv_dtype, bool(row.fast_prefill)),
            )
            for row in rows.itertuples(index=False)
        ]
    )


def fast_prefill_pairs(rows: pd.DataFrame) -> np.ndarray:
    """[n, 2] positions (on, off) of rows timing one shape of one model with YOCO fast prefill on and off.
    Raises ValueError when a shape timed both ways is timed more than once in one mode (which time would pair is
    ambiguous); the same step served again and again, never with fast prefill, pairs with nothing."""
    columns = ["model", "scale", "shape", "num_new", "num_context", "needs_logits"]
    frame = rows[columns].assign(
        position=np.arange(len(rows)), fast=rows["fast_prefill"].astype(bool).to_numpy()
    )
    both = frame[frame["fast"]].merge(frame[~frame["fast"]], on=columns, suffixes=("_on", "_off"))
    if both["position_on"].duplicated().any() or both["position_off"].duplicated().any():
        raise ValueError("a shape is timed more than once with fast prefill on or off: one row each")
    return both[["position_on", "position_off"]].to_numpy(np.int64).reshape(-1, 2)


def held_out_shapes(rows: pd.DataFrame, test_fraction: float = 0.25, seed: int = 0) -> np.ndarray:
    """Boolean mask of test rows: a seeded random `test_fraction` of the distinct shapes (all their rows)."""
    keys = rows["model"] + "|" + rows["scale"] + "|" + rows["num_new"] + "|" + rows["num_context"]
    shapes = np.array(sorted(keys.unique()))
    n_test = int(round(test_fraction * len(shapes))) if len(shapes) > 3 else 0
    test = set(np.random.default_rng(seed).permutation(shapes)[:n_test])
    return keys.isin(test).to_numpy()


#: Every operator at the device's peaks and no overheads: the physics floor a measured step cannot beat.
ROOFLINE = Profile(
    name="roofline",
    gemm_compute=1.0,
    gemm_memory=1.0,
    attn_compute=1.0,
    attn_memory=1.0,
    moe_compute=None,
    moe_memory=None,
    step_overhead_s=0.0,
    request_overhead_s=0.0,
)


@dataclass(frozen=True)
class FitReport:
    """The fitted profile, per-row predictions (columns split, roofline_s, default_s, fitted_s) and MAPE in
    percent. A row faster than `roofline_s` means the device peaks or the cost model's counts are wrong."""

    profile: Profile
    rows: pd.DataFrame
    mape: dict[str, float]  # keys: "<train|test|served>_<default|fitted>" ("served" only with served rows)

    @property
    def num_beating_roofline(self) -> int:
        return int((self.rows["time_s"] < self.rows["roofline_s"]).sum())

    def table(self) -> list[list[str]]:
        """[split, rows, default MAPE %, fitted MAPE %] for printing."""
        out = []
        for split in ("train", "test", "served"):
            if f"{split}_default" in self.mape:
                n = int((self.rows["split"] == split).sum())
                out.append(
                    [
                        split,
                        str(n),
                        f"{self.mape[f'{split}_default']:.1f}",
                        f"{self.mape[f'{split}_fitted']:.1f}",
                    ]
                )
        return out


def calibrate_rows(
    rows: pd.DataFrame,
    gpu: GpuSpec,
    name: str,
    provenance: str,
    test_fraction: float = 0.25,
    seed: int = 0,
    knots: np.ndarray | None = None,
    served: pd.DataFrame | None = None,
) -> FitReport:
    """Fit a profile on the train shapes of `rows` and report default-vs-fitted MAPE on both splits.
    Train shapes timed with fast prefill on and off also have their time ratio fitted (`fit_profile`'s pairs):
    the saving is a prediction of its own, and interleaved rounds measure it more precisely than either time.

    `served` rows (the same columns: steps of a served trace) are fitted too, never held out: they are
    the step shapes and the order a real serving loop runs them in, which a grid only approximates."""
    test = held_out_shapes(rows, test_fraction, seed)
    split = np.where(test, "test", "train")
    if served is not None and len(served):
        rows = pd.concat([rows, served], ignore_index=True)
        split = np.r_[split, np.full(len(served), "served")]
    tt = terms_of_rows(rows, gpu)
    measured = rows["time_s"].to_numpy(float)
    fitted_on = split != "test"
    profile = fit_profile(
        tt.subset(fitted_on),
        measured[fitted_on],
        knots,
        name=name,
        provenance=provenance,
        pairs=fast_prefill_pairs(rows[fitted_on]),
    )
    default_s, fitted_s = predict_table(tt, Profile()), predict_table(tt, profile)
    roofline_s = predict_table(tt, ROOFLINE)
    scores = {}
    for part in ("train", "test", "served"):
        mask = split == part
        if part == "test" and not mask.any():
            mask = split == "train"
        if mask.any():
            scores[f"{part}_default"] = mape(default_s[mask], measured[mask])
            scores[f"{part}_fitted"] = mape(fitted_s[mask], measured[mask])
    profile = profile.model_copy(update={"fit_mape": round(scores["test_fitted"], 3)})
    out = rows.assign(split=split, roofline_s=roofline_s, default_s=default_s, fitted_s=fitted_s)
    return FitReport(profile, out, scores)


def profile_yaml(profile: Profile, header: dict[str, object]) -> str:
    """The profile as YAML (loadable by hardware.profile.load_profile) after a commented header."""
    lines = [f"# {key}: {value}" for key, value in header.items()]
    return "\n".join(["# servesim calibration profile", *lines, ""]) + yaml.safe_dump(
        profile.model_dump(mode="json"), sort_keys=False
    )


def save_profile(profile: Profile, path: Path, header: dict[str, object]) -> Path:
    write_text_atomic(Path(path), profile_yaml(profile, header))
    return Path(path)
