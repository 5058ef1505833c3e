"""Prefix caching, routing and application caches end to end (issue 4's must-shows)."""

from pathlib import Path

import pytest

from tests.simulator.conftest import run, scenario
from servesim.workloads.prefix_stats import ideal_prefix_hit_tokens
from servesim.workloads.traces import load_mooncake

MOONCAKE = (
    Path(__file__).resolve().parents[2].parent
    / "shared"
    / "data"
    / "traces"
    / "mooncake_synthetic"
    / "synthetic_trace.jsonl"
)
SHARED = {
    "trace": None,
    "lengths": {
        "prompt": {"kind": "uniform", "low": 50, "high": 300},
        "output": {"kind": "uniform", "low": 20, "high": 200},
    },
    "shared_prefix": {"num_prefixes": 10, "prefix_tokens": 500, "zipf_s": 1.0},
    "arrivals": {"kind": "poisson", "rate_per_s": 60},
    "num_requests": 1000,
}


def test_lpm_radix_beats_fcfs_without_caching_on_shared_system_prompts():
    cached = run(
        scenario(
            engine={"max_model_len": 4096, "prefix_caching": "radix", "queue_order": "lpm"}, workload=SHARED
        )
    ).summary
    plain = run(scenario(engine={"max_model_len": 4096, "prefix_caching": "none"}, workload=SHARED)).summary
    assert plain["prefix_cache_hit_rate"] == 0
    assert cached["prefix_cache_hit_rate"] > 0.6  # 500 of ~675 prompt tokens are a shared system prompt
    assert cached["mean_ttft_ms"] < plain["mean_ttft_ms"] / 5
    assert cached["prefill_tokens_saved"] > 0


def test_prefix_affinity_routing_beats_round_robin_on_hit_rate():
    def hit_rate(router):
        return run(
            scenario(
                cluster={"replicas": 4, "router": router},
                engine={"max_model_len": 4096, "prefix_caching": "radix"},
                workload=SHARED,
            )
        ).summary

    affinity, spread = hit_rate("prefix_affinity"), hit_rate("round_robin")
    assert affinity["prefix_cache_hit_rate"] > spread["prefix_cache_hit_rate"]
    assert spread["replica_requests"] == [250] * 4 and spread["load_imbalance"] == 1.0
    assert sum(affinity["replica_requests"]) == 1000


@pytest.mark.skipif(not MOONCAKE.exists(), reason="the shared Mooncake trace is not next to this checkout")
def test_mooncake_replay_hits_the_ideal_with_an_unbounded_cache_and_less_on_an_h100():
    ideal = ideal_prefix_hit_tokens(_mooncake_requests()) / _mooncake_prompt_tokens()
    assert round(ideal, 3) == 0.651
    common = {
        "workload": {
            "trace": {"format": "mooncake", "path": str(MOONCAKE)},
            "arrivals": {"kind": "trace", "time_scale": 50},
            "num_requests": None,
        },  # spaced: no overlap
        # every request runs: the trace's longest prompts exceed Llama-3.1's 128K context
        "engine": {"max_model_len": 200_000, "allow_long_max_model_len": True, "prefix_caching": "vllm"},
    }
    huge = run(
        scenario(
            hardware={"gpu": "h200"},
            **{**common, "engine": {**common["engine"], "num_gpu_blocks_override": 3_000_000}},
        )
    )
    # equal up to vLLM's whole 16-token blocks and its always-recomputed last token
    assert huge.summary["prefix_cache_hit_rate"] == pytest.approx(ideal, abs=0.002)
    h100 = run(scenario(hardware={"gpu": "h100-sxm"}, **common))
    assert h100.summary["prefix_cache_hit_rate"] < huge.summary["prefix_cache_hit_rate"] - 0.1
    print(
        f"Mooncake token hit rate: ideal {ideal:.4f}, unbounded cache {huge.summary['prefix_cache_hit_rate']:.4f}, "
        f"one H100 (Llama-3.1-8B) {h100.summary['prefix_cache_hit_rate']:.4f}"
    )


def _mooncake_requests():
    from servesim.workloads.generate import _block_segments
    from servesim.workloads.request import Request

    table = load_mooncake(MOONCAKE)
    return [
        Request(
            i,
            float(row.arrival_s),
            int(row.num_prompt_tokens),
            int(row.num_output_tokens),
            _block_segments(tuple(row.hash_ids), int(row.num_prompt_tokens)),
        )
        for i, row in enumerate(table.itertuples())
    ]


def _mooncake_prompt_tokens() -> int:
    return int(load_mooncake(MOONCAKE)["num_prompt_tokens"].sum())


