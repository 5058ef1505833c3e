"""Shared prefixes, sessions, parallel sampling, semantic clusters, and the ideal prefix-hit reference."""

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from servesim.workloads.config import WorkloadConfig
from servesim.workloads.generate import Workload, build_workload
from servesim.workloads.prefix_stats import ideal_prefix_hit_tokens
from servesim.workloads.prefixes import zipf_probs
from servesim.workloads.request import OUTPUT_SEGMENT_BASE, Request, output_segment_id
from tests.workloads.paths import QUICKSTART_TRACE

SCENARIOS_DIR = QUICKSTART_TRACE.parent.parent
QUICKSTART = {"format": "azure", "path": "traces/azure_conv_1h_first2000.csv"}
LENGTHS = {
    "prompt": {"kind": "uniform", "low": 20, "high": 300},
    "output": {"kind": "uniform", "low": 1, "high": 200},
}
PREFIX = {
    "num_prefixes": 5,
    "prefix_tokens": {"kind": "uniform", "low": 100, "high": 2000},
    "zipf_s": 1.0,
    "share": 0.7,
}
SESSIONS = {
    "turns": {"kind": "uniform", "low": 1, "high": 6},
    "think_time_s": {"kind": "fixed", "value": 3},
    "new_message_tokens": {"kind": "lognormal", "median": 40, "sigma": 0.5},
}


def build(seed: int = 0, base_dir: Path = SCENARIOS_DIR, **fields) -> Workload:
    return build_workload(WorkloadConfig.model_validate(fields), np.random.default_rng(seed), base_dir)


def synthetic(seed: int = 0, num_requests: int = 4000, **fields) -> Workload:
    return build(
        seed,
        lengths=LENGTHS,
        arrivals={"kind": "poisson", "rate_per_s": 10},
        num_requests=num_requests,
        **fields,
    )


def every_request(w: Workload) -> list[Request]:
    return sorted([*w.requests, *w.followups.values()], key=lambda r: r.id)


def state(w: Workload) -> tuple:
    def fields(r: Request) -> tuple:
        return (
            r.id,
            r.arrival_s,
            r.num_prompt_tokens,
            r.num_output_tokens,
            r.prompt_segments,
            r.session_id,
            r.priority,
            r.turn,
            r.think_time_s,
            r.semantic_cluster,
        )

    return [fields(r) for r in w.requests], {k: fields(r) for k, r in w.followups.items()}


def assert_runs_cover_prompts(requests: list[Request]) -> None:
    for r in requests:
        assert r.prompt_segments, f"request {r.id} has no explicit segments"
        assert sum(n for _, n in r.prompt_segments) == r.num_prompt_tokens
        assert all(n >= 1 for _, n in r.prompt_segments)


def test_request_segments_and_output_ids():
    assert Request(3, 0.0, 50, 5).segments() == ((-4, 50),)
    assert Request(3, 0.0, 50, 5, prompt_segments=((7, 20), (-4, 30))).segments() == ((7, 20), (-4, 30))
    assert OUTPUT_SEGMENT_BASE == 2**48 and output_segment_id(5) == 2**48 + 5


def test_prefix_popularity_is_zipf_and_prompt_includes_the_prefix():
    plain = synthetic()
    w = synthetic(shared_prefix=PREFIX)
    assert_runs_cover_prompts(w.requests)
    with_prefix = [r for r in w.requests if r.prompt_segments[0][0] >= 0]
    assert len(with_prefix) / len(w.requests) == pytest.approx(0.7, abs=0.03)
    counts = Counter(r.prompt_segments[0][0] for r in with_prefix)
    ranked = [counts[k] for k in range(5)]
    assert ranked == sorted(ranked, reverse=True)  # prefix 0 is the most popular, then 1, ...
    assert np.allclose(np.array(ranked) / len(with_prefix), zipf_probs(5, 1.0), atol=0.02)
    for r, p in zip(w.requests, plain.requests):  # own part keeps its drawn length, after the prefix
        own = r.prompt_segments[-1]
        assert own == (-(r.id + 1), p.num_prompt_tokens)
        assert r.num_prompt_tokens == p.num_prompt_tokens + sum(n for s, n in r.prompt_segments if s >= 0)


