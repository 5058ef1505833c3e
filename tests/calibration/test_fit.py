"""Fitting recovers a known profile from timings the cost model itself generated (no torch, no timing noise)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from servesim.calibration.calibrate import (
    calibrate_rows,
    fast_prefill_pairs,
    held_out_shapes,
    row_batch,
    row_model,
    save_profile,
    terms_of_rows,
)
from servesim.calibration.fit import (
    curve_weights,
    default_knots,
    fit_profile,
    mape,
    predict_table,
    stack_terms,
)
from servesim.calibration.fit_terms import step_terms
from servesim.calibration.profile_grid import GridSpec, _row, grid_shapes
from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, step_cost
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.hardware.profile import EfficiencyCurve, Profile, load_profile

H200 = get_gpu("h200")
TRUE = Profile(
    gemm_compute=0.62,
    gemm_memory=0.8,
    attn_compute=0.45,
    attn_memory=0.7,
    step_overhead_s=3e-4,
    layer_overhead_s=2e-5,
    request_overhead_s=5e-6,
    token_overhead_s=4e-8,
    mixed_layer_overhead_s=6e-6,
    fast_prefill_layer_s=8e-6,
    kv_write_token_s=3e-9,
)


def synthetic_rows(
    profile: Profile, models=(("llama-3.1-8b", {}), ("llama-3.1-8b", {"layers": 8}), ("gemma-3n-e2b", {}))
) -> pd.DataFrame:
    """The default grid on full-size models, timed by step_cost under `profile` (fast prefill on and off)."""
    rows = []
    for model, scale in models:
        spec = row_model(model, json.dumps(scale))
        for label, batch in grid_shapes(GridSpec()):
            for fast in (False, True) if spec.num_kv_layers < spec.num_layers else (False,):
                options = CostOptions(kv_sharing_fast_prefill=fast)
                time_s = step_cost(batch, spec, H200, profile=profile, options=options).total_s
                rows.append(
                    _row(label, batch, fast, np.array([time_s]))
                    | {"model": model, "scale": json.dumps(scale)}
                )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    "model,fast",
    [
        ("llama-3.1-8b", False),
        ("gemma-3n-e2b", True),
        ("mixtral-8x7b", False),
        ("gemma-2-9b", False),
        ("deepseek-v3", False),
    ],
)
def test_terms_rebuild_step_cost_exactly(model, fast):
    # every curve depends on tokens, so an entry priced at the wrong row count (LM head, YOCO layers) shows
    profile = Profile(
        gemm_compute=EfficiencyCurve(points=((1, 0.3), (512, 0.8))),
        gemm_memory=EfficiencyCurve(points=((1, 0.9), (2048, 0.2))),
        attn_compute=EfficiencyCurve(points=((1, 0.2), (1024, 0.6))),
        attn_memory=EfficiencyCurve(points=((1, 0.8), (256, 0.4))),
        moe_compute=EfficiencyCurve(points=((1, 0.1), (4096, 0.5))),
        moe_memory=0.35,
        layer_overhead_s=1e-5,
        request_overhead_s=3e-6,
        token_overhead_s=2e-8,
        mixed_layer_overhead_s=4e-6,
        fast_prefill_layer_s=5e-6,
        kv_write_token_s=2e-9,
    )
    options = CostOptions(kv_sharing_fast_prefill=fast)
    mixed = StepBatch.of([1, 1, 300], [500, 4000, 100], [True, True, False])
    for batch in (StepBatch.uniform(1, 0, 2048), StepBatch.uniform(64, 1000), mixed):
        want = step_cost(batch, get_model(model), H200, profile=profile, options=options).total_s
        table = stack_terms([step_terms(batch, get_model(model), H200, options)])
        assert predict_table(table, profile)[0] == pytest.approx(want, rel=1e-12)
    # what its terms do not hold it refuses rather than price without
    for moe in (
        {"moe_layer_s": 1e-5},
        {"moe_expert_s": 1e-7},
        {"moe_kernels": {"mxfp4": {"moe_memory": 0.5}}},
    ):
        with pytest.raises(ValueError, match="priced by step_cost"):
            predict_table(table, profile.model_copy(update=moe))


def test_curve_weights_interpolate_like_the_profile():
    knots = np.array([1.0, 16.0, 512.0])
    curve = EfficiencyCurve(points=((1, 0.2), (16, 0.5), (512, 0.9)))
    tokens = np.array([1, 4, 16, 100, 512, 4096])
    assert curve_weights(tokens, knots) @ np.array([0.2, 0.5, 0.9]) == pytest.approx(
        [curve.at(t) for t in tokens]
    )
    assert curve.at(4) == pytest.approx(0.35)  # halfway between 1 and 16 in log2: (0.2 + 0.5) / 2


def test_default_knots_span_the_steps():
    assert default_knots(np.array([1, 30, 4096]), 3).tolist() == [1.0, 64.0, 4096.0]
    assert default_knots(np.array([8, 8])).tolist() == [8.0]


def test_fit_recovers_constant_efficiencies_and_overheads():
    rows = synthetic_rows(TRUE)
    tt = stack_terms(
        [
            step_terms(
                row_batch(r),
                row_model(r.model, r.scale),
                H200,
                CostOptions(kv_sharing_fast_prefill=r.fast_prefill),
            )
            for r in rows.itertuples()
        ]
    )
    fitted = fit_profile(tt, rows["time_s"].to_numpy(), knots=np.array([1.0]))
    for name in ("gemm_compute", "gemm_memory", "attn_compute", "attn_memory"):
        assert getattr(fitted, name).at(1) == pytest.approx(getattr(TRUE, name).at(1), rel=0.02), name
    assert fitted.step_overhead_s == pytest.approx(3e-4, rel=0.02)
    assert fitted.layer_overhead_s == pytest.approx(2e-5, rel=0.02)
    assert fitted.request_overhead_s == pytest.approx(5e-6, rel=0.02)
    assert fitted.token_overhead_s == pytest.approx(4e-8, rel=0.02)
    assert fitted.mixed_layer_overhead_s == pytest.approx(6e-6, rel=0.02)
    assert fitted.fast_prefill_layer_s == pytest.approx(8e-6, rel=0.02)
    assert fitted.kv_write_token_s == pytest.approx(3e-9, rel=0.02)


def test_one_depth_fixes_the_per_layer_and_per_token_costs_at_zero():
    """With every row on one model depth, a per-layer cost is a per-step one and a per-token cost outside the
    layers is a GEMM efficiency: neither is identifiable, so the fit leaves both at 0 and still matches the steps."""
    rows = synthetic_rows(TRUE, models=(("llama-3.1-8b", {}),))
    report = calibrate_rows(rows, H200, "one depth", "test", knots=np.array([1.0]))
    assert report.profile.layer_overhead_s == 0.0 and report.profile.token_overhead_s == 0.0
    assert report.profile.step_overhead_s > TRUE.step_overhead_s  # the per-layer cost, folded in


CURVED = TRUE.model_copy(update={"gemm_compute": EfficiencyCurve(points=((1, 0.3), (64, 0.5), (2048, 0.75)))})
KNOTS = np.array([1.0, 64.0, 2048.0])


def test_fit_recovers_a_gemm_efficiency_curve():
    report = calibrate_rows(synthetic_rows(CURVED), H200, "synthetic", "test", knots=KNOTS)
    curve = report.profile.gemm_compute
    assert curve.at(64) == pytest.approx(0.5, rel=0.02) and curve.at(2048) == pytest.approx(0.75, rel=0.02)
    assert report.profile.attn_memory.at(1) == pytest.approx(0.7, rel=0.02)
    # defaults: far from this "device"
    assert report.mape["test_fitted"] < 0.5 and report.mape["test_default"] > 20.0
    assert report.num_beating_roofline == 0 and (report.rows["roofline_s"] < report.rows["default_s"]).all()


def test_robust_loss_shrugs_off_a_few_slow_steps():
    rows = synthetic_rows(CURVED)
    slow = rows.index % 15 == 0
    rows.loc[slow, "time_s"] *= 1.5  # a busy machine: 7% of the steps ran half again as long
    tt = stack_terms(
        [
            step_terms(
                row_batch(r),
                row_model(r.model, r.scale),
                H200,
                CostOptions(kv_sharing_fast_prefill=r.fast_prefill),
            )
            for r in rows.itertuples()
        ]
    )
    clean_s = rows["time_s"][~slow].to_numpy()

    def clean_mape(loss: str) -> float:
        fitted = fit_profile(tt, rows["time_s"].to_numpy(), KNOTS, loss=loss)
        return mape(predict_table(tt, fitted)[~slow], clean_s)

    assert clean_mape("soft_l1") < 2.0
    assert clean_mape("soft_l1") < clean_mape("linear") / 2  # plain least squares is pulled much further


def test_held_out_rows_are_whole_shapes():
    rows = synthetic_rows(TRUE, models=(("gemma-3n-e2b", {}),))
    test = held_out_shapes(rows, 0.25, seed=3)
    by_shape = pd.Series(test).groupby(rows["shape"].to_numpy()).agg(["min", "max"])
    assert (by_shape["min"] == by_shape["max"]).all()  # fast prefill on and off land in the same split
    assert 0.15 < test.mean() < 0.35


def test_mape_is_in_percent():
    assert mape(np.array([1.1, 0.8]), np.array([1.0, 1.0])) == pytest.approx(15.0)


def test_saved_profile_loads_with_its_fit_error(tmp_path):
    profile = TRUE.model_copy(
        update={"name": "x", "fit_mape": 4.2, "gemm_compute": EfficiencyCurve(points=((1, 0.3), (64, 0.5)))}
    )
    path = save_profile(profile, tmp_path / "p.yaml", {"device": "cpu", "torch": "2.x"})
    assert path.read_text().startswith("# servesim calibration profile\n# device: cpu")
    assert load_profile(path) == profile


@pytest.mark.parametrize(
    "model,fast", [("llama-3.1-8b", False), ("gemma-3n-e2b", True), ("mixtral-8x7b", False)]
)
def test_operator_terms_are_what_step_cost_sums(model, fast):
    """fit_terms reads hardware.cost.operator_terms, the public pricing step_cost is built on: summing the
    terms per operator name reproduces step_cost's operators bit for bit."""
    from servesim.hardware.cost import operator_terms

    options = CostOptions(kv_sharing_fast_prefill=fast)
    batch = StepBatch.of([1, 1, 300], [500, 4000, 100], [True, True, False])
    terms = operator_terms(batch, get_model(model), H200, profile=TRUE, options=options)
    totals: dict[str, float] = {}
    for term in terms:
        assert term.time_s == max(term.compute_s, term.memory_s)
        totals[term.name] = totals.get(term.name, 0.0) + term.time_s * term.layers
    ops = step_cost(batch, get_model(model), H200, profile=TRUE, options=options).operators
    assert {op.name: op.time_s for op in ops if op.kind != "overhead"} == totals


