"""The serving loop runs the simulator's scheduler for real: correct tokens, honest times, same bookkeeping."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servesim.calibration.reference import reference_logits
from servesim.calibration.serve import serve
from servesim.policies.config import EngineConfig
from tests.calibration.conftest import BLOCK_SIZE, tiny_executor
from servesim.workloads.request import Phase, Request


def requests(arrivals_s: list[float], prompts: list[int], outputs: list[int]) -> list[Request]:
    return [
        Request(id=i, arrival_s=a, num_prompt_tokens=p, num_output_tokens=o)
        for i, (a, p, o) in enumerate(zip(arrivals_s, prompts, outputs))
    ]


def engine(**overrides) -> EngineConfig:
    # the executor keeps one block table for all layers: sliding layers keep their whole KV
    base = dict(
        block_size=BLOCK_SIZE,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        max_model_len=64,
        disable_hybrid_kv_cache_manager=True,
    )
    if "prefix_caching" in EngineConfig.model_fields:
        base["prefix_caching"] = "none"
    return EngineConfig(**base | overrides)


def greedy(ex, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(reference_logits(ex, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


@pytest.mark.parametrize("name", ["llama", "gemma3n"])
def test_served_tokens_are_the_reference_greedy_continuations_even_after_preemption(name):
    ex = tiny_executor(name, fast_prefill=name == "gemma3n", num_blocks=14)
    reqs = requests([0.0, 0.0, 0.001, 0.002, 0.003], [13, 9, 20, 6, 11], [6, 8, 5, 7, 4])
    result = serve(ex, reqs, engine())
    assert result.requests["preemptions"].sum() > 0  # 14 blocks x 4 tokens cannot hold them all
    for req in reqs:
        assert req.phase is Phase.FINISHED and req.num_generated == req.num_output_tokens
        prompt, out = (
            result.tokens[req.id][: req.num_prompt_tokens],
            result.tokens[req.id][req.num_prompt_tokens :],
        )
        assert out == greedy(ex, prompt, req.num_output_tokens), req.id


@pytest.mark.parametrize("name", ["llama", "gemma3n"])
def test_samples_of_one_prompt_share_its_prefill_within_the_step(name):
    """Three samples of one prompt arrive together: the first prefills it, the others hit its blocks in the same
    forward pass (every layer writes the step's KV before it attends) and still decode the reference tokens."""
    ex = tiny_executor(name, fast_prefill=name == "gemma3n")
    prompt = ((11, 13),)
    reqs = [
        Request(id=i, arrival_s=0.0, num_prompt_tokens=13, num_output_tokens=5, prompt_segments=prompt)
        for i in range(3)
    ]
    result = serve(ex, reqs, engine(prefix_caching="vllm", max_num_batched_tokens=32))
    first = result.steps.iloc[0]
    assert json.loads(first["num_new"]) == [13, 1, 1] and json.loads(first["num_context"]) == [0, 12, 12]
    assert result.prefix_hits == {0: 0, 1: 12, 2: 12}
    for req in reqs:
        prompt_ids, out = result.tokens[req.id][:13], result.tokens[req.id][13:]
        assert out == greedy(ex, prompt_ids, req.num_output_tokens), req.id


def test_arrivals_are_honoured_in_wall_clock_time():
    ex = tiny_executor("llama")
    reqs = requests([0.0, 0.15], [8, 8], [3, 3])
    result = serve(ex, reqs, engine())
    df = result.requests.set_index("request_id")
    assert df.loc[1, "first_token_s"] >= 0.15  # r1 was not started before it arrived
    assert (df["first_token_s"] >= df["arrival_s"]).all() and (df["finish_s"] >= df["first_token_s"]).all()
    assert df.loc[0, "finish_s"] < 0.15  # r0 (3 tokens on a tiny model) is done long before r1 arrives
    steps = result.steps
    assert steps["start_s"].is_monotonic_increasing
    assert (steps["end_s"] >= steps["start_s"] + steps["execute_s"] - 1e-9).all()
    # prompts plus the fed-back outputs (the last is not fed)
    assert steps["num_tokens"].sum() == 8 + 2 + 8 + 2


def test_chunked_prefill_and_mixed_batches_happen():
    ex = tiny_executor("llama")
    reqs = requests([0.0] * 3, [30, 12, 5], [4, 4, 4])
    result = serve(ex, reqs, engine(max_num_batched_tokens=16))
    steps = result.steps
    assert steps["num_tokens"].max() <= 16
    new = steps["num_new"].map(json.loads)
    assert (new.map(lambda n: 1 in n and max(n) > 1)).any()  # a decode rode along with a prefill chunk
    assert result.summary["completed"] == 3 and result.summary["total_output_tokens"] == 12


def test_requests_that_cannot_fit_are_rejected_not_served():
    ex = tiny_executor("llama", num_blocks=4)
    reqs = requests([0.0, 0.0], [8, 30], [2, 2])
    result = serve(ex, reqs, engine())
    assert reqs[1].phase is Phase.REJECTED and "KV blocks" in reqs[1].reject_reason
    assert reqs[0].phase is Phase.FINISHED and np.isnan(result.requests.loc[1, "finish_s"])


def test_prompt_ids_follow_token_identity():
    from servesim.calibration.serve import prompt_token_ids, token_id

    a = Request(
        id=0, arrival_s=0.0, num_prompt_tokens=30, num_output_tokens=1, prompt_segments=((3, 20), (-1, 10))
    )
    b = Request(
        id=1, arrival_s=0.0, num_prompt_tokens=25, num_output_tokens=1, prompt_segments=((3, 20), (-2, 5))
    )
    ids_a, ids_b = prompt_token_ids(a, 256), prompt_token_ids(b, 256)
    assert ids_a[:20] == ids_b[:20] and ids_a[20:25] != ids_b[20:25]  # shared run equal, own parts differ
    assert ids_a == prompt_token_ids(a, 256) and all(0 <= t < 256 for t in ids_a)  # stable, in the vocab
    assert ids_a[:20] == [token_id(3, k, 256) for k in range(20)] and ids_a[20] == token_id(-1, 0, 256)
    assert prompt_token_ids(a, 256, seed=1) != ids_a
    plain = Request(id=5, arrival_s=0.0, num_prompt_tokens=8, num_output_tokens=1)  # one unique run
    assert prompt_token_ids(plain, 1 << 20) == [token_id(-6, k, 1 << 20) for k in range(8)]


@pytest.mark.parametrize("name", ["llama", "gemma3n"])
def test_prefix_hits_skip_the_cached_prefill_and_keep_the_tokens_exact(name):
    """With vLLM's prefix cache, later requests reuse the shared prefix's blocks (the executor prefills only
    the tail) and still produce the reference greedy continuation of their full prompt. Request 3 repeats
    request 0's prompt exactly: it may hit its prompt blocks, never the blocks holding request 0's outputs."""
    ex = tiny_executor(name, fast_prefill=name == "gemma3n")
    shared = (7, 13)
    reqs = [
        Request(
            id=0, arrival_s=0.0, num_prompt_tokens=18, num_output_tokens=9, prompt_segments=(shared, (-1, 5))
        ),
        Request(
            id=1, arrival_s=0.05, num_prompt_tokens=16, num_output_tokens=6, prompt_segments=(shared, (-2, 3))
        ),
        Request(
            id=2, arrival_s=0.05, num_prompt_tokens=21, num_output_tokens=5, prompt_segments=(shared, (-3, 8))
        ),
        Request(
            id=3, arrival_s=0.10, num_prompt_tokens=18, num_output_tokens=4, prompt_segments=(shared, (-1, 5))
        ),
        Request(id=4, arrival_s=0.10, num_prompt_tokens=9, num_output_tokens=4),
    ]
    result = serve(ex, reqs, engine(prefix_caching="vllm", max_model_len=64))
    hits = result.prefix_hits
    assert hits[0] == 0 and hits[4] == 0
    # the prefix's 3 full blocks of 4 (the 13th token shares a block with own text)
    assert hits[1] == hits[2] == 12
    # request 0's prompt blocks: 17 tokens (the last is always recomputed) -> 4 full blocks
    assert hits[3] == 16
    assert result.requests.set_index("request_id")["cached_tokens"].to_dict() == hits
    assert result.summary["prefix_cache_hit_rate"] == pytest.approx(40 / (18 + 16 + 21 + 18 + 9))
    assert result.steps["prefix_hit_tokens"].sum() == 40
    # cached tokens never re-run
    assert result.steps["prefill_tokens"].sum() == 18 + 16 + 21 + 18 + 9 - 40 + 0
    for req in reqs:
        prompt, out = (
            result.tokens[req.id][: req.num_prompt_tokens],
            result.tokens[req.id][req.num_prompt_tokens :],
        )
        assert out == greedy(ex, prompt, req.num_output_tokens), req.id


def test_a_hybrid_pool_is_refused_for_a_model_with_sliding_layers():
    ex = tiny_executor("gemma2")
    with pytest.raises(ValueError, match="disable_hybrid_kv_cache_manager"):
        serve(ex, requests([0.0], [8], [2]), engine(disable_hybrid_kv_cache_manager=False))


# 2 and 4 KV cache groups
@pytest.mark.parametrize(
    "name,prefix_caching,num_blocks",
    [("gemma2", "none", 24), ("gemma2", "vllm", 24), ("gemma3n", "vllm", 36)],
)
def test_a_hybrid_pool_frees_out_of_window_blocks_and_the_tokens_stay_exact(name, prefix_caching, num_blocks):
    """Sliding groups give blocks back as requests move past their window, and other requests overwrite them
    at once in a tight pool. Had one been freed while a query could still see it, the greedy tokens would
    leave the reference's; they do not."""
    from servesim.calibration.executor import Executor
    from servesim.hardware.kv_groups import kv_groups
    from tests.calibration.conftest import tiny_spec

    spec = tiny_spec(name)
    windows = kv_groups(spec).windows
    ex = Executor(
        spec,
        num_blocks,
        BLOCK_SIZE,
        "cpu",
        seed=1,
        kv_sharing_fast_prefill=name == "gemma3n",
        kv_windows=windows,
    )
    shared = (5, 12)
    reqs = [
        Request(
            id=i,
            arrival_s=0.002 * i,
            num_prompt_tokens=12 + n,
            num_output_tokens=10,
            prompt_segments=(shared, (-1 - i, n)),
        )
        for i, n in enumerate((6, 9, 3, 7, 5))
    ]
    result = serve(ex, reqs, engine(prefix_caching=prefix_caching, disable_hybrid_kv_cache_manager=False))
    assert result.requests["reject_reason"].isna().all()
    for req in reqs:
        prompt, out = (
            result.tokens[req.id][: req.num_prompt_tokens],
            result.tokens[req.id][req.num_prompt_tokens :],
        )
        assert out == greedy(ex, prompt, req.num_output_tokens), req.id
    if prefix_caching == "none":  # some step ran requests whose whole tables would not fit in the pool at all
        whole = [
            len(windows) * sum(-(-(c + n) // BLOCK_SIZE) for c, n in zip(json.loads(ctx), json.loads(new)))
            for ctx, new in zip(result.steps["num_context"], result.steps["num_new"])
        ]
        assert max(whole) > ex.num_blocks
    if prefix_caching == "vllm":
        assert result.summary["prefix_cache_hit_rate"] > 0
