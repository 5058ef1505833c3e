"""KV cache groups (vLLM's hybrid KV cache manager) and the memory plan over them."""

import json
from pathlib import Path

import pytest

from servesim.hardware.gpu import get_gpu
from servesim.hardware.kv_groups import KVGroups, group_of_layers, kv_groups, live_kv_bytes, skipped_blocks
from servesim.hardware.memory import EngineMemoryConfig, plan_memory
from servesim.hardware.model import get_model, model_from_config

CONFIGS = Path(__file__).resolve().parents[2] / "hardware" / "model_configs"


def with_layer_types(full: int, sliding: int, window: int = 1024):
    """Llama-3.1-8B's shapes with `full` full-attention and `sliding` sliding-window layers (HF layer_types)."""
    raw = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    types = ["full_attention"] * full + ["sliding_attention"] * sliding
    return model_from_config(
        raw | {"num_hidden_layers": full + sliding, "layer_types": types, "sliding_window": window}, "mixed"
    )


def test_groups_of_the_catalog_models():
    assert kv_groups(get_model("llama-3.1-8b")) == KVGroups((None,), 32)
    # all sliding: one group, freeing early
    assert kv_groups(get_model("mistral-7b")) == KVGroups((4096,), 32)
    assert kv_groups(get_model("gemma-2-9b")) == KVGroups((None, 4096), 21)  # 21 + 21 alternating
    # 4 full + 16 sliding
    assert kv_groups(get_model("gemma-3n-e2b")) == KVGroups((None, 512, 512, 512, 512), 4)
    assert kv_groups(get_model("gemma-2-9b"), disable_hybrid=True) == KVGroups((None,), 42)


def test_group_size_is_the_smallest_kind_unless_the_largest_is_within_1_5x():
    assert kv_groups(with_layer_types(10, 52)) == KVGroups((None,) + (1024,) * 6, 10)  # Gemma 3 27B: 8 padded
    assert kv_groups(with_layer_types(10, 14)) == KVGroups((None, 1024), 14)  # 14 < 15: one padded full group