def test_multi_turn_sessions_hit_their_previous_turns():
    s = scenario(
        engine={"max_model_len": 8192, "prefix_caching": "vllm"},
        cluster={"replicas": 2, "router": "session_affinity"},
        workload={
            "trace": None,
            "lengths": {
                "prompt": {"kind": "uniform", "low": 200, "high": 400},
                "output": {"kind": "uniform", "low": 50, "high": 150},
            },
            "sessions": {
                "turns": {"kind": "fixed", "value": 4},
                "think_time_s": {"kind": "fixed", "value": 1.0},
                "new_message_tokens": {"kind": "fixed", "value": 40},
            },
            "arrivals": {"kind": "poisson", "rate_per_s": 2},
            "num_requests": 80,
        },
    )
    result = run(s)
    df = result.requests
    assert result.summary["completed"] == 80
    later = df[df["request_id"] >= 20]  # turns 2..4 of the 20 sessions
    assert (later["cached_tokens"] > 0).all()
    for _, turns in df.sort_values("arrival_s").groupby("session_id"):
        rows = turns.to_dict("records")
        # the whole previous turn, answer included, in whole blocks: its
        for prev, cur in zip(rows, rows[1:]):
            held = prev["prompt_tokens"] + prev["output_tokens"] - 1  # last token was never fed back
            assert cur["cached_tokens"] == min(held, cur["prompt_tokens"] - 1) // 16 * 16
    assert df.groupby("session_id")["replica"].nunique().max() == 1  # affinity keeps a session together
    fast = run(s.model_copy(update={"simulation": s.simulation.model_copy(update={"fast_forward": False})}))
    assert fast.requests.equals(result.requests)


def test_a_session_whose_turn_is_rejected_sends_no_more_turns():
    """1,000-token prompts, 100-token answers, 50-token messages, 4 turns, max_model_len 1,300: turn 3's prompt
    (1,300) and answer do not fit, so it is rejected, and turn 4, which would carry its answer, is never sent."""
    result = run(
        scenario(
            engine={"max_model_len": 1300},
            workload={
                "trace": None,
                "lengths": {
                    "prompt": {"kind": "fixed", "value": 1000},
                    "output": {"kind": "fixed", "value": 100},
                },
                "sessions": {
                    "turns": {"kind": "fixed", "value": 4},
                    "think_time_s": {"kind": "fixed", "value": 0.5},
                    "new_message_tokens": {"kind": "fixed", "value": 50},
                },
                "arrivals": {"kind": "poisson", "rate_per_s": 1},
                "num_requests": 20,
            },
        )
    )
    df, summary = result.requests, result.summary
    assert (summary["completed"], summary["rejected"]) == (10, 5)
    assert (df[df["reject_reason"].notna()]["prompt_tokens"] == 1300).all()
    unsent = df[df["arrival_s"].isna()]
    assert len(unsent) == 5 and (unsent["prompt_tokens"] == 1450).all()


@pytest.mark.parametrize("kind", ["exact", "semantic"])
def test_application_caches_answer_repeats_without_the_engine(kind, tmp_path):
    if kind == "exact":  # 10 distinct prompts, each asked 40 times, 0.2 s apart
        trace = tmp_path / "repeats.csv"
        trace.write_text(
            "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
            + "".join(f"{i * 0.2},300,100,{i % 10},300\n" for i in range(400))
        )
        workload = {
            "trace": {"format": "servesim", "path": str(trace)},
            "arrivals": {"kind": "trace"},
            "num_requests": 400,
        }
    else:
        workload = {
            "trace": None,
            "lengths": {"prompt": {"kind": "fixed", "value": 300}, "output": {"kind": "fixed", "value": 100}},
            "arrivals": {"kind": "poisson", "rate_per_s": 5},
            "num_requests": 400,
            "semantic_clusters": {"num_clusters": 20, "zipf_s": 1.0},
        }
    result = run(
        scenario(
            app_cache={"kind": kind, "lookup_latency_s": 0.003, "false_hit_rate": 0.1},
            workload=workload,
            engine={"max_model_len": 4096},
        )
    )
    df, summary = result.requests, result.summary
    hits = df[df["served_by"] == f"{kind}_cache"]
    assert summary["response_cache_hits"] == len(hits) > 0
    assert (hits["ttft_s"].round(9) == 0.003).all() and hits["replica"].isna().all()
    assert summary["gpu_time_saved_s"] > 0
    if kind == "exact":
        assert len(hits) > 350 and summary["response_cache_false_hits"] == 0  # only the first asks miss
    else:
        assert 0 < summary["response_cache_false_hits"] < len(hits)
        assert (hits["false_hit"].mean()) == pytest.approx(0.1, abs=0.08)


def test_a_chat_traces_later_turns_hit_the_conversation_they_resend(tmp_path):
    """A servesim trace of one conversation whose turns resend it: vLLM's prefix cache holds the earlier turns'
    prompts and answers, so each later turn computes little more than its new question."""
    from servesim.simulator.world.run import simulate

    (tmp_path / "chat.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens,session_id\n0.0,1000,200,1\n5.0,1400,100,1\n10.0,1700,10,1\n"
    )
    s = scenario(
        workload={
            "trace": {"format": "servesim", "path": "chat.csv"},
            "arrivals": {"kind": "trace"},
            "num_requests": 3,
        }
    )
    cached = simulate(s, tmp_path).requests.sort_values("arrival_s")["cached_tokens"].tolist()
    # whole 16-token blocks of what each turn computed (its last answer token is never fed back): 1199, then 1499
    assert cached == [0, 1184, 1488]
