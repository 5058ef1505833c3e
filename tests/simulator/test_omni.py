"""Multi-stage (vLLM-Omni) pipelines: the stage-output cache's host memory (the seed's Qwen3-Omni numbers),
a request's way through the stages, host transfers, per-stage results and rejections."""

import json

import pytest
import yaml

from servesim.hardware.gpu import get_interconnect
from servesim.hardware.omni_memory import stage_output_cache_bytes
from servesim.simulator.planning.capacity import judge
from servesim.simulator.world.output import write_run
from tests.simulator.conftest import SCENARIOS, run, scenario

GIB, MIB = 1 << 30, 1 << 20


def test_the_seeds_qwen3_omni_host_footprints():
    thinker = stage_output_cache_bytes(15092, 16, 2048, "bf16")  # __hidden_states__ [15092, 16, 2048] bf16
    assert thinker == 15092 * 16 * 2048 * 2
    assert thinker / GIB == pytest.approx(0.92, abs=0.005)
    talker = stage_output_cache_bytes(16180, 16, 16, "int64")  # codes.audio [16180, 16, 16] int64
    assert talker == 33_136_640
    assert talker / 1e6 == pytest.approx(33.1, abs=0.05)  # the seed's "33 MiB" is MB: ...
    assert talker / MIB == pytest.approx(31.6, abs=0.05)  # ... 31.6 MiB


STAGES = [
    {"name": "thinker", "cache_outputs": True},
    {
        "name": "talker",
        "model": "llama-3.2-1b",
        "prompt_ratio": 1.0,
        "output_ratio": 4.0,
        "outputs": [{"name": "codes", "dims": 16, "dtype": "int64"}],
        "cache_outputs": True,
    },
    {"name": "codec", "model": "llama-3.2-1b", "prompt_ratio": 4.0, "output_ratio": 0.01},
]


def pipeline(num_requests=20, stages=STAGES, rate=2.0, seed=1):
    return scenario(
        model="llama-3.1-8b",
        seed=seed,
        hardware={"gpu": "h200"},
        engine={"max_model_len": 16384},
        workload={
            "trace": None,
            "arrivals": {"kind": "poisson", "rate_per_s": rate},
            "num_requests": num_requests,
            "lengths": {
                "prompt": {"kind": "uniform", "low": 200, "high": 2000},
                "output": {"kind": "uniform", "low": 20, "high": 300},
            },
        },
        stages=stages,
    )


def test_a_request_passes_every_stage_in_order_with_host_transfers_between():
    result = run(pipeline(num_requests=1))
    (req,) = result.requests.itertuples()
    s = result.summary
    assert s["completed"] == 1 and s["stage_thinker_completed"] == s["stage_codec_completed"] == 1
    # the thinker hands on [prompt + output, 4096] bf16 hidden states; the talker [its prompt + output, 16] int64
    thinker_output = s["stage_thinker_transfer_bytes"] // (4096 * 2) - req.prompt_tokens
    assert s["stage_thinker_transfer_bytes"] == (req.prompt_tokens + thinker_output) * 4096 * 2
    assert s["stage_talker_transfer_bytes"] == (thinker_output + 4 * thinker_output) * 16 * 8
    assert req.output_tokens == max(1, round(4 * thinker_output * 0.01))  # the codec's, what the client gets
    pcie = get_interconnect("pcie5")  # the H200's host link, used twice: device -> host -> device
    for name in ("thinker", "talker"):
        nbytes = s[f"stage_{name}_transfer_bytes"]
        assert s[f"stage_{name}_mean_transfer_ms"] == pytest.approx(
            2 * (pcie.latency_s + nbytes / pcie.bytes_per_s) * 1e3
        )
    # the client's TTFT is the last stage's first token: every stage and both transfers come before it
    before = (
        s["stage_thinker_mean_e2el_ms"]
        + s["stage_talker_mean_e2el_ms"]
        + s["stage_codec_mean_ttft_ms"]
        + s["stage_thinker_mean_transfer_ms"]
        + s["stage_talker_mean_transfer_ms"]
    )
    assert req.ttft_s * 1e3 == pytest.approx(before, rel=1e-9)


def test_stage_lengths_follow_the_ratios_and_every_request_completes():
    result = run(pipeline())
    df, s = result.requests, result.summary
    assert s["completed"] == 20 and df["finish_s"].notna().all()
    assert s["stage_thinker_completed"] == s["stage_talker_completed"] == s["stage_codec_completed"] == 20
    # talker: prompt = thinker output, output = 4x; codec: prompt = 4x talker output, output = 1%
    assert (df["ttft_s"] > 0).all() and (df["e2el_s"] >= df["ttft_s"]).all()
    assert s["stage_talker_transfer_bytes"] > 0 and s["stage_codec_transfer_bytes"] == 0


def test_a_paced_pipelines_duration_runs_from_the_clients_start():
    """Paced arrivals (vllm bench serve's): the first request leaves after its own gap, and the throughputs divide
    by the span from t = 0, as a single engine's run counts it."""
    s = pipeline(num_requests=8)
    arrivals = s.workload.arrivals.model_copy(update={"paced": True})
    result = run(s.model_copy(update={"workload": s.workload.model_copy(update={"arrivals": arrivals})}))
    df, summary = result.requests, result.summary
    assert df["arrival_s"].min() > 0 and summary["duration_s"] == df["finish_s"].max()


