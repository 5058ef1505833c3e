"""Parallelism in the simulator: pipeline micro-batches as engines over one KV pool; EP and DP attention end to end."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.batch import StepBatch
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_interconnect
from servesim.hardware.memory import weight_bytes_per_gpu
from servesim.hardware.model import get_model
from servesim.policies.hybrid_blocks import usable_pages
from servesim.policies.step import StepPlan
from servesim.simulator.world.replicas import build_step_time, build_timer, memory_plan
from servesim.simulator.world.run import World
from servesim.workloads.request import Request
from tests.simulator.conftest import SCENARIOS, run, scenario


def test_a_pipelined_replica_runs_one_scheduler_with_a_step_in_flight_per_stage():
    """vLLM V1 keeps one scheduler and one KV cache manager per replica whatever its pipeline depth, with a
    batch queue of pp steps: the whole pool, the whole max_num_seqs, and more throughput than one stage."""
    s = scenario(
        parallelism={"pp": 2}, workload={"arrivals": {"kind": "trace", "rate_per_s": 40}, "num_requests": 200}
    )
    world = World(s, SCENARIOS)
    assert len(world.replicas) == 1
    pool, (replica,) = world.pools[0], world.replicas
    assert pool.num_pages == pool.num_blocks - 1  # vLLM's null block
    assert replica.scheduler.pipelined and replica.scheduler.kv.num_blocks == pool.num_pages
    assert replica.scheduler.max_num_seqs == pool.scenario.engine.max_num_seqs
    result = world.run()
    assert result.summary["completed"] == 200
    replica.scheduler.kv.check_invariants()
    assert replica.scheduler.kv.num_free_blocks == pool.num_pages  # every block came back
    single = run(scenario(workload={"arrivals": {"kind": "trace", "rate_per_s": 40}, "num_requests": 200}))
    assert result.summary["output_throughput"] > single.summary["output_throughput"]


@pytest.mark.parametrize("pp", [2, 4])
def test_a_long_prompts_chunks_pipeline_through_the_stages(pp):
    """A 16,000-token prompt in 2,048-token chunks: as vLLM counts a chunk computed when it schedules it, the
    next chunk goes into the next micro-batch at once, up to pp in flight; chunk j enters when chunk j - pp
    leaves the last stage. Its first token comes when the last chunk leaves it, as the flow-shop recursion
    over each chunk's stage times gives: D[s][j] = max(D[s-1][j], D[s][j-1]) + t[s][j] (at PP4 ~166 ms, where
    chunks waiting for each other to leave the pipeline took 456 ms)."""
    s = scenario(
        parallelism={"pp": pp},
        engine={"max_num_batched_tokens": 2048},
        workload={
            "trace": None,
            "lengths": {"prompt": {"kind": "fixed", "value": 16000}, "output": {"kind": "fixed", "value": 2}},
            "arrivals": {"kind": "all_at_once"},
            "num_requests": 1,
        },
    )
    ttft = run(s).requests["ttft_s"].item()
    timer = build_timer(s.with_engine_defaults())
    chunks = [2048] * 7 + [16000 - 7 * 2048]
    done: dict[tuple[int, int], float] = {}  # (stage, chunk) -> when it leaves the stage
    for j, n in enumerate(chunks):
        times = timer.stage_s(StepBatch.of([n], [2048 * j], [j == len(chunks) - 1]))  # the last chunk samples
        for stage, time_s in enumerate(times):
            ready = done[(stage - 1, j)] if stage else (done[(pp - 1, j - pp)] if j >= pp else 0.0)
            done[(stage, j)] = max(ready, done.get((stage, j - 1), 0.0)) + time_s
    assert ttft == pytest.approx(done[(pp - 1, len(chunks) - 1)], rel=1e-9)
    one_stage = run(scenario(engine={"max_num_batched_tokens": 2048}, workload=s.workload.model_dump()))
    assert ttft < 0.6 * one_stage.requests["ttft_s"].item()


def test_swapped_blocks_cross_pcie_on_every_stage_for_its_layers():
    """Each stage's GPUs hold their layers' share of a swapped block, so a swap's PCIe time (blocks x block bytes
    over the link, plus its latency) is spread over the stages by layers: 16 of Llama 3.1 8B's 32 layers each."""
    s = scenario(parallelism={"pp": 2}, engine={"preemption_mode": "swap"}).with_engine_defaults()
    memory, timer = memory_plan(s), build_timer(s)
    step_time, stage_times = build_step_time(s, memory, timer)
    req = Request(0, 0.0, 100, 10)
    plain = StepPlan((req,), (1,), (100,), (True,))
    swapping = dataclasses.replace(plain, swap_in_blocks=50)
    pcie = get_interconnect("pcie5")
    swap_s = 50 * memory.block_bytes / pcie.bytes_per_s + pcie.latency_s
    assert step_time(swapping) == pytest.approx(step_time(plain) + swap_s, rel=1e-12)
    assert [b - a for a, b in zip(stage_times(plain), stage_times(swapping))] == pytest.approx(
        [swap_s / 2] * 2
    )


