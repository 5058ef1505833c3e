"""Sliding-window models end to end: the hybrid KV pool holds more long requests than keeping every layer whole."""

import json
from pathlib import Path

import pytest

from servesim import hardware
from servesim.hardware.errors import SpecError
from servesim.policies.hybrid_blocks import HybridBlockManager
from servesim.policies.swa_radix import SWARadixCache
from tests.simulator.conftest import run, scenario
from tests.simulator.test_simulate import assert_same_run


def long_context(model="mistral-7b", **engine):
    """Mistral-7B (every layer slides over 4096 tokens): 40 requests of 12K + 400 tokens at once on one L40S."""
    return scenario(
        model=model,
        hardware={"gpu": "l40s"},
        engine={"max_model_len": 16384, "max_num_batched_tokens": 4096, **engine},
        workload={
            "trace": None,
            "lengths": {
                "prompt": {"kind": "fixed", "value": 12000},
                "output": {"kind": "fixed", "value": 400},
            },
            "arrivals": {"kind": "all_at_once"},
            "num_requests": 40,
        },
    )


def test_sliding_windows_hold_more_long_requests_and_finish_sooner(tmp_path):
    """Mistral-7B against the same model without its window (vLLM's --disable-hybrid-kv-cache-manager keeps an
    all-sliding model's window: nothing to unify)."""
    config = json.loads((Path(hardware.__file__).parent / "model_configs" / "mistral-7b.json").read_text())
    unwindowed = tmp_path / "config.json"
    unwindowed.write_text(json.dumps({**config, "sliding_window": None}))
    hybrid, whole = run(long_context()), run(long_context(str(unwindowed)))
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
    ungated = run(long_context(str(unwindowed), scheduler_reserve_full_isl=False))
    assert ungated.steps["num_running"].max() == 17
    blocks_per_request = (hybrid.steps["kv_blocks_used"] / hybrid.steps["num_running"])[
        hybrid.steps["num_running"] == 40
    ]
    assert blocks_per_request.max() <= -(-(4096 + 400) // 16) + 1
    assert hybrid.summary["duration_s"] < whole.summary["duration_s"]


def test_a_hybrid_run_is_deterministic_and_fast_forward_changes_nothing():
    s = scenario(model="gemma-2-9b", engine={"max_model_len": 8192}, workload={"num_requests": 120})
    first, second = run(s), run(s)
    stepped = run(
        scenario(
            model="gemma-2-9b",
            engine={"max_model_len": 8192},
            workload={"num_requests": 120},
            simulation={"fast_forward": False},
        )
    )
    assert first.memory.kv_windows == (None, 4096)
    assert first.requests.equals(second.requests) and first.requests.equals(stepped.requests)


SHARED_PROMPTS = {
    "trace": None,
    "lengths": {
        "prompt": {"kind": "uniform", "low": 50, "high": 600},
        "output": {"kind": "uniform", "low": 100, "high": 600},
    },
    "shared_prefix": {"num_prefixes": 4, "prefix_tokens": 300, "zipf_s": 1.0},
    "arrivals": {"kind": "poisson", "rate_per_s": 20},
    "num_requests": 300,
}


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the Azure chat slice
        {
            "engine": {"max_model_len": 16384, "num_gpu_blocks_override": 500, "max_num_seqs": 32}
        },  # waiting, preempting
        {
            "engine": {"max_model_len": 16384, "max_num_seqs": 8}
        },  # waiting for slots: window frees admit nobody
        {"engine": {"max_model_len": 16384, "prefix_caching": "none"}},
        {"workload": SHARED_PROMPTS},  # prefix hits over the sliding group, freed blocks keep their hashes
        {"workload": SHARED_PROMPTS, "engine": {"max_model_len": 4096, "num_gpu_blocks_override": 400}},
    ],
    ids=["azure", "tight", "slots", "no-caching", "shared", "shared-tight"],
)
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


