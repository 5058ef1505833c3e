"""The serving loop runs the simulator's scheduler for real: correct tokens, honest times, same bookkeeping."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.reference import reference_logits
from calibration.serve import serve
from policies.config import EngineConfig
from tests.calibration.conftest import BLOCK_SIZE, tiny_executor
from workloads.request import Phase, Request


def requests(arrivals_s: list[float], prompts: list[int], outputs: list[int]) -> list[Request]:
    return [Request(id=i, arrival_s=a, num_prompt_tokens=p, num_output_tokens=o)
            for i, (a, p, o) in enumerate(zip(arrivals_s, prompts, outputs))]


def engine(**overrides) -> EngineConfig:
    base = dict(block_size=BLOCK_SIZE, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    if "prefix_caching" in EngineConfig.model_fields:
        base["prefix_caching"] = "none"
    return EngineConfig(**base | overrides)


def greedy(ex, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(reference_logits(ex, tokens)[-1].argmax()))
    return tokens[len(prompt):]


@pytest.mark.parametrize("name", ["llama", "gemma3n"])
def test_served_tokens_are_the_reference_greedy_continuations_even_after_preemption(name):
    ex = tiny_executor(name, fast_prefill=name == "gemma3n", num_blocks=14)
    reqs = requests([0.0, 0.0, 0.001, 0.002, 0.003], [13, 9, 20, 6, 11], [6, 8, 5, 7, 4])
    result = serve(ex, reqs, engine())
    assert result.requests["preemptions"].sum() > 0  # 14 blocks x 4 tokens cannot hold them all
    for req in reqs:
        assert req.phase is Phase.FINISHED and req.num_generated == req.num_output_tokens
        prompt, out = result.tokens[req.id][:req.num_prompt_tokens], result.tokens[req.id][req.num_prompt_tokens:]
        assert out == greedy(ex, prompt, req.num_output_tokens), req.id


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
    assert steps["num_tokens"].sum() == 8 + 2 + 8 + 2  # prompts plus the fed-back outputs (the last is not fed)


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
