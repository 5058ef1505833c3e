"""CUDA-graph padding: the capture sizes each engine family takes from its defaults (counted by hand from vLLM's
and SGLang's size lists), and what a padded step costs: its GEMMs, norms and collectives those of the padded size,
its attention and LM head those of its own requests."""

from types import SimpleNamespace

import numpy as np
import pytest

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import CostOptions, Parallelism, step_cost
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.policies.families import SGLANG, TRTLLM, VLLM

H100, B200 = get_gpu("h100-sxm"), get_gpu("b200")


def limits(
    max_num_seqs=1024, max_num_batched_tokens=8192, cuda_graph_max_size=None, cuda_graph_sizes=None, mode=None
):
    return SimpleNamespace(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        cuda_graph_max_size=cuda_graph_max_size,
        cuda_graph_sizes=cuda_graph_sizes,
        cuda_graph_mode=mode,
    )


#: the batch_sizes of NVIDIA's TensorRT-LLM perf-overview runs (llm_options.yml, enable_padding: true)
PERF_OVERVIEW_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192]


def test_vllm_captures_every_step_up_to_twice_its_slots_or_512_tokens():
    sizes = VLLM.graph_options(H100, limits(), 1, False, 1)["graph_sizes"]
    # 1, 2, 4; 8..248 by 8 (31); 256..512 by 16 (17)
    assert sizes == (1, 2, 4, *range(8, 249, 8), *range(256, 513, 16)) and len(sizes) == 51
    assert VLLM.graph_options(H100, limits(), 1, False, 1)["graph_prefills"]
    # Vidur's engine: 128 slots (largest 256), a 512-token budget
    assert VLLM.graph_options(H100, limits(128, 512), 2, False, 1)["graph_sizes"][-3:] == (240, 248, 256)
    # the budget caps it, and is captured itself
    assert VLLM.graph_options(H100, limits(1024, 100), 1, False, 1)["graph_sizes"][-2:] == (96, 100)
    # data-center Blackwell: up to 1024
    assert VLLM.graph_options(B200, limits(), 1, False, 1)["graph_sizes"][-2:] == (1008, 1024)
    assert VLLM.graph_options(H100, limits(cuda_graph_max_size=64), 1, False, 1)["graph_sizes"][-1] == 64
    assert VLLM.graph_options(H100, limits(cuda_graph_max_size=0), 1, False, 1)["graph_sizes"] == ()
    # verifying 4 drafts, 5 tokens a request: multiples of 5 (1, 2, 4 -> 5; 8 -> 10; 496 -> 500; 512 -> 515: out)
    spec = VLLM.graph_options(H100, limits(), 1, False, 5)["graph_sizes"]
    assert spec[:4] == (5, 10, 20, 25) and spec[-1] == 500 and all(size % 5 == 0 for size in spec)
    # the largest counts the verify tokens: one slot verifying 3 drafts, min(2 x 1 x 4, 512) = 8
    assert VLLM.graph_options(H100, limits(max_num_seqs=1), 1, False, 4)["graph_sizes"] == (4, 8)


def test_sglang_captures_decode_batches_up_to_its_memory_tiers_max_bs():
    options = SGLANG.graph_options(H100, limits(4096), 1, False, 1)
    # 80 GB: cuda_graph_max_bs 256 below TP 4; 1, 2, 4, 8, 12, then 16..256 by 8 (31)
    assert options["graph_sizes"] == (1, 2, 4, 8, 12, *range(16, 257, 8))
    assert (
        not options["graph_prefills"] and not options["graph_masks_experts"] and options["graph_pads_logits"]
    )
    # TP 4: 512, so 272..496 by 16 (15) and 512
    assert SGLANG.graph_options(H100, limits(4096), 4, False, 1)["graph_sizes"][-3:] == (480, 496, 512)
    # max_running_requests below it is captured itself
    assert SGLANG.graph_options(H100, limits(100), 1, False, 1)["graph_sizes"][-3:] == (88, 96, 100)
    # under expert parallel padding rows are routed nowhere
    assert SGLANG.graph_options(B200, limits(4096), 1, True, 1)["graph_masks_experts"]


