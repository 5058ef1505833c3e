"""A plan folder's report: every candidate and what became of it, the deployments sized and verified against their
cost and latency, and the recommendation with its launch commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from servesim.simulator.report.charts import PALETTE, POINT_MARKER, _layout

PLAN = "plan.json"


def _verdict(candidate: dict[str, Any], unit: str) -> tuple[str, str]:
    """(outcome, per-replica rate) of a candidate: its rejection, or the replicas it needs."""
    if candidate.get("rejected"):
        return f"rejected: {candidate['rejected']}", ""
    rate = candidate.get("rate_per_replica")
    return f"{candidate.get('replicas')} replica(s)", f"{rate:.3g} {unit}" if rate else ""


def candidate_rows(plan: dict[str, Any]) -> list[list[Any]]:
    unit = plan.get("rate_unit", "req/s")
    rows = []
    for c in plan["candidates"]:
        outcome, rate = _verdict(c, unit)
        rows.append(
            [c["candidate"], c["gpus_per_replica"], f"${c['price_per_replica_hour_usd']:.2f}", rate, outcome]
            + [c.get("detail") or ""]
        )
    return rows


def cost_latency(plan: dict[str, Any]) -> go.Figure:
    """Each verified deployment's cost per hour against its p90 TTFT and TPOT; the recommendation marked."""
    fig = go.Figure()
    chosen = (plan.get("recommendation") or {}).get("deployment")
    deployments = plan["deployments"]
    for i, (metric, name) in enumerate((("p90_ttft_ms", "p90 TTFT"), ("p90_tpot_ms", "p90 TPOT"))):
        fig.add_trace(
            go.Scatter(
                x=[d["cost_per_hour_usd"] for d in deployments],
                y=[d["verdict"].get(metric) for d in deployments],
                mode="markers",
                name=name,
                text=[d["deployment"] + ("" if d["verdict"]["ok"] else " (fails)") for d in deployments],
                marker={
                    **POINT_MARKER,
                    "color": PALETTE[i],
                    "symbol": ["circle" if d["verdict"]["ok"] else "x" for d in deployments],
                },
                hovertemplate="%{text}: $%{x:.2f}/h, %{y:.1f} ms<extra></extra>",
                yaxis="y" if i == 0 else "y2",
            )
        )
    if chosen is not None:
        best = next(d for d in deployments if d["deployment"] == chosen)
        fig.add_vline(x=best["cost_per_hour_usd"], line_dash="dash", annotation_text=f"recommended: {chosen}")
    fig.update_layout(
        xaxis_title="cost ($/h)",
        yaxis_title="p90 TTFT (ms)",
        yaxis2={"title": "p90 TPOT (ms)", "overlaying": "y", "side": "right"},
        legend={"orientation": "h", "y": -0.2},
    )
    return _layout(fig, "Deployments verified: cost against latency")


def capacities(plan: dict[str, Any]) -> go.Figure:
    """Each candidate's sustainable rate per replica (0: rejected), coloured by its outcome."""
    unit = plan.get("rate_unit", "req/s")
    outcomes = sorted({_verdict(c, unit)[0].split(":")[0] for c in plan["candidates"]})
    fig = go.Figure()
    for i, outcome in enumerate(outcomes):
        mine = [c for c in plan["candidates"] if _verdict(c, unit)[0].split(":")[0] == outcome]
        fig.add_trace(
            go.Bar(
                x=[c["candidate"] for c in mine],
                y=[c.get("rate_per_replica") or 0 for c in mine],
                name=outcome,
                marker_color=PALETTE[i % len(PALETTE)],
                text=[c.get("rejected") or "" for c in mine],
                hovertemplate="%{x}: %{y:.3g} " + unit + " %{text}<extra></extra>",
            )
        )
    fig.update_layout(
        xaxis_title="candidate", yaxis_title=f"sustainable rate per replica ({unit})", barmode="group"
    )
    return _layout(fig, "Candidates: sustainable rate per replica")


def plan_report(folder: Path) -> tuple[str, list[go.Figure], list[tuple[str, list[str], list[list[Any]]]]]:
    """(title, figures, tables as (name, columns, rows)) of a plan folder."""
    plan = json.loads((folder / PLAN).read_text())
    figures = [capacities(plan)] + ([cost_latency(plan)] if plan["deployments"] else [])
    rec = plan.get("recommendation")
    summary = [
        ["target", f"{plan['target_rate_per_s']:g} {plan.get('rate_unit', 'req/s')}"],
        [
            "recommended",
            f"{rec['deployment']} (${rec['cost_per_hour_usd']:.2f}/h, {rec['gpus']} GPUs)" if rec else "none",
        ],
        ["next cheaper", (plan.get("next_cheaper") or {}).get("deployment", "none")],
        ["simulations", plan.get("num_simulations")],
        *[
            [name, command]
            for name, command in (plan.get("commands") or {}).items()
            if isinstance(command, str)
        ],
    ]
    candidates = ["candidate", "GPUs per replica", "$/replica-h", "rate per replica", "outcome", "why"]
    tables = [("Plan", ["", ""], summary), ("Candidates", candidates, candidate_rows(plan))]
    return f"servesim plan: {rec['deployment'] if rec else 'no deployment passes'}", figures, tables
