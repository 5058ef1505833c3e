"""End-to-end simulations: determinism, fast-forward identity, latency identities, load response, invariants."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.errors import SpecError
from servesim.simulator.world.fast_forward import plan_stretch
from servesim.simulator.world.run import simulate
from servesim.simulator.scenario import Scenario
from servesim.simulator.scenario import load_scenario
from tests.simulator.conftest import SCENARIOS, run, scenario


def assert_same_run(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    assert a.summary == b.summary or pd.Series(a.summary).equals(pd.Series(b.summary))


def test_same_scenario_and_seed_give_identical_results():
    s = scenario(
        workload={
            "lengths": {
                "prompt": {"kind": "lognormal", "median": 800, "sigma": 1.0},
                "output": {"kind": "uniform", "low": 10, "high": 300},
            },
            "arrivals": {"kind": "poisson", "rate_per_s": 8},
            "num_requests": 200,
            "trace": None,
        }
    )
    first, second = run(s), run(s)
    assert_same_run(first, second)
    other = run(s.model_copy(update={"seed": 2}))
    assert not first.requests["prompt_tokens"].equals(other.requests["prompt_tokens"])


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the quickstart trace slice
        {
            "engine": {"max_model_len": 16384, "num_gpu_blocks_override": 600, "max_num_seqs": 32}
        },  # preemptions
        {"engine": {"max_model_len": 16384, "num_gpu_blocks_override": 600, "preemption_mode": "swap"}},
        {"cluster": {"replicas": 3, "router": "least_outstanding"}},
        {"model": "gemma-2-9b", "engine": {"max_model_len": 8192}},  # sliding windows
        {
            "workload": {
                "trace": {"format": "azure", "path": "traces/azure_conv_1h_first2000.csv"},
                "arrivals": {"kind": "all_at_once"},
                "num_requests": 200,
                "closed_loop": {"clients": 16, "think_time_s": {"kind": "uniform", "low": 0.0, "high": 0.5}},
            }
        },
        {
            "engine": {
                "max_model_len": 16384,
                "speculative": {  # speculative decoding, switched off above 8 running
                    "method": "draft",
                    "k": 4,
                    "acceptance": 0.7,
                    "draft_model": "llama-3.2-1b",
                    "disable_above_batch": 8,
                },
            }
        },
        {"engine": {"scheduler": "sglang", "prefix_caching": "radix"}},
        {"engine": {"scheduler": "sglang", "scheduler_recv_interval": 10}},  # arrivals read late
        {"engine": {"scheduler": "sglang", "scheduler_recv_interval": 4, "async_scheduling": False}},
        {
            "engine": {"scheduler": "sglang", "max_model_len": 16384, "num_gpu_blocks_override": 600}
        },  # retractions
        {
            "engine": {
                "max_model_len": 16384,
                "num_gpu_blocks_override": 600,
                "max_num_seqs": 32,
                "speculative": {"method": "eagle", "k": 3, "acceptance": {"kind": "beta", "a": 6, "b": 4}},
            }
        },  # and preemptions
    ],
)
def test_fast_forward_gives_the_same_results_as_stepping(overrides):
    fast = run(scenario(**overrides, simulation={"fast_forward": True}))
    slow = run(scenario(**overrides, simulation={"fast_forward": False}))
    assert_same_run(fast, slow)
    assert fast.summary["completed"] + fast.summary["rejected"] == len(fast.requests)


def test_recv_interval_delays_arrivals_that_come_while_decoding():
    """Read every 10th decode step, a request sent while others decode waits longer for its first token."""
    every, tenth = (
        run(
            scenario(
                engine={"scheduler": "sglang", "scheduler_recv_interval": n}, workload={"num_requests": 100}
            )
        )
        for n in (1, 10)
    )
    assert tenth.summary["mean_ttft_ms"] > every.summary["mean_ttft_ms"]
    assert tenth.summary["completed"] == every.summary["completed"] == 100


def test_recv_interval_is_refused_under_dp_attention_and_pipeline_parallelism():
    """SGLang 0.5 refuses it under DP attention; under pp its micro-batches share one queue, not modelled."""
    with pytest.raises(ValueError, match="refuses --scheduler-recv-interval under DP attention"):
        scenario(
            model="deepseek-v3",
            hardware={"gpu": "h200"},
            parallelism={"tp": 8, "dp_attention": True},
            engine={"scheduler": "sglang", "scheduler_recv_interval": 10},
        )
    with pytest.raises(ValueError, match="with pipeline parallelism .* is not modelled"):
        scenario(parallelism={"pp": 2}, engine={"scheduler": "sglang", "scheduler_recv_interval": 10})


@pytest.mark.parametrize("engine", [{"max_num_seqs": 32}, {"scheduler": "sglang"}])
def test_preemption_scenario_does_preempt(engine):
    result = run(scenario(engine={"max_model_len": 16384, "num_gpu_blocks_override": 600, **engine}))
    assert result.summary["preemptions"] > 0
    assert result.summary["completed"] == 300


def test_ttlt_is_ttft_plus_tpot_times_remaining_tokens():
    df = run(scenario()).requests
    multi = df[df["output_tokens"] > 1]
    np.testing.assert_allclose(
        multi["e2el_s"],
        multi["ttft_s"] + multi["tpot_s"] * (multi["output_tokens"] - 1),
        rtol=1e-12,
        atol=1e-12,
    )
    assert (df["ttft_s"] > 0).all() and (df["e2el_s"] >= df["ttft_s"]).all()


@pytest.mark.parametrize("paced", [False, True])
def test_the_duration_runs_from_the_clients_start_to_the_last_finish(paced):
    """vllm bench serve starts its clock before the first request's gap: a paced run's first request leaves after
    one, and the throughputs divide by the whole span from t = 0 (a plain renewal process sends its first at 0)."""
    result = run(
        scenario(
            workload={
                "trace": None,
                "lengths": {
                    "prompt": {"kind": "fixed", "value": 128},
                    "output": {"kind": "fixed", "value": 32},
                },
                "arrivals": {"kind": "poisson", "rate_per_s": 1.0, "paced": paced},
                "num_requests": 10,
            }
        )
    )
    df, summary = result.requests, result.summary
    assert bool(df["arrival_s"].min() > 0) is paced
    assert summary["duration_s"] == df["finish_s"].max()
    assert summary["request_throughput"] == 10 / df["finish_s"].max()


def test_throughput_rises_and_latency_degrades_past_saturation():
    summaries = [
        run(
            scenario(
                workload={"arrivals": {"kind": "trace", "rate_per_s": rate}, "num_requests": 400},
                engine={"max_model_len": 16384, "max_num_seqs": 64},
            )
        ).summary
        for rate in (2, 20, 200)
    ]
    throughput = [s["output_throughput"] for s in summaries]
    assert throughput[0] < throughput[1] < throughput[2]
    assert summaries[0]["mean_ttft_ms"] < summaries[1]["mean_ttft_ms"] < summaries[2]["mean_ttft_ms"]
    assert summaries[0]["mean_tpot_ms"] < summaries[2]["mean_tpot_ms"]
    assert summaries[2]["mean_ttft_ms"] > 10 * summaries[0]["mean_ttft_ms"]  # queueing past saturation


def test_requests_longer_than_max_model_len_are_rejected_with_a_reason():
    result = run(scenario(engine={"max_model_len": 2048}))
    rejected = result.requests[result.requests["reject_reason"].notna()]
    assert len(rejected) > 0 and result.summary["rejected"] == len(rejected)
    assert (rejected["prompt_tokens"] + rejected["requested_output_tokens"] > 2048).all()
    assert (rejected["output_tokens"] == 0).all()
    assert rejected["reject_reason"].str.contains("exceed max_model_len \\(2048\\)").all()
    assert rejected["finish_s"].isna().all()


@pytest.mark.parametrize(
    "scheduler, async_scheduling, completed, rejected",
    [("vllm", True, 0, 5), ("vllm", False, 5, 0), ("orca", False, 0, 5)],
)
def test_a_request_the_admission_gate_could_never_let_in_is_rejected(
    scheduler, async_scheduling, completed, rejected
):
    """gpt-oss-20b (full attention and a 128-token window, 16-token blocks), 16,000 + 10 tokens, 1,600 blocks (1,599
    usable). The admission gate wants the full group's cdiv(16009, 16) = 1,001 blocks and the window's
    min(1,001, cdiv(127 + in-flight tokens, 16) + 1): 8,192 x 2 in flight under async scheduling, 1,001 (2,002 in
    all, more than the pool: rejected, where it used to wait at the queue's head forever); synchronously 8,192,
    521 (1,522: all run). Orca reserves every block of both groups at admission: 2 x 1,001, rejected too."""
    result = run(
        scenario(
            model="gpt-oss-20b",
            engine={
                "num_gpu_blocks_override": 1600,
                "max_model_len": 32768,
                "max_num_batched_tokens": 8192,
                "scheduler": scheduler,
                "prefix_caching": "none" if scheduler == "orca" else "vllm",
                "async_scheduling": async_scheduling,
            },
            workload={
                "trace": None,
                "lengths": {
                    "prompt": {"kind": "fixed", "value": 16000},
                    "output": {"kind": "fixed", "value": 10},
                },
                "arrivals": {"kind": "all_at_once"},
                "num_requests": 5,
            },
        )
    )
    assert (result.summary["completed"], result.summary["rejected"]) == (completed, rejected)
    if rejected:
        usable = 1599 if scheduler == "vllm" else 1600  # vLLM's null block
        assert (
            result.requests["reject_reason"] == f"needs 2002 KV blocks at full length; the pool has {usable}"
        ).all()


@pytest.mark.parametrize(
    "file, blocks, least", [("quickstart.yaml", 1, 2), ("deepseek_v3_8xh200.yaml", 15, 16)]
)
def test_a_pool_override_too_small_for_one_usable_block_is_refused(file, blocks, least):
    """vLLM keeps one block as its null block, on each of DeepSeek-V3's 8 DP-attention ranks: 2 and 8 x 2 blocks
    are the least that leave one usable (too few used to end in a traceback)."""
    s, base = load_scenario(SCENARIOS / file, [f"engine.num_gpu_blocks_override={blocks}"])
    with pytest.raises(
        SpecError, match=f"override \\({blocks}\\) leaves no usable KV block.*give at least {least}$"
    ):
        simulate(s, base)


@pytest.mark.parametrize("scheduler, usable", [("vllm", 7), ("sglang", 8)])
def test_vllm_keeps_one_block_of_the_pool_as_its_null_block(tmp_path, scheduler, usable):
    """8 planned blocks of 16 tokens: vLLM's BlockPool holds block 0 back, so a request that needs all 8 (100 + 29 - 1
    = 128 tokens) is refused and KV usage counts 7; SGLang's pool pads its dummy slot outside the plan."""
    from servesim.simulator.world.run import simulate

    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,29\n1.0,100,12\n")
    result = simulate(
        scenario(
            engine={
                "scheduler": scheduler,
                "max_model_len": 1024,
                "num_gpu_blocks_override": 8,
                "prefix_caching": "none",
            },
            workload={
                "trace": {"format": "servesim", "path": "trace.csv"},
                "arrivals": {"kind": "trace"},
                "num_requests": 2,
            },
        ),
        tmp_path,
    )
    reasons = result.requests["reject_reason"]
    if usable == 7:
        assert (
            reasons.iloc[0] == "needs 8 KV blocks at full length; the pool has 7"
            and reasons.iloc[1:].isna().all()
        )
    else:
        assert reasons.isna().all()
    assert (result.steps["kv_usage"] == result.steps["kv_blocks_used"] / usable).all()


