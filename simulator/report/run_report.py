"""`servesim report`: one self-contained HTML file (plotly.js inlined) for a run folder or a sweep folder.

The page draws its charts from JSON embedded in it, then sets `document.title` to
"servesim report: N charts drawn" once every chart has its SVG (or "servesim report: error: ..." if a
script fails), so a headless browser can check it without a debugger.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import yaml
from plotly.offline import get_plotlyjs, get_plotlyjs_version
from pydantic import ValidationError

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, step_cost
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.simulator.report import charts
from servesim.simulator.atomic import check_output_file, write_text_atomic
from servesim.simulator.world.output import read_table, replica_labels
from servesim.simulator.report.plan_report import PLAN, plan_report
from servesim.simulator.planning.pricing import cost_per_hour_usd
from servesim.simulator.scenario import Scenario
from servesim.simulator.planning.sweep import POINTS, REPORT, RESULTS
from servesim.workloads.config import WorkloadConfig

SUMMARY_KEYS = (
    "completed",
    "rejected",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
    "p90_e2el_ms",
    "request_goodput",
    "preemptions",
    "kv_cache_usage_mean",
    "kv_cache_usage_max",
)
TABLE_METRICS = (
    "completed",
    "request_throughput",
    "output_throughput",
    "p90_ttft_ms",
    "p90_tpot_ms",
    "p90_e2el_ms",
    "request_goodput",
    "preemptions",
    "kv_cache_usage_max",
)


def write_report(folder: Path, out: Path | None = None, plotly: str = "inline") -> Path:
    """Write the report of a run folder (summary.json), a sweep folder (results.csv) or a plan folder (plan.json);
    returns its path. `plotly`: inline (a self-contained file) or cdn (small; plotly.js fetched when opened)."""
    if plotly not in PLOTLY_SOURCES:
        raise SpecError(f"--plotly {plotly!r}: choose from {', '.join(PLOTLY_SOURCES)}")
    folder = Path(folder)
    kinds = {RESULTS: sweep_report, "summary.json": run_report, PLAN: _plan_report}
    report = next((make for name, make in kinds.items() if (folder / name).is_file()), None)
    if report is None:  # before the output's checks: a file given as FOLDER is no place to write one either
        raise SpecError(
            f"{folder}: not a run folder (summary.json), a sweep folder ({RESULTS}) or a plan folder ({PLAN})"
        )
    out = Path(out) if out else folder / REPORT
    check_output_file(out, "--out")
    try:
        title, figures, tables = report(folder)
    except (
        FileNotFoundError,
        ValueError,  # unparseable JSON or CSV, a truncated Parquet table (ArrowInvalid), bytes that are no text
        yaml.YAMLError,
        KeyError,
        TypeError,
    ) as err:
        raise SpecError(
            f"{folder}: an incomplete or damaged output folder ({type(err).__name__}: {err})"
        ) from None
    write_text_atomic(out, page(title, figures, tables, plotly))
    return out


def _plan_report(folder: Path) -> tuple[str, list[go.Figure], list[tuple[str, str]]]:
    title, figures, tables = plan_report(folder)
    return title, figures, [(name, table_html(columns, rows)) for name, columns, rows in tables]


def run_report(folder: Path) -> tuple[str, list[go.Figure], list[tuple[str, str]]]:
    requests, steps = read_table(folder, "requests"), read_table(folder, "steps")
    summary = json.loads((folder / "summary.json").read_text())
    scenario = yaml.safe_load((folder / "scenario.yaml").read_text())
    figures = [charts.latency_cdfs(requests, scenario.get("slo"))]
    if "kv_transfer_s" in requests and requests["kv_transfer_s"].notna().any():
        figures.append(charts.kv_transfers(requests))
    if "cached_tokens" in requests and requests["cached_tokens"].fillna(0).gt(0).any():
        figures.append(charts.prefix_hits(requests))
    if len(steps):
        figures += [
            charts.kv_and_queue(steps),
            charts.batch_composition(steps),
            charts.step_roofline(
                steps, pool_of_steps(scenario, steps), rooflines(scenario), np.random.default_rng(0)
            ),
        ]
    summary_rows = [[k, _fmt(summary[k])] for k in SUMMARY_KEYS if k in summary]
    config_rows = [[k, _fmt(v)] for k, v in flatten(scenario).items() if v is not None]
    tables = [("Summary", table_html(["metric", "value"], summary_rows))]
    memory = folder / "memory.json"
    if memory.is_file():  # per GPU of one replica, as the engine plans it at start-up
        rows = [
            [k, _memory_value(k, v)]
            for k, v in flatten(json.loads(memory.read_text())).items()
            if v is not None
        ]
        tables.append(("Memory plan (per GPU)", table_html(["quantity", "value"], rows)))
    tables.append(("Configuration", table_html(["field", "value"], config_rows)))
    return f"servesim run: {scenario.get('name', folder.name)}", figures, tables


POOLS = ("prefill", "decode")  # a disaggregated run's, in the order their replicas are numbered
ROOFLINE_CHUNK = (
    256  # tokens of the prefill whose FLOPs per token bound fast prefill's (attention's still small)
)


def pool_of_steps(scenario: dict, steps: pd.DataFrame) -> pd.Series:
    """Each step's pool: "prefill" or "decode" under P/D, else "" (one pool)."""
    if not scenario.get("disaggregation"):
        return pd.Series("", index=steps.index)
    labels = replica_labels(scenario)
    return steps["replica"].map(lambda r: labels[int(r)].split()[0] if int(r) < len(labels) else "")


