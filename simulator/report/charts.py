"""Plotly figures for reports: a run's latency, memory, queue and batch charts, a sweep's load curves.

Every function takes DataFrames (the run folder's CSVs, a sweep's results.csv) and returns figures;
long time series are resampled to at most a few thousand points so a report of a 1M-step run stays small.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

MAX_POINTS = 2000
POINT_MARKER = {"size": 10, "opacity": 0.6}
PALETTE = (
    "#636efa",
    "#ef553b",
    "#00cc96",
    "#ab63fa",
    "#ffa15a",
    "#19d3f3",
    "#ff6692",
    "#b6e880",
    "#ff97ff",
    "#fecb52",
)
LATENCIES = (
    ("ttft_s", "TTFT", "ttft_ms"),
    ("tpot_s", "TPOT", "tpot_ms"),
    ("e2el_s", "E2E latency", "e2el_ms"),
)
HIT_WINDOW = 200  # requests per point of the prefix-cache hit share over time


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(title=title, template="plotly_white", height=height, margin={"t": 60, "l": 60, "r": 20})
    return fig


def latency_cdfs(requests: pd.DataFrame, slo: dict | None = None) -> go.Figure:
    """Empirical CDFs of TTFT, TPOT and E2E latency (ms) over completed requests, as the summary's percentiles
    (one cut off by a stop after its first token has a TTFT, but is not one of them), each with its SLO limit
    (`slo`: the scenario's section) as a dashed line where one is set."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=[name for _, name, _ in LATENCIES])
    done = requests[requests["finish_s"].notna()]
    for col, (column, name, limit) in enumerate(LATENCIES, start=1):
        values = np.sort(done[column].dropna().to_numpy() * 1e3)
        if len(values) > MAX_POINTS:  # evenly spaced quantiles keep the curve's shape
            values = np.quantile(values, np.linspace(0, 1, MAX_POINTS))
        share = np.arange(1, len(values) + 1) / max(len(values), 1)
        fig.add_trace(go.Scatter(x=values, y=share, mode="lines", name=name), row=1, col=col)
        if (slo or {}).get(limit) is not None:
            fig.add_trace(
                go.Scatter(
                    x=[slo[limit]] * 2,
                    y=[0, 1],
                    mode="lines",
                    name=f"{name} SLO",
                    line={"dash": "dash", "color": "#ef553b"},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text=f"{name} (ms)", row=1, col=col)
    fig.update_yaxes(title_text="share of requests", row=1, col=1)
    return _layout(fig, "Latency distributions")


def kv_transfers(requests: pd.DataFrame) -> go.Figure:
    """A disaggregated run's KV hand-offs: CDFs of each request's KV transfer time and its wait for a decode
    slot (ms), over the requests that made them."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["KV transfer", "wait for the decode pool"])
    for col, (column, name) in enumerate(
        (("kv_transfer_s", "KV transfer"), ("decode_wait_s", "decode wait")), 1
    ):
        values = np.sort(requests[column].dropna().to_numpy() * 1e3)
        if len(values) > MAX_POINTS:
            values = np.quantile(values, np.linspace(0, 1, MAX_POINTS))
        share = np.arange(1, len(values) + 1) / max(len(values), 1)
        fig.add_trace(go.Scatter(x=values, y=share, mode="lines", name=name), row=1, col=col)
        fig.update_xaxes(title_text=f"{name} (ms)", row=1, col=col)
    fig.update_yaxes(title_text="share of requests", row=1, col=1)
    return _layout(fig, "Prefill-to-decode KV hand-offs")


def prefix_hits(requests: pd.DataFrame) -> go.Figure:
    """The share of prompt tokens served from the prefix cache, over windows of HIT_WINDOW requests by arrival."""
    served = requests[requests["first_token_s"].notna()].sort_values("arrival_s")
    windows = np.arange(len(served)) // HIT_WINDOW
    grouped = served.groupby(windows)
    share = grouped["cached_tokens"].sum() / grouped["prompt_tokens"].sum().clip(lower=1)
    fig = go.Figure(
        go.Scatter(
            x=grouped["arrival_s"].mean(),
            y=share,
            mode="lines+markers",
            name="cached share",
            hovertemplate="%{x:.0f} s: %{y:.1%} of prompt tokens cached<extra></extra>",
        )
    )
    fig.update_layout(
        xaxis_title="arrival time (s)", yaxis_title="prompt tokens from the cache", yaxis_range=[0, 1]
    )
    return _layout(fig, f"Prefix-cache hits over time ({HIT_WINDOW} requests a point)")


def time_grid(steps: pd.DataFrame, n: int = MAX_POINTS) -> np.ndarray:
    end = float(steps["time_s"].max()) if len(steps) else 0.0
    return np.linspace(0.0, end, n)


def sampled(steps: pd.DataFrame, column: str, grid: np.ndarray) -> pd.DataFrame:
    """Per replica, the value of `column` after the last step ending at or before each grid time (0 before)."""
    out = {}
    for replica, rows in steps.groupby("replica", sort=True):
        idx = np.searchsorted(rows["time_s"].to_numpy(), grid, side="right") - 1
        values = rows[column].to_numpy()
        out[int(replica)] = np.where(idx >= 0, values[np.clip(idx, 0, None)], 0)
    return pd.DataFrame(out, index=grid)


def kv_and_queue(steps: pd.DataFrame) -> go.Figure:
    """KV cache usage per replica, and running / waiting requests summed over replicas, over time."""
    grid = time_grid(steps)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=["KV cache usage", "requests running and waiting (all replicas)"],
    )
    kv = sampled(steps, "kv_usage", grid)
    for replica in kv.columns[:16]:  # beyond 16 lines the chart is unreadable anyway
        fig.add_trace(
            go.Scatter(x=grid, y=kv[replica], mode="lines", name=f"KV replica {replica}"), row=1, col=1
        )
    for column in ("num_running", "num_waiting"):
        total = sampled(steps, column, grid).sum(axis=1)
        fig.add_trace(
            go.Scatter(x=grid, y=total, mode="lines", name=column.removeprefix("num_")), row=2, col=1
        )
    fig.update_yaxes(title_text="used / total blocks", tickformat=".0%", row=1, col=1)
    fig.update_yaxes(title_text="requests", row=2, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
    return _layout(fig, "Memory and queues over time", height=620)


def batch_composition(steps: pd.DataFrame) -> go.Figure:
    """Mean prefill and decode tokens per step in each time bin (stacked)."""
    bins = np.minimum((steps["time_s"] / max(float(steps["time_s"].max()), 1e-12) * 400).astype(int), 399)
    per_bin = steps.groupby(bins)[["prefill_tokens", "decode_tokens"]].mean()
    centers = (per_bin.index.to_numpy() + 0.5) / 400 * float(steps["time_s"].max())
    fig = go.Figure()
    for column, name in (("decode_tokens", "decode"), ("prefill_tokens", "prefill")):
        fig.add_trace(go.Scatter(x=centers, y=per_bin[column], mode="lines", stackgroup="tokens", name=name))
    fig.update_layout(xaxis_title="simulated time (s)", yaxis_title="tokens per step (mean over the bin)")
    return _layout(fig, "Batch composition: prefill vs decode tokens per step")


def step_roofline(
    steps: pd.DataFrame,
    pools: pd.Series,
    lines: dict[str, tuple[float | None, float]],
    rng: np.random.Generator,
) -> go.Figure:
    """Step time vs tokens of a sample of executed steps, under each pool's roofline in time form:
    t >= max(weight bytes / bandwidth, 2 x active params x tokens / peak FLOP/s) per GPU of that pool (`pools`:
    each step's pool, "" for one pool; `lines`: each pool's two terms)."""
    sample = (
        steps
        if len(steps) <= 3 * MAX_POINTS
        else steps.iloc[np.sort(rng.choice(len(steps), 3 * MAX_POINTS, replace=False))]
    )
    tokens = sample["prefill_tokens"] + sample["decode_tokens"]
    share = sample["prefill_tokens"] / tokens.clip(lower=1)
    fig = go.Figure()
    for i, pool in enumerate(sorted(set(pools.loc[sample.index]))):
        mine = pools.loc[sample.index] == pool
        fig.add_trace(
            go.Scatter(
                x=tokens[mine],
                y=sample["duration_s"][mine] * 1e3,
                mode="markers",
                name=f"{pool} pool steps" if pool else "steps",
                marker={
                    "size": 5,
                    "symbol": ("circle", "diamond", "square")[i % 3],
                    "color": share[mine],
                    "colorscale": "Viridis",
                    "colorbar": {"title": "prefill share"},
                    "showscale": i == 0,
                },
                hovertemplate="%{x} tokens, %{y:.2f} ms<extra></extra>",
            )
        )
        floor_s, s_per_token = lines.get(pool, (None, None))
        if floor_s is not None and s_per_token is not None:
            x = np.logspace(0, np.log10(max(float(tokens.max()), 10)), 200)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=np.maximum(floor_s, s_per_token * x) * 1e3,
                    mode="lines",
                    name=f"{pool} pool roofline" if pool else "roofline: weights read once / compute",
                    line={"dash": "dash"},
                )
            )
    fig.update_layout(
        xaxis_title="tokens in the step",
        yaxis_title="step time (ms)",
        xaxis_type="log",
        yaxis_type="log",
        legend={"orientation": "h", "y": -0.2},
    )
    return _layout(fig, "Executed steps against the roofline")


# ---- sweeps -------------------------------------------------------------------------------------

LOAD_KEY = "workload.arrivals.rate_per_s"


def _groups(table: pd.DataFrame, keys: list[str]) -> list[tuple[str, pd.DataFrame]]:
    if not keys:
        return [("all points", table)]
    return [
        (", ".join(f"{k}={v}" for k, v in zip(keys, np.atleast_1d(name))), rows)
        for name, rows in table.groupby(keys if len(keys) > 1 else keys[0], sort=False)
    ]


def latency_vs_load(table: pd.DataFrame, grid_keys: list[str], unit: str = "req/s") -> go.Figure:
    """p90 TTFT, TPOT and E2E latency against the offered rate (or, without one, the achieved throughput)."""
    x_key = LOAD_KEY if LOAD_KEY in grid_keys else "request_throughput"
    fig = make_subplots(rows=1, cols=3, subplot_titles=["p90 TTFT", "p90 TPOT", "p90 E2E latency"])
    for i, (label, rows) in enumerate(_groups(table, [k for k in grid_keys if k != x_key])):
        rows, color = rows.sort_values(x_key), PALETTE[i % len(PALETTE)]  # one color per group in every panel
        for col, metric in enumerate(("p90_ttft_ms", "p90_tpot_ms", "p90_e2el_ms"), start=1):
            fig.add_trace(
                go.Scatter(
                    x=rows[x_key],
                    y=rows[metric],
                    mode="lines+markers",
                    name=label,
                    legendgroup=label,
                    showlegend=col == 1,
                    line={"color": color},
                ),
                row=1,
                col=col,
            )
    for col in (1, 2, 3):
        fig.update_xaxes(
            title_text=f"offered rate ({unit})" if x_key == LOAD_KEY else "throughput (req/s)", row=1, col=col
        )
    fig.update_yaxes(title_text="ms", row=1, col=1)
    return _layout(fig, "Latency vs load")


def frontier_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Points no other point beats on both: lower x is better and lower y is better."""
    order = np.lexsort((y, x))
    mask, best = np.zeros(len(x), bool), np.inf
    for i in order:
        if y[i] < best:
            mask[i], best = True, y[i]
    return mask


def throughput_latency(table: pd.DataFrame, labels: list[str]) -> go.Figure:
    """Output throughput vs p90 TPOT of every point, with the frontier (more throughput at less latency)."""
    x, y = table["output_throughput"].to_numpy(), table["p90_tpot_ms"].to_numpy()
    mask = frontier_mask(-x, y)
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=y,
            mode="markers",
            name="points",
            text=labels,
            marker=POINT_MARKER,
            hovertemplate="%{text}<br>%{x:.0f} tok/s, %{y:.1f} ms<extra></extra>",
        )
    )
    order = np.argsort(x[mask])
    fig.add_trace(go.Scatter(x=x[mask][order], y=y[mask][order], mode="lines+markers", name="frontier"))
    fig.update_layout(xaxis_title="output throughput (tokens/s)", yaxis_title="p90 TPOT (ms)")
    return _layout(fig, "Throughput-latency frontier")


def cost_pareto(cost_per_hour: np.ndarray, ttft_ms: np.ndarray, labels: list[str]) -> go.Figure:
    """Cost per hour vs p90 TTFT of every point, with the Pareto frontier."""
    mask = frontier_mask(cost_per_hour, ttft_ms)
    fig = go.Figure(
        go.Scatter(
            x=cost_per_hour,
            y=ttft_ms,
            mode="markers",
            name="points",
            text=labels,
            marker=POINT_MARKER,
            hovertemplate="%{text}<br>$%{x:.2f}/h, %{y:.1f} ms<extra></extra>",
        )
    )
    order = np.argsort(cost_per_hour[mask])
    fig.add_trace(
        go.Scatter(
            x=cost_per_hour[mask][order], y=ttft_ms[mask][order], mode="lines+markers", name="Pareto frontier"
        )
    )
    fig.update_layout(xaxis_title="cost (USD per hour)", yaxis_title="p90 TTFT (ms)")
    return _layout(fig, "Cost vs latency: Pareto frontier")