def test_closed_loop_never_exceeds_its_clients():
    df = run(
        scenario(
            workload={
                "trace": {"format": "azure", "path": "traces/azure_conv_1h_first2000.csv"},
                "arrivals": {"kind": "all_at_once"},
                "num_requests": 120,
                "closed_loop": {"clients": 5},
            }
        )
    ).requests
    events = sorted(
        [(t, 1) for t in df["arrival_s"]] + [(t, -1) for t in df["finish_s"]], key=lambda e: (e[0], e[1])
    )
    in_flight = np.cumsum([d for _, d in events])
    assert in_flight.max() == 5


def test_a_closed_loop_cut_by_the_stop_never_sent_the_rest():
    """Five clients stopped at 3 s: the requests they had not sent by then are not arrived, not a backlog, and no
    SLO misses (they used to count as unfinished since t=0, each a TTFT miss)."""
    result = run(
        scenario(
            workload={
                "trace": {"format": "azure", "path": "traces/azure_conv_1h_first2000.csv"},
                "arrivals": {"kind": "all_at_once"},
                "num_requests": 120,
                "closed_loop": {"clients": 5},
            },
            stop={"max_sim_time_s": 3.0},
            slo={"ttft_ms": 2000},
        )
    )
    df, summary = result.requests, result.summary
    sent = df["arrival_s"].notna()
    assert df.loc[~sent, "finish_s"].isna().all() and 0 < (~sent).sum() < 120 - summary["completed"]
    in_flight = sent & df["finish_s"].isna() & df["reject_reason"].isna()
    assert summary["unfinished"] == in_flight.sum() <= 5
    assert summary["not_arrived"] == (~sent).sum()
    assert summary["slo_attainment"] == 1.0


