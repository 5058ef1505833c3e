"""Sliding-window models end to end: the hybrid KV pool holds more long requests than keeping every layer whole."""

import pytest

from policies.hybrid_blocks import HybridBlockManager
from tests.simulator.conftest import run, scenario
from tests.simulator.test_simulate import assert_same_run


def long_context(**engine):
    """Mistral-7B (every layer slides over 4096 tokens): 40 requests of 12K + 400 tokens at once on one L40S."""
    return scenario(model="mistral-7b", hardware={"gpu": "l40s"},
                    engine={"max_model_len": 16384, "max_num_batched_tokens": 4096, **engine},
                    workload={"trace": None, "lengths": {"prompt": {"kind": "fixed", "value": 12000},
                                          "output": {"kind": "fixed", "value": 400}},
                              "arrivals": {"kind": "all_at_once"}, "num_requests": 40})


def test_sliding_windows_hold_more_long_requests_and_finish_sooner():
    hybrid, whole = run(long_context()), run(long_context(disable_hybrid_kv_cache_manager=True))
    assert hybrid.memory.kv_windows == (4096,) and whole.memory.kv_windows == (None,)
    assert hybrid.num_blocks == whole.num_blocks  # one group either way: the same pool
    for result in (hybrid, whole):
        assert result.summary["completed"] == 40 and result.summary["rejected"] == 0
    # kept whole, a 12K-token prompt needs 750 of the 12,768 blocks free to be admitted: 16 fit with the
    # blocks they grow by (16 x 775 = 12,400 at their end), a 17th gets in only on its first chunk's blocks,
    # without vLLM's full-prompt gate. Sliding, each holds at most ceil((4096 + 400) / 16) + 1 = 282 blocks
    # (its 4096-token window), so all 40 (11,280 blocks) run at once
    assert hybrid.num_blocks == 12_768
    assert whole.steps["num_running"].max() == 16 and hybrid.steps["num_running"].max() == 40
    ungated = run(long_context(disable_hybrid_kv_cache_manager=True, scheduler_reserve_full_isl=False))
    assert ungated.steps["num_running"].max() == 17
    blocks_per_request = (hybrid.steps["kv_blocks_used"] / hybrid.steps["num_running"])[hybrid.steps["num_running"] == 40]
    assert blocks_per_request.max() <= -(-(4096 + 400) // 16) + 1
    assert hybrid.summary["duration_s"] < whole.summary["duration_s"]


def test_a_hybrid_run_is_deterministic_and_fast_forward_changes_nothing():
    s = scenario(model="gemma-2-9b", engine={"max_model_len": 8192}, workload={"num_requests": 120})
    first, second = run(s), run(s)
    stepped = run(scenario(model="gemma-2-9b", engine={"max_model_len": 8192}, workload={"num_requests": 120},
                           simulation={"fast_forward": False}))
    assert first.memory.kv_windows == (None, 4096)
    assert first.requests.equals(second.requests) and first.requests.equals(stepped.requests)


SHARED_PROMPTS = {"trace": None, "lengths": {"prompt": {"kind": "uniform", "low": 50, "high": 600},
                                             "output": {"kind": "uniform", "low": 100, "high": 600}},
                  "shared_prefix": {"num_prefixes": 4, "prefix_tokens": 300, "zipf_s": 1.0},
                  "arrivals": {"kind": "poisson", "rate_per_s": 20}, "num_requests": 300}


@pytest.mark.parametrize("overrides", [
    {},  # the Azure chat slice
    {"engine": {"max_model_len": 16384, "num_gpu_blocks_override": 500, "max_num_seqs": 32}},  # waiting, preempting
    {"engine": {"max_model_len": 16384, "max_num_seqs": 8}},  # waiting for slots: window frees admit nobody
    {"engine": {"max_model_len": 16384, "prefix_caching": "none"}},
    {"workload": SHARED_PROMPTS},  # prefix hits over the sliding group, freed blocks keep their hashes
    {"workload": SHARED_PROMPTS, "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 400}},
], ids=["azure", "tight", "slots", "no-caching", "shared", "shared-tight"])
def test_fused_decode_stretches_free_window_blocks_as_stepping_does(overrides, monkeypatch):
    """gpt-oss's 128-token windows free a block every 16 decode steps: fused stretches replay those frees (and
    the registrations before them) in stepping order, so every table matches a stepped run's."""
    freed = []
    end_step = HybridBlockManager.end_decode_step

    def counting(self, req, computed):
        freed.append(end_step(self, req, computed))
        return freed[-1]
    monkeypatch.setattr(HybridBlockManager, "end_decode_step", counting)
    fused = run(scenario(model="gpt-oss-20b", **overrides))
    assert sum(freed) > 100  # the fused path ran and its windows freed blocks
    stepped = run(scenario(model="gpt-oss-20b", **overrides, simulation={"fast_forward": False}))
    assert_same_run(fused, stepped)
    assert fused.memory.kv_windows == (None, 128)
