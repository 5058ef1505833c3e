"""Issue 7: YOCO fast prefill on a KV-sharing tiny model lowers measured prefill time, and the simulator
with the fitted profile predicts the reduction.

"Predicts the reduction within 15%" is read as a relative error of the reduction itself:
|predicted - measured| / measured <= 0.15, where reduction = 1 - t_on / t_off of one prefill step.

The lengths are 512 and 1,024 tokens. The profile is fitted on the quick grid at full and half depth (which tells
a layer's cost from the step's) and prices the cross-decoder's own path (`fast_prefill_layer_s`) and the KV writes
the KV-sharing layers skip (`kv_write_token_s`): without them the prediction at 512 tokens is biased high by 8-19%. At 256 tokens the fixed costs the fitted terms do not span
are a third of the step, so the test does not judge it.

Those bounds hold on a machine that keeps its speed. Under pytest-xdist the other worker's tests share the two
cores, and one CI run's rounds disagreed by 23% at 512 tokens (0.363, 0.363, 0.445) while the fit, timed under
the same load, predicted 0.436 against a median of 0.363. As in test_validate, the test measures the machine's
drift (wall time above the thread's CPU time, and the rounds' disagreement): steady (<= QUIET_DRIFT), it checks
BOUNDS; else COARSE, which a model that priced no saving (0) or every layer's still misses, and warns that the
strict bounds went unchecked.
"""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

from servesim.calibration.calibrate import row_model
from servesim.calibration.pipeline import Setup, make_executor, run_calibration
from servesim.calibration.profile_grid import GridSpec, blocks_for_batch, profile_grid
from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, fast_prefill_layers, step_cost
from servesim.hardware.gpu import get_gpu
from servesim.hardware.profile import load_profile

#: Gemma 3n's pattern (sliding + full layers, trailing KV-sharing layers) at a CPU-friendly width; half the
#: layers share KV, so fast prefill runs them on one token per request.
SCALE = dict(layers=6, kv_shared=3, hidden=128, heads=4, kv_heads=2, intermediate=384, vocab=1024)
PROMPTS = (512, 1024)
BOUNDS = {512: 0.15, 1024: 0.15}  # relative error of the predicted reduction (see the docstring)
COARSE = 0.35  # the same, at every length, on a machine that changed speed under the test
QUIET_DRIFT = 0.10  # steady: rounds within 10% of each other (a quiet day's agree within 0.02 of ~0.36)


def _drift(folder, timed: list[pd.DataFrame], rounds: list[pd.Series]) -> float:
    """How much the shared machine changed under the test (0 = steady): other processes taking the core (wall
    time above the thread's CPU time, in the calibration grid and the measured rounds), or the rounds' reductions
    disagreeing."""
    rows = pd.concat([pd.read_csv(folder / "grid.csv"), *timed])
    stolen = float((rows["time_s"] / rows["cpu_time_s"]).median()) - 1.0
    table = pd.concat(rounds, axis=1)
    return max(stolen, float((table.max(axis=1) / table.min(axis=1)).max()) - 1.0)


def _reductions(rows: pd.DataFrame) -> pd.Series:
    t = rows.pivot_table(index="num_tokens", columns="fast_prefill", values="time_s")
    return 1.0 - t[True] / t[False]


@pytest.mark.timing
def test_fast_prefill_reduction_is_measured_and_predicted(tmp_path):
    setup = Setup("gemma-3n-e2b", SCALE, "cpu", "", (), threads=1)
    spec = row_model(setup.model, setup.scale_json)
    assert fast_prefill_layers(spec) == 3
    # the quick grid times every shape with fast prefill off and on; timed again at half depth (quick=False with
    # the grid given) it separates per-layer from per-step costs
    report, setup = run_calibration(setup, tmp_path, repeats=3, grid=GridSpec.quick())
    profile = load_profile(tmp_path / "profile.yaml")
    gpu = get_gpu(setup.gpu, tuple(setup.gpu_files))

    shapes = [(f"prefill {n}", StepBatch.uniform(1, 0, n)) for n in PROMPTS]
    ex = make_executor(setup, max(blocks_for_batch(b, setup.block_size) for _, b in shapes))
    # on/off interleaved, 3 times a round; a shared machine's other work can slow a whole round, so the median of
    # five rounds' reductions is the measurement (single rounds at 1,024 tokens ranged 0.33-0.58 on one run)
    timed = [profile_grid(ex, shapes, setup.model, setup.scale, repeats=3, warmup=1) for _ in range(5)]
    rounds = [_reductions(rows) for rows in timed]
    measured = pd.concat(rounds, axis=1).median(axis=1)

    def predicted(n: int) -> float:
        batch = StepBatch.uniform(1, 0, n)
        on, off = (
            step_cost(
                batch, spec, gpu, profile=profile, options=CostOptions(kv_sharing_fast_prefill=f)
            ).total_s
            for f in (True, False)
        )
        return 1.0 - on / off

    table = pd.DataFrame({"measured": measured, "predicted": [predicted(n) for n in measured.index]})
    table["rel_err"] = (table["predicted"] - table["measured"]).abs() / table["measured"]
    drift = _drift(tmp_path, timed, rounds)
    quiet = drift <= QUIET_DRIFT
    summary = (
        f"machine drift {drift:.1%}; fit MAPE {report.mape}\n{table.round(3).to_string()}\nmeasured per round:\n"
        f"{pd.concat(rounds, axis=1).round(3).to_string()}"
    )
    print(summary)
    assert (table["measured"] > 0).all(), summary
    bounds = table.index.map(BOUNDS) if quiet else COARSE
    assert (table["rel_err"] <= bounds).all(), summary
    if not quiet:
        warnings.warn(
            f"the machine's speed changed by {drift:.0%} under the test: strict bounds unchecked\n{summary}"
        )