def test_goodput_counts_requests_within_slos():
    result = run(scenario(slo={"ttft_ms": 60, "tpot_ms": 7}))
    df = result.requests
    good = ((df["ttft_s"] * 1e3 <= 60) & ~(df["tpot_s"] * 1e3 > 7)).sum()
    assert result.summary["request_goodput"] == pytest.approx(good / result.summary["duration_s"])
    assert 0 < good < len(df)


def _bursty_lognormal(rate: float) -> dict:
    """60 requests of widely spread lengths (prompts around 300 tokens, outputs around 60), arriving in bursts."""
    return {
        "lengths": {
            "prompt": {"kind": "lognormal", "median": 300, "sigma": 1.2},
            "output": {"kind": "lognormal", "median": 60, "sigma": 1.0},
        },
        "arrivals": {"kind": "gamma", "rate_per_s": rate, "cv": 2.0},
        "num_requests": 60,
        "trace": None,
    }


def test_sglang_micro_batches_on_a_pool_too_small_for_two_prompts_take_turns():
    """Two pipeline micro-batches of SGLang over 40 blocks (640 tokens) and ~450-token prompts: each stalls on its
    second chunk. Each giving its pages back, they retracted each other's prompts tens of thousands of times (the
    run never ended); the oldest now waits while the younger gives way, so every request the pool can hold
    finishes (a hanging run would still be spinning at the stop, its requests neither finished nor refused)."""
    s = scenario(
        seed=9094,
        engine={
            "prefix_caching": "vllm",
            "scheduler": "sglang",
            "max_model_len": 4096,
            "num_gpu_blocks_override": 40,
            "max_num_seqs": 1,
            "max_num_batched_tokens": 256,
            "chunk_size": 256,
        },
        parallelism={"pp": 2},
        stop={"max_sim_time_s": 120},
        workload=_bursty_lognormal(200.0),
    )
    df = run(s).requests
    finished = df["finish_s"].notna()
    assert (finished ^ df["reject_reason"].notna()).all()  # 19 prompts longer than the pool are refused
    assert df["finish_s"].max() < 30 and df["preemptions"].max() <= 10  # 13.6 s, 3


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    rate=st.floats(1, 200),
    blocks=st.integers(40, 400),
    max_num_seqs=st.integers(1, 64),
    budget=st.sampled_from([256, 2048, 8192]),
    scheduler=st.sampled_from(["vllm", "sarathi", "orca", "static", "sglang"]),
    preemption=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    caching=st.sampled_from(["none", "vllm", "radix"]),
    lpm=st.booleans(),
    pp=st.sampled_from([1, 1, 2]),
)
def test_every_request_finishes_or_is_rejected(
    seed, rate, blocks, max_num_seqs, budget, scheduler, preemption, chunked, caching, lpm, pp
):
    if scheduler in ("orca", "static"):
        caching = "none"  # they allocate contiguously and share nothing
    if scheduler == "sglang":
        preemption = "recompute"  # SGLang retracts
    s = scenario(
        seed=seed,
        engine={
            "prefix_caching": caching,
            "queue_order": "lpm" if lpm and caching != "none" else "fcfs",
            "scheduler": scheduler,
            "max_model_len": 4096,
            "num_gpu_blocks_override": blocks,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max(budget, max_num_seqs) if chunked else 4096,
            "enable_chunked_prefill": chunked,
            "preemption_mode": preemption,
            "chunk_size": 256,
        },
        parallelism={"pp": pp},
        workload=_bursty_lognormal(rate),
    )
    result = run(s)
    df = result.requests
    finished = df["finish_s"].notna()
    assert (finished ^ df["reject_reason"].notna()).all()  # exactly one of the two
    assert result.steps["kv_usage"].max() <= 1.0
    pages = blocks * 16 if caching == "radix" else blocks  # radix pages the same memory 1 token at a time
    assert (result.steps["kv_blocks_used"] <= pages).all()
    done = df[finished]
    assert (done["output_tokens"] == done["requested_output_tokens"]).all()  # no token lost or duplicated
    assert (df.loc[~finished, "reject_reason"].str.len() > 0).all()


