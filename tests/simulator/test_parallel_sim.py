"""Parallelism in the simulator: pipeline micro-batches as engines over one KV pool; EP and DP attention end to end."""

import dataclasses

import pytest

from hardware.gpu import get_interconnect
from policies.step import StepPlan
from simulator.run import World, _memory_plan, build_step_time, build_timer
from workloads.request import Request
from tests.simulator.conftest import SCENARIOS, run, scenario


def test_pipeline_stages_run_as_many_micro_batches_over_one_shared_kv_pool():
    """vLLM V1 keeps one KV cache manager per replica whatever its pipeline depth: the two micro-batch engines
    share its whole pool (and prefix cache) and split max_num_seqs."""
    s = scenario(parallelism={"pp": 2}, workload={"arrivals": {"kind": "trace", "rate_per_s": 40}, "num_requests": 200})
    world = World(s, SCENARIOS)
    assert len(world.replicas) == 2
    pool = world.pools[0]
    assert pool.num_pages == pool.num_blocks - 1  # vLLM's null block
    first, second = world.replicas
    assert first.scheduler.kv is second.scheduler.kv and first.scheduler.kv.num_blocks == pool.num_pages
    assert first.scheduler.max_num_seqs + second.scheduler.max_num_seqs == pool.scenario.engine.max_num_seqs
    result = world.run()
    assert result.summary["completed"] == 200 and sorted(set(result.requests["replica"])) == [0, 1]
    first.scheduler.kv.check_invariants()
    assert first.scheduler.kv.num_free_blocks == pool.num_pages  # every block came back
    single = run(scenario(workload={"arrivals": {"kind": "trace", "rate_per_s": 40}, "num_requests": 200}))
    # two micro-batches in flight, each step a full pass through both stages: more throughput when loaded
    assert result.summary["output_throughput"] > single.summary["output_throughput"]


def test_a_decoding_micro_batch_waits_for_the_stages_a_long_prefill_holds():
    """PP2: request 0 decodes on engine 0 when request 1's 6,000-token prefill (P = P0 + P1 seconds over the two
    stages) starts on engine 1. The prefill takes stage 0 when engine 0's micro-batch leaves it; engine 0's next
    step waits for stage 0 (P0) and then behind the prefill for stage 1 (P1): one decode gap of at least P minus
    a decode stage, where micro-batches running beside each other without sharing the stages would not stall."""
    s = scenario(parallelism={"pp": 2}, workload={
        "trace": None, "lengths": {"prompt": {"kind": "fixed", "value": 6000}, "output": {"kind": "fixed", "value": 300}},
        "arrivals": {"kind": "constant", "rate_per_s": 4}, "num_requests": 2})
    steps = run(s).steps
    prefill = steps[(steps["replica"] == 1) & (steps["prefill_tokens"] == 6000)]["duration_s"].item()
    decodes = steps[(steps["replica"] == 0) & (steps["prefill_tokens"] == 0)]
    decode_s = decodes["duration_s"].median()
    gaps = decodes["time_s"].diff().dropna()
    assert gaps.max() >= prefill - decode_s / 2 and decode_s < 0.1 * prefill


def test_swapped_blocks_cross_pcie_on_every_stage_for_its_layers():
    """Each stage's GPUs hold their layers' share of a swapped block, so a swap's PCIe time (blocks x block bytes
    over the link, plus its latency) is spread over the stages by layers: 16 of Llama 3.1 8B's 32 layers each."""
    s = scenario(parallelism={"pp": 2}, engine={"preemption_mode": "swap"}).with_engine_defaults()
    memory, timer = _memory_plan(s), build_timer(s)
    step_time, stage_times = build_step_time(s, memory, timer)
    req = Request(0, 0.0, 100, 10)
    plain = StepPlan((req,), (1,), (100,), (True,))
    swapping = dataclasses.replace(plain, swap_in_blocks=50)
    pcie = get_interconnect("pcie5")
    swap_s = 50 * memory.block_bytes / pcie.bytes_per_s + pcie.latency_s
    assert step_time(swapping) == pytest.approx(step_time(plain) + swap_s, rel=1e-12)
    assert [b - a for a, b in zip(stage_times(plain), stage_times(swapping))] == pytest.approx([swap_s / 2] * 2)


def test_deepseek_v3_with_dp_attention_and_expert_parallel_on_8_h200():
    s = scenario(model="deepseek-v3", hardware={"gpu": "h200"},
                 parallelism={"tp": 8, "ep": True, "dp_attention": True},
                 engine={"max_model_len": 16384, "weight_dtype": "fp8"},
                 workload={"arrivals": {"kind": "trace", "rate_per_s": 10}, "num_requests": 100})
    result = run(s)
    assert result.summary["completed"] == 100
    plain = run(s.model_copy(update={"parallelism": s.parallelism.model_copy(update={"dp_attention": False})}))
    assert result.memory.kv_cache_tokens > 7 * plain.memory.kv_cache_tokens * (
        result.memory.kv_cache_bytes / plain.memory.kv_cache_bytes)


@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_a_request_that_needs_more_than_half_the_pool_still_runs_under_two_stages(scheduler):
    """300 blocks of 16 tokens: each 3,000 + 100-token request needs 194 of them, more than half the pool. Split
    per micro-batch, the pool would refuse them; shared, they run one after the other (each engine's finish
    wakes the other, whose request waited for the blocks)."""
    s = scenario(parallelism={"pp": 2}, engine={"num_gpu_blocks_override": 300, "scheduler": scheduler},
                 workload={"trace": None, "lengths": {"prompt": {"kind": "fixed", "value": 3000},
                                                      "output": {"kind": "fixed", "value": 100}},
                           "arrivals": {"kind": "all_at_once"}, "num_requests": 4})
    result = run(s)
    assert result.summary["completed"] == 4 and result.summary["rejected"] == 0
    assert sorted(set(result.requests["replica"])) == [0, 1]
    assert result.steps["kv_blocks_used"].max() <= 300