def test_the_memory_plan_reports_each_stages_pinned_output_cache(tmp_path):
    result = run(pipeline(num_requests=2))
    memory = result.memory.as_dict()
    thinker, talker, codec = memory["stages"]
    assert thinker["stage_output_cache"] == [
        {
            "name": "hidden_states",
            "shape": [thinker["num_blocks"], 16, 4096],
            "dtype": "bf16",
            "bytes": thinker["num_blocks"] * 16 * 4096 * 2,
        }
    ]
    assert talker["stage_output_cache_host_bytes"] == talker["num_blocks"] * 16 * 16 * 8
    assert codec["stage_output_cache"] == []  # cache_outputs off
    assert (
        memory["stage_output_cache_host_bytes"]
        == result.summary["stage_output_cache_host_bytes"]
        == thinker["stage_output_cache_host_bytes"] + talker["stage_output_cache_host_bytes"]
    )
    assert thinker["model"] == "llama-3.1-8b" and talker["model"] == "llama-3.2-1b"
    written = json.loads((write_run(result, tmp_path / "run", SCENARIOS) / "memory.json").read_text())
    assert written["stages"][0]["stage_output_cache_host_bytes"] == thinker["stage_output_cache_host_bytes"]


def test_a_later_stage_rejects_with_its_name_in_the_reason():
    stages = [STAGES[0], {**STAGES[1], "engine": {"max_model_len": 600}}]
    df = run(pipeline(stages=stages)).requests
    rejected = df[df["reject_reason"].notna()]
    assert len(rejected) > 0 and rejected["reject_reason"].str.startswith("stage talker: prompt").all()
    assert rejected["finish_s"].isna().all()
    assert df.loc[df["reject_reason"].isna(), "finish_s"].notna().all()


def test_pipelines_are_deterministic_and_fast_forward_changes_nothing():
    first, again = run(pipeline()), run(pipeline())
    assert first.summary == again.summary
    stepped = run(
        pipeline().model_copy(
            update={"simulation": pipeline().simulation.model_copy(update={"fast_forward": False})}
        )
    )
    assert first.requests.equals(stepped.requests) and first.summary == stepped.summary