def test_trtllm_pads_only_when_padding_is_on():
    def sizes(*args, **kwargs):
        return TRTLLM.graph_options(H100, limits(*args, **kwargs), 1, False, 1).get("graph_sizes")

    assert TRTLLM.graph_options(H100, limits(), 1, False, 1) == {}  # enable_padding is off by default
    assert sizes(cuda_graph_max_size=0) is None
    # max_batch_size 3000: 1, 2, 4, 8s to 128 (16), powers of two below 2^ceil(log2 3000) = 4096, then 3000
    assert sizes(4096, cuda_graph_max_size=3000) == (1, 2, 4, *range(8, 129, 8), 256, 512, 1024, 2048, 3000)
    assert sizes(4096, cuda_graph_max_size=2048)[-3:] == (512, 1024, 2048)
    options = TRTLLM.graph_options(H100, limits(cuda_graph_max_size=64), 1, False, 1)
    assert not options["graph_prefills"] and options["graph_pads_logits"]
    assert not options.get("graph_masks_experts")
    # the perf-overview list under a 600-request batch limit: the first size past it gives way to 600
    assert sizes(600, cuda_graph_sizes=PERF_OVERVIEW_SIZES) == (*PERF_OVERVIEW_SIZES[:11], 600)
    # ... and a token budget below the slots bounds a pure decode batch too
    assert sizes(600, 300, cuda_graph_sizes=PERF_OVERVIEW_SIZES)[-2:] == (256, 300)
    # a list within the limits is taken as it is
    assert sizes(cuda_graph_sizes=[8, 1, 64]) == (1, 8, 64)


def test_listed_sizes_replace_vllm_and_sglangs_default_lists():
    listed = limits(256, 2048, cuda_graph_sizes=[1, 4, 16, 64, 512, 4096])
    # vLLM drops the sizes past the token budget; SGLang's past its slots give way to them
    assert VLLM.graph_options(H100, listed, 1, False, 1)["graph_sizes"] == (1, 4, 16, 64, 512)
    assert SGLANG.graph_options(H100, listed, 1, False, 1)["graph_sizes"] == (1, 4, 16, 64, 256)
    # verifying 2 drafts: multiples of 3 up to the largest size listed within the budget (513 > 512 drops); one verify
    # batch when rounding leaves nothing (adjust_cudagraph_sizes_for_spec_decode)
    assert VLLM.graph_options(H100, listed, 1, False, 3)["graph_sizes"] == (3, 6, 18, 66)
    assert VLLM.graph_options(H100, limits(256, 2048, cuda_graph_sizes=[8, 16]), 1, False, 3)[
        "graph_sizes"
    ] == (9,)
    assert VLLM.graph_options(H100, limits(256, 2048, cuda_graph_sizes=[1]), 1, False, 3)["graph_sizes"] == (
        3,
    )
    assert (
        VLLM.graph_options(H100, limits(256, 4, cuda_graph_sizes=[8, 16]), 1, False, 1)["graph_sizes"] == ()
    )


def test_vllms_full_decode_only_mode_runs_prefilling_steps_eagerly():
    options = VLLM.graph_options(H100, limits(mode="full_decode_only"), 1, False, 1)
    assert not options["graph_prefills"] and options["graph_sizes"][-1] == 512
    mixed = StepBatch.of([1] * 20 + [280], [900] * 20 + [0])  # 300 tokens, one of them prefilling
    assert CostOptions(**options).graph_tokens(mixed) == 300
    assert CostOptions(**options).graph_tokens(StepBatch.uniform(9, 1000)) == 16


def test_the_two_graph_fields_are_not_set_together():
    from servesim.policies.config import EngineConfig

    with pytest.raises(ValueError, match="cuda_graph_mode is vLLM's"):
        EngineConfig(scheduler="sglang", cuda_graph_mode="full_decode_only")

    with pytest.raises(ValueError, match="cuda_graph_sizes and cuda_graph_max_size both set"):
        EngineConfig(cuda_graph_sizes=[1, 2], cuda_graph_max_size=2)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        EngineConfig(cuda_graph_sizes=[0, 2])


def test_a_step_pads_up_to_the_next_size_it_fits():
    vllm = CostOptions(**VLLM.graph_options(H100, limits(), 1, False, 1))
    sglang = CostOptions(**SGLANG.graph_options(H100, limits(4096), 1, False, 1))
    decode = StepBatch.uniform(9, 1000)
    mixed = StepBatch.of([1] * 20 + [280], [900] * 20 + [0])  # 300 tokens
    assert vllm.graph_tokens(decode) == 16 and sglang.graph_tokens(decode) == 12
    assert vllm.graph_tokens(mixed) == 304 and sglang.graph_tokens(mixed) == 300  # SGLang extends eagerly
    assert vllm.graph_tokens(StepBatch.uniform(513, 10)) == 513  # past the largest graph: eager
    assert CostOptions().graph_tokens(decode) == 9
    with pytest.raises(SpecError, match="graph_sizes"):
        CostOptions(graph_sizes=(8, 4))