@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_deepseek_v3_with_dp_attention_and_expert_parallel_on_8_h200(scheduler):
    """Eight ranks, each with its own scheduler, eighth of the group's budget and slots, and KV pool: every request
    runs on the one rank it was sent to (SGLang's in turn), and every rank's blocks come back."""
    s = scenario(
        model="deepseek-v3",
        hardware={"gpu": "h200"},
        parallelism={"tp": 8, "ep": True, "dp_attention": True},
        engine={"max_model_len": 16384, "weight_dtype": "fp8", "scheduler": scheduler},
        workload={"arrivals": {"kind": "trace", "rate_per_s": 10}, "num_requests": 100},
    )
    world = World(s, SCENARIOS)
    pool, (replica,) = world.pools[0], world.replicas
    group = pool.scenario.engine
    assert len(replica.scheduler.ranks) == 8
    for rank in replica.scheduler.ranks:
        assert rank.kv.num_blocks == pool.num_pages == usable_pages(group, pool.num_blocks // 8)
        assert rank.cfg.max_num_batched_tokens == group.max_num_batched_tokens // 8
    result = world.run()
    assert result.summary["completed"] == 100
    assert result.requests["dp_rank"].dtype == "Int64"
    ranks = result.requests.sort_values("arrival_s", kind="stable")["dp_rank"].tolist()
    assert set(ranks) == set(range(8))
    if scheduler == "sglang":
        assert ranks == [i % 8 for i in range(100)]
    assert all(rank.kv.num_free_blocks == rank.kv.num_blocks for rank in replica.scheduler.ranks)
    plain = run(
        s.model_copy(update={"parallelism": s.parallelism.model_copy(update={"dp_attention": False})})
    )
    assert result.memory.kv_cache_tokens > 7 * plain.memory.kv_cache_tokens * (
        result.memory.kv_cache_bytes / plain.memory.kv_cache_bytes
    )


def test_dp_attention_runs_vllms_data_parallel_layout_unless_sglang_schedules():
    """The scenario's layout follows its engine: vLLM's DP ranks keep their dense weights whole, SGLang slices them."""
    s = scenario(
        model="deepseek-v3",
        hardware={"gpu": "h200"},
        parallelism={"tp": 8, "ep": True, "dp_attention": True},
        engine={"max_model_len": 16384, "weight_dtype": "fp8"},
    )
    assert s.parallelism.spec("vllm").dense_replicated and s.parallelism.spec("vllm_decode").dense_replicated
    assert not s.parallelism.spec("sglang").dense_replicated
    single = scenario(parallelism={"tp": 1, "dp_attention": True})
    assert not single.parallelism.spec("vllm").dense_replicated  # one GPU: nothing to replicate
    v3 = get_model("deepseek-v3")
    for scheduler in ("vllm", "sglang"):
        run_by = s.model_copy(update={"engine": s.engine.model_copy(update={"scheduler": scheduler})})
        weights = memory_plan(run_by.with_engine_defaults()).weight_bytes
        assert weights == weight_bytes_per_gpu(v3, s.parallelism.spec(scheduler), "fp8")
        assert build_timer(run_by).parallelism == s.parallelism.spec(scheduler)  # and the steps are priced so


@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_a_request_that_needs_more_than_half_the_pool_still_runs_under_two_stages(scheduler):
    """300 blocks of 16 tokens: each 3,000 + 100-token request needs 194 of them, more than half the pool. Split
    per micro-batch, the pool would refuse them; shared, they run one after the other (each engine's finish
    wakes the other, whose request waited for the blocks)."""
    s = scenario(
        parallelism={"pp": 2},
        engine={"num_gpu_blocks_override": 300, "scheduler": scheduler},
        workload={
            "trace": None,
            "lengths": {
                "prompt": {"kind": "fixed", "value": 3000},
                "output": {"kind": "fixed", "value": 100},
            },
            "arrivals": {"kind": "all_at_once"},
            "num_requests": 4,
        },
    )
    result = run(s)
    assert result.summary["completed"] == 4 and result.summary["rejected"] == 0
    # one scheduler
    assert sorted(set(result.requests["replica"])) == ([0] if scheduler == "vllm" else [0, 1])
    assert result.steps["kv_blocks_used"].max() <= 300


def test_a_pipelined_prefill_pool_wakes_its_engines_when_a_transfer_frees_blocks():
    """P/D: a prefill's blocks come back when its KV has moved, not when it finishes; the pipelined prefill
    replica must hear of it, or its queue, waiting for blocks, sleeps for good."""
    s = scenario(
        engine={"max_model_len": 8192, "max_num_batched_tokens": 2048},
        disaggregation={
            "prefill": {"replicas": 1, "pp": 2, "engine": {"num_gpu_blocks_override": 250}},
            "decode": {"replicas": 1, "engine": {"num_gpu_blocks_override": 400}},
            "transfer": {"link": "ib-ndr-400"},
        },
        workload={
            "trace": None,
            "lengths": {
                "prompt": {"kind": "fixed", "value": 3000},
                "output": {"kind": "fixed", "value": 200},
            },
            "arrivals": {"kind": "all_at_once"},
            "num_requests": 12,
        },
    )
    assert run(s).summary["completed"] == 12


def test_sglang_runs_a_pipelined_replica_as_engines_splitting_max_num_seqs_where_vllm_keeps_it_whole():
    """SGLang's scheduler runs a PP2 replica as two engines, one step in flight each, splitting an odd
    max_num_seqs exactly; vLLM's one scheduler keeps it whole, and the replica's swap space, in blocks twice one
    stage's (each stage's GPUs swap their layers' share of a block)."""
    sglang = World(
        scenario(parallelism={"pp": 2}, engine={"max_num_seqs": 5, "scheduler": "sglang"}), SCENARIOS
    )
    assert [r.scheduler.max_running for r in sglang.replicas] == [3, 2]
    # fewer seats than stages: one engine a seat, never more requests running than max_num_seqs
    single = scenario(parallelism={"pp": 4}, engine={"max_num_seqs": 2, "scheduler": "sglang"})
    assert [r.scheduler.max_running for r in World(single, SCENARIOS).replicas] == [1, 1]
    assert run(single).summary["completed"] == single.workload.num_requests
    engine = {"max_num_seqs": 5, "preemption_mode": "swap"}
    whole = World(scenario(engine=engine), SCENARIOS).replicas[0].scheduler.host_blocks_free
    (vllm,) = World(scenario(parallelism={"pp": 2}, engine=engine), SCENARIOS).replicas
    assert vllm.scheduler.max_num_seqs == 5 and vllm.scheduler.host_blocks_free == 2 * whole


@pytest.mark.parametrize("router", ["least_kv", "round_robin"])
def test_a_pipelined_sglang_replica_is_one_target_whose_micro_batches_share_its_requests(router):
    """The router and the API server see a PP2 SGLang replica once, whatever the router reads: its micro-batch
    engines share one KV pool (least_kv saw them tie and sent everything to the first) and take requests from
    one queue, here each engine's by the shortest queue. Every engine of both replicas runs requests."""
    s = scenario(
        parallelism={"pp": 2},
        engine={"scheduler": "sglang"},
        cluster={"replicas": 2, "router": router},
        workload={"arrivals": {"kind": "trace", "rate_per_s": 30}, "num_requests": 300},
    )
    world = World(s, SCENARIOS)
    assert [len(group.ranks) for group in world.pools[0].targets] == [2, 2]
    result = world.run()
    assert result.summary["completed"] == 300
    per_engine = result.requests["replica"].value_counts()
    assert sorted(per_engine.index) == [0, 1, 2, 3] and per_engine.min() >= 50
    assert result.requests["dp_rank"].isna().all()  # micro-batches are not DP ranks


def test_a_pipelined_prefill_replica_sends_its_kv_over_one_link():
    """Two prompts prefill in two micro-batches of one PP2 prefill replica (the budget holds one), the second
    one stage behind the first (the stages run one micro-batch at a time). Llama 2's 512 KiB per token take longer on the wire
    than a stage's prefill, so the second transfer starts while the first is still sending: they share the
    replica's NICs, so it waits for the first to end instead of getting a link of its own."""
    s = scenario(
        model="llama-2-7b",
        engine={"max_model_len": 4096, "max_num_batched_tokens": 3000},
        disaggregation={
            "prefill": {"replicas": 1, "pp": 2},
            "decode": {"replicas": 1},
            "transfer": {"link": "ib-hdr-200"},
        },
        workload={
            "trace": None,
            "lengths": {"prompt": {"kind": "fixed", "value": 3000}, "output": {"kind": "fixed", "value": 4}},
            "arrivals": {"kind": "all_at_once"},
            "num_requests": 2,
        },
    )
    result = run(s)
    first_end, second_end = result.steps.loc[result.steps["prefill_tokens"] == 3000, "time_s"]
    first, second = result.requests.sort_values("kv_transfer_s")["kv_transfer_s"]
    # the second prefill ends while the first KV is on the wire
    assert first_end < second_end < first_end + first
    assert second == pytest.approx(first + (first_end + first - second_end), rel=1e-9)


def test_two_prefill_replicas_sending_to_one_decode_replica_share_its_nics():
    """2P1D: two prompts end their prefills together on the two prefill replicas and both go to the one decode
    replica, whose NICs take one transfer at a time: the second takes exactly twice the first (a link per
    sender gave the decode GPU twice its bandwidth)."""
    s = scenario(
        disaggregation={
            "prefill": {"replicas": 2},
            "decode": {"replicas": 1},
            "transfer": {"link": "ib-ndr-400"},
        },
        workload={
            "trace": None,
            "lengths": {"prompt": {"kind": "fixed", "value": 4000}, "output": {"kind": "fixed", "value": 4}},
            "arrivals": {"kind": "all_at_once"},
            "num_requests": 2,
        },
    )
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
    assert (
        sglang.scenario.engine.gpu_memory_utilization == 0.834
        and vllm.scenario.engine.gpu_memory_utilization == 0.9
    )
    assert (sglang.pools[0].num_blocks, vllm.pools[0].num_blocks) == (25644, 27419)
    assert sglang.pools[0].memory.activation_bytes == 0
    staged = World(
        scenario(engine={"scheduler": "sglang", "num_gpu_blocks_override": 2000}, parallelism={"pp": 2}),
        SCENARIOS,
    )
    assert [r.scheduler.max_running for r in staged.replicas] == [1024, 1024]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    pp=st.integers(2, 4),
    blocks=st.integers(120, 1500),
    budget=st.sampled_from([64, 512, 8192]),
    preemption=st.sampled_from(["recompute", "swap"]),
    caching=st.sampled_from(["vllm", "none"]),
    rate=st.floats(2, 60),
)
def test_a_pipelined_scheduler_finishes_every_request_and_gives_back_every_block(
    seed, pp, blocks, budget, preemption, caching, rate
):
    """Steps in flight through the stages, tokens counted when scheduled, prefix hits on blocks registered while
    in flight, preemptions (of requests in flight too) under a tight pool: every request ends with all its
    tokens and all blocks come back. (`test_a_tight_pipelined_pool_preempts_steps_in_flight_and_hits_its_cache`
    pins a draw where all of that happens.)"""
    s = scenario(
        seed=seed,
        parallelism={"pp": pp},
        engine={
            "num_gpu_blocks_override": blocks,
            "max_num_batched_tokens": budget,
            "max_model_len": 1800,
            "preemption_mode": preemption,
            "prefix_caching": caching,
            "max_num_seqs": 16,
        },
        workload={
            "trace": None,
            "lengths": {
                "prompt": {"kind": "lognormal", "median": 300, "sigma": 1.0},
                "output": {"kind": "lognormal", "median": 60, "sigma": 1.0},
            },
            "shared_prefix": {"num_prefixes": 3, "prefix_tokens": 128},
            "arrivals": {"kind": "poisson", "rate_per_s": rate},
            "num_requests": 40,
        },
    )
    world = World(s, SCENARIOS)
    result = world.run()
    df = result.requests
    assert (df["finish_s"].notna() ^ df["reject_reason"].notna()).all()
    done = df[df["finish_s"].notna()]
    assert (done["output_tokens"] == done["requested_output_tokens"]).all()
    (replica,) = world.replicas
    replica.scheduler.kv.check_invariants()
    assert replica.scheduler.kv.num_free_blocks == replica.scheduler.kv.num_blocks
    assert not any(r.num_in_flight_tokens for r in world.workload.requests) and not replica.scheduler._stamps
    assert result.steps["kv_blocks_used"].max() <= blocks - 1  # vLLM's null block


