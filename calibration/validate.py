"""Close the loop: serve a trace on the executor, replay the same requests in the simulator, compare.

The simulator gets the scaled model as a config.json (`spec_to_config`), the device as a GPU-catalog
entry (a measured CPU YAML, or a catalog GPU), the fitted profile, and the executor's engine settings
with `num_gpu_blocks_override` set to the executor's pool, so both runs schedule identically and
differ only in step durations. Errors are per request, |simulated - measured| / measured, for TTFT,
TPOT and E2E latency (median and p90 over requests), plus the error of each median, of throughput,
and of every served step's time as the fitted profile predicts it (the row `step_time`; its
`requests` column counts steps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.calibration.scaled import spec_to_config
from servesim.hardware.model import ModelSpec
from servesim.policies.config import EngineConfig
from servesim.simulator.atomic import write_text_atomic
from servesim.simulator.world.run import RunResult, World
from servesim.simulator.scenario import Scenario
from servesim.workloads.config import WorkloadConfig
from servesim.workloads.generate import Workload, build_workload
from servesim.workloads.request import Request

METRICS = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2el", "e2el_s"))


def trace_config(
    num_requests: int,
    rate_per_s: float,
    prompt_median: float,
    output_low: int,
    output_high: int,
    prompt_sigma: float = 0.6,
    num_prefixes: int = 0,
    prefix_tokens: int = 0,
    prefix_share: float = 1.0,
) -> WorkloadConfig:
    """Poisson arrivals, lognormal prompts, uniform outputs: a small chat-like trace. With `num_prefixes` and
    `prefix_tokens` > 0, a `prefix_share` of the prompts start with one of that many shared prefixes (Zipf)."""
    raw = {
        "lengths": {
            "prompt": {"kind": "lognormal", "median": prompt_median, "sigma": prompt_sigma},
            "output": {"kind": "uniform", "low": output_low, "high": output_high},
        },
        "arrivals": {"kind": "poisson", "rate_per_s": rate_per_s},
        "num_requests": num_requests,
    }
    if num_prefixes and prefix_tokens:
        raw["shared_prefix"] = {
            "num_prefixes": num_prefixes,
            "prefix_tokens": prefix_tokens,
            "share": prefix_share,
        }
    return WorkloadConfig.model_validate(raw)


def build_requests(cfg: WorkloadConfig, seed: int) -> list[Request]:
    """Fresh Request objects for `cfg`; the same seed gives the same trace (call twice for two runs)."""
    return build_workload(cfg, np.random.default_rng(seed), Path(".")).requests


def simulate_requests(
    spec: ModelSpec,
    requests: list[Request],
    engine: EngineConfig,
    workload: WorkloadConfig,
    gpu: str,
    gpu_files: list[Path],
    profile: Path,
    folder: Path,
) -> RunResult:
    """Replay `requests` in the simulator with the fitted profile; writes the model config into `folder`."""
    config = Path(folder) / "model_config.json"
    write_text_atomic(config, json.dumps(spec_to_config(spec), indent=2))
    scenario = Scenario.model_validate(
        {
            "name": "validate",
            "model": str(config),
            "hardware": {"gpu": gpu, "gpu_files": [str(p) for p in gpu_files], "profile": str(profile)},
            "engine": engine.model_dump(),
            "workload": workload.model_dump(exclude_none=True),
        }
    )
    return World(scenario, Path(folder), workload=Workload(requests)).run()


def _abs_pct(sim: pd.Series, meas: pd.Series) -> pd.Series:
    return ((sim - meas).abs() / meas * 100.0).dropna()


def compare(
    measured: pd.DataFrame,
    simulated: pd.DataFrame,
    measured_summary: dict,
    simulated_summary: dict,
    steps: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per metric: per-request median / p90 absolute % error, medians (ms) and the error of the median;
    then output throughput (tokens/s), and with `steps` (columns execute_s, predicted_s) the per-step error."""
    both = measured.merge(simulated, on="request_id", how="inner", suffixes=("", "_sim")).set_index(
        "request_id"
    )
    rows = []
    for name, column in METRICS:
        err = _abs_pct(both[f"{column}_sim"], both[column])
        meas_ms, sim_ms = both[column].median() * 1e3, both[f"{column}_sim"].median() * 1e3
        rows.append(
            {
                "metric": name,
                "requests": len(err),
                "median_abs_pct_err": float(err.median()),
                "p90_abs_pct_err": float(np.percentile(err, 90)) if len(err) else float("nan"),
                "measured_median_ms": meas_ms,
                "simulated_median_ms": sim_ms,
                "median_pct_err": abs(sim_ms - meas_ms) / meas_ms * 100.0,
            }
        )
    tput_m, tput_s = measured_summary["output_throughput"], simulated_summary["output_throughput"]
    rows.append(
        {
            "metric": "output_throughput",
            "requests": len(both),
            "median_abs_pct_err": float("nan"),
            "p90_abs_pct_err": float("nan"),
            "measured_median_ms": tput_m,
            "simulated_median_ms": tput_s,
            "median_pct_err": abs(tput_s - tput_m) / tput_m * 100.0,
        }
    )
    if steps is not None:
        err = _abs_pct(steps["predicted_s"], steps["execute_s"])
        meas_ms, pred_ms = steps["execute_s"].median() * 1e3, steps["predicted_s"].median() * 1e3
        rows.append(
            {
                "metric": "step_time",
                "requests": len(steps),
                "median_abs_pct_err": float(err.median()),
                "p90_abs_pct_err": float(np.percentile(err, 90)),
                "measured_median_ms": meas_ms,
                "simulated_median_ms": pred_ms,
                "median_pct_err": abs(pred_ms - meas_ms) / meas_ms * 100.0,
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Validation:
    """Measured and simulated per-request tables and the comparison (see `compare`)."""

    measured: pd.DataFrame
    simulated: pd.DataFrame
    table: pd.DataFrame
    measured_steps: pd.DataFrame
    measured_summary: dict | None = None
    simulated_summary: dict | None = None


def report_html(v: Validation, path: Path, title: str) -> Path:
    """A plotly page: simulated vs measured TTFT / TPOT / E2E per request, and the error table. Atomic."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    both = v.measured.merge(v.simulated, on="request_id", how="left", suffixes=("", "_sim")).set_index(
        "request_id"
    )
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{m.upper()} (ms)" for m, _ in METRICS])
    for i, (name, column) in enumerate(METRICS, start=1):
        x, y = both[column] * 1e3, both[f"{column}_sim"] * 1e3
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=name, marker={"size": 4}), row=1, col=i)
        top = float(np.nanmax([x.max(), y.max()])) if len(x) else 1.0
        fig.add_trace(
            go.Scatter(
                x=[0, top], y=[0, top], mode="lines", line={"dash": "dot", "color": "grey"}, showlegend=False
            ),
            row=1,
            col=i,
        )
        fig.update_xaxes(title_text="measured", row=1, col=i)
        fig.update_yaxes(title_text="simulated", row=1, col=i)
    fig.update_layout(title=title, height=450)
    table = v.table.round(3).to_html(index=False)
    write_text_atomic(path, fig.to_html(include_plotlyjs=True).replace("</body>", f"{table}</body>"))
    return Path(path)