def test_served_rows_join_the_fit_and_are_never_held_out():
    """Served steps (a real serving loop's shapes) are fitted with the grid's train split and scored apart."""
    grid = synthetic_rows(TRUE, models=(("llama-3.1-8b", {}),))
    rng = np.random.default_rng(0)
    served = []
    for i in range(40):  # decodes riding along with prefill chunks, as chunked prefill serves them
        n = int(rng.integers(1, 24))
        batch = StepBatch.of([1] * n + [int(rng.integers(16, 256))], rng.integers(50, 900, n + 1))
        time_s = step_cost(batch, get_model("llama-3.1-8b"), H200, profile=TRUE).total_s
        served.append(
            _row("served", batch, False, np.array([time_s])) | {"model": "llama-3.1-8b", "scale": "{}"}
        )
    report = calibrate_rows(grid, H200, "x", "test", served=pd.DataFrame(served), knots=KNOTS)
    split = report.rows["split"]
    assert (split == "served").sum() == 40 and (split[len(grid) :] == "served").all()
    assert (split[: len(grid)] == "test").any()  # the grid still holds shapes out
    assert set(report.mape) == {
        f"{s}_{p}" for s in ("train", "test", "served") for p in ("default", "fitted")
    }
    assert report.mape["served_fitted"] < 0.5 and report.mape["test_fitted"] < 0.5
    assert [row[0] for row in report.table()] == ["train", "test", "served"]