def test_a_tight_pipelined_pool_preempts_steps_in_flight_and_hits_its_cache():
    """One draw of the property above where it all happens: PP3 over 150 blocks preempts, both ways, requests
    whose steps are in flight, and later prompts hit the shared prefixes; nothing is lost or leaked."""
    for mode in ("recompute", "swap"):
        s = scenario(
            seed=3,
            parallelism={"pp": 3},
            engine={
                "num_gpu_blocks_override": 150,
                "max_num_batched_tokens": 512,
                "max_model_len": 1800,
                "preemption_mode": mode,
                "max_num_seqs": 16,
            },
            workload={
                "trace": None,
                "lengths": {
                    "prompt": {"kind": "lognormal", "median": 300, "sigma": 1.0},
                    "output": {"kind": "lognormal", "median": 60, "sigma": 1.0},
                },
                "shared_prefix": {"num_prefixes": 3, "prefix_tokens": 128},
                "arrivals": {"kind": "poisson", "rate_per_s": 40},
                "num_requests": 40,
            },
        )
        world = World(s, SCENARIOS)
        (replica,) = world.replicas
        scheduler, preempted_in_flight = replica.scheduler, []
        preempt = scheduler._preempt

        def spy(victim, step):
            preempted_in_flight.append(victim.num_in_flight_tokens > 0)
            preempt(victim, step)

        scheduler._preempt = spy
        result = world.run()
        assert any(preempted_in_flight), mode
        assert result.summary["prefix_cache_hit_rate"] > 0
        done = result.requests[result.requests["finish_s"].notna()]
        assert len(done) + result.summary["rejected"] == 40
        assert (done["output_tokens"] == done["requested_output_tokens"]).all()
        scheduler.kv.check_invariants()
        assert scheduler.kv.num_free_blocks == scheduler.kv.num_blocks
        assert not any(r.num_in_flight_tokens for r in world.workload.requests)


