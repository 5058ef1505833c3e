"""Unset batch limits take vLLM's defaults for the GPU (EngineArgs.get_batch_defaults, `vllm serve`)."""

import pytest

from servesim.hardware.gpu import get_gpu
from servesim.policies.config import EngineConfig
from tests.simulator.conftest import scenario


@pytest.mark.parametrize(
    "gpu,tokens,seqs",
    [
        ("h100-sxm", 8192, 1024),
        ("h200", 8192, 1024),
        ("b200", 8192, 1024),
        ("mi300x", 8192, 1024),
        ("a100-80gb", 2048, 256),  # >= 70 GiB, but vLLM measured the large budget slower on A100s
        ("l40s", 2048, 256),
        ("l4", 2048, 256),
    ],
)
def test_defaults_follow_the_memory_the_gpu_reports_and_spare_the_a100(gpu, tokens, seqs):
    spec = get_gpu(gpu)
    engine = EngineConfig().with_defaults(spec, 16384)
    assert (engine.max_num_batched_tokens, engine.max_num_seqs) == (tokens, seqs)


def test_set_limits_stay_and_unset_slots_never_exceed_the_budget():
    h100 = get_gpu("h100-sxm")
    args = (h100, 16384)
    assert EngineConfig(max_num_seqs=64).with_defaults(*args).max_num_batched_tokens == 8192
    assert EngineConfig(max_num_batched_tokens=512).with_defaults(*args).max_num_seqs == 512
    unchunked = EngineConfig(enable_chunked_prefill=False).with_defaults(*args)
    assert unchunked.max_num_batched_tokens == 16384  # a whole max_model_len prompt fits in one step


def test_a_scheduler_refuses_unset_limits_and_a_scenario_records_the_ones_it_ran():
    with pytest.raises(ValueError, match="batch limits unset"):
        EngineConfig().batch_limits()
    s = scenario(hardware={"gpu": "l40s"}, engine={"max_model_len": 8192})
    assert s.engine.max_num_seqs is None
    assert s.with_engine_defaults().engine.batch_limits() == (2048, 256)


def test_a_default_that_breaks_the_budget_check_is_a_clear_error_naming_it():
    from servesim.hardware.errors import SpecError

    l40s = get_gpu("l40s")
    with pytest.raises(
        SpecError, match=r"vLLM's default max_num_batched_tokens=2048 .* < max_num_seqs \(4096\)"
    ):
        EngineConfig(max_num_seqs=4096).with_defaults(l40s, 8192)


@pytest.mark.parametrize(
    "scheduler, pp, stated, resolved",
    [
        ("vllm", 1, None, True),  # vLLM's default since 0.14
        ("vllm", 2, None, False),  # pipelined steps are committed one by one
        ("vllm", 1, False, False),
        ("sarathi", 1, None, False),
        ("sglang", 1, None, True),  # its overlap scheduler
        ("sglang", 2, None, False),
        ("orca", 1, None, False),
    ],
)
def test_async_scheduling_defaults_to_vllms_for_a_colocated_replica(scheduler, pp, stated, resolved):
    engine = EngineConfig(scheduler=scheduler, async_scheduling=stated).with_defaults(
        get_gpu("h100-sxm"), 16384, pp=pp
    )
    assert engine.async_scheduling is resolved


def test_async_scheduling_where_it_is_not_modelled_is_a_clear_error():
    from servesim.hardware.errors import SpecError

    with pytest.raises(
        ValueError, match="async_scheduling is modelled for the vllm, sglang and trtllm schedulers.*'sarathi'"
    ):
        EngineConfig(scheduler="sarathi", async_scheduling=True)
    with pytest.raises(SpecError, match=r"async_scheduling with pipeline parallelism \(pp > 1\)"):
        EngineConfig(async_scheduling=True).with_defaults(get_gpu("h100-sxm"), 16384, pp=2)