def test_sglang_fast_forward_notices_a_finish_inside_a_stretch(tmp_path):
    """A finish inside a fused stretch clears SGLang's batch_is_full one decode later, still inside it: the
    arrival after the stretch is admitted exactly when stepping would admit it."""
    from servesim.simulator.world.run import simulate

    (tmp_path / "trace.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens\n0.0,500,20\n0.0,481,577\n0.5,100,10\n"
    )
    runs = [
        simulate(
            scenario(
                engine={"scheduler": "sglang", "max_model_len": 1536, "num_gpu_blocks_override": 100},
                workload={
                    "trace": {"format": "servesim", "path": "trace.csv"},
                    "arrivals": {"kind": "trace"},
                    "num_requests": 3,
                },
                simulation={"fast_forward": fast},
            ),
            tmp_path,
        )
        for fast in (True, False)
    ]
    assert_same_run(*runs)


def test_a_fused_stretch_ends_exactly_where_stepping_would_even_where_no_delay_reaches():
    """From 0.4337101143344169 no float delay d gives now + d == 0.9742684086894654 (the nearest sums miss by one
    unit in the last place); the stretch's end must still land on it, as the stepped steps' sums do."""
    import math

    import simpy

    from servesim.simulator.world.fast_forward import wait_until

    start, target = 0.4337101143344169, 0.9742684086894654
    delay = target - start
    assert all(start + d != target for d in (math.nextafter(delay, -1), delay, math.nextafter(delay, 2)))
    env, ends = simpy.Environment(), []

    def process():
        yield env.timeout(start)
        yield from wait_until(env, target)
        ends.append(env.now)

    env.process(process())
    env.run()
    assert ends == [target]