def test_sglang_keeps_every_token_of_gemmas_sliding_layers():
    """SGLang turns its hybrid SWA memory off for Gemma 2/3/3n: under the sglang scheduler Gemma 3's KV is one
    full group of every layer, as vLLM's with --disable-hybrid-kv-cache-manager, and the radix cache runs on it.
    Set false explicitly, the flag wins (a what-if of SGLang sliding the windows); vLLM keeps its hybrid groups."""
    engine = {"scheduler": "sglang", "prefix_caching": "radix", "max_model_len": 32768}
    sglang = run(scenario(model="gemma-3-12b", engine=engine, workload={"num_requests": 40}))
    whole = run(
        scenario(
            model="gemma-3-12b",
            workload={"num_requests": 40},
            engine={"max_model_len": 32768, "disable_hybrid_kv_cache_manager": True},
        )
    )
    assert sglang.memory.kv_windows == whole.memory.kv_windows == (None,)
    assert sglang.memory.block_bytes == whole.memory.block_bytes  # every layer's KV in each block
    assert sglang.summary["completed"] == 40
    resolved = lambda **e: scenario(model="gemma-3-12b", engine=e).with_engine_defaults().engine  # noqa: E731
    assert resolved(scheduler="sglang").disable_hybrid_kv_cache_manager
    assert not resolved(
        scheduler="sglang", disable_hybrid_kv_cache_manager=False
    ).disable_hybrid_kv_cache_manager
    assert not resolved().disable_hybrid_kv_cache_manager
    # vLLM: full and sliding groups
    assert set(
        run(
            scenario(model="gemma-3-12b", engine={"max_model_len": 32768}, workload={"num_requests": 5})
        ).memory.kv_windows
    ) == {None, 1024}


def test_the_memory_command_plans_gemma_under_sglang_with_full_kv():
    import json

    from typer.testing import CliRunner

    from servesim.simulator.cli.main import app

    args = ["memory", "gemma-3-12b", "--gpu", "h100-sxm", "--max-model-len", "32768", "--json"]
    sglang, vllm = (
        json.loads(CliRunner().invoke(app, args + extra).stdout) for extra in (["--engine", "sglang"], [])
    )
    assert sglang["kv_windows"] == [None] and set(vllm["kv_windows"]) == {None, 1024}
    # every layer: all 32K
    assert sglang["max_concurrency"] == pytest.approx(sglang["kv_cache_tokens"] / 32768)
    assert sglang["max_concurrency"] < vllm["max_concurrency"]


def _two_replicas_and_a_late_arrival(tmp_path, arrival_s: float, async_scheduling: bool, fast: bool):
    """Two gpt-oss-20b replicas behind least_kv, a long request on each, a short one arriving at `arrival_s`."""
    trace = tmp_path / f"t{arrival_s}.csv"
    trace.write_text(
        f"arrival_s,prompt_tokens,output_tokens\n0.0,500,400\n0.003,484,400\n{arrival_s!r},100,5\n"
    )
    return run(
        scenario(
            model="gpt-oss-20b",
            cluster={"replicas": 2, "router": "least_kv"},
            engine={"max_model_len": 4096, "async_scheduling": async_scheduling},
            workload={
                "trace": {"format": "servesim", "path": str(trace)},
                "arrivals": {"kind": "trace"},
                "num_requests": 3,
            },
            simulation={"fast_forward": fast},
        )
    )


@pytest.mark.parametrize("async_scheduling, routes", [(False, [0, 1, 0]), (True, [0, 1, 1])])
def test_a_router_reading_kv_mid_stretch_sees_what_stepping_shows(tmp_path, async_scheduling, routes):
    """The third request arrives mid-way through a step at whose end replica 1's sliding window frees a block
    (found by stepping the first two alone). A fused stretch's last step spans that arrival, so the window frees it
    makes as it ends must not show before: the router would see one block fewer on replica 1 and send the request
    there instead of replica 0. (Under async scheduling a window keeps the blocks of the step in flight, so its
    frees come a step later and this arrival finds replica 1 lighter either way: fused and stepped must still
    agree.)"""
    steps = _two_replicas_and_a_late_arrival(tmp_path, 60.0, False, False).steps
    steps = steps[steps["replica"] == 1]
    freeing = steps[(steps["kv_blocks_used"].diff() < 0) & (steps["time_s"] > 0.2)].iloc[0]
    arrival_s = float(freeing["time_s"] - freeing["duration_s"] / 2)
    runs = [
        _two_replicas_and_a_late_arrival(tmp_path, arrival_s, async_scheduling, fast)
        for fast in (True, False)
    ]
    assert runs[1].requests["replica"].tolist() == routes
    assert_same_run(*runs)