def test_sliding_groups_free_the_blocks_no_query_can_see():
    # tokens 0-12 are out of sight: blocks 0-2
    assert skipped_blocks(computed=20, window=8, block_size=4) == 3
    assert skipped_blocks(7, 8, 4) == 0
    groups = KVGroups((None, 8), 21)
    assert groups.blocks_held(computed=20, total=21, block_size=4) == 6 + (6 - 3)
    # window + chunk, +1
    assert groups.peak_blocks(total=100, block_size=4, max_chunk=4) == 25 + (-(-11 // 4) + 1)


def test_the_most_blocks_a_request_can_need_is_maximised_over_where_its_chunks_start():
    groups = KVGroups((None, 8), 1)
    # 27 tokens, chunks of up to 16: a chunk from token 9 reaches 25 (7 blocks) before anything slid out
    assert groups.most_blocks(total=27, block_size=4, max_chunk=16) == 7 + 7
    # one token at a time: at most 3 blocks are live in the sliding group (e.g. tokens 4-10 at c = 10)
    assert groups.most_blocks(total=27, block_size=4, max_chunk=1) == 7 + 3
    assert KVGroups((None,), 1).most_blocks(27, 4, 16) == 7
    assert groups.most_blocks(27, 4, 16) <= groups.peak_blocks(27, 4, 16)  # vLLM's start-up bound is looser


def test_gemma_2_pool_has_twice_the_blocks_of_half_the_layers():
    """A block spans one group (21 layers), so the pool has twice the blocks; at full length a request holds
    blocks in both groups, the sliding one only its window plus a chunk."""
    gemma, gpu = get_model("gemma-2-9b"), get_gpu("h100-sxm")
    cfg = EngineMemoryConfig(max_num_batched_tokens=2048)
    hybrid = plan_memory(gemma, gpu, cfg=cfg)
    whole = plan_memory(
        gemma, gpu, cfg=EngineMemoryConfig(max_num_batched_tokens=2048, disable_hybrid_kv_cache_manager=True)
    )
    assert hybrid.kv_windows == (None, 4096) and whole.kv_windows == (None,)
    assert hybrid.block_bytes == pytest.approx(whole.block_bytes / 2)
    assert hybrid.num_blocks in (2 * whole.num_blocks, 2 * whole.num_blocks + 1)
    assert hybrid.kv_cache_tokens == pytest.approx(whole.kv_cache_tokens, abs=16)
    full, sliding = 8192 // 16, -(-(4095 + 2048) // 16) + 1  # max_model_len 8192
    assert hybrid.request_bytes_at_max_len == pytest.approx((full + sliding) * hybrid.block_bytes)
    assert hybrid.max_concurrency == pytest.approx(hybrid.num_blocks / (full + sliding))
    assert whole.max_concurrency == pytest.approx(whole.num_blocks / full)
    assert hybrid.max_concurrency / whole.max_concurrency == pytest.approx(
        2 * full / (full + sliding), rel=1e-3
    )


def test_layers_go_round_robin_over_the_groups_of_their_kind():
    gemma = get_model("gemma-2-9b")  # sliding on even layers, full on odd ones
    assert group_of_layers(gemma, kv_groups(gemma)) == {i: 1 if i % 2 == 0 else 0 for i in range(42)}
    mixed = with_layer_types(10, 52)  # layers 0-9 full, 10-61 sliding over groups 1-6
    of = group_of_layers(mixed, kv_groups(mixed))
    assert {of[i] for i in range(10)} == {0}
    assert [of[i] for i in range(10, 17)] == [1, 2, 3, 4, 5, 6, 1]
    assert sorted(list(of.values()).count(g) for g in range(1, 7)) == [8, 8, 9, 9, 9, 9]  # 52 over 6 groups


def test_live_kv_is_every_token_of_full_layers_and_the_window_of_sliding_ones():
    gpt_oss, per_layer = get_model("gpt-oss-120b"), 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, bf16
    hybrid, whole = kv_groups(gpt_oss), kv_groups(gpt_oss, disable_hybrid=True)
    # 10,000 tokens done: the 18 sliding layers' first (10000 - 127) // 16 = 617 blocks fell out of the window
    assert live_kv_bytes(gpt_oss, hybrid, 10_000, 16, "bf16") == per_layer * 18 * (10_000 + 10_000 - 617 * 16)
    assert live_kv_bytes(gpt_oss, whole, 10_000, 16, "bf16") == per_layer * 36 * 10_000
    assert live_kv_bytes(gpt_oss, hybrid, 100, 16, "bf16") == per_layer * 36 * 100  # nothing out of reach yet
    llama = get_model("llama-3.1-8b")
    assert live_kv_bytes(llama, kv_groups(llama), 4096, 16, "fp8") == 4096 * llama.kv_bytes_per_token("fp8")


def test_disabling_the_hybrid_manager_unifies_only_mixed_kinds():
    """vLLM's --disable-hybrid-kv-cache-manager turns sliding layers full only to unify them with full ones; a model
    whose every layer slides the same window keeps it (unify_hybrid_kv_cache_specs has nothing to unify)."""
    mistral = get_model("mistral-7b")
    assert kv_groups(mistral, disable_hybrid=True) == kv_groups(mistral) == KVGroups((4096,), 32)
    assert kv_groups(get_model("gemma-2-9b"), disable_hybrid=True) == KVGroups((None,), 42)


def test_a_pipeline_stage_stores_kv_for_its_kv_owning_layers_only():
    """Gemma 3n E2B: 30 layers, the first 20 own KV, 2,048 bytes per token each in bf16. At pp=2 the first stage
    (layers 0-14) owns 15 of them, the second 5: a GPU of the first stores 30,720 bytes per token."""
    from servesim.hardware.cost import Parallelism
    from servesim.hardware.memory import kv_bytes_per_replica_token

    model = get_model("gemma-3n-e2b")
    assert model.kv_bytes_per_token("bf16", 1) == 20 * 2048
    assert kv_bytes_per_replica_token(model, "bf16", Parallelism(pp=2)) == 15 * 2048
