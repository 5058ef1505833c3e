"""Parallelism in the simulator: pipeline micro-batches as virtual engines; EP and DP attention end to end."""

from simulator.run import World
from tests.simulator.conftest import SCENARIOS, run, scenario


def test_pipeline_stages_run_as_many_micro_batches_over_a_split_kv_pool():
    s = scenario(parallelism={"pp": 2}, workload={"arrivals": {"kind": "trace", "rate_per_s": 40}, "num_requests": 200})
    world = World(s, SCENARIOS)
    assert len(world.replicas) == 2
    pool = world.pools[0]
    assert pool.num_pages == pool.num_blocks * s.engine.block_size // pool.page_size // 2
    assert all(r.scheduler.kv.num_blocks == pool.num_pages for r in world.replicas)
    result = world.run()
    assert result.summary["completed"] == 200 and sorted(set(result.requests["replica"])) == [0, 1]
    single = run(scenario(workload={"arrivals": {"kind": "trace", "rate_per_s": 40}, "num_requests": 200}))
    # two micro-batches in flight, each step a full pass through both stages: more throughput when loaded
    assert result.summary["output_throughput"] > single.summary["output_throughput"]


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
