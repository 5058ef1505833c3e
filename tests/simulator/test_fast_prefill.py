"""YOCO / KV-sharing fast prefill on Gemma-3n-E2B, end to end: the seed's H100 sweep over max concurrency and
input length (closed-loop clients, as `vllm bench serve --max-concurrency --random-input-len`), and the
rejection of prompt-logprobs requests while it is on.

The seed reports mean-TTFT reductions from 17% to 55%. The simulator gives 22-32% on this grid: in the
roofline model a prefill step saves at most the last 10 of 30 layers' share of its time (~31% for a long
prompt, less for a short one, whose LM head, embeddings and step overhead do not shrink), and mixing decodes
into the step only dilutes that. Reductions above a third, as the seed's upper end, need effects the cost
model does not have (see the report of issue 6).
"""

from itertools import pairwise

import numpy as np
import pytest

from servesim.simulator.world.run import World
from tests.simulator.conftest import SCENARIOS, run, scenario
from servesim.workloads.generate import Workload
from servesim.workloads.request import Request

# bench serve's default output
CONCURRENCY, INPUT_LENS, OUTPUT_LEN = (
    (1, 8, 32),
    (1024, 4096, 8192, 16384),
    128,
)


def bench(fast_prefill: bool, clients: int, input_len: int):
    return run(
        scenario(
            model="gemma-3n-e2b",
            hardware={"gpu": "h100-sxm"},
            engine={"max_model_len": 32768, "kv_sharing_fast_prefill": fast_prefill},
            workload={
                "trace": None,
                "arrivals": {"kind": "all_at_once"},
                "num_requests": max(8 * clients, 64),
                "closed_loop": {"clients": clients},
                "lengths": {
                    "prompt": {"kind": "fixed", "value": input_len},
                    "output": {"kind": "fixed", "value": OUTPUT_LEN},
                },
            },
        )
    ).summary


@pytest.fixture(scope="module")
def sweep() -> dict[tuple[int, int], tuple[float, float]]:
    """(clients, input length) -> (mean TTFT reduction, mean TPOT reduction) from turning fast prefill on."""
    out = {}
    for clients in CONCURRENCY:
        for input_len in INPUT_LENS:
            off, on = bench(False, clients, input_len), bench(True, clients, input_len)
            assert off["completed"] == on["completed"] == max(8 * clients, 64)
            out[clients, input_len] = (
                1 - on["mean_ttft_ms"] / off["mean_ttft_ms"],
                1 - on["mean_tpot_ms"] / off["mean_tpot_ms"],
            )
    return out


def test_ttft_falls_everywhere_within_the_seeds_band(sweep):
    ttft = np.array([v[0] for v in sweep.values()])
    assert ((0.17 <= ttft) & (ttft <= 0.55)).all(), sweep
    assert ttft.max() > 0.30  # long prefills save close to the 10/30 layers that skip them


def test_ttft_falls_more_for_longer_prompts(sweep):
    single = [sweep[1, n][0] for n in INPUT_LENS]  # one client: the prompt is the whole prefill step
    assert all(a < b for a, b in pairwise(single)), single
    assert min(v[0] for v in sweep.values()) == single[0]  # a short lone prompt saves the least
    for clients in CONCURRENCY:
        assert sweep[clients, INPUT_LENS[-1]][0] > sweep[clients, INPUT_LENS[0]][0] - 0.02


def test_tpot_falls_under_mixed_batching(sweep):
    for n in INPUT_LENS:  # one client never mixes a prefill into its decodes: nothing to gain
        assert sweep[1, n][1] == pytest.approx(0.0, abs=1e-9)
    for clients in CONCURRENCY[1:]:
        tpot = [sweep[clients, n][1] for n in INPUT_LENS]
        assert all(t > 0 for t in tpot[1:]) and tpot[-1] > 0.15, tpot
        assert all(a < b for a, b in pairwise(tpot)), tpot  # longer prefills in the batch: more saved


def test_prompt_logprobs_requests_are_rejected_while_fast_prefill_is_on():
    def world(fast: bool) -> World:
        requests = [Request(i, 0.01 * i, 512, 16, prompt_logprobs=i % 2 == 1) for i in range(6)]
        s = scenario(
            model="gemma-3n-e2b",
            hardware={"gpu": "h100-sxm"},
            engine={"max_model_len": 8192, "kv_sharing_fast_prefill": fast},
        )
        return World(s, SCENARIOS, workload=Workload(requests))

    on, off = world(True).run().requests, world(False).run().requests
    rejected = on[on["reject_reason"].notna()]
    assert rejected["request_id"].tolist() == [1, 3, 5]
    assert (
        rejected["reject_reason"] == "prompt_logprobs is not supported with kv_sharing_fast_prefill"
    ).all()
    assert rejected["finish_s"].isna().all() and (rejected["output_tokens"] == 0).all()
    assert on.loc[on["reject_reason"].isna(), "output_tokens"].tolist() == [16, 16, 16]
    assert off["reject_reason"].isna().all() and (off["output_tokens"] == 16).all()
