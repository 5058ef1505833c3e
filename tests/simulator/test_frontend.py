"""The API server in front of each engine: FIFO per target, its time priced by the profile, exact under
fast-forward, absent for the offline LLM class."""

from __future__ import annotations

from pathlib import Path

import pytest
import simpy

from servesim.calibration.fit_runs import fit_to_runs
from servesim.hardware.errors import SpecError
from servesim.simulator.world.frontend import Frontend
from servesim.simulator.compare.measured import MeasuredRun, scenario_for
from tests.simulator.conftest import run, scenario
from servesim.workloads.request import Request


class _Target:
    """A routed target as the API server sees it."""

    entering = 0


def test_each_target_serves_its_requests_one_at_a_time():
    """10 ms + 10 us per prompt token: 1,000-token prompts take 20 ms each, queued behind each other at one
    target and side by side at two; each target counts those in its server until they are handed over."""
    env = simpy.Environment()
    frontend = Frontend(env, 0.010, 1e-5)
    handed: list[tuple[int, float]] = []
    one, two = _Target(), _Target()
    for i, target in enumerate((one, one, one, two)):
        frontend.submit(Request(i, 0.0, 1000, 1), target, lambda r: handed.append((r.id, env.now)))
    assert frontend.next_hand_over_s() == pytest.approx(0.020)
    assert (one.entering, two.entering) == (3, 1)
    env.run(until=0.030)
    assert (one.entering, two.entering) == (2, 0)
    env.run()
    assert (one.entering, two.entering) == (0, 0)
    assert handed == [
        (0, pytest.approx(0.020)),
        (3, pytest.approx(0.020)),
        (1, pytest.approx(0.040)),
        (2, pytest.approx(0.060)),
    ]
    assert frontend.next_hand_over_s() == float("inf")


def test_the_latency_delays_each_request_without_holding_the_server():
    """2 ms serial per request plus 5 ms on the way: hand-overs at 7, 9, 11 ms, not 7, 14, 21."""
    env = simpy.Environment()
    frontend = Frontend(env, 0.002, 0.0, latency_s=0.005)
    handed: list[float] = []
    target = _Target()
    for i in range(3):
        frontend.submit(Request(i, 0.0, 1000, 1), target, lambda r: handed.append(env.now))
    env.run()
    assert handed == pytest.approx([0.007, 0.009, 0.011])


def _profile(tmp_path, request_s: float, token_s: float) -> str:
    path = tmp_path / "api.yaml"
    path.write_text(f"name: api\napi_request_s: {request_s}\napi_token_s: {token_s}\n")
    return str(path)


def _spaced(profile: str, fast_forward: bool = True, api_server: bool = True, every_s: float = 2.0):
    """Fixed 1,000-token prompts sent every `every_s` seconds, 100 tokens out each."""
    return run(
        scenario(
            hardware={"gpu": "h100-sxm", "profile": profile},
            engine={"max_model_len": 16384, "api_server": api_server},
            simulation={"fast_forward": fast_forward},
            workload={
                "trace": None,
                "lengths": {
                    "prompt": {"kind": "fixed", "value": 1000},
                    "output": {"kind": "fixed", "value": 100},
                },
                "arrivals": {"kind": "constant", "rate_per_s": 1 / every_s},
                "num_requests": 20,
            },
        )
    )


def test_an_idle_engine_sees_a_request_after_its_api_server_time(tmp_path):
    """Requests 2 s apart find the engine idle: each waits exactly its API-server time (5 ms + 1,000 x 3 us)
    before its first step, and its TTFT grows by as much."""
    profile = _profile(tmp_path, 0.005, 3e-6)
    served = _spaced(profile).requests
    assert served["queue_s"].to_numpy() == pytest.approx([0.008] * 20)
    offline = _spaced(profile, api_server=False).requests
    assert offline["queue_s"].to_numpy() == pytest.approx([0.0] * 20)
    assert served["ttft_s"].to_numpy() == pytest.approx(offline["ttft_s"].to_numpy() + 0.008)


def test_hand_overs_during_decode_stretches_are_exact(tmp_path):
    """Requests sent every 0.3 s reach a decoding engine 8 ms later: fast-forwarded stretches must stop there,
    so the run is the same stepped one by one."""
    profile = _profile(tmp_path, 0.005, 3e-6)
    fast = _spaced(profile, every_s=0.3)
    stepped = _spaced(profile, fast_forward=False, every_s=0.3)
    columns = ["arrival_s", "scheduled_s", "first_token_s", "finish_s"]
    assert (fast.requests["queue_s"] > 0.008 - 1e-12).all()
    assert fast.requests[columns].to_numpy() == pytest.approx(stepped.requests[columns].to_numpy(), rel=1e-12)


