"""A small, fast chat scenario for the sweep, capacity, plan and report tests: the quickstart Azure
conversation trace slice, rescaled to a chosen rate, on Llama-3.1-8B."""

from __future__ import annotations

import copy
from pathlib import Path

from servesim.simulator.scenario import Scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

CHAT = {
    "name": "chat",
    "seed": 0,
    "model": "llama-3.1-8b",
    "hardware": {"gpu": "h100-sxm"},
    "engine": {"max_model_len": 16384},
    "workload": {
        "trace": {"format": "azure", "path": "traces/azure_conv_1h_first2000.csv"},
        "arrivals": {"kind": "trace", "rate_per_s": 10},
        "num_requests": 200,
    },
    "slo": {"ttft_ms": 500, "tpot_ms": 50},
}


def chat(**sections) -> Scenario:
    """CHAT with whole sections replaced or merged: chat(slo={"ttft_ms": 100}) merges into CHAT's slo."""
    raw = copy.deepcopy(CHAT)
    for key, value in sections.items():
        raw[key] = (
            {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
        )
    return Scenario.model_validate(raw)