def test_a_prefix_is_the_same_run_in_every_request_that_uses_it():
    w = synthetic(num_requests=500, shared_prefix=PREFIX)
    runs = {}
    for r in w.requests:
        first = r.prompt_segments[0]
        if first[0] >= 0:
            assert runs.setdefault(first[0], first) == first
    assert sorted(runs) == [0, 1, 2, 3, 4] and len({n for _, n in runs.values()}) > 1  # drawn per prefix
    fixed = synthetic(num_requests=50, shared_prefix=dict(PREFIX, prefix_tokens=64, zipf_s=0, share=1))
    assert {r.prompt_segments[0][1] for r in fixed.requests} == {64}


def test_uniform_popularity_with_zipf_s_zero():
    w = synthetic(shared_prefix=dict(PREFIX, zipf_s=0, share=1))
    counts = Counter(r.prompt_segments[0][0] for r in w.requests)
    assert all(abs(c / 4000 - 0.2) < 0.025 for c in counts.values()) and len(counts) == 5


def test_session_turns_extend_the_previous_prompt_with_its_answer():
    w = synthetic(num_requests=600, shared_prefix=PREFIX, sessions=SESSIONS)
    assert w.followups and all(r.turn == 0 and r.think_time_s == 0 for r in w.requests)
    assert_runs_cover_prompts(every_request(w))
    for prev_id, nxt in w.followups.items():
        prev = next(r for r in every_request(w) if r.id == prev_id)
        answer = (output_segment_id(prev.id), prev.num_output_tokens)
        assert nxt.prompt_segments[: len(prev.prompt_segments) + 1] == prev.prompt_segments + (answer,)
        message = nxt.prompt_segments[-1]
        assert message[0] == -(nxt.id + 1) and len(nxt.prompt_segments) == len(prev.prompt_segments) + 2
        assert nxt.num_prompt_tokens == prev.num_prompt_tokens + prev.num_output_tokens + message[1]
        assert (nxt.session_id, nxt.turn, nxt.think_time_s) == (prev.session_id, prev.turn + 1, 3.0)
        assert math.isnan(nxt.arrival_s)


def test_followups_form_chains_over_dense_unique_ids():
    w = synthetic(num_requests=600, sessions=SESSIONS)
    everyone = every_request(w)
    assert [r.id for r in everyone] == list(range(600))  # num_requests counts every turn
    assert [r.id for r in w.requests] == list(range(len(w.requests)))
    assert list(np.diff([r.arrival_s for r in w.requests]) >= 0) == [True] * (len(w.requests) - 1)
    assert {r.session_id for r in w.requests} == {r.id for r in w.requests}
    assert len({id(r) for r in w.followups.values()}) == len(w.followups)
    seen = set()
    for first in w.requests:  # walking each chain from its first turn reaches every follow-up exactly once
        r, turn = first, 0
        while r.id in w.followups:
            r, turn = w.followups[r.id], turn + 1
            assert r.turn == turn and r.session_id == first.id and r.id not in seen
            seen.add(r.id)
        assert turn <= 5
    assert seen == {r.id for r in w.followups.values()}
    turns = Counter(r.session_id for r in everyone)
    assert max(turns.values()) == 6 and min(turns.values()) == 1


def test_max_prompt_tokens_ends_sessions_early():
    capped = synthetic(num_requests=600, sessions=dict(SESSIONS, max_prompt_tokens=500))
    assert all(r.num_prompt_tokens <= 500 for r in capped.followups.values())
    assert len(capped.requests) > len(synthetic(num_requests=600, sessions=SESSIONS).requests)


def test_session_turns_past_what_a_run_takes_are_refused_before_they_are_drawn():
    """Every possible follow-up is drawn up front: a billion turns a session was a 90 GB allocation."""
    turns = dict(SESSIONS, turns={"kind": "fixed", "value": 10**9})
    with pytest.raises(
        ValueError,
        match="gives 12 sessions 11,999,999,988 follow-up turns, more than the "
        "100,000,000 requests a run takes",
    ):
        synthetic(num_requests=12, sessions=turns)