@pytest.mark.parametrize(
    "gpu,scheduler,mla,stated,expected",
    [
        ("h200", "vllm", True, None, 64),  # FlashMLA: vLLM forces 64-token blocks
        ("b200", "vllm", True, None, 64),
        ("a100-80gb", "vllm", True, None, 16),  # FlashMLA needs Hopper: Triton MLA, vLLM's 16
        ("mi300x", "vllm", True, None, 16),
        ("h200", "vllm", False, None, 16),  # not an MLA model
        ("h200", "sglang", True, None, 16),  # SGLang's own pages
        ("h200", "vllm", True, 128, 128),  # a stated multiple of 64 stays
        ("h200", "sarathi", True, 16, 16),  # a what-if loop keeps what it is given
    ],
)
def test_mla_models_take_flashmla_blocks_under_vllm_on_hopper_and_newer(
    gpu, scheduler, mla, stated, expected
):
    engine = EngineConfig(scheduler=scheduler, **({} if stated is None else {"block_size": stated}))
    assert engine.with_defaults(get_gpu(gpu), 16384, mla=mla).block_size == expected


def test_a_block_size_flashmla_would_not_run_is_an_error():
    from servesim.hardware.errors import SpecError

    with pytest.raises(
        SpecError,
        match="engine.block_size 16: vLLM runs MLA models on h200 with FlashMLA, which "
        "needs a multiple of 64",
    ):
        EngineConfig(block_size=16).with_defaults(get_gpu("h200"), 16384, mla=True)


def test_a_deepseek_scenario_runs_vllm_s_block_size_colocated_in_pools_and_in_stages():
    from servesim.simulator.world.omni_run import stage_scenario
    from servesim.simulator.world.run import pool_settings
    from servesim.simulator.omni import StageConfig
    from servesim.simulator.scenario import Scenario

    raw = {
        "name": "ds",
        "model": "deepseek-v3",
        "hardware": {"gpu": "h200"},
        "parallelism": {"tp": 8},
        "engine": {"max_num_seqs": 64},
        "workload": {
            "lengths": {"prompt": {"kind": "fixed", "value": 100}, "output": {"kind": "fixed", "value": 10}},
            "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
            "num_requests": 5,
        },
    }
    s = Scenario.model_validate(raw)
    assert s.with_engine_defaults().engine.block_size == 64
    pd = Scenario.model_validate(
        {
            **raw,
            "disaggregation": {
                "prefill": {"replicas": 1, "tp": 8},
                "decode": {"replicas": 1, "tp": 8},
                "transfer": {"link": "ib-ndr-400"},
            },
        }
    )
    for pool, scheduler, role in (
        (pd.disaggregation.prefill, "vllm_prefill", "prefill"),
        (pd.disaggregation.decode, "vllm_decode", "decode"),
    ):
        assert (
            pool_settings(pd, pool, scheduler, role).with_engine_defaults().engine.block_size == 64
        )  # was 16
    assert stage_scenario(s, StageConfig(name="only", tp=8)).engine.block_size == 64


@pytest.mark.parametrize(
    "method,extra,resolved",
    [
        ("eagle", {}, True),
        ("mtp", {}, True),  # vLLM's EagleModelTypes schedule ahead
        ("ngram", {}, False),
        ("draft", {"draft_model": "llama-3.2-1b"}, False),
    ],
)
def test_vllm_schedules_ahead_only_with_eagle_or_mtp_drafts(method, extra, resolved):
    from servesim.hardware.errors import SpecError

    spec = {"method": method, "k": 3, "acceptance": 0.7, **extra}
    h100 = get_gpu("h100-sxm")
    assert EngineConfig(speculative=spec).with_defaults(h100, 16384).async_scheduling is resolved
    if not resolved:  # vLLM refuses it when asked for explicitly
        with pytest.raises(
            SpecError, match=f"speculative method '{method}': vLLM schedules ahead only with eagle or"
        ):
            EngineConfig(speculative=spec, async_scheduling=True).with_defaults(h100, 16384)
