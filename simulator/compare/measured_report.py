"""How far the simulator is from measured runs: error tables per figure and per family, and a plotly page."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go

from servesim.simulator.atomic import write_text_atomic
from servesim.simulator.compare.measured import MeasuredRun, MetricError
from servesim.simulator.report.run_report import number_text, page, table_html

Results = list[tuple[MeasuredRun, list[MetricError]]]
FAMILIES = ("ttft", "tpot", "itl", "e2el", "throughput", "latency")


def family(metric: str) -> str:
    """TTFT, TPOT, ITL and E2E latency statistics by their metric; throughputs together; whole-run times."""
    for name in ("ttft", "tpot", "itl", "e2el"):
        if f"_{name}_" in metric:
            return name
    return "throughput" if metric.endswith("throughput") else "latency"


def error_rows(results: Results) -> list[list[str]]:
    return [
        [run.label(), e.metric, number_text(e.measured), number_text(e.predicted), f"{e.error_pct:+.1f}%"]
        for run, errors in results
        for e in errors
    ]


def family_rows(results: Results) -> list[list[str]]:
    """Per family: how many figures, median and p90 absolute % error, and the median signed error (bias)."""
    rows = []
    for name in FAMILIES:
        errs = np.array([e.error_pct for _, errors in results for e in errors if family(e.metric) == name])
        if len(errs):
            rows.append(
                [
                    name,
                    str(len(errs)),
                    f"{np.median(np.abs(errs)):.1f}%",
                    f"{np.percentile(np.abs(errs), 90):.1f}%",
                    f"{np.median(errs):+.1f}%",
                ]
            )
    return rows


ERROR_COLUMNS = ["run", "figure", "measured", "predicted", "error"]
FAMILY_COLUMNS = ["family", "figures", "median |error|", "p90 |error|", "median error (bias)"]


def parity_figure(results: Results) -> go.Figure:
    """Predicted against measured, as a ratio, per family: the y = 1 line is a perfect prediction."""
    fig = go.Figure()
    for name in FAMILIES:
        points = [(run.label(), e) for run, errors in results for e in errors if family(e.metric) == name]
        if points:
            fig.add_trace(
                go.Scatter(
                    x=[e.measured for _, e in points],
                    y=[e.predicted / e.measured for _, e in points],
                    mode="markers",
                    name=name,
                    text=[f"{label}<br>{e.metric}" for label, e in points],
                )
            )
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(
        title="Predicted / measured, per figure (hover for the run)",
        height=460,
        xaxis={"title": "measured value (its own unit)", "type": "log"},
        yaxis={"title": "predicted / measured", "type": "log"},
        margin={"t": 50},
    )
    return fig


def write_html(results: Results, path: Path, title: str) -> Path:
    tables = [
        ("Error per family", table_html(FAMILY_COLUMNS, family_rows(results))),
        ("Every figure", table_html(ERROR_COLUMNS, error_rows(results))),
        (
            "Sources",
            table_html(
                ["run", "source", "notes"], [[run.label(), run.source, run.notes or ""] for run, _ in results]
            ),
        ),
    ]
    write_text_atomic(path, page(title, [parity_figure(results)], tables))
    return path
