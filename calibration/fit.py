"""Fit a `hardware.profile.Profile` to measured step times: pure functions of arrays and DataFrames.

Model (the cost model's own, see `calibration.fit_terms`): a step takes
    sum_entries layers * max(compute_s / eff_c[kind](T), memory_s / eff_m[kind](T))
    + step_overhead_s + layer_overhead_s * num_layers + request_overhead_s * num_requests
    + token_overhead_s * num_tokens + mixed_layer_overhead_s * mixed_layers
    + fast_prefill_layer_s * cross_layers + kv_write_token_s * kv_tokens
with T the token rows of each entry (its operator's, see fit_terms) and the four efficiency curves
(gemm/attention x compute/memory) given by their values at a few token-count knots (linear in log T
between knots, flat outside, exactly as `EfficiencyCurve.at`).

The fit minimises relative errors (pred - measured) / measured, and those of given pairs' time ratios
(a shape timed with YOCO fast prefill on and off), with scipy's robust least squares
(soft-L1 loss: a few noisy rows do not drag the fit), efficiencies bounded to [1e-4, 1] and
overheads to >= 0, plus a weak smoothness penalty between neighbouring knots so a knot no row
depends on stays near its neighbours. `layer_overhead_s` and `token_overhead_s` are only identifiable
when the rows span models of different depths (otherwise a per-layer cost is a per-step one, and a
per-token cost outside the layers is the GEMM curves' business); without that they are fixed at 0.
`mixed_layer_overhead_s` (a step attending decodes beside prefill chunks runs both attention paths) is fitted
when the rows hold mixed steps and steps of one kind; `fast_prefill_layer_s` (YOCO's cross-decoder layers of a
prefilling step run on their own metadata and attention path) and `kv_write_token_s` (the key rotation and cache
write of each KV-owning layer) when they hold prefills timed with fast prefill on and off: the on/off ratio tells
the layers that write KV from those that share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from servesim.calibration.fit_terms import KIND_CODES, KIND_NAMES, StepTerms
from servesim.hardware.profile import FIXED_COSTS as OVERHEADS, EfficiencyCurve, Profile

CURVES = ("gemm_compute", "gemm_memory", "attn_compute", "attn_memory")
EFF_BOUNDS = (1e-4, 1.0)


@dataclass(frozen=True)
class TermTable:
    """Many rows' StepTerms stacked: entry arrays carry the row they belong to."""

    row: np.ndarray
    kind: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    layers: np.ndarray
    tokens: np.ndarray  # per entry: where its efficiencies are read
    num_layers: np.ndarray
    num_requests: np.ndarray
    num_tokens: np.ndarray
    mixed_layers: np.ndarray
    cross_layers: np.ndarray
    kv_tokens: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.num_layers)

    def subset(self, rows: np.ndarray) -> TermTable:
        """The rows selected by boolean mask `rows`, renumbered from 0."""
        new_index = np.cumsum(rows) - 1
        keep = rows[self.row]
        return TermTable(
            new_index[self.row[keep]],
            self.kind[keep],
            self.compute_s[keep],
            self.memory_s[keep],
            self.layers[keep],
            self.tokens[keep],
            self.num_layers[rows],
            self.num_requests[rows],
            self.num_tokens[rows],
            self.mixed_layers[rows],
            self.cross_layers[rows],
            self.kv_tokens[rows],
        )


def stack_terms(terms: list[StepTerms]) -> TermTable:
    cat = np.concatenate
    return TermTable(
        cat([np.full(len(t.kind), i) for i, t in enumerate(terms)]),
        cat([t.kind for t in terms]),
        cat([t.compute_s for t in terms]),
        cat([t.memory_s for t in terms]),
        cat([t.layers for t in terms]),
        cat([t.tokens for t in terms]),
        np.array([t.num_layers for t in terms], float),
        np.array([t.num_requests for t in terms], float),
        np.array([t.num_tokens for t in terms], float),
        np.array([t.mixed_layers for t in terms], float),
        np.array([t.cross_layers for t in terms], float),
        np.array([t.kv_tokens for t in terms], float),
    )