def test_dp_attention_gives_each_vllm_rank_its_own_defaults_and_a_request_one_ranks_share():
    """vLLM runs DP attention as tp engines, each with its own 8,192-token budget on an H100: the group of 4 steps
    up to 32,768 tokens, but a 20,000-token prompt lives on one rank, so it is prefilled 8,192 tokens a step."""
    s = scenario(
        model="qwen3-30b-a3b",
        parallelism={"tp": 4, "ep": True, "dp_attention": True},
        engine={"max_model_len": 32768},
        workload={
            "trace": None,
            "lengths": {"prompt": {"kind": "fixed", "value": 20000}, "output": {"kind": "fixed", "value": 4}},
            "arrivals": {"kind": "all_at_once"},
            "num_requests": 1,
        },
    )
    assert s.with_engine_defaults().engine.max_num_batched_tokens == 4 * 8192
    result = run(s)
    assert result.steps["prefill_tokens"].tolist()[:3] == [8192, 8192, 20000 - 2 * 8192]


def test_pd_pools_with_dp_attention_hand_each_request_from_its_prefill_rank_to_a_decode_rank():
    """A request is prefilled on one rank of the prefill group, its blocks there freed once its KV has moved, and
    decoded on one rank of the decode group: every request completes and every rank of both gets its blocks back."""
    s = scenario(
        model="deepseek-v3",
        hardware={"gpu": "h200"},
        parallelism={"tp": 8, "ep": True, "dp_attention": True},
        engine={"max_model_len": 16384, "weight_dtype": "fp8"},
        disaggregation={
            "prefill": {"replicas": 1, "tp": 8},
            "decode": {"replicas": 1, "tp": 8},
            "transfer": {"link": "ib-ndr-400"},
        },
        workload={"arrivals": {"kind": "trace", "rate_per_s": 10}, "num_requests": 60},
    )
    world = World(s, SCENARIOS)
    result = world.run()
    assert result.summary["completed"] == 60
    assert set(result.requests["dp_rank"]) == set(range(8))
    for replica in world.replicas:
        assert all(rank.kv.num_free_blocks == rank.kv.num_blocks for rank in replica.scheduler.ranks)