def test_a_pipelined_prefill_pool_wakes_its_engines_when_a_transfer_frees_blocks():
    """P/D: a prefill's blocks come back when its KV has moved, not when it finishes; both micro-batch engines
    of the prefill replica must hear of it, or the one whose queue waited for blocks sleeps for good."""
    s = scenario(engine={"max_model_len": 8192, "max_num_batched_tokens": 2048},
                 disaggregation={"prefill": {"replicas": 1, "pp": 2, "engine": {"num_gpu_blocks_override": 250}},
                                 "decode": {"replicas": 1, "engine": {"num_gpu_blocks_override": 400}},
                                 "transfer": {"link": "ib-ndr-400"}},
                 workload={"trace": None, "lengths": {"prompt": {"kind": "fixed", "value": 3000},
                                                      "output": {"kind": "fixed", "value": 200}},
                           "arrivals": {"kind": "all_at_once"}, "num_requests": 12})
    assert run(s).summary["completed"] == 12


def test_pipeline_engines_split_an_odd_max_num_seqs_exactly_and_the_swap_space():
    s = scenario(engine={"max_num_seqs": 5, "preemption_mode": "swap"})
    whole = World(s, SCENARIOS).replicas[0].scheduler.host_blocks_free
    world = World(scenario(parallelism={"pp": 2}, engine={"max_num_seqs": 5, "preemption_mode": "swap"}), SCENARIOS)
    assert [r.scheduler.max_num_seqs for r in world.replicas] == [3, 2]
    # each stage's GPUs swap their layers' share of a block: the replica's host budget in blocks doubles, once
    assert sum(r.scheduler.host_blocks_free for r in world.replicas) == 2 * whole


def test_a_pipelined_prefill_replica_sends_its_kv_over_one_link():
    """Two prompts prefill on the two micro-batch engines of one prefill replica, the second one stage behind
    the first (the stages run one micro-batch at a time). Llama 2's 512 KiB per token take longer on the wire
    than a stage's prefill, so the second transfer starts while the first is still sending: they share the
    replica's NICs, so it waits for the first to end instead of getting a link of its own."""
    s = scenario(model="llama-2-7b", engine={"max_model_len": 4096},
                 disaggregation={"prefill": {"replicas": 1, "pp": 2}, "decode": {"replicas": 1},
                                 "transfer": {"link": "ib-hdr-200"}},
                 workload={"trace": None, "lengths": {"prompt": {"kind": "fixed", "value": 3000},
                                                      "output": {"kind": "fixed", "value": 4}},
                           "arrivals": {"kind": "all_at_once"}, "num_requests": 2})
    result = run(s)
    first_end, second_end = result.steps.loc[result.steps["prefill_tokens"] == 3000, "time_s"]
    first, second = result.requests.sort_values("kv_transfer_s")["kv_transfer_s"]
    assert first_end < second_end < first_end + first  # the second prefill ends while the first KV is on the wire
    assert second == pytest.approx(first + (first_end + first - second_end), rel=1e-9)


def test_two_prefill_replicas_sending_to_one_decode_replica_share_its_nics():
    """2P1D: two prompts end their prefills together on the two prefill replicas and both go to the one decode
    replica, whose NICs take one transfer at a time: the second takes exactly twice the first (a link per
    sender gave the decode GPU twice its bandwidth)."""
    s = scenario(disaggregation={"prefill": {"replicas": 2}, "decode": {"replicas": 1},
                                 "transfer": {"link": "ib-ndr-400"}},
                 workload={"trace": None, "lengths": {"prompt": {"kind": "fixed", "value": 4000},
                                                      "output": {"kind": "fixed", "value": 4}},
                           "arrivals": {"kind": "all_at_once"}, "num_requests": 2})
    requests = run(s).requests
    assert sorted(requests["prefill_replica"]) == [0, 1] and set(requests["replica"]) == {2}
    first, second = sorted(requests["kv_transfer_s"])
    assert second == pytest.approx(2 * first, rel=1e-9)


def test_sglang_plans_memory_by_its_mem_fraction_static():
    """SGLang's default mem_fraction_static on an H100 (81,090 MiB) at TP1: 512 + 1.5 x 8192 + 2 x 256 (CUDA graphs
    up to batch 256) + 1/8 x 1024 = 13,440 MiB reserved, so 0.834 of the device holds weights and KV, activations
    outside it: (0.834 x 85.03e9 - 16.06e9 of weights - 1 GiB) / 2 MiB blocks = 25,644 blocks, where vLLM's 0.9,
    less its profiled activations, leaves 27,419. Under pipeline parallelism SGLang's pool-based max_running
    default is what the micro-batch engines split: 2,000 blocks hold 32,000 tokens, 1,000 slots by its formula, so
    at least its 2048, half each (not half of 4096)."""
    vllm, sglang = (World(scenario(engine={"scheduler": name}), SCENARIOS) for name in ("vllm", "sglang"))
    assert sglang.scenario.engine.gpu_memory_utilization == 0.834 and vllm.scenario.engine.gpu_memory_utilization == 0.9
    assert (sglang.pools[0].num_blocks, vllm.pools[0].num_blocks) == (25644, 27419)
    assert sglang.pools[0].memory.activation_bytes == 0
    staged = World(scenario(engine={"scheduler": "sglang", "num_gpu_blocks_override": 2000}, parallelism={"pp": 2}),
                   SCENARIOS)
    assert [r.scheduler.max_running for r in staged.replicas] == [1024, 1024]