def curve_weights(tokens: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """W [len(tokens), knots] with W @ values == EfficiencyCurve(points=zip(knots, values)).at(tokens)."""
    w = np.zeros((len(tokens), len(knots)))
    logk, logt = np.log(knots), np.log(np.asarray(tokens, float))
    for i, lt in enumerate(logt):
        j = int(np.searchsorted(logk, lt))
        if j == 0 or len(knots) == 1:
            w[i, 0] = 1.0
        elif j == len(knots):
            w[i, -1] = 1.0
        else:
            frac = (lt - logk[j - 1]) / (logk[j] - logk[j - 1])
            w[i, j - 1], w[i, j] = 1.0 - frac, frac
    return w


def default_knots(tokens: np.ndarray, count: int = 4) -> np.ndarray:
    """`count` token counts spread evenly in log between the smallest and largest step (rounded, distinct)."""
    lo, hi = max(float(np.min(tokens)), 1.0), max(float(np.max(tokens)), 1.0)
    return np.unique(np.round(np.geomspace(lo, hi, count))) if hi > lo else np.array([lo])


def predict_table(tt: TermTable, profile: Profile) -> np.ndarray:
    """Predicted seconds per row under `profile`, which the caller resolves for the rows' GPU (`Profile.for_gpu`):
    equals `step_cost(...).total_s` row by row."""
    if profile.gpus:
        raise ValueError(
            "predict_table takes a profile resolved for one GPU (Profile.for_gpu), not its sections"
        )
    if profile.moe_kernels or profile.moe_layer_s or profile.moe_expert_s:
        raise ValueError(
            "predict_table prices routed experts by the efficiency curves alone: a profile with moe_kernels or fixed "
            "MoE costs (moe_layer_s, moe_expert_s) is priced by step_cost"
        )
    eff_c, eff_m = np.empty(len(tt.kind)), np.empty(len(tt.kind))
    for code, kind in KIND_NAMES.items():
        entries = tt.kind == code
        tokens, inverse = np.unique(tt.tokens[entries], return_inverse=True)
        for eff, curve in zip((eff_c, eff_m), profile.curves(kind)):
            eff[entries] = np.array([curve.at(t) for t in tokens])[inverse]
    return _predict(tt, eff_c, eff_m, {name: getattr(profile, name) for name in OVERHEADS})


def _predict(tt: TermTable, eff_c: np.ndarray, eff_m: np.ndarray, over: dict[str, float]) -> np.ndarray:
    """`eff_c`, `eff_m`: each entry's compute and memory efficiency; `over`: the OVERHEADS' values."""
    per_entry = np.maximum(tt.compute_s / eff_c, tt.memory_s / eff_m) * tt.layers
    ops = np.bincount(tt.row, weights=per_entry, minlength=tt.num_rows)
    return (
        ops
        + over["step_overhead_s"]
        + over["layer_overhead_s"] * tt.num_layers
        + over["request_overhead_s"] * tt.num_requests
        + over["token_overhead_s"] * tt.num_tokens
        + over["mixed_layer_overhead_s"] * tt.mixed_layers
        + over["fast_prefill_layer_s"] * tt.cross_layers
        + over["kv_write_token_s"] * tt.kv_tokens
    )


def mape(predicted_s: np.ndarray, measured_s: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    return float(np.mean(np.abs(predicted_s - measured_s) / measured_s) * 100.0)


class _Params:
    """Packs efficiencies (4 curves x knots) and overheads into least_squares' vector (overheads in ms, the
    per-token one in us, so every entry is of order one)."""

    def __init__(self, knots: np.ndarray, two_depths: bool, mixed: bool = False, cross: bool = False):
        self.knots, self.k = knots, len(knots)
        # Profile field -> unit in the vector; the per-layer and per-token ones need two model depths, the mixed
        # one mixed steps beside others, the cross-decoder one prefills with fast prefill on beside others
        self.overheads = {"step_overhead_s": 1e-3, "request_overhead_s": 1e-3}
        if two_depths:
            self.overheads |= {"layer_overhead_s": 1e-3, "token_overhead_s": 1e-6}
        if mixed:
            self.overheads |= {"mixed_layer_overhead_s": 1e-3}
        if cross:  # the on/off pairs tell the layers that write KV from those that share it
            self.overheads |= {"fast_prefill_layer_s": 1e-3, "kv_write_token_s": 1e-6}

    def initial(self, init: Profile) -> np.ndarray:
        effs = [np.clip([getattr(init, c).at(t) for t in self.knots], *EFF_BOUNDS) for c in CURVES]
        over = [getattr(init, name) / unit for name, unit in self.overheads.items()]
        return np.concatenate(effs + [np.array(over)])

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        n_over = len(self.overheads)
        return (
            np.r_[np.full(4 * self.k, EFF_BOUNDS[0]), np.zeros(n_over)],
            np.r_[np.full(4 * self.k, EFF_BOUNDS[1]), np.full(n_over, np.inf)],
        )

    def unpack(self, x: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The curves' knot values and every one of OVERHEADS (those not fitted at 0)."""
        effs = {c: x[i * self.k : (i + 1) * self.k] for i, c in enumerate(CURVES)}
        over = dict.fromkeys(OVERHEADS, 0.0)
        over |= {
            name: float(value) * unit for (name, unit), value in zip(self.overheads.items(), x[4 * self.k :])
        }
        return effs, over

    def profile(self, x: np.ndarray, **fields) -> Profile:
        effs, over = self.unpack(x)
        curves = {
            c: EfficiencyCurve(points=tuple((float(k), float(v)) for k, v in zip(self.knots, effs[c])))
            for c in CURVES
        }
        # routed experts ran on the executor's own GEMMs: they read the fitted GEMM curves (moe_* None)
        return Profile(**curves, moe_compute=None, moe_memory=None, **over, **fields)


def fit_profile(
    tt: TermTable,
    measured_s: np.ndarray,
    knots: np.ndarray | None = None,
    init: Profile = Profile(),
    loss: str = "soft_l1",
    f_scale: float = 0.05,
    smooth: float = 0.02,
    pairs: np.ndarray | None = None,
    **fields,
) -> Profile:
    """The profile whose predictions best match `measured_s` (seconds per row of `tt`) in relative terms.

    `loss`/`f_scale` are scipy's (soft_l1 with 5%: relative errors beyond ~5% count linearly, not squared).
    `pairs` [n, 2]: rows (a, b) whose time ratio a / b is matched too, one residual each, beside their own
    times: the same step timed two ways in interleaved rounds (fast prefill on and off), whose ratio the
    machine's drift between rounds does not blur as it blurs each time.
    `fields` go to the Profile (name, provenance, fit_mape). Raises ValueError on non-positive times."""
    measured_s = np.asarray(measured_s, float)
    if (measured_s <= 0).any() or len(measured_s) != tt.num_rows:
        raise ValueError("need one positive measured time per row")
    a, b = np.asarray(pairs, np.int64).reshape(-1, 2).T if pairs is not None else (np.zeros(0, np.int64),) * 2
    measured_ratio = measured_s[a] / measured_s[b]
    knots = default_knots(tt.tokens) if knots is None else np.asarray(knots, float)
    mixed, cross = tt.mixed_layers > 0, tt.cross_layers > 0
    params = _Params(
        knots,
        two_depths=len(np.unique(tt.num_layers)) > 1,
        mixed=bool(mixed.any() and not mixed.all()),
        cross=bool(cross.any() and not cross.all()),
    )
    w = curve_weights(tt.tokens, knots)

    def residuals(x: np.ndarray) -> np.ndarray:
        effs, over = params.unpack(x)
        at = {c: w @ v for c, v in effs.items()}
        # routed experts (kind 2) read the GEMM curves, as Profile.curves does for the moe-less profile fitted here
        attention = tt.kind == KIND_CODES["attention"]
        pred = _predict(
            tt,
            np.where(attention, at["attn_compute"], at["gemm_compute"]),
            np.where(attention, at["attn_memory"], at["gemm_memory"]),
            over,
        )
        rough = [np.diff(np.log(v)) * smooth for v in effs.values()]
        return np.concatenate(
            [(pred - measured_s) / measured_s, pred[a] / pred[b] / measured_ratio - 1, *rough]
        )

    x0 = np.clip(params.initial(init), *params.bounds())
    result = least_squares(
        residuals, x0, bounds=params.bounds(), loss=loss, f_scale=f_scale, x_scale="jac", max_nfev=2000
    )
    return params.profile(result.x, **fields)