def rooflines(scenario: dict) -> dict[str, tuple[float, float]]:
    """Per pool ("" for one pool, else "prefill" and "decode"): a floor under every step of that pool, as (seconds
    to move the bytes of the lightest step, one token's decode: its weights, a MoE's routed experts only; seconds
    per token at peak FLOP/s of the cheapest token, a decode or, with fast prefill, a prefill one), per GPU of that
    pool's GPU, TP and PP. Empty when the scenario or a GPU cannot be read again (e.g. a GPU file that moved), or
    for a multi-stage run (its stages' models differ)."""
    try:
        s = Scenario.model_validate(scenario)
    except (ValidationError, SpecError, OSError):
        return {}
    if s.stages:
        return {}
    files = tuple(s.hardware.gpu_files)
    d = s.disaggregation
    layouts = (
        {
            name: (getattr(d, name).gpu or s.hardware.gpu, getattr(d, name).tp, getattr(d, name).pp)
            for name in POOLS
        }
        if d is not None
        else {"": (s.hardware.gpu, s.parallelism.tp, s.parallelism.pp)}
    )
    options = CostOptions(s.engine.weight_dtype, s.engine.kv_dtype, s.engine.kv_sharing_fast_prefill)
    one, chunk = StepBatch.of(np.ones(1, np.int64), np.zeros(1, np.int64)), ROOFLINE_CHUNK
    prefill = StepBatch.of(np.full(1, chunk, np.int64), np.zeros(1, np.int64))
    found = {}
    try:
        model = get_model(s.model)
        for name, (gpu_name, tp, pp) in layouts.items():
            gpu = get_gpu(gpu_name, files)
            par = s.parallelism.model_copy(update={"tp": tp, "pp": pp}).spec(s.engine.scheduler)
            lightest = step_cost(one, model, gpu, par, options=options)
            per_token = min(
                lightest.flops, step_cost(prefill, model, gpu, par, options=options).flops / chunk
            )
            found[name] = (lightest.floor_s, per_token / lightest.peak_flop_per_s)
    except (SpecError, OSError, ValueError):
        return {}
    return found


def sweep_report(folder: Path) -> tuple[str, list[go.Figure], list[tuple[str, str]]]:
    table = pd.read_csv(folder / RESULTS)
    meta = yaml.safe_load((folder / "sweep.yaml").read_text()) if (folder / "sweep.yaml").is_file() else {}
    grid_keys = list(table.columns[: list(table.columns).index("point")])
    done = table[table["error"].isna()] if "error" in table else table
    done = done[done["completed"].notna()] if "completed" in done else done
    if done.empty:
        raise SpecError(f"{folder}: no sweep point has results yet")
    labels = [", ".join(f"{k}={row[k]}" for k in grid_keys) or "base" for _, row in done.iterrows()]
    figures = [
        charts.latency_vs_load(done, grid_keys, _rate_unit(meta)),
        charts.throughput_latency(done, labels),
    ]
    cost = np.array([point_cost_per_hour(folder / POINTS / p) for p in done["point"]])
    if np.isfinite(cost).all() and len(np.unique(cost)) > 1:
        figures.append(charts.cost_pareto(cost, done["p90_ttft_ms"].to_numpy(), labels))
    columns = (
        grid_keys + [c for c in TABLE_METRICS if c in table] + [c for c in ("status", "error") if c in table]
    )
    rows = [[_fmt(row[c]) for c in columns] for _, row in table.iterrows()]
    base = meta.get("scenario") or {}
    tables = [
        ("Points", table_html(columns, rows)),
        (
            "Grid",
            table_html(["field", "values"], [[k, _fmt(v)] for k, v in (meta.get("grid") or {}).items()]),
        ),
        (
            "Base configuration",
            table_html(["field", "value"], [[k, _fmt(v)] for k, v in flatten(base).items() if v is not None]),
        ),
    ]
    return f"servesim sweep: {base.get('name', folder.name)} ({len(table)} points)", figures, tables