def _chats(prompt_high: int, output_high: int, rate: float, num: int) -> dict:
    """A workload of `num` chats at `rate`/s, prompts of 20 to `prompt_high` tokens, answers of 20 to `output_high`."""
    return {
        "trace": None,
        "lengths": {
            "prompt": {"kind": "uniform", "low": 20, "high": prompt_high},
            "output": {"kind": "uniform", "low": 20, "high": output_high},
        },
        "arrivals": {"kind": "poisson", "rate_per_s": rate},
        "num_requests": num,
    }


def _short_requests(router: str, scheduler: str = "vllm") -> Scenario:
    """150 short chats at 5/s on two replicas with a small pool: routers choosing by KV usage see close calls."""
    return scenario(
        engine={"max_model_len": 4096, "num_gpu_blocks_override": 300, "scheduler": scheduler},
        workload=_chats(200, 300, 5.0, 150),
        cluster={"replicas": 2, "router": router},
    )


@pytest.mark.parametrize(
    "router, scheduler",
    [("least_kv", "vllm"), ("least_outstanding", "vllm"), ("least_outstanding", "sglang")],
)
def test_steps_planned_before_an_arrival_fuse_only_where_routing_cannot_tell(router, scheduler, monkeypatch):
    """Under async (vLLM) or overlap (SGLang) scheduling the step after the one a request arrives in was planned
    without it, so a stretch runs it too (`Scheduler.arrival_lag_steps`); its blocks are then taken before the
    arrival is routed, which a router choosing by KV usage would see (in this run it would route differently), so
    there it is left to stepping."""
    from servesim.simulator.world import engine

    lagged = []

    def counting(*args, **kwargs):
        stretch = plan_stretch(*args, **kwargs)
        lagged.append(stretch is not None and stretch.lagged > 0)
        return stretch

    monkeypatch.setattr(engine, "plan_stretch", counting)
    s = _short_requests(router, scheduler)
    fast = run(s.model_copy(update={"simulation": s.simulation.model_copy(update={"fast_forward": True})}))
    slow = run(s.model_copy(update={"simulation": s.simulation.model_copy(update={"fast_forward": False})}))
    assert_same_run(fast, slow)
    assert any(lagged) == (router == "least_outstanding")


def test_an_lpm_queue_keeps_decodes_stepped_while_anyone_waits():
    """Each plan re-sorts a longest-prefix-match queue by the cache, which decode steps change (they evict cached
    blocks): a request that fits may come to the head mid-stretch, so with anyone waiting decodes stay stepped. With
    seed 807 such a request is admitted after ~100 steps."""
    s = scenario(
        engine={
            "max_num_seqs": 8,
            "num_gpu_blocks_override": 150,
            "prefix_caching": "vllm",
            "queue_order": "lpm",
            "max_model_len": 4096,
        },
        workload=_chats(300, 500, 50.0, 300)
        | {"shared_prefix": {"num_prefixes": 12, "prefix_tokens": 160, "zipf_s": 1.0, "share": 0.9}},
    ).model_copy(update={"seed": 807})
    fast = run(s.model_copy(update={"simulation": s.simulation.model_copy(update={"fast_forward": True})}))
    slow = run(s.model_copy(update={"simulation": s.simulation.model_copy(update={"fast_forward": False})}))
    assert_same_run(fast, slow)