def test_under_dp_attention_the_rank_swapping_most_sets_the_pcie_time():
    """A rank's blocks sit whole on its GPU (tp times the memory plan's per-GPU average of a block) and the ranks
    swap over their own links at once: 30 blocks on one rank beside 10 on another take as long as those 30."""
    s = scenario(
        model="deepseek-v3",
        hardware={"gpu": "h200"},
        parallelism={"tp": 8, "ep": True, "dp_attention": True},
        engine={"max_model_len": 16384, "weight_dtype": "fp8", "preemption_mode": "swap"},
    ).with_engine_defaults()
    memory, timer = memory_plan(s), build_timer(s)
    step_time, _ = build_step_time(s, memory, timer)
    a, b = Request(0, 0.0, 100, 10), Request(1, 0.0, 100, 10)
    plain = StepPlan((a, b), (1, 1), (100, 100), (True, True), rank=(0, 1))
    swapping = dataclasses.replace(plain, swap_in_blocks=40, rank_swap_blocks=30)
    pcie = get_interconnect("pcie5")
    assert step_time(swapping) == pytest.approx(
        step_time(plain) + 30 * 8 * memory.block_bytes / pcie.bytes_per_s + pcie.latency_s, rel=1e-12
    )


@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_dp_attention_ranks_over_two_pipeline_stages(scheduler):
    """vLLM's ranks each keep a batch queue of pp steps; SGLang runs pp engines whose ranks share each rank's pool.
    Every request completes on its rank and every rank's blocks come back."""
    s = scenario(
        model="deepseek-v3",
        hardware={"gpu": "h200"},
        parallelism={"tp": 4, "pp": 2, "ep": True, "dp_attention": True},
        engine={"max_model_len": 16384, "weight_dtype": "fp8", "scheduler": scheduler},
        workload={"arrivals": {"kind": "trace", "rate_per_s": 10}, "num_requests": 60},
    )
    world = World(s, SCENARIOS)
    assert len(world.replicas) == (1 if scheduler == "vllm" else 2)
    assert all(len(replica.scheduler.ranks) == 4 for replica in world.replicas)
    if scheduler == "vllm":
        assert world.replicas[0].scheduler.pipelined
    result = world.run()
    assert result.summary["completed"] == 60
    ranks = result.requests.sort_values("arrival_s", kind="stable")["dp_rank"].tolist()
    assert set(ranks) == set(range(4))
    if scheduler == "sglang":  # one controller per replica: its two engines' requests take the ranks in turn
        assert ranks == [i % 4 for i in range(60)]
    for replica in world.replicas:
        assert all(rank.kv.num_free_blocks == rank.kv.num_blocks for rank in replica.scheduler.ranks)


