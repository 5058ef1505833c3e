"""Prefill/decode disaggregation: transfer arithmetic, hand-off bookkeeping, backpressure, DistServe's result."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.gpu import get_interconnect
from servesim.hardware.model import get_model
from servesim.simulator.world.disagg import KVPlacement, streamed_transfer_s
from servesim.simulator.disagg_config import TransferConfig
from servesim.simulator.planning.capacity import judge
from servesim.simulator.scenario import ParallelismConfig, with_overrides
from servesim.policies.registry import routers as router_registry
from tests.simulator.conftest import SCENARIOS as SCENARIOS_DIR, run, scenario

ROUTERS = router_registry.names()
PREFILL_HEAVY = {
    "trace": None,
    "lengths": {
        "prompt": {"kind": "uniform", "low": 2000, "high": 6000},
        "output": {"kind": "uniform", "low": 50, "high": 250},
    },
    "arrivals": {"kind": "poisson", "rate_per_s": 2},
    "num_requests": 300,
}


def test_kv_of_a_4k_prompt_over_400g_takes_10_7_ms_and_one_layer_when_streamed():
    nbytes = 4096 * get_model("llama-3.1-8b").kv_bytes_per_token("bf16")
    assert nbytes == 0.5 * (1 << 30)
    wire_s = nbytes / get_interconnect("ib-ndr-400").bytes_per_s
    assert wire_s == pytest.approx(10.7e-3, rel=0.01)
    # prefill slower than the link (e.g. 40 ms): only the last layer's share is left after it ends
    assert streamed_transfer_s(wire_s, 40e-3, 32) == pytest.approx(wire_s / 32)
    # link slower than the prefill (2 ms): most of the transfer remains
    assert streamed_transfer_s(wire_s, 2e-3, 32) == pytest.approx(wire_s - 2e-3 * 31 / 32)


def disaggregated(rate=2.0, decode_engine=None, streaming=False, **prefill):
    return scenario(
        model="llama-3.1-8b",
        hardware={"gpu": "h100-sxm"},
        engine={"max_model_len": 16384, "max_num_batched_tokens": 4096},
        disaggregation={
            "prefill": {"replicas": 1, **prefill},
            "decode": {"replicas": 1, "engine": decode_engine or {}},
            "transfer": {"link": "ib-ndr-400", "streaming": streaming},
        },
        workload={**PREFILL_HEAVY, "arrivals": {"kind": "poisson", "rate_per_s": rate}},
    )


def test_handoff_moves_every_request_once_and_ttft_includes_the_transfer():
    result = run(disaggregated(streaming=True))
    df = result.requests
    assert result.summary["completed"] == 300
    assert (df["output_tokens"] == df["requested_output_tokens"]).all()
    assert (df["prefill_replica"] == 0).all() and (df["replica"] == 1).all()
    # the decode pool's one replica: balanced, not [0, 300]
    assert result.summary["replica_requests"] == [300]
    assert result.summary["load_imbalance"] == 1.0
    per_token = get_model("llama-3.1-8b").kv_bytes_per_token("bf16")
    assert (df["kv_transfer_bytes"] == df["prompt_tokens"] * per_token).all()
    assert (df["kv_transfer_s"] > 0).all()
    assert result.summary["kv_transfers"] == 300 and result.summary["mean_kv_transfer_ms"] > 0
    # the default: vLLM's NixlConnector pulls the KV once the prefill is done
    unstreamed = run(disaggregated())
    assert unstreamed.summary["mean_ttft_ms"] > result.summary["mean_ttft_ms"]
    assert unstreamed.summary["mean_kv_transfer_ms"] > 5 * result.summary["mean_kv_transfer_ms"]


def test_each_pools_kv_usage_comes_from_its_own_steps():
    """The run's KV usage is the decode pool's (its memory plan is the run's), the prefill pool's is beside it:
    each the step-time weighted mean and the peak of that pool's steps, not of both pools' together."""
    result = run(disaggregated(rate=3.0))
    steps, summary = result.steps, result.summary
    for key, replica in (("", 1), ("prefill_", 0)):
        own = steps[steps["replica"] == replica]
        weighted = (own["kv_usage"] * own["duration_s"]).sum() / own["duration_s"].sum()
        assert summary[f"{key}kv_cache_usage_mean"] == pytest.approx(weighted, rel=1e-12)
        assert summary[f"{key}kv_cache_usage_max"] == own["kv_usage"].max()
    assert summary["kv_cache_usage_mean"] != pytest.approx(summary["prefill_kv_cache_usage_mean"], rel=0.05)


def _one_by_one(tmp_path, rows: str, prefill=None, decode=None, profile="default", **transfer):
    """Requests from a servesim trace (`rows` after its header) on 1P1D Llama-3.1-8B (`prefill`, `decode`: the
    pools' engine settings)."""
    from servesim.simulator.world.run import simulate

    (tmp_path / "trace.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n" + rows
    )
    return simulate(
        scenario(
            model="llama-3.1-8b",
            hardware={"gpu": "h100-sxm", "profile": profile},
            engine={"max_model_len": 8192},
            disaggregation={
                "prefill": {"replicas": 1, "engine": prefill or {}},
                "decode": {"replicas": 1, "engine": decode or {}},
                "transfer": {"link": "ib-ndr-400", **transfer},
            },
            workload={
                "trace": {"format": "servesim", "path": "trace.csv"},
                "arrivals": {"kind": "trace"},
                "num_requests": rows.count("\n"),
            },
        ),
        tmp_path,
    )


def test_the_decode_side_samples_the_first_token_after_recomputing_the_last_prompt_token(tmp_path):
    """vLLM's proxy drops the prefill's token; with the KV in place the decode engine computes the last prompt
    token again and samples token 1 there: TTFT = prefill + transfer + that 1-token step, and the decode replica
    runs one step per output token."""
    result = _one_by_one(tmp_path, "0.0,1000,5,,\n", streaming=False)
    req, steps = result.requests.iloc[0], result.steps
    prefill, decode = steps[steps["replica"] == 0], steps[steps["replica"] == 1]
    assert len(prefill) == 1 and len(decode) == 5 and decode["decode_tokens"].tolist() == [0, 1, 1, 1, 1]
    assert decode["prefill_tokens"].iloc[0] == 1
    first = decode.iloc[0]
    assert req["first_token_s"] == pytest.approx(
        prefill["time_s"].iloc[0] + req["kv_transfer_s"] + first["duration_s"]
    )
    assert req["first_token_s"] == first["time_s"] and req["output_tokens"] == 5


def test_the_decode_engine_reserves_and_pulls_at_its_next_schedule(tmp_path):
    """vLLM's decode scheduler sees a handed-off request in its next `schedule` (its connector starts the pull in
    that step): a prefill ending while the decode engine is mid-step waits for that step to end, then moves."""
    result = _one_by_one(tmp_path, "0.0,1000,400,,\n0.5,1000,5,,\n", streaming=False)
    steps, second = result.steps, result.requests.sort_values("arrival_s").iloc[1]
    prefill_ends = steps[steps["replica"] == 0]["time_s"].to_numpy()
    decode_ends = steps[steps["replica"] == 1]["time_s"].to_numpy()
    reserved = prefill_ends[1] + second["decode_wait_s"]
    assert second["decode_wait_s"] > 0  # the first request was decoding: a step was under way
    assert min(abs(decode_ends - reserved)) < 1e-12  # at a decode step's end, the next one's start
    assert second["first_token_s"] > reserved + second["kv_transfer_s"]


def _api_profile(tmp_path) -> str:
    """The default profile with 5 ms of API-server time per request and 2 ms on the way."""
    path = tmp_path / "api.yaml"
    path.write_text("name: api\napi_request_s: 0.005\napi_latency_s: 0.002\n")
    return str(path)


@pytest.mark.parametrize("streaming", [False, True])
def test_the_proxy_sends_the_request_through_the_decode_instances_api_server(tmp_path, streaming):
    """vLLM's proxy sends the request on to the decode instance once the prefill instance answers: it passes that
    instance's API server too (5 + 2 ms here, as on the prefill side). Pulled, the KV moves after it; streamed
    (a push connector), the layers left during the prefill and the decode engine takes the request once its API
    server hands it over."""
    one = _one_by_one(tmp_path, "0.0,1000,5,,\n", profile=_api_profile(tmp_path), streaming=streaming)
    req, steps = one.requests.iloc[0], one.steps
    prefill_end = steps[steps["replica"] == 0]["time_s"].iloc[0]
    first_decode = steps[steps["replica"] == 1].iloc[0]
    assert prefill_end == pytest.approx(0.007 + steps["duration_s"].iloc[0])  # the prefill side's API server
    assert req["decode_wait_s"] == pytest.approx(0.0 if streaming else 0.007)
    entered = prefill_end + 0.007
    if streaming:
        assert req["kv_transfer_s"] < 0.007  # what the streamed layers leave after the prefill
        assert first_decode["time_s"] == pytest.approx(entered + first_decode["duration_s"])
    else:
        assert first_decode["time_s"] == pytest.approx(
            entered + req["kv_transfer_s"] + first_decode["duration_s"]
        )
    assert req["first_token_s"] == first_decode["time_s"]


def test_a_streamed_request_counts_once_on_its_decode_replica_while_in_its_api_server(tmp_path):
    """Streamed, the decode engine reserves for the request at the prefill's end while the request is still in that
    instance's API server: the decode router counts it once, not in both."""
    from servesim.simulator.world.run import World

    (tmp_path / "trace.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0.0,1000,5,,\n"
    )
    s = scenario(
        model="llama-3.1-8b",
        hardware={"gpu": "h100-sxm", "profile": _api_profile(tmp_path)},
        engine={"max_model_len": 8192},
        disaggregation={
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
            "transfer": {"link": "ib-ndr-400", "streaming": True},
        },
        workload={
            "trace": {"format": "servesim", "path": "trace.csv"},
            "arrivals": {"kind": "trace"},
            "num_requests": 1,
        },
    )
    prefill_end = World(s, tmp_path).run().steps.query("replica == 0")["time_s"].iloc[0]
    world = World(s, tmp_path)
    world.env.run(until=prefill_end + 0.003)  # inside its 7 ms at the decode instance's API server
    decode = world.pools[1].replicas[0]
    assert decode.entering == 0 and decode.num_outstanding == 1


def test_the_decode_side_hits_its_own_prefix_cache_and_is_sent_only_the_rest(tmp_path):
    """Two prompts share 3000 tokens: the second finds 187 full blocks (2992 tokens) of them cached on the decode
    replica, as vLLM's scheduler asks its local cache before the connector, and only its other 1008 tokens move."""
    result = _one_by_one(tmp_path, "0.0,3500,20,7,3000\n2.0,4000,20,7,3000\n")
    df = result.requests
    per_token = get_model("llama-3.1-8b").kv_bytes_per_token("bf16")
    assert df["decode_hit_tokens"].tolist() == [0, 2992]
    assert df["kv_transfer_bytes"].tolist() == [3500 * per_token, (4000 - 2992) * per_token]
    assert result.summary["decode_hit_tokens"] == 2992
    assert (df["output_tokens"] == 20).all()


def test_a_decode_pool_with_larger_blocks_hits_only_what_the_prompts_share(tmp_path):
    """The same prompts on a 32-token-block decode pool: 93 full blocks (2976 tokens) of the 3000 shared."""
    result = _one_by_one(tmp_path, "0.0,3500,20,7,3000\n2.0,4000,20,7,3000\n", decode={"block_size": 32})
    assert result.requests["decode_hit_tokens"].tolist() == [0, 2976]


def test_the_prefill_pool_needs_room_for_the_prompt_only(tmp_path):
    """A prefill engine serves max_tokens=1: 69 usable blocks (1104 tokens) take a 1000-token prompt whose 500
    outputs only the decode pool holds."""
    result = _one_by_one(tmp_path, "0.0,1000,500,,\n", prefill={"num_gpu_blocks_override": 70})
    assert result.requests["reject_reason"].isna().all() and result.summary["completed"] == 1


def test_a_decode_engine_with_every_slot_taken_reserves_nothing(tmp_path):
    """vLLM's waiting loop stops at max_num_seqs running, so the second request's KV stays on the prefill side
    until the first, decoding when it arrives, finishes."""
    result = _one_by_one(tmp_path, "0.0,500,50,,\n0.1,500,50,,\n", decode={"max_num_seqs": 1})
    df = result.requests.sort_values("first_token_s")
    assert df["decode_wait_s"].iloc[0] == 0
    assert df["decode_wait_s"].iloc[1] > 0 and df["first_token_s"].iloc[1] > df["finish_s"].iloc[0]


def test_sliding_layers_send_only_their_window_unless_the_hybrid_manager_is_off():
    """gpt-oss-120b P/D over 400G: its 18 sliding layers hand over at most 128 tokens (plus a block's rounding)
    instead of the whole prompt, so a 2-6K prompt moves about half the bytes and arrives sooner."""

    def pd(**engine):
        return scenario(
            model="gpt-oss-120b",
            hardware={"gpu": "h200"},
            engine={"max_model_len": 16384, "max_num_batched_tokens": 4096, **engine},
            disaggregation={
                "prefill": {"replicas": 1},
                "decode": {"replicas": 1},
                "transfer": {"link": "ib-ndr-400", "streaming": False},
            },
            workload={**PREFILL_HEAVY, "num_requests": 80},
        )

    hybrid, whole = run(pd()), run(pd(disable_hybrid_kv_cache_manager=True))
    per_layer = 2 * 8 * 64 * 2
    for result in (hybrid, whole):
        assert result.summary["completed"] == 80
    prompt = hybrid.requests["prompt_tokens"]
    in_window = prompt - (prompt - 127) // 16 * 16  # 128 to 143 tokens
    assert (hybrid.requests["kv_transfer_bytes"] == per_layer * 18 * (prompt + in_window)).all()
    assert (whole.requests["kv_transfer_bytes"] == per_layer * 36 * whole.requests["prompt_tokens"]).all()
    assert hybrid.summary["mean_kv_transfer_ms"] < 0.6 * whole.summary["mean_kv_transfer_ms"]


@pytest.mark.parametrize(
    "model,tp,pp,dp_attention,share,gpus",
    [
        ("llama-3.1-8b", 4, 1, False, 1 / 4, 4),  # 8 KV heads: 2 per rank
        ("llama-3.1-8b", 16, 1, False, 1 / 8, 16),  # TP above the 8 heads: each rank keeps one, duplicated
        ("llama-3.1-8b", 2, 2, False, 1 / 4, 4),  # stages split the layers
        ("deepseek-v3", 8, 1, False, 1.0, 8),  # MLA: every rank keeps the whole latent
        ("deepseek-v3", 8, 1, True, 1.0, 1),  # DP attention: the request lives on one rank
    ],
)
def test_kv_placement_of_a_request_on_a_replica(model, tp, pp, dp_attention, share, gpus):
    placed = KVPlacement.of(get_model(model), ParallelismConfig(tp=tp, pp=pp, dp_attention=dp_attention))
    assert placed.share == pytest.approx(share) and placed.gpus == gpus


@pytest.mark.parametrize(
    "model,gpu,prefill_tp,decode_tp,received_share",
    [
        ("llama-3.1-8b", "h100-sxm", 2, 2, 1 / 2),  # each decode GPU pulls its 4 heads from its twin
        ("llama-3.1-8b", "h100-sxm", 2, 1, 1.0),  # one decode GPU receives every head: twice as long
        ("llama-3.1-8b", "h100-sxm", 1, 2, 1.0),  # one prefill GPU sends both halves
        ("deepseek-v3", "h200", 8, 8, 1.0),  # every decode rank pulls the whole latent (8 copies on the wire)
    ],
)
def test_a_transfer_lasts_as_long_as_its_busiest_gpu(
    tmp_path, model, gpu, prefill_tp, decode_tp, received_share
):
    """One 4096-token prompt, NixlConnector-style pull over 400G per GPU: the time is the busier end's bytes
    over one GPU's link; the recorded bytes are what all decode GPUs receive."""
    from servesim.simulator.world.run import simulate

    (tmp_path / "trace.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n0.0,4096,4,,\n"
    )
    result = simulate(
        scenario(
            model=model,
            hardware={"gpu": gpu},
            engine={"max_model_len": 8192},
            disaggregation={
                "prefill": {"replicas": 1, "tp": prefill_tp},
                "decode": {"replicas": 1, "tp": decode_tp},
                "transfer": {"link": "ib-ndr-400"},
            },
            workload={
                "trace": {"format": "servesim", "path": "trace.csv"},
                "arrivals": {"kind": "trace"},
                "num_requests": 1,
            },
        ),
        tmp_path,
    )
    req = result.requests.iloc[0]
    per_token = {"llama-3.1-8b": 32 * 2 * 8 * 128 * 2, "deepseek-v3": 61 * (512 + 64) * 2}[model]  # bf16 KV
    link = get_interconnect("ib-ndr-400")
    assert req["kv_transfer_s"] == pytest.approx(
        4096 * per_token * received_share / link.bytes_per_s + link.latency_s
    )
    copies = decode_tp if model == "deepseek-v3" else 1
    assert req["kv_transfer_bytes"] == pytest.approx(4096 * per_token * copies)


def _dp_handoff(tmp_path, model, prefill_tp, decode_tp, prompts, streaming=False):
    """`prompts` 4096-token prompts at once on 1P1D `model` (H200) under DP attention."""
    from servesim.simulator.world.run import simulate

    (tmp_path / "trace.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n" + "0.0,4096,4,,\n" * prompts
    )
    return simulate(
        scenario(
            model=model,
            hardware={"gpu": "h200"},
            parallelism={"dp_attention": True},
            engine={"max_model_len": 8192},
            disaggregation={
                "prefill": {"replicas": 1, "tp": prefill_tp},
                "decode": {"replicas": 1, "tp": decode_tp},
                "transfer": {"link": "ib-ndr-400", "streaming": streaming},
            },
            workload={
                "trace": {"format": "servesim", "path": "trace.csv"},
                "arrivals": {"kind": "trace"},
                "num_requests": prompts,
            },
        ),
        tmp_path,
    ).requests


@pytest.mark.parametrize("streaming", [False, True])
def test_under_dp_attention_each_rank_sends_and_receives_its_own_requests_kv(tmp_path, streaming):
    """DeepSeek-V3 1P1D at TP 8 with DP attention: eight 4096-token prompts at once, one per attention rank, each
    whole on its rank's GPU. Each rank's NICs move its own request, so all eight transfers take one prompt's
    latent over one GPU's link, side by side, not one after another on the replica's; pushed, each streams
    during its rank's prefill (the decode ranks reserve at once) and lands one layer's share after it."""
    requests = _dp_handoff(tmp_path, "deepseek-v3", 8, 8, 8, streaming)
    assert sorted(requests["dp_rank"]) == list(range(8))  # the decode ranks, one request each
    link = get_interconnect("ib-ndr-400")
    wire_s = 4096 * 61 * (512 + 64) * 2 / link.bytes_per_s  # the whole bf16 latent, one GPU's link
    one = (wire_s / 61 if streaming else wire_s) + link.latency_s
    assert requests["kv_transfer_s"].tolist() == pytest.approx([one] * 8)


def test_a_decode_replica_of_one_attention_rank_receives_one_transfer_at_a_time(tmp_path):
    """Qwen3-30B-A3B under DP attention, prefill at TP 2 (two ranks, two NIC sets) and decode at TP 1 (one rank):
    the decode replica's one NIC set takes the four prompts one after another, whichever rank sent them."""
    requests = _dp_handoff(tmp_path, "qwen3-30b-a3b", 2, 1, 4)
    link = get_interconnect("ib-ndr-400")
    one = 4096 * 48 * 2 * 4 * 128 * 2 / link.bytes_per_s + link.latency_s
    assert sorted(requests["kv_transfer_s"]) == pytest.approx([k * one for k in range(1, 5)])


def test_streamed_prompts_of_one_prefill_step_share_the_link_as_their_layers_are_computed(tmp_path):
    """Eight 2000-token prompts prefilled in one step, pushed layer by layer: the link sends every prompt's layers
    as the step computes them (~0.4 s, against 5.2 ms of wire a prompt), so the k-th lands one layer's share of
    the first k prompts' bytes after the step, not after the earlier prompts' whole transfers."""
    rows = "0.0,2000,4,,\n" * 8
    result = _one_by_one(tmp_path, rows, prefill={"max_num_batched_tokens": 16384}, streaming=True)
    link = get_interconnect("ib-ndr-400")
    wire_s = 2000 * 32 * 2 * 8 * 128 * 2 / link.bytes_per_s  # Llama 3.1 8B's bf16 KV of one prompt
    landed = sorted(result.requests["kv_transfer_s"])
    assert landed == pytest.approx([k * wire_s / 32 + link.latency_s for k in range(1, 9)])
    # pulled after the prefill: one after another
    pulled = _one_by_one(tmp_path, rows, prefill={"max_num_batched_tokens": 16384})
    assert sorted(pulled.requests["kv_transfer_s"]) == pytest.approx(
        [k * (wire_s + link.latency_s) for k in range(1, 9)]
    )


def test_a_transfer_waiting_for_a_busy_decode_replica_holds_up_no_other_from_its_sender(tmp_path):
    """2P2D Llama 3.1 8B: a 16,000-token prompt moves from P0 to D0 (42 ms); meanwhile P1 prefills two 1000-token
    prompts in one step, one for D0 (busy: it waits) and one for D1 (idle). The second starts at once, a whole
    transfer and no more; a sender held while its receiver is busy made it wait behind the first."""
    from servesim.simulator.world.run import simulate

    # decode routing by session (consistent hashing): sessions 1 and 4 land on D0, session 0 on D1
    rows = "0.0,16000,4,1\n0.42,1000,4,4\n0.42,1000,4,5\n0.42,1000,4,0\n"
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens,session_id\n" + rows)
    s = scenario(
        model="llama-3.1-8b",
        hardware={"gpu": "h100-sxm"},
        engine={"max_model_len": 32768, "max_num_batched_tokens": 16384},
        disaggregation={
            "prefill": {"replicas": 2, "router": "round_robin"},
            "decode": {"replicas": 2, "router": "session_affinity"},
            "transfer": {"link": "ib-ndr-400"},
        },
        workload={
            "trace": {"format": "servesim", "path": "trace.csv"},
            "arrivals": {"kind": "trace"},
            "num_requests": 4,
        },
    )
    requests = simulate(s, tmp_path).requests.set_index("request_id")
    assert requests.loc[[1, 3], "prefill_replica"].tolist() == [1, 1]
    assert requests.loc[[0, 1, 3], "replica"].tolist() == [2, 2, 3]  # D0, D0, D1
    link = get_interconnect("ib-ndr-400")
    one = 1000 * 32 * 2 * 8 * 128 * 2 / link.bytes_per_s + link.latency_s
    assert requests.loc[1, "kv_transfer_s"] > 2 * one  # the situation: D0 was busy
    assert requests.loc[3, "kv_transfer_s"] == pytest.approx(one)


def test_a_full_decode_pool_backs_up_the_prefill_pool_without_losing_requests():
    tight = run(disaggregated(rate=8.0, decode_engine={"num_gpu_blocks_override": 1200}))
    df = tight.requests
    assert tight.summary["completed"] == 300 and tight.summary["rejected"] == 0
    assert df["decode_wait_s"].max() > 0.1  # requests waited for decode blocks, holding their prefill KV
    assert (df["output_tokens"] == df["requested_output_tokens"]).all()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    rate=st.floats(1, 30),
    decode_blocks=st.integers(700, 3000),
    prefill_blocks=st.integers(700, 3000),
    replicas=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    transfer=st.sampled_from(["direct", "store"]),
    preemption=st.sampled_from(["recompute", "swap"]),
    routers=st.tuples(st.sampled_from(ROUTERS), st.sampled_from(ROUTERS)),
)
def test_no_request_is_lost_or_duplicated_across_the_handoff(
    seed, rate, decode_blocks, prefill_blocks, replicas, transfer, preemption, routers
):
    s = scenario(
        seed=seed,
        model="llama-3.1-8b",
        hardware={"gpu": "h100-sxm"},
        engine={"max_model_len": 8192, "preemption_mode": preemption},
        disaggregation={
            "prefill": {
                "replicas": replicas[0],
                "router": routers[0],
                "engine": {"num_gpu_blocks_override": prefill_blocks},
            },
            "decode": {
                "replicas": replicas[1],
                "router": routers[1],
                "engine": {"num_gpu_blocks_override": decode_blocks},
            },
            "transfer": {"kind": transfer},
        },
        workload={
            "trace": None,
            "lengths": {
                "prompt": {"kind": "lognormal", "median": 1500, "sigma": 0.8},
                "output": {"kind": "lognormal", "median": 80, "sigma": 1.0},
            },
            "arrivals": {"kind": "gamma", "rate_per_s": rate, "cv": 2.0},
            "num_requests": 60,
        },
    )
    df = run(s).requests
    finished = df["finish_s"].notna()
    assert (finished ^ df["reject_reason"].notna()).all()
    done = df[finished]
    assert (done["output_tokens"] == done["requested_output_tokens"]).all()
    handed = done[done["requested_output_tokens"] > 1]
    assert handed["kv_transfer_s"].notna().all() and handed["decode_wait_s"].ge(0).all()
    assert df["request_id"].is_unique
    decode_engines = range(replicas[0], replicas[0] + replicas[1])  # numbered after the prefill pool's
    assert (
        handed["replica"].isin(decode_engines).all()
        and handed["prefill_replica"].isin(range(replicas[0])).all()
    )


def test_pools_storing_kv_in_different_dtypes_are_refused():
    from servesim.hardware.errors import SpecError

    s = scenario(
        disaggregation={"prefill": {"replicas": 1}, "decode": {"replicas": 1, "engine": {"kv_dtype": "fp8"}}}
    )
    with pytest.raises(
        SpecError, match=r"prefill pool's engine.kv_dtype \(bf16\) and the decode pool's \(fp8\)"
    ):
        run(s)


def test_session_affinity_keeps_a_session_on_one_decode_replica():
    """The decode pool's engines are numbered after the prefill pool's: the hash ring must map them by position
    (numbers used as positions ran past the pool and crashed)."""
    sessions = {
        "turns": {"kind": "fixed", "value": 3},
        "think_time_s": {"kind": "fixed", "value": 0.5},
        "new_message_tokens": {"kind": "fixed", "value": 50},
    }
    s = scenario(
        disaggregation={"prefill": {"replicas": 1}, "decode": {"replicas": 3, "router": "session_affinity"}},
        workload={"sessions": sessions, "num_requests": 60},
    )
    df = run(s).requests
    assert df["finish_s"].notna().all() and set(df["replica"]) <= {1, 2, 3} and df["replica"].nunique() > 1
    assert (df.groupby("session_id")["replica"].nunique() == 1).all()


def _goodputs(disagg: bool, slo: dict) -> list[dict]:
    out = []
    for rate in (1.0, 2.0, 3.0, 4.0, 5.0):
        s = scenario(
            model="llama-3.1-70b",
            hardware={"gpu": "h100-sxm"},
            engine={"max_model_len": 16384, "max_num_batched_tokens": 2048},
            slo=slo,
            workload={
                **PREFILL_HEAVY,
                "arrivals": {"kind": "poisson", "rate_per_s": rate},
                "num_requests": 300,
            },
            **(
                {"disaggregation": {"prefill": {"replicas": 1, "tp": 4}, "decode": {"replicas": 1, "tp": 4}}}
                if disagg
                else {"parallelism": {"tp": 4}, "cluster": {"replicas": 2, "router": "least_outstanding"}}
            ),
        )
        out.append(run(s).summary)
    return out


def test_distserve_disaggregation_wins_goodput_under_strict_slos_colocation_wins_throughput():
    """Llama-3.1-70B on 8 H100s: 2 x TP4 colocated (chunked prefill) vs 1 prefill + 1 decode TP4 replica."""
    strict = {"ttft_ms": 2000, "tpot_ms": 25}
    colocated, disaggregated_ = _goodputs(False, strict), _goodputs(True, strict)
    best = lambda runs, key: max(r[key] for r in runs)  # noqa: E731
    assert best(disaggregated_, "request_goodput") > 1.2 * best(colocated, "request_goodput")
    assert best(colocated, "output_throughput") >= best(disaggregated_, "output_throughput")


def test_each_pool_records_the_batch_limits_its_gpu_gave_it_and_the_record_reruns_identically():
    s = scenario(
        model="llama-3.1-8b",
        hardware={"gpu": "h100-sxm"},
        engine={"max_model_len": 16384},
        disaggregation={
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1, "gpu": "l40s"},
            "transfer": {"link": "ib-ndr-400"},
        },
        workload={**PREFILL_HEAVY, "num_requests": 60},
    )
    first = run(s)
    d = first.scenario.disaggregation
    # H100
    assert (d.prefill.engine["max_num_seqs"], d.prefill.engine["max_num_batched_tokens"]) == (
        1024,
        8192,
    )
    assert (d.decode.engine["max_num_seqs"], d.decode.engine["max_num_batched_tokens"]) == (256, 2048)  # L40S
    again = run(type(s).model_validate(first.scenario.model_dump(mode="json")))
    assert again.requests.equals(first.requests)