def test_sglang_serves_gpt_oss_from_its_full_and_sliding_window_pools():
    """gpt-oss-20b under SGLang with its radix cache, as SGLang runs it by default: the memory plan's two pools
    (the sliding one 0.8 of the full one's tokens) back a sliding-window radix cache. 40 prompts of 12K tokens
    arrive at once: every token of a request takes a full-pool slot, so at most 294,640 // 12,000 = 24 prompts
    fit at once (SGLang's admission, which also sets aside their outputs, lets 23 in), and none is lost. vLLM's
    hybrid manager, whose sliding group keeps a window, runs all 40 at once in the same memory."""
    lengths = {"prompt": {"kind": "fixed", "value": 12000}, "output": {"kind": "fixed", "value": 400}}

    def long_prompts(scheduler: str):
        return scenario(
            model="gpt-oss-20b",
            hardware={"gpu": "l40s"},
            engine={
                "scheduler": scheduler,
                "prefix_caching": "radix" if scheduler == "sglang" else "vllm",
                "max_model_len": 16384,
                "gpu_memory_utilization": 0.6,
            },
            workload={
                "trace": None,
                "lengths": lengths,
                "arrivals": {"kind": "all_at_once"},
                "num_requests": 40,
            },
        )

    sglang = run(long_prompts("sglang"))
    memory = sglang.memory
    assert memory.swa_window == 128 and memory.kv_cache_tokens == 294_640
    assert memory.swa_tokens == int(294_640 * 0.8) // 16 * 16
    assert sglang.summary["completed"] == 40 and sglang.summary["rejected"] == 0
    assert sglang.steps["num_running"].max() == 23 and sglang.steps["kv_usage"].max() <= 1
    vllm = run(long_prompts("vllm"))
    assert vllm.memory.swa_window is None and vllm.steps["num_running"].max() == 40


def test_sglang_with_a_sliding_model_refuses_vllms_prefix_cache():
    engine = {"scheduler": "sglang", "prefix_caching": "vllm", "max_model_len": 16384}
    with pytest.raises(SpecError, match="use radix"):
        run(scenario(model="gpt-oss-20b", engine=engine, workload={"num_requests": 5}))


SGLANG = {"scheduler": "sglang", "prefix_caching": "radix", "max_model_len": 16384}


@pytest.mark.parametrize(
    "overrides",
    [
        {"engine": SGLANG},  # the Azure chat slice
        {"engine": {**SGLANG, "num_gpu_blocks_override": 2000, "max_num_batched_tokens": 2048}},  # retracting
        {"engine": {**SGLANG, "max_num_seqs": 8}},  # waiting for slots
        {"engine": {**SGLANG, "prefix_caching": "none"}},
        {"engine": SGLANG, "workload": SHARED_PROMPTS},  # hits over tombstones
        {"engine": {**SGLANG, "async_scheduling": False}, "workload": SHARED_PROMPTS},
    ],
    ids=["azure", "tight", "slots", "no-caching", "shared", "shared-sync"],
)
def test_fused_decode_stretches_free_sglangs_sliding_slots_as_stepping_does(overrides, monkeypatch):
    """Under SGLang's two pools a decoding request frees its out-of-window sliding slots every 128 steps: fused
    stretches free them as they open each step's page, so every table (KV usage: the fuller pool's) matches a
    stepped run's."""
    fused_trims = []
    open_blocks = SWARadixCache.open_decode_blocks

    def counting(self, req, num_tokens):
        before = self._swa_done.get(req.id, 0)
        opened = open_blocks(self, req, num_tokens)
        fused_trims.append(self._swa_done.get(req.id, 0) != before)
        return opened

    monkeypatch.setattr(SWARadixCache, "open_decode_blocks", counting)
    fused = run(scenario(model="gpt-oss-20b", **overrides))
    assert len(fused_trims) > 1000 and sum(fused_trims) > 10  # the fused path ran, and freed sliding slots
    stepped = run(scenario(model="gpt-oss-20b", **overrides, simulation={"fast_forward": False}))
    assert_same_run(fused, stepped)
