"""Plotly roofline chart of one step's operators: each operator a point under the GPU's roofs."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from servesim.hardware.cost import StepCost
from servesim.hardware.gpu import GpuSpec


def roofline_figure(cost: StepCost, gpu: GpuSpec, title: str) -> go.Figure:
    """Log-log roofline (attainable FLOP/s vs FLOP/byte) with the step's FLOP-doing operators as points."""
    bw = gpu.memory_bytes_per_s
    x = np.logspace(-2, 5, 400)
    fig = go.Figure()
    for dtype in ("bf16", "fp8"):
        if dtype in gpu.peak_flop_per_s:
            peak = gpu.peak_flop_per_s[dtype]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=np.minimum(peak, bw * x) / 1e12,
                    mode="lines",
                    name=f"{gpu.name} {dtype} roof (ridge {peak / bw:.0f} FLOP/B)",
                )
            )
    ops = [op for op in cost.operators if op.flops > 0 and op.bytes > 0 and op.time_s > 0]
    fig.add_trace(
        go.Scatter(
            x=[op.intensity for op in ops],
            y=[op.flops / op.time_s / 1e12 for op in ops],
            mode="markers+text",
            text=[op.name for op in ops],
            textposition="top center",
            name="operators",
            marker={"size": [8 + 30 * op.time_s / cost.total_s for op in ops]},
            customdata=[[op.time_s * 1e3, op.bound, op.layers] for op in ops],
            hovertemplate="%{text}<br>%{x:.1f} FLOP/B, %{y:.1f} TFLOP/s<br>%{customdata[0]:.3f} ms, "
            "%{customdata[1]}-bound, %{customdata[2]} layers<extra></extra>",
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="arithmetic intensity (FLOP/byte)",
        yaxis_title="attained TFLOP/s (predicted)",
        xaxis_type="log",
        yaxis_type="log",
        template="plotly_white",
    )
    return fig