def test_sessions_over_a_trace_resample_its_outputs():
    w = build(trace=QUICKSTART, arrivals={"kind": "trace"}, num_requests=300, sessions=SESSIONS)
    trace_outputs = {
        r.num_output_tokens for r in build(trace=QUICKSTART, arrivals={"kind": "trace"}).requests
    }
    assert {r.num_output_tokens for r in w.followups.values()} <= trace_outputs
    assert w.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert_runs_cover_prompts(every_request(w))


def test_parallel_sampling_gives_n_identical_prompts_at_one_arrival():
    w = synthetic(num_requests=400, parallel_sampling={"n": 4}, shared_prefix=PREFIX)
    assert [r.id for r in w.requests] == list(range(400)) and not w.followups
    assert_runs_cover_prompts(w.requests)
    groups = [w.requests[i : i + 4] for i in range(0, 400, 4)]
    for g in groups:
        assert len({r.prompt_segments for r in g}) == 1 and len({r.arrival_s for r in g}) == 1
        assert g[0].prompt_segments[-1][0] == -(g[0].id + 1)  # the unique run is named after copy 0
    assert len({g[0].prompt_segments for g in groups}) == 100
    assert any(len({r.num_output_tokens for r in g}) > 1 for g in groups)  # outputs drawn independently
    one = synthetic(num_requests=100, parallel_sampling={"n": 1})
    assert state(one) == state(synthetic(num_requests=100))


def test_semantic_clusters_follow_zipf_and_identical_prompts_share_one():
    w = synthetic(semantic_clusters={"num_clusters": 8, "zipf_s": 1.0})
    counts = np.bincount([r.semantic_cluster for r in w.requests], minlength=8) / 4000
    assert np.allclose(counts, zipf_probs(8, 1.0), atol=0.02) and counts.argmax() == 0
    sampled = synthetic(num_requests=400, parallel_sampling={"n": 4}, semantic_clusters={"num_clusters": 50})
    assert all(len({r.semantic_cluster for r in sampled.requests[i : i + 4]}) == 1 for i in range(0, 400, 4))
    sessions = synthetic(num_requests=300, sessions=SESSIONS, semantic_clusters={"num_clusters": 3})
    assert all(r.semantic_cluster in (0, 1, 2) for r in every_request(sessions))
    assert all(r.semantic_cluster is None for r in synthetic(num_requests=10).requests)


def test_same_seed_same_workload():
    fields = {"shared_prefix": PREFIX, "sessions": SESSIONS, "semantic_clusters": {"num_clusters": 20}}
    a, b, c = (synthetic(seed=s, num_requests=500, **fields) for s in (1, 1, 2))
    assert repr(state(a)) == repr(state(b))  # repr: NaN arrivals compare unequal
    assert repr(state(a)) != repr(state(c))


def test_mooncake_blocks_and_ideal_prefix_hits(traces_dir):
    w = build(
        trace={"format": "mooncake", "path": str(traces_dir / "mooncake_synthetic/synthetic_trace.jsonl")},
        arrivals={"kind": "trace"},
    )
    assert_runs_cover_prompts(w.requests)
    total = sum(r.num_prompt_tokens for r in w.requests)
    assert round(ideal_prefix_hit_tokens(w.requests) / total, 3) == 0.651


def test_mooncake_runs_are_hash_blocks(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]}]
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = build(
        trace={"format": "mooncake", "path": "mc.jsonl"},
        arrivals={"kind": "trace"},
        base_dir=tmp_path,
        parallel_sampling={"n": 2},
    )
    assert [r.prompt_segments for r in w.requests] == [((7, 512), (8, 512), (9, 76))] * 2
    with pytest.raises(ValueError, match="collide"):
        build(
            trace={"format": "mooncake", "path": "mc.jsonl"},
            arrivals={"kind": "trace"},
            base_dir=tmp_path,
            shared_prefix=PREFIX,
        )