def _rate_unit(meta: dict) -> str:
    """What the sweep's base scenario's rates count (WorkloadConfig.rate_unit); req/s if it is not recorded."""
    try:
        return WorkloadConfig.model_validate((meta.get("scenario") or {})["workload"]).rate_unit
    except (KeyError, ValidationError):
        return "req/s"


def point_cost_per_hour(point: Path) -> float:
    """The GPUs of a point's resolved scenario (replicas, prefill/decode pools or stages) at their prices,
    USD/h (NaN if unknown)."""
    try:
        return cost_per_hour_usd(
            Scenario.model_validate(yaml.safe_load((point / "scenario.yaml").read_text()))
        )
    except (OSError, yaml.YAMLError, ValidationError, SpecError):
        return float("nan")


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings to dotted keys: {"engine": {"max_num_seqs": 8}} -> {"engine.max_num_seqs": 8}."""
    if not isinstance(data, dict):
        return {prefix: data}
    out = {}
    for key, value in data.items():
        out |= flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def _memory_value(key: str, value: Any) -> str:
    """A memory plan's figure, bytes also in GiB."""
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return f"{_fmt(value)} ({value / (1 << 30):.2f} GiB)"
    return _fmt(value)


def number_text(value: float) -> str:
    """Four significant digits, thousands separated, e-notation only below 0.001: 3.927, 1,443, 28,030."""
    return "" if np.isnan(value) else f"{value:,.4g}" if abs(value) < 9999.5 else f"{value:,.0f}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return number_text(value)
    return "" if value is None else str(value)


def table_html(columns: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


_STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
.chart{width:100%;min-height:420px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f4f4f4}.scroll{overflow-x:auto}"""

# Runs before plotly.js, so that an error anywhere on the page shows in the title.
_ERRORS = (
    """window.addEventListener("error", e => { document.title = "servesim report: error: " + e.message; });"""
)

_DRAW = """const figures = JSON.parse(document.getElementById("figures").textContent);
Promise.all(figures.map((f, i) => Plotly.newPlot("chart-" + i, f.data, f.layout, {displaylogo: false})))
  .then(() => {
    const drawn = [...document.querySelectorAll(".chart")].filter(d => d.querySelector(".main-svg")).length;
    if (!document.title.includes("error")) document.title = "servesim report: " + drawn + " charts drawn";
  })
  .catch(e => { document.title = "servesim report: error: " + e; });"""


PLOTLY_SOURCES = ("inline", "cdn")


def _plotly_script(plotly: str) -> str:
    """plotly.js inlined (~4.8 MB, opens offline) or from its CDN at the version the figures were built for."""
    if plotly == "cdn":
        return f'<script src="https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js" charset="utf-8"></script>'
    return f"<script>{get_plotlyjs()}</script>"


def page(title: str, figures: list[go.Figure], tables: list[tuple[str, str]], plotly: str = "inline") -> str:
    """The whole HTML document: plotly.js (inline or from its CDN), figures as JSON, drawn by one script."""
    data = "[" + ",".join(f.to_json() for f in figures) + "]"
    data = data.replace("</", "<\\/")  # never close the <script> early; "\/" is a valid JSON escape
    charts_html = "\n".join(f'<div class="chart" id="chart-{i}"></div>' for i in range(len(figures)))
    tables_html = "\n".join(f"<h2>{html.escape(name)}</h2>\n{body}" for name, body in tables)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>servesim report</title>\n'
        f"<script>{_ERRORS}</script>\n{_plotly_script(plotly)}\n<style>{_STYLE}</style></head>\n"
        f"<body><h1>{html.escape(title)}</h1>\n{charts_html}\n{tables_html}\n"
        f'<script type="application/json" id="figures">{data}</script>\n<script>{_DRAW}</script>\n'
        "</body></html>\n"
    )