def test_servesim_simulate_runs_a_pipeline_scenario(tmp_path):
    from typer.testing import CliRunner

    from servesim.simulator.cli.main import app

    path = tmp_path / "omni.yaml"
    path.write_text(yaml.safe_dump(pipeline(num_requests=4).model_dump(mode="json", exclude_unset=True)))
    result = CliRunner().invoke(app, ["simulate", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    memory = json.loads((tmp_path / "run" / "memory.json").read_text())
    assert [s["stage"] for s in memory["stages"]] == ["thinker", "talker", "codec"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stage_codec_completed"] == 4


@pytest.mark.parametrize(
    "stage,reason",
    [
        (
            {
                "name": "talker",
                "model": "gemma-2-9b",
                "cache_outputs": True,
                "engine": {"max_model_len": 8192},
            },
            "sliding-window layers",
        ),
        (
            {"name": "talker", "cache_outputs": True, "engine": {"prefix_caching": "radix"}},
            "radix pages of 1 tokens",
        ),
        (
            {
                "name": "talker",
                "cache_outputs": True,
                "engine": {"speculative": {"method": "ngram", "k": 3, "acceptance": 0.5}},
            },
            "decodes speculatively",
        ),
    ],
)
def test_stage_output_cache_is_refused_where_vllm_omni_refuses_it(stage, reason):
    """The seed's table: the cache mirrors one full-attention block table of whole blocks, so hybrid KV,
    sub-block prefix matches and speculative stages refuse it at KV-cache init."""
    from servesim.hardware.errors import SpecError

    with pytest.raises(SpecError, match=rf"stages\['talker'\]\.cache_outputs: .*{reason}"):
        run(pipeline(num_requests=2, stages=[{"name": "thinker"}, stage]))
    allowed = {k: v for k, v in stage.items() if k != "cache_outputs"}
    assert run(pipeline(num_requests=2, stages=[{"name": "thinker"}, allowed])).summary["completed"] == 2


def test_a_stage_rejects_what_its_sliding_window_pool_can_never_hold(tmp_path):
    """gpt-oss-20b in 69 usable blocks: a 1,000 + 50-token request needs 132 blocks over its full and sliding
    groups, so the stage rejects it at once, as a plain run does, and the next request is served."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,1000,50\n0.5,100,10\n")
    s = scenario(
        model="gpt-oss-20b",
        engine={"max_model_len": 4096, "num_gpu_blocks_override": 70},
        workload={
            "trace": {"format": "servesim", "path": str(trace)},
            "arrivals": {"kind": "trace"},
            "num_requests": 2,
        },
        stop={"max_sim_time_s": 30},
        stages=[{"name": "only"}],
    )
    requests = run(s).requests
    assert (
        requests["reject_reason"].tolist()[0]
        == "stage only: needs 132 KV blocks at full length; the pool has 69"
    )
    assert requests["finish_s"].notna().tolist() == [False, True]


def test_each_replica_of_a_stage_pins_its_own_output_cache():
    one = run(pipeline(num_requests=2)).memory.as_dict()["stages"][1]
    stages = [STAGES[0], {**STAGES[1], "replicas": 2}, STAGES[2]]
    two = run(pipeline(num_requests=2, stages=stages)).memory.as_dict()["stages"][1]
    assert (
        two["stage_output_cache_host_bytes"]
        == 2 * one["stage_output_cache_host_bytes"]
        == 2 * (one["num_blocks"] * 16 * 16 * 8)
    )


@pytest.mark.parametrize(
    "section, value, field",
    [("parallelism", {"tp": 2}, "stages[i].tp"), ("app_cache", {"kind": "exact"}, "app_cache.kind: none")],
)
def test_settings_a_pipeline_cannot_honour_are_refused_not_dropped(section, value, field):
    from servesim.hardware.errors import SpecError

    with pytest.raises(SpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        run(
            pipeline(num_requests=2).model_copy(update={section: type(getattr(pipeline(), section))(**value)})
        )


def test_an_sglang_stage_sizes_its_slots_by_the_resolved_context_as_a_plain_run_does():
    """SGLang's default max_running_requests depends on the context length: unset, a stage takes the memory
    plan's (the model's own), as a plain run's pool does, not the pool size."""
    from servesim.simulator.world.run import make_world

    plain = scenario(
        model="llama-3.1-8b",
        hardware={"gpu": "h200"},
        engine={"scheduler": "sglang", "max_model_len": None, "prefix_caching": "radix"},
    )
    world = make_world(plain, SCENARIOS)
    staged = make_world(
        plain.model_copy(update={"stages": pipeline(stages=[{"name": "only"}]).stages}), SCENARIOS
    )
    assert (
        staged.stages[0].replicas[0].scheduler.max_running == world.pools[0].replicas[0].scheduler.max_running
    )


def test_later_stages_see_each_requests_session_and_priority():
    """A later stage's request carries its client request's session and priority, so session_affinity keeps a
    conversation's turns on one replica there and the priority order holds."""
    from servesim.simulator.world.run import make_world

    sessions = {
        "turns": {"kind": "fixed", "value": 3},
        "think_time_s": {"kind": "fixed", "value": 0.5},
        "new_message_tokens": {"kind": "fixed", "value": 50},
    }
    s = pipeline(
        num_requests=24, stages=[{"name": "a"}, {"name": "b", "replicas": 3, "router": "session_affinity"}]
    )
    raw = s.model_dump(mode="json")
    s = type(s).model_validate({**raw, "workload": {**raw["workload"], "sessions": sessions}})
    world = make_world(s, SCENARIOS)
    world.run()
    later = world.stages[1].requests
    assert later and all(r.session_id is not None for r in later)
    replicas_of = {}
    for r in later:
        replicas_of.setdefault(r.session_id, set()).add(r.replica)
    assert all(len(replicas) == 1 for replicas in replicas_of.values()) and len(replicas_of) > 1


@pytest.mark.parametrize(
    "engine,expected",
    [
        ({"max_num_seqs": 0}, "stages.0.engine.max_num_seqs: Input should be greater than or equal to 1"),
        (
            {"max_num_seqs": 300, "max_num_batched_tokens": 100},
            "stages.0.engine: max_num_batched_tokens (100) <",
        ),
    ],
)
def test_a_stage_engine_is_checked_when_the_scenario_loads(tmp_path, engine, expected):
    """It was validated only when the stage was built: a ValidationError traceback, not a line."""
    from typer.testing import CliRunner

    from servesim.simulator.cli.main import app

    stages = [{"name": "a", "model": "qwen2.5-7b", "engine": engine}, {"name": "b", "model": "llama-3.2-1b"}]
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            str(SCENARIOS / "omni_thinker_talker.yaml"),
            "--out",
            str(tmp_path / "out"),
            "--set",
            f"stages={json.dumps(stages)}",
        ],
    )
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    assert expected in result.stderr and result.stderr.count("\n") == 1


def test_a_later_stages_growing_queue_is_an_unstable_queue():
    """A talker that serves one request at a time (~700 codes each, ~0.6 s) falls behind 3 req/s: the thinker takes
    each request at once, so only the waits in the talker's queue, counted into the client's, show the backlog."""
    talker = {**STAGES[1], "engine": {"max_num_seqs": 1}}
    s = pipeline(num_requests=60, stages=[STAGES[0], talker], rate=3.0)
    result = run(s)
    df = result.requests
    assert (df["queue_s"] < 0.1).all() and df["stage_wait_s"].iloc[-10:].mean() > 5.0
    verdict = judge(result, s.slo, 3.0)
    assert "unstable queue" in verdict.reasons and "mean queue wait grows" in " ".join(verdict.details)
    calm = run(pipeline(num_requests=60, stages=[STAGES[0], talker], rate=0.05))
    assert "unstable queue" not in judge(calm, s.slo, 0.05).reasons