def test_ideal_prefix_hits_by_hand():
    a = Request(0, 0.0, 300, 10, prompt_segments=((0, 200), (-1, 100)))
    b = Request(1, 1.0, 250, 10, prompt_segments=((0, 200), (-2, 50)))  # hits the prefix: 200
    c = Request(2, 2.0, 360, 10, prompt_segments=((0, 200), (-1, 100), (output_segment_id(0), 10), (-3, 50)))
    d = Request(3, 3.0, 150, 10, prompt_segments=((0, 150),))  # a shorter run of the prefix is a miss
    assert ideal_prefix_hit_tokens([a, b, c, d]) == 200 + 310
    assert ideal_prefix_hit_tokens([a, b, c, d], include_outputs=False) == 200 + 300
    assert ideal_prefix_hit_tokens([c, a]) == 300  # c came first: a's whole prompt was in c's


def test_yaml_with_every_sharing_section():
    cfg = WorkloadConfig.model_validate(
        yaml.safe_load("""
        lengths: {prompt: {kind: fixed, value: 100}, output: {kind: fixed, value: 10}}
        arrivals: {kind: poisson, rate_per_s: 2}
        num_requests: 40
        shared_prefix: {num_prefixes: 10, prefix_tokens: 1024, zipf_s: 1.2, share: 0.5}
        sessions:
          turns: {kind: uniform, low: 1, high: 8}
          think_time_s: {kind: lognormal, median: 5, sigma: 1}
          new_message_tokens: {kind: fixed, value: 50}
          max_prompt_tokens: 8192
        semantic_clusters: {num_clusters: 100, zipf_s: 0.9}
    """)
    )
    assert cfg.shared_prefix.prefix_tokens == 1024 and cfg.sessions.max_prompt_tokens == 8192
    assert WorkloadConfig.model_validate(dict(cfg.model_dump(), sessions=None, parallel_sampling={"n": 4}))


BASE = {"lengths": LENGTHS, "arrivals": {"kind": "all_at_once"}, "num_requests": 8}


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"parallel_sampling": {"n": 0}}, "greater than or equal to 1"),
        ({"parallel_sampling": {"n": 3}}, "multiple of parallel_sampling.n"),
        ({"shared_prefix": dict(PREFIX, share=1.5)}, "less than or equal to 1"),
        ({"shared_prefix": dict(PREFIX, zipf_s=-1)}, "greater than or equal to 0"),
        ({"shared_prefix": dict(PREFIX, num_prefixes=0)}, "greater than or equal to 1"),
        ({"shared_prefix": dict(PREFIX, prefix_tokens=0)}, "must be 1 to 2"),
        (
            {"shared_prefix": dict(PREFIX, prefix_tokens=10**20)},
            "must be 1 to 2",
        ),  # an OverflowError when drawn
        ({"shared_prefix": dict(PREFIX, prefix_tokens={"kind": "fixed", "value": 0.3})}, "below 1 token"),
        ({"shared_prefix": dict(PREFIX, prefixes=3)}, "Extra inputs are not permitted"),
        ({"sessions": dict(SESSIONS, max_turns=3)}, "Extra inputs are not permitted"),
        ({"sessions": dict(SESSIONS, think_time_s={"kind": "normal", "mean": 1, "std": 1})}, "min >= 0"),
        ({"sessions": dict(SESSIONS, turns={"kind": "fixed", "value": 0})}, "sessions.turns"),
        ({"sessions": dict(SESSIONS, max_prompt_tokens=0)}, "greater than or equal to 1"),
        ({"sessions": SESSIONS, "parallel_sampling": {"n": 2}}, "cannot be combined"),
        ({"sessions": SESSIONS, "closed_loop": {"clients": 2}}, "cannot be combined"),
        ({"semantic_clusters": {"num_clusters": 0}}, "greater than or equal to 1"),
        ({"semantic_clusters": {"num_clusters": 4, "zipf": 1}}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_sharing_configs(fields, message):
    with pytest.raises(ValidationError, match=message):
        WorkloadConfig.model_validate({**BASE, **fields})
