"""Summary metrics: SLO judgement of requests a stop cut off (a miss only when no future can save it), queue
time, prefix-cache hit rate and the GPU time a response cache saved."""

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.world.metrics import cache_and_load_summary, known_misses
from servesim.simulator.world.step_table import StepFigures
from tests.simulator.conftest import run, scenario

SLO = {"ttft": 500.0, "tpot": 50.0, "e2el": 9000.0}


def _unfinished(arrival_s, first_token_s, requested):
    frame = pd.DataFrame(
        {"arrival_s": arrival_s, "first_token_s": first_token_s, "requested_output_tokens": requested}
    )
    return frame.assign(ttft_s=frame["first_token_s"] - frame["arrival_s"])


def test_unfinished_requests_miss_only_what_they_can_no_longer_meet():
    stop_s = 10.0
    rows = _unfinished(
        [9.8, 9.0, 9.0, 8.0, 0.5, 9.0], [np.nan, np.nan, 9.2, 8.3, 0.6, 9.1], [10, 10, 100, 11, 2000, 10]
    )
    # 0: waited 200 ms for its first token: could still make 500 ms
    # 1: waited 1 s without one: TTFT > 500 ms whatever comes
    # 2: TTFT 200 ms; its 99 gaps take longer than 0.8 s: a TPOT bound of 8.1 ms, fine
    # 3: TTFT 300 ms; 10 gaps after 1.7 s already: TPOT > 170 ms
    # 4: 9.5 s old: past the 9 s E2EL limit (its TPOT bound, 4.7 ms, would pass)
    # 5: TTFT 100 ms, 9 gaps after 0.9 s: TPOT > 100 ms
    assert known_misses(rows, SLO, stop_s).tolist() == [False, True, False, True, True, True]
    assert known_misses(rows, {"ttft": 500.0}, stop_s).tolist() == [False, True, False, False, False, False]
    assert known_misses(rows, {"tpot": 50.0}, stop_s).tolist() == [False, False, False, True, False, True]


def _fixed_trace(tmp_path, rows: int, prompt: int, output: int, prefix_tokens: int = 0) -> dict:
    """All requests at t=0, each `prompt` tokens (the first `prefix_tokens` shared) and `output` tokens."""
    trace = tmp_path / "fixed.csv"
    prefix = ",prefix_id,prefix_tokens" if prefix_tokens else ""
    trace.write_text(
        f"arrival_s,prompt_tokens,output_tokens{prefix}\n"
        + "".join(
            f"0,{prompt},{output}" + (f",0,{prefix_tokens}" if prefix_tokens else "") + "\n"
            for _ in range(rows)
        )
    )
    return {
        "trace": {"format": "servesim", "path": str(trace)},
        "arrivals": {"kind": "trace"},
        "num_requests": rows,
    }


def test_queue_time_is_the_wait_for_a_running_request_to_finish(tmp_path):
    """One sequence at a time: each request is scheduled in the step after the one before it finishes, so its
    queue time is that request's E2E, and TTFT less queue time is its own (one-step) prefill."""
    result = run(
        scenario(
            workload=_fixed_trace(tmp_path, 3, 512, 20), engine={"max_num_seqs": 1, "async_scheduling": False}
        )
    )
    df = result.requests.sort_values("request_id")
    assert df["queue_s"].iloc[0] == 0
    assert df["queue_s"].iloc[1:].tolist() == pytest.approx(df["finish_s"].iloc[:-1].tolist())
    prefill = df["ttft_s"] - df["queue_s"]
    assert prefill.tolist() == pytest.approx([prefill.iloc[0]] * 3) and prefill.iloc[0] > 0
    assert result.summary["median_queue_ms"] == pytest.approx(df["queue_s"].median() * 1e3)


def test_prefix_hit_rate_counts_only_requests_an_engine_looked_up(tmp_path):
    """20 identical-prefix requests at once, one at a time, stopped early: of the k scheduled, all but the first
    hit the 19 shared blocks (304 tokens) of their 320; the ones still queued at the stop were never looked up."""
    result = run(
        scenario(
            workload=_fixed_trace(tmp_path, 20, 320, 50, prefix_tokens=304),
            engine={"max_num_seqs": 1},
            stop={"max_sim_time_s": 1.0},
        )
    )
    k = int(result.requests["scheduled_s"].notna().sum())
    assert 1 < k < 20
    assert result.summary["prefix_cache_hit_rate"] == pytest.approx((k - 1) * 304 / (k * 320))


def test_gpu_time_saved_prices_kept_tokens_not_rejected_drafts():
    """4 GPU-seconds (2 steps of 1 s at TP2) bought 100 prefilled positions and 2 emitted decode tokens (the
    decode step verified 7 drafts and kept 1, plus its bonus token): 102 positions. A cached answer of 50 + 2 tokens would have
    needed 51 of them: 51 * 4 / 102 = 2 s."""
    requests = pd.DataFrame(
        {
            "served_by": ["engine", "exact_cache"],
            "scheduled_s": [0.0, np.nan],
            "prompt_tokens": [100, 50],
            "cached_tokens": [0, 0],
            "output_tokens": [3, 2],
            "requested_output_tokens": [3, 2],
            "false_hit": [False, False],
            "replica": [0, np.nan],
        }
    )
    steps = pd.DataFrame(
        {
            "duration_s": [1.0, 1.0],
            "replica": [0, 0],
            "prefill_tokens": [100, 0],
            "decode_tokens": [0, 8],
            "kv_usage": [0.5, 0.5],
        }
    )
    summary = cache_and_load_summary(requests, StepFigures.of(steps, {0: 2}), [0])
    assert summary["gpu_time_saved_s"] == pytest.approx(2.0)
    assert summary["response_cache_hit_rate"] == 0.5


def test_the_step_table_is_by_end_time_then_replica_with_ties_in_logged_order():
    from servesim.simulator.world.step_table import StepLog

    log = StepLog()
    for n, (time_s, replica) in enumerate([(2.0, 1), (1.0, 0), (2.0, 0), (1.0, 0), (2.0, 1), (0.5, 3)]):
        log.record(time_s, 0.1, replica, n, 0, 1, 1, 0, 1, 0.1, 0)
    frame = log.table().frame()
    assert frame["num_requests"].tolist() == [5, 1, 3, 2, 0, 4]  # the row each came from
    assert list(frame.index) == list(range(6))
