"""The seed's batching claims end to end: offline runs fill max_num_seqs or the KV cache, prefill is
compute-bound and long prompts take seconds, and the token budget trades TTFT against decode stalls."""

import pytest

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import step_cost
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.simulator.world.run import World
from tests.simulator.conftest import SCENARIOS, run, scenario
from servesim.workloads.generate import Workload
from servesim.workloads.request import Request

H200, LLAMA_8B = get_gpu("h200"), get_model("llama-3.1-8b")


def offline(prompt: int, output: int, num_requests: int, **engine):
    return scenario(
        hardware={"gpu": "h200"},
        engine={"max_model_len": 8192, **engine},
        workload={
            "trace": None,
            "arrivals": {"kind": "all_at_once"},
            "num_requests": num_requests,
            "lengths": {
                "prompt": {"kind": "fixed", "value": prompt},
                "output": {"kind": "fixed", "value": output},
            },
        },
    )


def test_prefill_is_compute_bound_and_a_100k_prompt_takes_seconds():
    assert step_cost(StepBatch.uniform(1, 0, 4096), LLAMA_8B, H200).bound == "compute"
    assert 1.0 < step_cost(StepBatch.uniform(1, 0, 100_000), LLAMA_8B, H200).total_s < 15.0


@pytest.mark.parametrize("max_num_seqs", [256, None])
def test_an_offline_run_keeps_max_num_seqs_running_until_the_queue_drains(max_num_seqs):
    """'pass 10,000 prompts and roughly 256 run at once' (short ones: the slots, not the KV, limit). The seed's
    256 is vLLM's default on smaller GPUs; on an H200 (>= 70 GiB) vLLM defaults to 1024 slots."""
    slots = max_num_seqs or 1024
    result = run(offline(200, 100, 6 * slots, max_num_seqs=max_num_seqs))
    assert result.scenario.engine.max_num_seqs == slots
    running = result.steps["num_running"]
    assert running.max() == slots
    # most steps run a full batch; only the drain at the end is smaller
    assert (running == slots).mean() > 0.5


def test_long_sequences_are_limited_by_the_kv_cache_not_the_slots():
    """4K-token sequences on one H200: the memory plan's ~200 concurrent requests, whatever max_num_seqs says."""
    result = run(offline(3584, 512, 400, max_num_batched_tokens=8192))
    fits = result.memory.kv_cache_tokens / 4096
    assert 150 < fits < 256
    assert result.steps["num_running"].max() == pytest.approx(fits, rel=0.15)


def with_a_long_prompt(**engine):
    """50 chat requests decoding on one H200; 1 s later an 8000-token prompt arrives among them."""
    s = scenario(
        hardware={"gpu": "h200"}, engine={"max_model_len": 8192, "max_num_batched_tokens": 8192, **engine}
    )
    requests = [Request(i, 0.0, 200, 400) for i in range(50)] + [Request(50, 1.0, 8000, 10)]
    return World(s, SCENARIOS, workload=Workload(requests)).run()


def test_without_chunking_a_long_prompt_stalls_every_decoder_for_its_whole_prefill():
    """The seed: an 8,000-token prompt prefilled whole makes the 50 decoders wait for it (one long gap each);
    chunked, the prompt rides along in budget-sized pieces and no decode step grows much."""
    whole = with_a_long_prompt(enable_chunked_prefill=False)
    chunked = with_a_long_prompt(max_num_batched_tokens=512)
    stall = step_cost(StepBatch.of([1] * 50 + [8000], [300] * 50 + [0]), LLAMA_8B, H200).total_s
    assert whole.steps["duration_s"].max() == pytest.approx(stall, rel=0.05)
    assert chunked.steps["duration_s"].max() < whole.steps["duration_s"].max() / 5
    assert chunked.summary["completed"] == whole.summary["completed"] == 51


def test_a_small_token_budget_trades_ttft_for_smoother_decoding():
    """Chunked prefill with a small budget interleaves prompt chunks with decodes (low ITL, later first
    tokens); a large budget prefills whole prompts at once (earlier first tokens, longer decode stalls)."""
    trace = {
        "trace": {"format": "azure", "path": "traces/azure_conv_1h_first2000.csv"},
        "arrivals": {"kind": "trace", "rate_per_s": 12},
        "num_requests": 600,
    }
    small = run(
        scenario(hardware={"gpu": "h100-sxm"}, engine={"max_num_batched_tokens": 512}, workload=trace)
    )
    large = run(
        scenario(hardware={"gpu": "h100-sxm"}, engine={"max_num_batched_tokens": 16384}, workload=trace)
    )
    assert small.summary["mean_ttft_ms"] > large.summary["mean_ttft_ms"]
    assert small.summary["p99_itl_ms"] < large.summary["p99_itl_ms"]
