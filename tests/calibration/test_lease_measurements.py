"""The H200 lease's committed measurements: physically possible, and the committed profiles refit from them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim.calibration.calibrate import ROOFLINE, calibrate_rows, terms_of_rows
from servesim.calibration.fit import predict_table
from servesim.hardware.gpu import get_gpu
from servesim.hardware.profile import load_profile

LEASE = Path(__file__).resolve().parents[2] / "calibration" / "measurements" / "h200-2026-12-04"
ADDED = ["split", "roofline_s", "default_s", "fitted_s"]  # the columns calibrate_rows appends


def _grid(model: str) -> pd.DataFrame:
    return pd.read_csv(LEASE / model / "grid.csv", keep_default_na=False, na_values=[""])


def _header_mape(model: str) -> dict[str, float]:
    text = (LEASE / model / "profile.yaml").read_text()
    return {key: float(value) for key, value in re.findall(r"^# (\w+)_mape_pct: ([\d.]+)$", text, re.M)}


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gemma-3n-e2b"])
def test_no_measured_step_beats_the_h200_roofline(model):
    grid = _grid(model)
    floor = predict_table(terms_of_rows(grid, get_gpu("h200")), ROOFLINE)
    assert len(grid) > 100 and (grid["time_s"].to_numpy() >= floor).all()


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gemma-3n-e2b"])
def test_the_committed_profile_refits_from_the_committed_rows(model):
    grid = _grid(model)
    served = grid["split"] == "served"
    rows = grid[~served].drop(columns=ADDED).reset_index(drop=True)
    report = calibrate_rows(
        rows,
        get_gpu("h200"),
        model,
        "refit",
        0.25,
        0,
        served=grid[served].drop(columns=ADDED).reset_index(drop=True),
    )
    for key, value in _header_mape(model).items():
        assert report.mape[key] == pytest.approx(value, abs=0.01), key
    committed = load_profile(LEASE / model / "profile.yaml")
    # host overheads are fitted separately on the served run; leave them out of both
    strip = {"host_step_s": 0.0, "host_request_s": 0.0}
    terms = terms_of_rows(grid, get_gpu("h200"))
    np.testing.assert_allclose(
        predict_table(terms, report.profile.model_copy(update=strip)),
        predict_table(terms, committed.model_copy(update=strip)),
        rtol=1e-4,
    )
    np.testing.assert_allclose(report.rows["fitted_s"], grid["fitted_s"], rtol=1e-4)
