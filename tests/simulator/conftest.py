"""Small scenarios built in code, run through the same path as `servesim simulate`."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from servesim.simulator.world.run import RunResult, simulate
from servesim.simulator.scenario import Scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

BASE = {
    "name": "test",
    "seed": 1,
    "model": "llama-3.1-8b",
    "hardware": {"gpu": "h100-sxm"},
    "engine": {"max_model_len": 16384},
    # the SimPy engine, which these tests exercise; the compiled loop reproduces it (test_compiled_run.py)
    "simulation": {"compiled": False},
    "workload": {
        "trace": {"format": "azure", "path": "traces/azure_conv_1h_first2000.csv"},
        "arrivals": {"kind": "trace"},
        "num_requests": 300,
    },
}


def scenario(**overrides) -> Scenario:
    """BASE with nested overrides: scenario(engine={"max_num_seqs": 8}) merges into BASE's engine section."""
    raw = copy.deepcopy(BASE)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return Scenario.model_validate(raw)


def run(s: Scenario) -> RunResult:
    return simulate(s, SCENARIOS)


@pytest.fixture
def run_scenario():
    return lambda **overrides: run(scenario(**overrides))