def _busy(
    profile: str, fast_forward: bool, async_scheduling: bool, replicas: int = 1, max_model_len: int = 16384
):
    """Poisson arrivals at 8 req/s onto a decoding engine: many arrivals fall inside decode stretches."""
    return scenario(
        hardware={"gpu": "h100-sxm", "profile": profile},
        engine={"max_model_len": max_model_len, "async_scheduling": async_scheduling},
        cluster={"replicas": replicas},
        simulation={"fast_forward": fast_forward},
        workload={
            "trace": None,
            "lengths": {
                "prompt": {"kind": "uniform", "low": 200, "high": 3000},
                "output": {"kind": "uniform", "low": 20, "high": 400},
            },
            "arrivals": {"kind": "poisson", "rate_per_s": 8.0},
            "num_requests": 120,
        },
    )


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("max_model_len", [16384, 2000])
def test_stretches_fused_past_arrivals_end_at_their_hand_overs_to_the_bit(
    tmp_path, async_scheduling, max_model_len
):
    """With one engine behind the API server, an arrival shows the engine nothing until its hand-over, so decode
    stretches run on past arrivals: every request and step is still the stepped run's, bit for bit. Under a 2,000
    token limit some prompts are refused on arrival and hold no API server, so the request after one may be handed
    over sooner than the refused one would have been."""
    profile = _profile(tmp_path, 0.004, 5e-6)
    fast, stepped = (
        run(_busy(profile, ff, async_scheduling, max_model_len=max_model_len)) for ff in (True, False)
    )
    assert (fast.requests["reject_reason"].notna().sum() > 0) == (max_model_len == 2000)
    assert fast.requests.equals(stepped.requests) and fast.steps.equals(stepped.steps)
    assert fast.summary == stepped.summary


def test_the_engines_horizon_is_the_next_arrivals_hand_over_when_nothing_sees_the_arrival(tmp_path):
    """One engine: the next outside event is when the next request reaches it, not when it reaches the API server;
    with two replicas the router sees each arrival, so the arrival itself is the horizon."""
    from servesim.simulator.world.run import World

    profile = _profile(tmp_path, 0.004, 5e-6)
    for replicas, seen in ((1, False), (2, True)):
        world = World(_busy(profile, True, True, replicas), Path.cwd())
        world.env.run(until=3.0)
        req, enters_s = world.traffic.next_entry()
        pending = world.frontend.next_hand_over_s()
        target = world.pools[0].targets[0]
        expected = enters_s if seen else world.frontend.hand_over_s(req, target, enters_s)
        assert world._next_event_s() == min(expected, pending)
        assert seen or expected >= enters_s + 0.004 + 5e-6 * req.num_prompt_tokens - 1e-12


def test_offline_benchmarks_replay_without_an_api_server():
    base = dict(source="test", gpu="h100-sxm", model="llama-3.1-8b", input_len=128, output_len=128)
    latency = MeasuredRun(**base, benchmark="latency", batch_size=8, measured={"latency_s": 1.0})
    serve = MeasuredRun(**base, benchmark="serve", num_prompts=8, measured={"median_ttft_ms": 10.0})
    assert not scenario_for(latency).engine.api_server
    assert scenario_for(serve).engine.api_server


def test_api_terms_are_fitted_only_to_runs_through_an_api_server():
    base = dict(source="test", gpu="h100-sxm", model="llama-3.1-8b", input_len=128, output_len=128)
    latency = MeasuredRun(**base, benchmark="latency", batch_size=8, measured={"latency_s": 1.0})
    with pytest.raises(SpecError, match="cannot tell api_request_s apart"):
        fit_to_runs([latency], [], only=["api_request_s"])


@pytest.mark.parametrize("router", ["least_outstanding", "prefix_affinity"])
def test_routers_count_the_requests_in_each_api_server(tmp_path, router):
    """32 requests sent at once to 4 replicas behind their API servers: a router counts each request from when it
    sends it (SGLang's gateway increments a worker's load as it forwards), so least-outstanding deals them 8 a
    replica, and the cache-aware router's balance check spreads a burst sharing one prefix once a replica is 64
    ahead, where neither saw a request before its engine had it."""
    burst = 32 if router == "least_outstanding" else 300
    result = run(
        scenario(
            hardware={"gpu": "h100-sxm", "profile": _profile(tmp_path, 0.005, 3e-6)},
            cluster={"replicas": 4, "router": router},
            workload={
                "trace": None,
                "lengths": {
                    "prompt": {"kind": "fixed", "value": 500},
                    "output": {"kind": "fixed", "value": 20},
                },
                "shared_prefix": {"num_prefixes": 1, "prefix_tokens": 1500},
                "arrivals": {"kind": "all_at_once"},
                "num_requests": burst,
            },
        )
    )
    counts = result.requests["replica"].value_counts().sort_index().tolist()
    if router == "least_outstanding":
        assert counts == [8, 8, 8, 8]
    else:
        assert len(counts) == 4 and max(counts) < burst / 2