def test_fast_prefill_pairs_match_a_shape_timed_both_ways_on_one_model():
    rows = synthetic_rows(
        TRUE, models=(("llama-3.1-8b", {}), ("gemma-3n-e2b", {}), ("gemma-3n-e2b", {"layers": 10}))
    )
    pairs = fast_prefill_pairs(rows)
    on, off = rows.iloc[pairs[:, 0]], rows.iloc[pairs[:, 1]]
    # every Gemma 3n shape, at both depths; no Llama one
    assert len(pairs) == 2 * len(grid_shapes(GridSpec()))
    assert on["fast_prefill"].all() and not off["fast_prefill"].any()
    for column in ("model", "scale", "shape", "num_new", "num_context", "needs_logits"):
        assert on[column].tolist() == off[column].tolist(), column


def test_fitting_the_pairs_ratios_keeps_the_saving_when_the_machine_drifts_between_shapes():
    """Each shape's on/off pair timed in the same rounds, so one drift factor (x0.5 to x2) scales both: the absolute
    times disagree with any profile, their ratios do not, and fitting those ratios keeps the saving closer."""
    rows = synthetic_rows(
        CURVED, models=(("gemma-3n-e2b", {}), ("gemma-3n-e2b", {"layers": 10, "kv_shared": 4}))
    )
    shape = rows["model"] + rows["scale"] + rows["shape"]
    drift = dict(zip(shape.unique(), np.random.default_rng(0).uniform(0.5, 2.0, shape.nunique())))
    measured = rows["time_s"].to_numpy() * shape.map(drift).to_numpy()
    tt, pairs = terms_of_rows(rows, H200), fast_prefill_pairs(rows)
    true = predict_table(tt, CURVED)

    def saving_error(pairs_fitted) -> float:
        """Median relative error of the predicted saving over the shapes that prefill."""
        pred = predict_table(tt, fit_profile(tt, measured, KNOTS, pairs=pairs_fitted))
        saving, true_saving = (
            1 - pred[pairs[:, 0]] / pred[pairs[:, 1]],
            1 - true[pairs[:, 0]] / true[pairs[:, 1]],
        )
        prefills = true_saving > 0  # a decode-only step runs every layer either way
        return float(np.median(np.abs(saving - true_saving)[prefills] / true_saving[prefills]))

    assert saving_error(pairs) < 0.5 * saving_error(None)


def test_a_shape_timed_twice_in_one_mode_cannot_be_paired_but_a_repeated_served_step_is_fine():
    rows = synthetic_rows(TRUE, models=(("gemma-3n-e2b", {}),))
    with pytest.raises(ValueError, match="more than once"):
        fast_prefill_pairs(pd.concat([rows, rows.iloc[[1]]], ignore_index=True))
    # one decode step served thrice
    served = rows[~rows["fast_prefill"]].iloc[[0, 0, 0]].assign(shape="served")
    assert (
        fast_prefill_pairs(pd.concat([rows, served], ignore_index=True)).tolist()
        == fast_prefill_pairs(rows).tolist()
    )
