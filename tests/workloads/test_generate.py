"""build_workload: trace and synthetic workloads, prefix segments, determinism."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim.workloads.arrivals import mean_rate_per_s
from servesim.workloads.config import WorkloadConfig
from servesim.workloads.generate import Workload, build_table, build_workload
from servesim.workloads.request import Request, output_segment_id
from tests.workloads.paths import QUICKSTART_TRACE

QUICKSTART = {"format": "azure", "path": "traces/azure_conv_1h_first2000.csv"}
SCENARIOS_DIR = QUICKSTART_TRACE.parent.parent
SYNTHETIC = {
    "lengths": {
        "prompt": {"kind": "lognormal", "median": 800, "sigma": 1.0},
        "output": {"kind": "uniform", "low": 1, "high": 400},
    },
    "arrivals": {"kind": "gamma", "rate_per_s": 4.0, "cv": 2.0},
    "duration_s": 300,
}


def build(seed: int = 0, base_dir: Path = SCENARIOS_DIR, **fields) -> Workload:
    return build_workload(WorkloadConfig.model_validate(fields), np.random.default_rng(seed), base_dir)


def fields(r: Request) -> tuple:
    return (
        r.id,
        r.arrival_s,
        r.num_prompt_tokens,
        r.num_output_tokens,
        r.prompt_segments,
        r.session_id,
        r.priority,
    )


def arrivals(w: Workload) -> np.ndarray:
    return np.array([r.arrival_s for r in w.requests])


def test_quickstart_trace_replays_as_is():
    w = build(trace=QUICKSTART, arrivals={"kind": "trace"})
    assert len(w.requests) == 2000 and [r.id for r in w.requests] == list(range(2000))
    assert fields(w.requests[0]) == (0, 0.0, 374, 44, ((-1, 374),), None, 0)
    assert w.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert mean_rate_per_s(arrivals(w)) == pytest.approx(4.7117, rel=1e-4)
    assert np.all(np.diff(arrivals(w)) >= 0) and w.closed_loop is None


def test_trace_rescaled_to_a_target_rate():
    w = build(trace=QUICKSTART, arrivals={"kind": "trace", "rate_per_s": 20.0}, num_requests=1500)
    assert len(w.requests) == 1500
    assert mean_rate_per_s(arrivals(w)) == pytest.approx(20.0, rel=1e-9)


def test_a_rescaled_trace_keeps_its_rate_within_a_duration_and_over_the_sessions_it_starts():
    """The conversation trace's first 2,000 rows run at 4.71 req/s, its first 600 faster or slower: asked for
    20 req/s over 30 s, the run keeps 600 rows at exactly 20/s (stretched over all 2,000, then cut at 30 s, the
    rate would be the first rows' own). With 3-turn sessions num_requests counts turns: 900 of them start 300
    sessions, which arrive at the rate asked for, and no note says rows ran out."""
    w = build(trace=QUICKSTART, arrivals={"kind": "trace", "rate_per_s": 20.0}, duration_s=30.0)
    assert len(w.requests) == 600 and mean_rate_per_s(arrivals(w)) == pytest.approx(20.0, rel=1e-9)
    assert arrivals(w).max() < 30.0
    sessions = {
        "turns": {"kind": "fixed", "value": 3},
        "think_time_s": {"kind": "fixed", "value": 1.0},
        "new_message_tokens": {"kind": "fixed", "value": 50},
    }
    w = build(
        trace=QUICKSTART, arrivals={"kind": "trace", "rate_per_s": 5.0}, num_requests=900, sessions=sessions
    )
    assert len(w.requests) == 300 and len(w.followups) == 600 and not w.notes
    assert mean_rate_per_s(arrivals(w)) == pytest.approx(5.0, rel=1e-9)
    short = build(
        trace=QUICKSTART,
        arrivals={"kind": "poisson", "rate_per_s": 5.0},
        num_requests=9000,
        sessions=sessions,
    )
    assert len(short.requests) == 2000 and "the run has 6000 requests in 2000 sessions" in short.notes[0]


def test_a_rate_that_one_arrival_cannot_have_names_the_trace_and_field():
    with pytest.raises(
        ValueError, match=r"azure_conv_1h_first2000.csv: arrivals.rate_per_s: mean rate needs >= 2"
    ):
        build(trace=QUICKSTART, arrivals={"kind": "trace", "rate_per_s": 5.0}, num_requests=1)


def test_trace_time_scale_duration_and_skip():
    base = arrivals(build(trace=QUICKSTART, arrivals={"kind": "trace"}))
    scaled = arrivals(build(trace=QUICKSTART, arrivals={"kind": "trace", "time_scale": 0.5}))
    assert np.allclose(scaled, base / 2)
    cut = arrivals(build(trace=QUICKSTART, arrivals={"kind": "trace"}, duration_s=60.0))
    assert cut.max() < 60.0 and len(cut) == (base < 60.0).sum()
    skipped = build(trace=QUICKSTART, arrivals={"kind": "trace"}, skip_requests=100).requests
    assert len(skipped) == 1900 and skipped[0].arrival_s == 0 and skipped[0].id == 0
    assert np.allclose(arrivals(Workload(skipped)), base[100:] - base[100])


def test_relative_paths_resolve_against_base_dir(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path / "traces")):
        build(trace=QUICKSTART, arrivals={"kind": "trace"}, base_dir=tmp_path)
    absolute = dict(QUICKSTART, path=str(QUICKSTART_TRACE))
    assert len(build(trace=absolute, arrivals={"kind": "trace"}, base_dir=tmp_path).requests) == 2000


def test_trace_lengths_with_synthetic_arrivals():
    w = build(trace=QUICKSTART, arrivals={"kind": "poisson", "rate_per_s": 50.0}, num_requests=300)
    assert [r.num_prompt_tokens for r in w.requests[:2]] == [374, 396]  # trace rows in order
    assert len(w.requests) == 300 and mean_rate_per_s(arrivals(w)) == pytest.approx(50, rel=0.15)
    every_row = build(trace=QUICKSTART, arrivals={"kind": "all_at_once"})
    assert len(every_row.requests) == 2000 and arrivals(every_row).max() == 0


def test_a_trace_that_runs_out_of_rows_says_so():
    """One request per row: 2000 rows at 20/s last ~100 s, short of the 600 s (or 5000 requests) asked for."""
    path = SCENARIOS_DIR / QUICKSTART["path"]
    w = build(trace=QUICKSTART, arrivals={"kind": "poisson", "rate_per_s": 20.0}, duration_s=600)
    assert len(w.requests) == 2000
    assert w.notes == (
        f"{path}: its 2000 usable rows ran out before duration_s 600: the run has 2000 arrivals, "
        f"the last at {w.requests[-1].arrival_s:.1f} s",
    )
    many = build(trace=QUICKSTART, arrivals={"kind": "all_at_once"}, num_requests=5000)
    assert many.notes == (
        f"{path}: its 2000 usable rows ran out before num_requests 5000: the run has 2000 "
        "arrivals, the last at 0.0 s",
    )
    assert (
        build(trace=QUICKSTART, arrivals={"kind": "poisson", "rate_per_s": 20.0}, duration_s=60).notes == ()
    )
    assert build(trace=QUICKSTART, arrivals={"kind": "all_at_once"}).notes == ()
    # num_requests, not the rows, ended it; a trace's own times end with it (ServeGen fills its duration so)
    assert (
        build(
            trace=QUICKSTART,
            arrivals={"kind": "poisson", "rate_per_s": 20.0},
            duration_s=600,
            num_requests=2000,
        ).notes
        == ()
    )
    assert build(trace=QUICKSTART, arrivals={"kind": "trace"}, duration_s=100_000).notes == ()


def test_synthetic_lengths_with_trace_arrivals():
    w = build(
        trace=QUICKSTART,
        arrivals={"kind": "trace"},
        num_requests=50,
        lengths={"prompt": {"kind": "fixed", "value": 64}, "output": {"kind": "fixed", "value": 8}},
    )
    assert {(r.num_prompt_tokens, r.num_output_tokens) for r in w.requests} == {(64, 8)}
    assert w.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-6)


def test_synthetic_workload_and_closed_loop():
    w = build(**SYNTHETIC)
    assert 1000 < len(w.requests) < 1400 and arrivals(w).max() < 300
    assert all(1 <= r.num_output_tokens <= 400 for r in w.requests)
    loop = build(**dict(SYNTHETIC, num_requests=64, closed_loop={"clients": 8}))
    assert len(loop.requests) == 64 and loop.closed_loop.clients == 8


def test_same_seed_same_requests_different_seed_different():
    a, b, c = (build(seed=s, **SYNTHETIC).requests for s in (7, 7, 8))
    assert [fields(r) for r in a] == [fields(r) for r in b]
    assert [fields(r) for r in a] != [fields(r) for r in c]
    tables = [
        build_table(WorkloadConfig.model_validate(SYNTHETIC), np.random.default_rng(7), SCENARIOS_DIR)
        for _ in range(2)
    ]
    pd.testing.assert_frame_equal(*tables)


def test_a_faster_rate_over_the_same_duration_keeps_the_same_lengths():
    """Common random numbers: the arrivals' stream is not the lengths', so request i has the same prompt and
    output at 4/s and at 4.4/s (only the count and the times differ)."""
    slow, fast = (
        build(seed=3, **{**SYNTHETIC, "arrivals": {"kind": "gamma", "rate_per_s": r, "cv": 2.0}}).requests
        for r in (4.0, 4.4)
    )
    assert len(fast) > len(slow) > 1000
    assert [(r.num_prompt_tokens, r.num_output_tokens) for r in slow] == [
        (r.num_prompt_tokens, r.num_output_tokens) for r in fast[: len(slow)]
    ]
    assert [r.arrival_s for r in slow] != [r.arrival_s for r in fast[: len(slow)]]


def test_empirical_lengths_resample_a_trace_column():
    w = build(
        lengths={
            "prompt": {"kind": "empirical", "trace": QUICKSTART, "column": "prompt"},
            "output": {"kind": "empirical", "trace": QUICKSTART, "column": "output"},
        },
        arrivals={"kind": "constant", "rate_per_s": 10},
        num_requests=500,
    )
    trace = pd.read_csv(QUICKSTART_TRACE)
    assert {r.num_prompt_tokens for r in w.requests} <= set(trace["ContextTokens"])
    assert {r.num_output_tokens for r in w.requests} <= set(trace["GeneratedTokens"])


def test_mooncake_blocks_become_segments(tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 512, "output_length": 7, "hash_ids": [0]},
    ]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = build(trace={"format": "mooncake", "path": "mc.jsonl"}, arrivals={"kind": "trace"}, base_dir=tmp_path)
    assert [r.prompt_segments for r in w.requests] == [((0, 512), (1, 512), (2, 76)), ((0, 512),)]
    assert w.requests[1].arrival_s == 1.5


def test_real_mooncake_segments_cover_the_prompt(traces_dir):
    w = build(
        trace={"format": "mooncake", "path": str(traces_dir / "mooncake_synthetic/synthetic_trace.jsonl")},
        arrivals={"kind": "trace"},
    )
    assert len(w.requests) == 3993
    for r in w.requests:
        assert sum(n for _, n in r.prompt_segments) == r.num_prompt_tokens
        assert all(n == 512 for _, n in r.prompt_segments[:-1]) and 1 <= r.prompt_segments[-1][1] <= 512


def test_servesim_prefixes_sessions_and_priorities(tmp_path):
    pd.DataFrame(
        [
            {
                "arrival_s": 0.0,
                "prompt_tokens": 300,
                "output_tokens": 9,
                "session_id": 4,
                "priority": 1,
                "prefix_id": 0,
                "prefix_tokens": 200,
            },
            {
                "arrival_s": 0.5,
                "prompt_tokens": 120,
                "output_tokens": 9,
                "session_id": None,
                "priority": None,
                "prefix_id": None,
                "prefix_tokens": None,
            },
            {
                "arrival_s": 1.0,
                "prompt_tokens": 200,
                "output_tokens": 9,
                "session_id": 4,
                "priority": 0,
                "prefix_id": 0,
                "prefix_tokens": 200,
            },
            {
                "arrival_s": 2.0,
                "prompt_tokens": 250,
                "output_tokens": 9,
                "session_id": 5,
                "priority": 2,
                "prefix_id": 3,
                "prefix_tokens": 50,
            },
        ]
    ).to_csv(tmp_path / "mine.csv", index=False)
    w = build(trace={"format": "servesim", "path": "mine.csv"}, arrivals={"kind": "trace"}, base_dir=tmp_path)
    assert [r.prompt_segments for r in w.requests] == [
        ((0, 200), (-1, 100)),
        ((-2, 120),),
        ((0, 200),),
        ((3, 50), (-4, 200)),
    ]
    assert [r.session_id for r in w.requests] == [4, None, 4, 5]
    assert [r.priority for r in w.requests] == [1, 0, 0, 2]
    prefix_ids = {s for r in w.requests for s, _ in r.prompt_segments[:1]}
    unique_ids = {s for r in w.requests for s, _ in r.prompt_segments[1:]}
    assert prefix_ids.isdisjoint(unique_ids)


def test_a_trace_sessions_later_turn_that_resends_the_conversation_starts_with_it(tmp_path):
    """A chat client resends the conversation: a turn whose prompt is at least the session's previous prompt and
    answer starts with them (the previous turn's runs, then its generated tokens), the rest its own; a turn
    shorter than that shares nothing. Turns count on within each session; synthetic lengths share nothing."""
    rows = [  # arrival_s, prompt_tokens, output_tokens, session_id
        (0.0, 100, 50, 7),
        (0.5, 80, 10, 8),
        (5.0, 200, 40, 7),  # 150 resent + 50 new
        (6.0, 60, 10, 8),  # shorter than 80 + 10: a new question alone
        (10.0, 290, 5, 7),  # exactly 200 + 40 resent + 50 new
    ]
    lines = "".join(f"{t},{p},{o},{sid}\n" for t, p, o, sid in rows)
    (tmp_path / "chat.csv").write_text("arrival_s,prompt_tokens,output_tokens,session_id\n" + lines)
    w = build(trace={"format": "servesim", "path": "chat.csv"}, arrivals={"kind": "trace"}, base_dir=tmp_path)
    answer = [(output_segment_id(i), o) for i, (_, _, o, _) in enumerate(rows)]
    assert [r.prompt_segments for r in w.requests] == [
        ((-1, 100),),
        ((-2, 80),),
        ((-1, 100), answer[0], (-3, 50)),
        ((-4, 60),),
        ((-1, 100), answer[0], (-3, 50), answer[2], (-5, 50)),
    ]
    assert [r.turn for r in w.requests] == [0, 0, 1, 1, 2]
    assert all(sum(n for _, n in r.prompt_segments) == r.num_prompt_tokens for r in w.requests)
    drawn = build(
        trace={"format": "servesim", "path": "chat.csv"},
        arrivals={"kind": "trace"},
        lengths={"prompt": {"kind": "fixed", "value": 500}, "output": {"kind": "fixed", "value": 5}},
        base_dir=tmp_path,
    )
    assert [r.prompt_segments for r in drawn.requests] == [((-(i + 1), 500),) for i in range(5)]
    assert [r.turn for r in drawn.requests] == [0, 0, 1, 1, 2]
    prefixed = build(
        trace={"format": "servesim", "path": "chat.csv"},
        arrivals={"kind": "trace"},
        shared_prefix={"num_prefixes": 5, "prefix_tokens": 100},
        base_dir=tmp_path,
    )  # each turn its own drawn prefix, none the conversation's
    assert all(
        len(r.prompt_segments) <= 2 and r.prompt_segments[-1][0] == -(i + 1)
        for i, r in enumerate(prefixed.requests)
    )


def test_trace_without_timestamps_cannot_drive_trace_arrivals(tmp_path):
    pd.DataFrame({"arrival_s": [None, None], "prompt_tokens": [5, 6], "output_tokens": [1, 2]}).to_csv(
        tmp_path / "untimed.csv", index=False
    )
    with pytest.raises(ValueError, match="no timestamps"):
        build(
            trace={"format": "servesim", "path": "untimed.csv"}, arrivals={"kind": "trace"}, base_dir=tmp_path
        )
    w = build(
        trace={"format": "servesim", "path": "untimed.csv"},
        arrivals={"kind": "constant", "rate_per_s": 1},
        num_requests=10,
        base_dir=tmp_path,
    )
    assert arrivals(w).tolist() == [0.0, 1.0]


def test_skip_past_the_end_is_an_error():
    with pytest.raises(ValueError, match="skip_requests"):
        build(trace=QUICKSTART, arrivals={"kind": "trace"}, skip_requests=2000)


def test_servegen_workload_is_deterministic(traces_dir):
    cfg = {
        "trace": {"format": "servegen", "path": str(traces_dir / "servegen/reason/deepseek-r1")},
        "arrivals": {"kind": "trace"},
        "duration_s": 300,
    }
    a, b = (build(seed=3, **cfg).requests for _ in range(2))
    assert len(a) > 1000 and [fields(r) for r in a] == [fields(r) for r in b]
    assert max(r.arrival_s for r in a) < 300
