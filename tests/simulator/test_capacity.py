"""Maximum sustainable rate: bisection agrees with a dense sweep; verdicts name the SLO that failed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.hardware.errors import SpecError
from servesim.simulator.planning.capacity import (
    CapacityResult,
    Verdict,
    at_rate,
    check_rate,
    judge,
    max_sustainable_rate,
    offered_rate,
    queue_growth,
    queue_waits_s,
)
from servesim.simulator.world.run import simulate
from servesim.simulator.scenario import SloConfig, load_scenario
from tests.simulator.study_helpers import SCENARIOS, chat
from tests.workloads.test_servegen import write_model

DENSE_STEP = 1.0


def test_bisection_matches_a_dense_rate_sweep_within_one_step():
    s = chat()
    dense = [check_rate(s, SCENARIOS, float(r)) for r in np.arange(2.0, 41.0, DENSE_STEP)]
    first_failure = next(v for v in dense if not v.ok)
    assert all(v.ok for v in dense if v.rate_per_s < first_failure.rate_per_s)
    dense_answer = first_failure.rate_per_s - DENSE_STEP  # the last passing rate before the first failure
    assert 10 < dense_answer < 38  # the answer lies inside the swept range, not at its edges

    result = max_sustainable_rate(s, SCENARIOS, rel_tol=0.01)
    assert abs(result.rate_per_s - dense_answer) <= DENSE_STEP
    assert result.num_simulations == len(result.verdicts) < 15  # far fewer runs than the dense sweep's 39
    assert result.best.ok and result.best.rate_per_s == result.rate_per_s
    assert not result.limit.ok and result.limit.rate_per_s > result.rate_per_s


def test_early_stopping_never_runs_above_a_failed_rate():
    result = max_sustainable_rate(chat(), SCENARIOS, rel_tol=0.05)
    failed = [v.rate_per_s for v in result.verdicts if not v.ok]
    passed = [v.rate_per_s for v in result.verdicts if v.ok]
    assert max(passed) < min(failed)
    # the first failure is the highest rate run
    assert max(v.rate_per_s for v in result.verdicts) == max(failed)
    assert sorted(failed) == failed and all(b > a for a, b in zip(failed, failed[1:]))


@pytest.mark.parametrize(
    "slo,reason",
    [
        ({"ttft_ms": 300}, "TTFT SLO"),
        ({"tpot_ms": 15}, "TPOT SLO"),
        ({"e2el_ms": 2000}, "E2E SLO"),
        ({"ttft_ms": 2000, "goodput_fraction": 0.99, "percentile": 50}, "goodput"),
    ],
)
def test_each_failed_slo_is_named(slo, reason):
    result = simulate(at_rate(chat(), 40.0), SCENARIOS)
    verdict = judge(result, SloConfig(**slo), 40.0)
    assert reason in verdict.reasons and not verdict.ok
    assert len(verdict.details) == len(verdict.reasons)


def test_percentile_decides_which_requests_must_meet_the_limit():
    result = simulate(at_rate(chat(), 20.0), SCENARIOS)
    median, p99 = result.summary["median_ttft_ms"], result.summary["p99_ttft_ms"]
    between = (median + p99) / 2
    assert judge(result, SloConfig(ttft_ms=between, percentile=50)).ok
    verdict = judge(result, SloConfig(ttft_ms=between, percentile=99))
    assert verdict.reasons[0] == "TTFT SLO" and "p99 TTFT" in verdict.details[0]


def test_overload_without_slos_is_an_unstable_queue():
    s = chat(slo={"ttft_ms": None, "tpot_ms": None})
    assert check_rate(s, SCENARIOS, 5.0).ok
    verdict = check_rate(s, SCENARIOS, 60.0)
    assert verdict.reasons == ("unstable queue",) and "mean queue wait grows" in verdict.details[0]


def _requests(waits_s: list[float], prefill_s: list[float] | None = None) -> pd.DataFrame:
    """One request a second, each waiting `waits_s` in the queue, then prefilled in `prefill_s` (default 50 ms)."""
    n = len(waits_s)
    arrival = np.arange(n, dtype=float)
    scheduled = arrival + np.array(waits_s)
    ttft = scheduled + np.array(prefill_s or [0.05] * n) - arrival
    return pd.DataFrame(
        {
            "request_id": range(n),
            "arrival_s": arrival,
            "scheduled_s": scheduled,
            "first_token_s": arrival + ttft,
            "ttft_s": ttft,
            "finish_s": arrival + ttft + 1,
            "reject_reason": [None] * n,
            "requested_output_tokens": [10] * n,
            "prefill_end_s": [np.nan] * n,
            "stage_wait_s": [np.nan] * n,
        }
    )


def test_queue_growth_compares_the_first_and_last_thirds_by_arrival():
    assert queue_growth(_requests([0.1, 0.2, 0.3, 0.5, 0.5, 0.5, 0.9, 1.0, 1.1])) == pytest.approx((0.2, 1.0))
    stable = _requests([0.05, 0.01, 0.03, 0.2, 0.01, 0.02, 0.08, 0.1, 0.09])  # 3x, but by 60 ms only: noise
    growing = _requests([0.05, 0.01, 0.03, 0.2, 0.5, 0.6, 0.8, 1.0, 1.2])
    summary = {"completed": 9, "rejected": 0, "unfinished": 0, "not_arrived": 0, "output_throughput": 1.0}
    assert judge(_result(stable, summary), SloConfig()).ok
    assert judge(_result(growing, summary), SloConfig()).reasons == ("unstable queue",)


def test_queue_waits_add_the_hand_off_and_count_open_waits_to_the_stop():
    """P/D: request 0's prefill ended at 0.25 s, its first decode token came at 0.75 s; request 1's prefill ended at
    1.3 s and it still waits for the decode pool at the 4 s stop (2.7 s so far); request 2 is still queued for its
    prefill (arrived at 2 s: 2 s so far); request 3 was answered by an application cache, by no engine."""
    df = _requests([0.2, 0.25, 5.0, 0.0])
    df["prefill_end_s"] = [0.25, 1.3, np.nan, np.nan]
    df["first_token_s"] = [0.75, np.nan, np.nan, 3.0]
    df.loc[1:2, "finish_s"] = np.nan
    df.loc[2:3, "scheduled_s"] = np.nan
    assert queue_waits_s(df, 4.0) == pytest.approx([0.2 + 0.5, 0.25 + 2.7, 2.0, 0.0])
    no_stop = queue_waits_s(df.iloc[[0, 3]], None)
    assert no_stop == pytest.approx([0.7, 0.0])


def test_longer_later_prompts_on_an_idle_server_are_a_stable_queue(tmp_path):
    """One request every 2 s on Llama-3.1-8B: 200-token prompts, then 12,000-token ones. Each is scheduled at
    once; the last third's TTFT is its own ~0.5 s prefill, 10x the first third's, and the queue is still empty."""
    prompts = [200] * 10 + [6000] * 10 + [12000] * 10
    rows = [f"{2.0 * i},{p},20" for i, p in enumerate(prompts)]
    (tmp_path / "drift.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    workload = {
        "trace": {"format": "servesim", "path": str(tmp_path / "drift.csv")},
        "arrivals": {"kind": "trace"},
    }
    s = chat(workload=workload, slo={"ttft_ms": None, "tpot_ms": None})
    result = simulate(s, SCENARIOS)
    ttft, waits = result.requests["ttft_s"], result.requests["queue_s"]
    assert ttft[-10:].mean() > 2 * ttft[:10].mean() and ttft[-10:].mean() - ttft[:10].mean() > 0.25
    assert waits.max() < 0.05
    verdict = judge(result, s.slo, 0.5)
    assert verdict.ok, verdict.details
    assert verdict.metrics["wait_last_third_ms"] < 50


def _result(requests: pd.DataFrame, summary: dict):
    class Result:  # judge reads only the summary, the per-request table and the scenario's stop
        pass

    result = Result()
    result.requests, result.summary, result.scenario = requests, summary, chat()
    return result


def test_rate_needs_open_loop_arrivals_with_a_rate():
    s = chat(workload={"arrivals": {"kind": "all_at_once"}})
    with pytest.raises(SpecError, match="arrivals 'all_at_once' have no rate"):
        max_sustainable_rate(s, SCENARIOS)
    assert offered_rate(chat(), SCENARIOS) == 10
    unscaled = chat(workload={"arrivals": {"kind": "trace"}})
    assert offered_rate(unscaled, SCENARIOS) == pytest.approx(3.25, abs=0.01)  # the trace's own pace


def test_at_rate_sets_the_rate_of_every_arrival_kind_that_has_one():
    lengths = {"prompt": {"kind": "fixed", "value": 100}, "output": {"kind": "fixed", "value": 10}}
    poisson = chat(
        workload={"trace": None, "lengths": lengths, "arrivals": {"kind": "poisson", "rate_per_s": 3}}
    )
    assert at_rate(poisson, 7.0).workload.arrivals.rate_per_s == 7.0
    scaled = at_rate(chat(workload={"arrivals": {"kind": "trace", "time_scale": 2.0}}), 7.0).workload.arrivals
    assert (scaled.rate_per_s, scaled.time_scale) == (7.0, None)
    closed = chat(workload={"closed_loop": {"clients": 4}})
    with pytest.raises(SpecError, match="closed_loop"):
        at_rate(closed, 7.0)


def test_rejected_requests_fail_the_slos_and_end_the_search_at_once():
    """With max_model_len 2048 the engine refuses the trace's longest conversations: they count against
    slo_attainment and goodput, and capacity reports that no rate serves them instead of halving down to 0."""
    s = chat(engine={"max_model_len": 2048}, slo={"goodput_fraction": 0.5})
    result = simulate(at_rate(s, 5.0), SCENARIOS)
    summary, rejected = result.summary, result.summary["rejected"]
    assert 0 < rejected < 200 and summary["completed"] == 200 - rejected
    met = summary["slo_attainment"] * 200  # of every answered request, rejected ones included
    assert summary["request_goodput"] * summary["duration_s"] == pytest.approx(met)
    assert met <= summary["completed"]
    verdict = judge(result, s.slo, 5.0)
    assert "rejected" in verdict.reasons
    assert f"{rejected} of 200 requests rejected at any rate" in verdict.details[-1]
    assert "exceed max_model_len (2048)" in verdict.details[-1]
    capacity = max_sustainable_rate(s, SCENARIOS)
    assert capacity.rate_per_s == 0.0 and capacity.num_simulations == 1
    assert "rejected" in capacity.limit.reasons


def test_a_rejection_a_stop_at_a_lost_slo_kept_from_arriving_still_ends_the_search():
    """Overloaded from its first arrivals, the run stops once its TTFT SLO is lost, before the one conversation
    too long for max_model_len 7000 arrives (the quickstart trace's row 1501, 7979 tokens): it is still a
    request no rate serves, so the first rate's verdict says so and the search ends there."""
    s, base = load_scenario(
        SCENARIOS / "quickstart.yaml", ["workload.num_requests=2000", "engine.max_model_len=7000"]
    )
    result = simulate(at_rate(s, 100.0), base, stop_when_slo_lost=True)
    assert result.summary["slo_lost_at_s"] is not None and result.summary["rejected"] == 0
    assert result.summary["rejected_unsent"] == 1
    verdict = judge(result, s.slo, 100.0)
    assert "rejected" in verdict.reasons and "exceed max_model_len (7000)" in verdict.details[-1]
    capacity = max_sustainable_rate(s, base, start_rate_per_s=100.0, max_factor=64)
    assert capacity.rate_per_s == 0.0 and capacity.num_simulations == 1
    assert "rejected" in capacity.limit.reasons


def test_a_pass_on_a_run_shorter_than_a_minute_of_arrivals_comes_with_a_note():
    """400 requests at 30 req/s arrive within ~13 s: too short for a slowly growing queue to show, so a pass
    there carries a caution; one whose arrivals span 100 s does not, and neither does a failure."""
    short = check_rate(chat(workload={"num_requests": 400}), SCENARIOS, 30.0)
    span = short.metrics["arrival_span_s"]
    assert short.ok and 10 < span < 15
    assert f"span only {span:.0f} s" in CapacityResult(30.0, 1, [short]).short_run
    long = Verdict(20.0, (), (), {"arrival_span_s": 100.0})
    assert CapacityResult(20.0, 1, [long]).short_run is None
    assert (
        CapacityResult(0.0, 1, [Verdict(5.0, ("TTFT SLO",), ("slow",), {"arrival_span_s": 3.0})]).short_run
        is None
    )


def test_rates_are_counted_in_what_arrives():
    """A session workload's arrivals start sessions (later turns follow the answers); parallel sampling's are
    prompts of n requests: capacity and plan say so instead of req/s."""
    sessions = {
        "sessions": {
            "turns": {"kind": "fixed", "value": 3},
            "think_time_s": {"kind": "fixed", "value": 1.0},
            "new_message_tokens": {"kind": "fixed", "value": 50},
        }
    }
    assert chat().workload.rate_unit == "req/s"
    assert chat(workload=sessions).workload.rate_unit == "sessions/s"
    assert (
        chat(workload={"parallel_sampling": {"n": 4}, "num_requests": 400}).workload.rate_unit == "prompts/s"
    )
    result = max_sustainable_rate(chat(workload={**sessions, "num_requests": 300}), SCENARIOS, rel_tol=0.5)
    assert result.unit == "sessions/s" and result.as_dict()["rate_unit"] == "sessions/s"


def test_a_stop_before_the_last_arrival_is_not_a_backlog():
    """Requests due after stop.max_sim_time_s were never sent, and those in flight at the stop are cut off by
    design: neither is a queue that did not drain, so a light load still passes (it used to fail at any rate)."""
    s = chat(stop={"max_sim_time_s": 20.0})
    result = simulate(at_rate(s, 4.0), SCENARIOS)
    summary, requests = result.summary, result.requests
    assert summary["not_arrived"] == (requests["arrival_s"] > 20.0).sum() > 0
    assert summary["completed"] > 0
    verdict = judge(result, s.slo, 4.0)
    assert "unstable queue" not in verdict.reasons, verdict.details
    overloaded = simulate(at_rate(s, 60.0), SCENARIOS)  # the TTFT growth still tells a queue that grows
    assert "unstable queue" in judge(overloaded, s.slo, 60.0).reasons


def test_an_arrival_at_the_stop_itself_was_never_seen():
    """simpy's run(until=4) runs no event at 4: the request due then was not sent, so it is not a backlog."""
    s = chat(
        stop={"max_sim_time_s": 4.0},
        workload={"arrivals": {"kind": "constant", "rate_per_s": 1.0}, "num_requests": 5},
    )
    result = simulate(s, SCENARIOS)
    assert result.requests["arrival_s"].tolist()[-1] == 4.0
    assert (result.summary["unfinished"], result.summary["not_arrived"]) == (0, 1)
    assert "unstable queue" not in judge(result, s.slo, 1.0).reasons


def test_session_turns_a_stuck_queue_never_released_do_not_hide_its_backlog():
    """One slot, sessions arriving at 10/s, all first turns due before the 25 s stop: later turns are never
    released because the queue is stuck. They are not requests due after the stop, so the backlog still fails."""
    from servesim.simulator.scenario import load_scenario

    s, base = load_scenario(
        SCENARIOS / "agent_prefix_sharing.yaml",
        [
            "cluster={replicas: 1, router: round_robin}",
            "engine.max_num_seqs=1",
            "engine.queue_order=fcfs",
            "workload.num_requests=120",
            "workload.arrivals={kind: poisson, rate_per_s: 10}",
            "stop.max_sim_time_s=25",
            "slo={ttft_ms: 60000, tpot_ms: 1000}",
        ],
    )
    result = simulate(s, base)
    requests = result.requests
    assert requests["arrival_s"].isna().sum() > 0 and not (requests["arrival_s"] >= 25).any()
    assert result.summary["unfinished"] > 0
    assert "unstable queue" in judge(result, s.slo, 10.0).reasons


def test_a_backlog_cut_off_by_the_stop_counts_its_waits():
    """80 req/s for 5 s overloads one H100: only ~20 requests complete, the early fast ones, and ~350 wait. Their
    waits at the stop are lower bounds of their TTFTs: counted, the p90 TTFT misses its 500 ms (judged on the
    completed requests alone, the run used to pass at three times the sustainable rate)."""
    s = chat(workload={"num_requests": 600}, stop={"max_sim_time_s": 5.0})
    result = simulate(at_rate(s, 80.0), SCENARIOS)
    assert result.summary["completed"] < 30 < 300 < result.summary["unfinished"]
    assert result.summary["p90_ttft_ms"] < 500  # the completed ones
    verdict = judge(result, s.slo, 80.0)
    assert "TTFT SLO" in verdict.reasons and verdict.metrics["p90_ttft_ms"] > 1000


def test_requests_a_stop_leaves_undecided_or_unsent_are_not_goodput_misses():
    """At 10 req/s every completed request meets the SLOs; the two in flight at the 5 s stop could too, and turns
    of sessions not begun by the stop were never sent: none of them makes the goodput share fall below 90%."""
    s = chat(workload={"num_requests": 600}, stop={"max_sim_time_s": 5.0}, slo={"goodput_fraction": 0.9})
    result = simulate(at_rate(s, 10.0), SCENARIOS)
    assert result.summary["slo_undecided"] > 0 and result.summary["slo_attainment"] == 1.0
    verdict = judge(result, s.slo, 10.0)
    assert verdict.ok and verdict.metrics["goodput_share"] == 1.0
    sessions = {
        "turns": {"kind": "fixed", "value": 3},
        "think_time_s": {"kind": "fixed", "value": 1.0},
        "new_message_tokens": {"kind": "fixed", "value": 50},
    }
    s = chat(
        workload={"sessions": sessions, "num_requests": 300},
        stop={"max_sim_time_s": 20.0},
        slo={"goodput_fraction": 0.9},
    )
    result = simulate(at_rate(s, 2.0), SCENARIOS)
    assert result.summary["not_arrived"] > 100 and result.requests["arrival_s"].isna().any()
    assert judge(result, s.slo, 2.0).ok


def test_a_run_that_completes_nothing_fails():
    s = chat(stop={"max_sim_time_s": 0.05})
    verdict = judge(simulate(at_rate(s, 10.0), SCENARIOS), s.slo, 10.0)
    assert verdict.reasons == ("unstable queue",) and verdict.details == (
        "no request completed before the stop",
    )


@pytest.mark.parametrize("stop_s", [20.0, 21.0])
def test_a_stop_just_after_the_last_arrival_leaves_requests_in_flight_not_a_backlog(stop_s):
    """Arrivals over 20 s and a stop at 20 or 21 s: the last few requests are still running (each takes over a
    second), which is no queue that failed to drain, so a light load passes; an overload's queued requests,
    waiting longer than any answered one waited for its first token, still fail it."""
    s = chat(workload={"duration_s": 20.0, "num_requests": None}, stop={"max_sim_time_s": stop_s})
    result = simulate(at_rate(s, 4.0), SCENARIOS)
    assert result.summary["unfinished"] > 0 and result.summary["not_arrived"] == 0
    verdict = judge(result, s.slo, 4.0)
    assert verdict.ok, verdict.details
    overloaded = simulate(at_rate(s, 60.0), SCENARIOS)
    assert "unstable queue" in judge(overloaded, s.slo, 60.0).reasons


def test_a_search_that_never_fails_says_its_answer_is_a_lower_bound():
    """With generous SLOs and a ceiling of 2x the start, every rate tried passes: the result is the ceiling, and
    says so; the CLI prints it as "at least"."""
    from typer.testing import CliRunner

    from servesim.simulator.cli.main import app

    result = max_sustainable_rate(
        chat(slo={"ttft_ms": 1e9, "tpot_ms": 1e9}, workload={"num_requests": 60}),
        SCENARIOS,
        start_rate_per_s=0.5,
        max_factor=2.0,
    )
    assert (
        result.rate_per_s == 1.0 and result.search_limit_reached and result.as_dict()["search_limit_reached"]
    )
    assert not max_sustainable_rate(chat(), SCENARIOS, rel_tol=0.2).search_limit_reached
    args = [
        "capacity",
        str(SCENARIOS / "quickstart.yaml"),
        "--set",
        "slo={}",
        "--set",
        "workload.num_requests=30",
    ]
    ran = CliRunner().invoke(app, [*args, "--rel-tol", "0.5"])
    assert "sets no SLO" in ran.stdout
    # not on a terminal: a line per rate tried on stderr, as many as the simulations it reports
    tried = [line for line in ran.stderr.splitlines() if line.startswith("tried ")]
    simulations = int(ran.stdout.split(" simulations)")[0].rsplit("(", 1)[1])
    assert len(tried) == simulations and all(line.endswith((": ok", "unstable queue")) for line in tried)


def test_output_tokens_are_counted_per_arrival_of_the_rate_unit():
    """A plan prices its rate x output tokens per arrival: a prompt of n samples asks for n answers and a session
    for every turn's; a stop that leaves the longest answers in flight does not lower the figure (the mean over
    completed requests did, and overstated the cost per token)."""
    sessions = {
        "turns": {"kind": "fixed", "value": 3},
        "think_time_s": {"kind": "fixed", "value": 1.0},
        "new_message_tokens": {"kind": "fixed", "value": 50},
    }
    cases = [
        (chat(), 1),
        (chat(workload={"parallel_sampling": {"n": 4}, "num_requests": 400}), 4),
        (chat(workload={"sessions": sessions, "num_requests": 300}), 3),
    ]
    for s, answers_per_arrival in cases:
        result = simulate(at_rate(s, 5.0), SCENARIOS)
        requests = result.requests
        per_arrival = judge(result, s.slo, 5.0).metrics["output_tokens_per_arrival"]
        assert per_arrival == pytest.approx(answers_per_arrival * requests["requested_output_tokens"].mean())
        cut = simulate(
            at_rate(s.model_copy(update={"stop": s.stop.model_copy(update={"max_sim_time_s": 15.0})}), 5.0),
            SCENARIOS,
        )
        assert cut.summary["unfinished"] + cut.summary["not_arrived"] > 0
        assert judge(cut, s.slo, 5.0).metrics["output_tokens_per_arrival"] == per_arrival


def test_the_offered_rate_is_that_of_the_requests_the_run_draws(tmp_path):
    """A ServeGen workload's arrivals are drawn: the search starts from (and a plan targets) the rate of the
    requests the scenario's runs draw with its seed, not of another draw."""
    write_model(tmp_path / "model")
    workload = {
        "trace": {"format": "servegen", "path": "model"},
        "arrivals": {"kind": "trace"},
        "duration_s": 120,
        "num_requests": None,
        "lengths": None,
    }
    for seed in (3, 4):
        s = chat(seed=seed, workload=workload)
        arrivals = np.sort(simulate(s, tmp_path).requests["arrival_s"].to_numpy())
        assert offered_rate(s, tmp_path) == pytest.approx((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))


def test_the_offered_rate_of_parallel_samples_counts_prompts():
    """A prompt's 8 samples arrive together: the trace's own pace is its prompts', the unit at_rate sets."""
    sampled = chat(
        workload={"arrivals": {"kind": "trace"}, "parallel_sampling": {"n": 8}, "num_requests": 200}
    )
    prompts = chat(workload={"arrivals": {"kind": "trace"}, "num_requests": 25})
    assert offered_rate(sampled, SCENARIOS) == pytest.approx(offered_rate(prompts, SCENARIOS))