def test_a_store_frees_the_prefills_blocks_once_written_whatever_the_decode_side_does(tmp_path):
    """Three 2000-token prompts through a KV store, the prefill pool holding one prompt's blocks and the decode
    replica one request: each prompt is written as soon as it is prefilled, freeing the prefill's blocks, so all
    three prefill before the first answer ends; the decode side reads each once it has a slot (the first also
    waits for its write)."""
    rows = "0.0,2000,200,,\n" * 3
    result = _one_by_one(
        tmp_path, rows, prefill={"num_gpu_blocks_override": 130}, decode={"max_num_seqs": 1}, kind="store"
    )
    prefills = result.steps[result.steps["replica"] == 0]
    assert len(prefills) == 3 and prefills["time_s"].max() < result.requests["finish_s"].min()
    cfg = TransferConfig(kind="store")
    one = 2000 * 32 * 2 * 8 * 128 * 2 / cfg.store_bytes_per_s + cfg.store_latency_s  # a write, or a read
    moved = result.requests.sort_values("arrival_s", kind="stable")["kv_transfer_s"].tolist()
    assert moved == pytest.approx([2 * one, one, one])


def test_streaming_through_the_store_tier_is_refused_by_name():
    from servesim.hardware.errors import SpecError
    from servesim.simulator.scenario import load_scenario

    path = SCENARIOS_DIR / "pd_disaggregated_70b.yaml"
    with pytest.raises(
        SpecError, match=r"pd_disaggregated_70b.yaml: disaggregation.transfer: streaming: .*kind 'direct'"
    ):
        load_scenario(path, ["disaggregation.transfer.kind=store"])
    assert (
        load_scenario(
            path, ["disaggregation.transfer.kind=store", "disaggregation.transfer.streaming=false"]
        )[0].disaggregation.transfer.kind
        == "store"
    )


def test_a_decode_pool_that_falls_behind_is_an_unstable_queue():
    """One decode slot (~1 s of decoding a request) behind 2 req/s: the prefill replica takes each prompt at once
    (its queue stays under 0.1 s), so only the waits between a prefill's end and the first decode token, counted to
    the stop for those still waiting, show the backlog."""
    s = disaggregated(rate=2.0, decode_engine={"max_num_seqs": 1})
    s = with_overrides(s, {"stop.max_sim_time_s": 80.0, "workload.num_requests": 100})
    result = run(s)
    df = result.requests
    waiting = df["prefill_end_s"].notna() & df["first_token_s"].isna()
    assert df["queue_s"].max() < 0.1 and waiting.sum() > 0
    verdict = judge(result, s.slo, 2.0)
    assert "unstable queue" in verdict.reasons and verdict.metrics["wait_last_third_ms"] > 10_000
    calm = with_overrides(s, {"workload.arrivals.rate_per_s": 0.3})
    assert "unstable queue" not in judge(run(calm), s.slo, 0.3).reasons