def test_a_dense_models_vllm_dp_ranks_run_as_engines_of_their_own(tmp_path):
    """Llama-3.1-8B under vLLM at DP 2 (dp_attention at tp 2): no MoE layer keeps its ranks in step, so each is an
    engine of its own behind vLLM's DP load balancer. A 6,000-token prompt and a 100-token one arrive together:
    the first goes to rank 0, the second to rank 1 (rank 0's score is then 4 x 1 waiting). Each is served exactly
    as alone on one GPU: the short one does not wait for the long one's prefill steps, as ranks stepping together
    would make it."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,6000,30\n0.0,100,30\n")
    workload = {
        "trace": {"format": "servesim", "path": str(trace)},
        "arrivals": {"kind": "trace"},
        "num_requests": 2,
    }
    world = World(scenario(parallelism={"tp": 2, "dp_attention": True}, workload=workload), SCENARIOS)
    assert len(world.replicas) == 2 and world.replicas[0].scheduler.kv.num_blocks == usable_pages(
        world.pools[0].engine, memory_plan(scenario().with_engine_defaults()).num_blocks
    )
    dp = world.run()
    assert dp.requests["dp_rank"].tolist() == [0, 1] and dp.requests["replica"].tolist() == [0, 1]
    # the group's
    assert dp.memory.num_blocks == 2 * memory_plan(scenario().with_engine_defaults()).num_blocks
    assert dp.summary["replica_requests"] == [1, 1]  # the ranks are the engines requests finish on
    for i, (prompt, output) in enumerate(((6000, 30), (100, 30))):
        alone_trace = tmp_path / f"alone{i}.csv"
        alone_trace.write_text(f"arrival_s,prompt_tokens,output_tokens\n0.0,{prompt},{output}\n")
        alone = run(
            scenario(
                workload={
                    **workload,
                    "trace": {"format": "servesim", "path": str(alone_trace)},
                    "num_requests": 1,
                }
            )
        )
        for column in ("first_token_s", "finish_s"):
            assert dp.requests[column].iloc[i] == alone.requests[column].iloc[0]


def test_a_dense_models_dp_group_is_still_planned_and_refused_as_a_group():
    """Errors name the group's layout (each of vLLM's ranks holds the whole model: more tp cannot help), and
    schedulers that run a pipelined replica as several engines over one pool keep their ranks stepping together."""
    with pytest.raises(SpecError, match="data-parallel ranks"):
        run(scenario(model="llama-3.1-70b", parallelism={"tp": 2, "dp_attention": True}))
    static = World(
        scenario(
            parallelism={"tp": 2, "pp": 2, "dp_attention": True},
            engine={"scheduler": "static", "prefix_caching": "none"},
            workload={"num_requests": 20},
        ),
        SCENARIOS,
    )
    assert len(static.replicas) == 2 and all(len(r.scheduler.ranks) == 2 for r in static.replicas)
    assert set(static.run().requests["dp_rank"]) == {0, 1}