@pytest.mark.parametrize("name, tp", [("llama-3.1-8b", 1), ("llama-3.1-70b", 4), ("qwen3-30b-a3b", 2)])
@pytest.mark.parametrize("masks_experts, pads_logits", [(False, False), (True, True)])
def test_padding_rows_cost_what_real_ones_do_except_attention(name, tp, masks_experts, pads_logits):
    """A 9-request decode padded to 16 prices each GEMM, norm and collective as 16 requests do, its attention as
    its own 9, its LM head and logits gather as 9 unless the graph computes the padding's logits (SGLang), and its
    routed experts as 9 when the padding is masked."""
    model, par = get_model(name), Parallelism(tp=tp)
    options = CostOptions(
        graph_sizes=(1, 2, 4, 8, 16, 24), graph_masks_experts=masks_experts, graph_pads_logits=pads_logits
    )
    contexts = np.arange(9) * 300 + 100
    padded = step_cost(StepBatch.of([1] * 9, contexts), model, H100, par, options=options)
    own = step_cost(StepBatch.of([1] * 9, contexts), model, H100, par)
    sixteen = step_cost(StepBatch.of([1] * 16, np.resize(contexts, 16)), model, H100, par)
    own_rows = {"attention_decode", "overhead", *(["moe"] if masks_experts else [])}
    own_rows |= set() if pads_logits else {"lm_head", "logits_gather"}
    assert {op.name for op in padded.operators} == {op.name for op in own.operators}
    for op in padded.operators:
        like = own if op.name in own_rows else sixteen
        assert op.time_s == like.by_name(op.name).time_s, op.name
    assert padded.total_s > own.total_s


def test_no_padding_under_dp_attention():
    """DP-attention ranks pad to one another's batches, which is not modelled: their steps price as eager ones."""
    model, par = get_model("deepseek-v2"), Parallelism(tp=2, dp_attention=True, ep=True)
    batch = StepBatch.uniform(9, 2000)
    options = CostOptions(graph_sizes=(8, 16, 24))
    assert (
        step_cost(batch, model, H100, par, options=options).total_s
        == step_cost(batch, model, H100, par).total_s
    )


def test_vllms_data_parallel_ranks_size_their_graphs_by_their_own_limits():
    """Llama-3.1-8B on 4 GPUs as vLLM's DP ranks, 128 slots and 1,024 tokens for the group: each rank is an engine
    of 32 slots and 256 tokens, capturing graphs up to min(2 x 32, 512) = 64 tokens."""
    from servesim.simulator.world.run import World
    from tests.simulator.conftest import SCENARIOS, scenario

    s = scenario(
        parallelism={"tp": 4, "dp_attention": True},
        engine={"max_model_len": 4096, "max_num_seqs": 128, "max_num_batched_tokens": 1024},
    )
    (pool,) = World(s, SCENARIOS).pools
    assert pool.engine.max_num_seqs == 32 and pool.timer.options.graph_sizes[-1] == 64


def test_a_largest_graph_past_the_slots_gives_way_to_them():
    """SGLang captures max_running_requests itself when its largest graph would exceed it, however large that is
    set (the list is never built past the slots)."""
    assert SGLANG.graph_options(H100, limits(1000, cuda_graph_max_size=10**7), 1, False, 1)["graph_sizes"][
        -3:
    ] == (
        960,
        992,
        1000,
    )


def test_a_fast_prefill_groups_rows_are_padded_only_within_a_graphed_step():
    """Gemma 3n's KV-sharing layers see one row a request in a prefill step (YOCO): five 120-token prompts are
    600 tokens, past vLLM's largest graph, so the step runs eagerly and those 5 rows are not padded to 8; 5 x 60
    tokens fit a graph, whose reduced layers take 5 rows padded to 8."""
    model = get_model("gemma-3n-e2b")
    vllm = CostOptions(kv_sharing_fast_prefill=True, **VLLM.graph_options(H100, limits(), 1, False, 1))
    eager = CostOptions(kv_sharing_fast_prefill=True)
    long = StepBatch.of([120] * 5, [0] * 5)
    assert (
        step_cost(long, model, H100, options=vllm).total_s
        == step_cost(long, model, H100, options=eager).total_s
    )
    short = StepBatch.of([60] * 5, [0] * 5)
    assert (
        step_cost(short, model, H100, options=vllm).total_s
        > step_cost(short, model, H100, options=eager).total_s
    )
