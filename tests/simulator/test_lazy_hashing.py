"""vLLM's prefix cache hashes a private request's blocks (one no other request can hit) only when it is freed
unfinished: a preempted request comes back to its own blocks. Runs are identical to hashing every block."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from servesim.simulator.scenario import load_scenario
from servesim.simulator.world import run as run_module
from servesim.simulator.world.run import World

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
TIGHT = ["engine.num_gpu_blocks_override=400", "workload.num_requests=250"]  # preemptions by recompute
CASES = {
    "recompute": ("quickstart.yaml", TIGHT),
    "synchronous": ("quickstart.yaml", [*TIGHT, "engine.async_scheduling=false"]),
    "swap": ("quickstart.yaml", [*TIGHT, "engine.preemption_mode=swap", "engine.swap_space_gib=1"]),
    "pipelined": ("quickstart.yaml", [*TIGHT, "parallelism.pp=2"]),
    "prefill-decode": ("pd_disaggregated_70b.yaml", ["workload.num_requests=120"]),
    "shared-prefixes": ("agent_prefix_sharing.yaml", ["workload.num_requests=200"]),
}


def simulate(name: str, lazy: bool, monkeypatch) -> tuple[World, object]:
    path, overrides = CASES[name]
    s, base = load_scenario(SCENARIOS / path, overrides)
    with monkeypatch.context() as patch:
        if not lazy:  # nobody private: every block hashed as it fills
            patch.setattr(run_module, "mark_private_prefixes", lambda requests: None)
        world = World(s, base)
        return world, world.run()


@pytest.mark.parametrize("name", CASES)
def test_hashing_only_what_can_be_hit_changes_nothing(name, monkeypatch):
    world, lazy = simulate(name, True, monkeypatch)
    _, eager = simulate(name, False, monkeypatch)
    pd.testing.assert_frame_equal(lazy.requests, eager.requests)
    pd.testing.assert_frame_equal(lazy.steps, eager.steps)
    assert lazy.summary == eager.summary
    private = sum(r.private_prefix for r in world.workload.requests)
    assert private > 0 or name == "shared-prefixes"
    if name in ("recompute", "synchronous", "pipelined", "swap"):  # freed unfinished: hashed then
        assert lazy.requests["preemptions"].sum() > 0


def test_private_means_no_other_prompt_begins_alike():
    """Parallel samples share their prompt, session turns begin with the last one's: neither is private."""
    from servesim.workloads.request import Request, mark_private_prefixes

    alone, shared, turn = (
        Request(0, 0, 30, 2),
        Request(1, 0, 30, 2, ((5, 10), (-2, 20))),
        Request(2, 0, 30, 2),
    )
    samples = [Request(3, 0, 30, 2, ((-4, 30),)), Request(4, 0, 30, 2, ((-4, 30),))]
    other = Request(5, 0, 30, 2, ((5, 10), (-6, 20)))
    turn.session_id = 7
    mark_private_prefixes([alone, shared, turn, *samples, other])
    assert [r.private_prefix for r in (alone, shared, turn, *samples, other)] == [True] + [False] * 5
