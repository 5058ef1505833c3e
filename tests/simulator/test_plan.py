"""The planner: pruning without simulation, a verified recommendation beside a failing cheaper deployment."""

from __future__ import annotations

import json
import pickle
import signal

import pytest
import yaml
from typer.testing import CliRunner

from servesim.hardware.errors import SpecError
from servesim.hardware.profile import best_validated_profile
from servesim.simulator.planning.capacity import CapacityResult, Verdict
from servesim.simulator.cli.main import app
from servesim.simulator.planning.executors import WorkerDied
from servesim.simulator.planning.launch import launch_notes, sglang_command, vllm_command
from servesim.simulator.scenario import load_scenario
from servesim.simulator.planning.plan import (
    Candidate,
    Deployment,
    Evaluation,
    PlanResult,
    _next_cheaper,
    check_under_profile,
    evaluate,
    other_profile,
    plan,
    screen,
    size,
)
from tests.simulator.study_helpers import SCENARIOS, chat
from tests.simulator.test_report import CHROMIUM, render

TARGET = 40.0


@pytest.fixture(scope="module")
def chat_plan():
    return plan(chat(), SCENARIOS, gpus=["h100-sxm"], tps=[1, 2], max_replicas=4, target_rate=TARGET)


def test_recommendation_passes_its_verification_and_the_next_cheaper_fails(chat_plan):
    rec, cheaper = chat_plan.recommendation, chat_plan.next_cheaper
    assert rec is not None and cheaper is not None
    assert rec.verdict.ok and rec.verdict.rate_per_s == TARGET  # simulated whole, at the target rate
    assert rec.label == "2 x h100-sxm tp=1" and rec.cost_per_hour_usd == pytest.approx(2 * 2.99)
    assert not cheaper.verdict.ok and cheaper.cost_per_hour_usd < rec.cost_per_hour_usd
    assert cheaper.label == "1 x h100-sxm tp=1" and "TTFT SLO" in cheaper.verdict.reasons
    assert rec in chat_plan.deployments and cheaper in chat_plan.deployments
    assert all(d.cost_per_hour_usd >= rec.cost_per_hour_usd for d in chat_plan.deployments if d.verdict.ok)
    # priced at the target rate's steady output, not the run's throughput with its drain tail
    per_request = rec.verdict.metrics["output_tokens_per_arrival"]
    assert per_request > 1
    tokens_per_hour = TARGET * per_request * 3600
    assert rec.cost_per_million_output_tokens_usd == pytest.approx(
        rec.cost_per_hour_usd / tokens_per_hour * 1e6
    )
    assert TARGET * per_request > rec.verdict.metrics["output_throughput"]


def test_verifying_on_two_processes_gives_the_same_plan(chat_plan):
    parallel = plan(
        chat(), SCENARIOS, gpus=["h100-sxm"], tps=[1, 2], max_replicas=4, target_rate=TARGET, workers=2
    )
    assert [d.as_dict() for d in parallel.deployments] == [d.as_dict() for d in chat_plan.deployments]
    assert parallel.recommendation.label == chat_plan.recommendation.label
    assert parallel.next_cheaper.label == chat_plan.next_cheaper.label


def test_candidates_too_costly_to_win_are_not_sized_and_the_choice_is_the_exhaustive_one():
    args = dict(gpus=["h100-sxm"], tps=[1, 2, 4], max_replicas=4, target_rate=TARGET)
    pruned = plan(chat(), SCENARIOS, **args)
    full = plan(chat(), SCENARIOS, **args, exhaustive=True)
    assert pruned.recommendation.label == full.recommendation.label == "2 x h100-sxm tp=1"
    assert pruned.next_cheaper.label == full.next_cheaper.label
    cost = pruned.recommendation.cost_per_hour_usd  # $5.98/h
    costlier = {e.candidate.label: e for e in pruned.evaluations if e.rejection == "costlier"}
    # $11.96/h a replica > 2 x tp=1's $5.98/h: not sized at all
    assert costlier["h100-sxm tp=4"].capacity is None and "$11.96/h" in costlier["h100-sxm tp=4"].detail
    assert pruned.num_simulations < full.num_simulations
    for short, whole in zip(pruned.evaluations, full.evaluations):
        if short.rejection is None:
            # its bisection stopped once its replica count was settled: the same count as bisecting to rel_tol
            assert short.replicas == whole.replicas
            assert short.capacity.num_simulations <= whole.capacity.num_simulations
            # each rate below the target a whole count's share (above it, the bracket doubles: 1/2, 1/4 replica)
            counts = [TARGET / v.rate_per_s for v in short.capacity.verdicts if v.rate_per_s <= TARGET]
            assert counts == pytest.approx([round(c) for c in counts])
            assert short.capacity.rate_per_s == pytest.approx(TARGET / short.replicas)
        elif short.rejection == "costlier":
            # the exhaustive search sized it, and it needs more replicas than could cost no more than the choice
            assert whole.rejection is None and whole.replicas * whole.price_per_replica_hour_usd > cost
    # what the shortcuts did not verify is every deployment of the candidates they found too costly
    shown = [d.as_dict() for d in full.deployments if d.evaluation.candidate.label not in costlier]
    assert [d.as_dict() for d in pruned.deployments] == shown


def test_a_cost_bound_stops_the_replica_search_at_the_counts_that_could_cost_no_more():
    """Once a deployment at $B/h passes, a candidate needing more than B / (its price) replicas cannot win: the search
    tries no count beyond what could cost no more, and such a candidate is rejected as costlier."""
    base = chat()
    free = size(base, SCENARIOS, screen(base, Candidate("h100-sxm", 1)), TARGET, 4, 0.05)
    assert free.rejection is None and free.replicas == 2
    price = free.price_per_replica_hour_usd
    one = size(
        base,
        SCENARIOS,
        screen(base, Candidate("h100-sxm", 1)),
        TARGET,
        4,
        0.05,
        bound_usd_per_hour=price * 1.5,
    )
    assert one.rejection == "costlier" and "needs more than 1 replica(s)" in one.detail
    assert [v.rate_per_s for v in one.capacity.verdicts] == [TARGET]  # one replica's share only
    assert one.capacity.num_simulations < free.capacity.num_simulations
    two = size(
        base, SCENARIOS, screen(base, Candidate("h100-sxm", 1)), TARGET, 4, 0.05, bound_usd_per_hour=price * 2
    )
    assert (
        two.rejection is None and two.replicas == 2
    )  # a deployment costing the bound itself may still win a tie


def test_sizing_comes_from_the_per_replica_rate(chat_plan):
    tp1, tp2 = chat_plan.evaluations
    assert tp1.rejection is None and tp1.replicas == 2 and TARGET / 2 <= tp1.rate_per_replica < TARGET
    assert tp2.rejection is None and tp2.replicas == 1 and tp2.rate_per_replica >= TARGET
    checked = chat_plan.profile_check.num_simulations if chat_plan.profile_check else 0
    assert chat_plan.num_simulations == len(chat_plan.deployments) + checked + sum(
        e.capacity.num_simulations for e in chat_plan.evaluations
    )


def test_the_profile_check_under_the_plans_own_profile_repeats_its_verdicts(chat_plan):
    """Simulating the two deployments again under the profile the plan used gives the plan's own verdicts (runs
    are deterministic), so the check agrees; the best-validated profile is the bundled one of lowest held-out
    error."""
    again = check_under_profile(chat_plan, chat(), SCENARIOS, "default")
    assert again.recommendation.metrics == chat_plan.recommendation.verdict.metrics
    assert again.next_cheaper.metrics == chat_plan.next_cheaper.verdict.metrics and again.agrees
    assert best_validated_profile() == "published-fit" and other_profile("published-fit") == "default"
    assert chat_plan.profile_check.profile == "published-fit"


def test_the_exhaustive_option_verifies_what_the_shortcuts_leave_out(tmp_path):
    """--exhaustive sizes and verifies the candidates too costly to be chosen: the whole cost/latency table, the same
    recommendation."""
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump(chat().run_settings().model_dump(mode="json", exclude_unset=True)))
    (tmp_path / "traces").symlink_to(SCENARIOS / "traces")
    plans = {}
    for extra in ([], ["--exhaustive"]):
        out = tmp_path / f"plan{len(extra)}"
        args = ["plan", str(path), "--gpus", "h100-sxm", "--tp", "1,4", "--max-replicas", "4"]
        args += ["--target-rate", str(TARGET), "--out", str(out), "--workers", "1", *extra]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        plans[bool(extra)] = json.loads((out / "plan.json").read_text())
    shortcut, everything = plans[False], plans[True]
    assert shortcut["recommendation"]["deployment"] == everything["recommendation"]["deployment"]
    shown = {d["deployment"] for d in shortcut["deployments"]}
    assert shown < {d["deployment"] for d in everything["deployments"]}
    assert not any("tp=4" in d for d in shown)  # one tp=4 replica costs more than the choice


def test_plan_json_and_the_terminal_show_both_and_the_launch_commands(tmp_path):
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump(chat().run_settings().model_dump(mode="json", exclude_unset=True)))
    (tmp_path / "traces").symlink_to(SCENARIOS / "traces")
    out = tmp_path / "plan"
    result = CliRunner().invoke(
        app,
        [
            "plan",
            str(path),
            "--gpus",
            "h100-sxm",
            "--tp",
            "1,2",
            "--max-replicas",
            "4",
            "--target-rate",
            str(TARGET),
            "--out",
            str(out),
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "plan.json").read_text())
    assert (
        data["recommendation"]["deployment"] == "2 x h100-sxm tp=1"
        and data["recommendation"]["verdict"]["ok"]
    )
    assert (
        data["next_cheaper"]["deployment"] == "1 x h100-sxm tp=1"
        and not data["next_cheaper"]["verdict"]["ok"]
    )
    assert data["pareto_ttft"] and data["pareto_tpot"]
    # a run stopped once it was certain to fail shows its figures as its requests' so far, marked
    stopped = [d for d in data["deployments"] if "stopped_at_s" in d["verdict"]]
    assert stopped and all(not d["verdict"]["ok"] for d in stopped)
    assert "* the run stopped once it was certain to fail" in result.stdout
    assert (
        "recommendation: 2 x h100-sxm tp=1 (2 GPUs)" in result.stdout
        and "next cheaper: 1 x h100-sxm tp=1" in result.stdout
    )
    # what it planned against, and whether the best-validated profile picks the same
    assert (
        data["slo"] == {"ttft_ms": 500.0, "tpot_ms": 50.0, "percentile": 90} and data["profile"] == "default"
    )
    assert data["profile_check"]["profile"] == "published-fit"
    assert "planned against: p90 TTFT <= 500 ms, TPOT <= 50 ms at " in result.stdout
    check = data["profile_check"]
    agrees = check["recommendation"]["ok"] and not check["next_cheaper"]["ok"]
    assert check["agrees"] == agrees
    assert ("profile check: under published-fit the same deployment is chosen" in result.stdout) == agrees
    # not on a terminal: a line per candidate sized and per deployment verified, on stderr
    progress = [line.split(":")[0] for line in result.stderr.splitlines()]
    assert [line for line in progress if line.startswith("sized")] == ["sized 1/2", "sized 2/2"]
    assert [line for line in progress if line.startswith("verified")] == [
        f"verified {i}" for i in range(1, len(data["deployments"]) + 1)
    ]
    assert len(progress) == 2 + len(data["deployments"])
    assert "h100-sxm tp=1: " in result.stderr and "2 x h100-sxm tp=1 ($5.98/h): ok" in result.stderr
    assert "sized 1/2" not in result.stdout
    # the batch limits the run used, written out: vLLM's defaults on an H100 (>= 70 GiB) are 1024 seqs, 8192 tokens
    assert data["commands"]["vllm"] == (
        "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 1 --max-num-seqs 1024 --max-num-batched-tokens 8192 "
        "--gpu-memory-utilization 0.9 --max-model-len 16384 --enable-chunked-prefill"
    )
    # SGLang's own memory split, not vLLM's 0.9
    assert data["commands"]["sglang"] == (
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --tp 1 --max-running-requests 1024 "
        "--chunked-prefill-size 8192 --context-length 16384"
    )
    assert data["commands"]["replicas"] == 2
    # its report: every candidate with its outcome, the deployments' cost against latency, the recommendation
    report = CliRunner().invoke(app, ["report", str(out)])
    assert report.exit_code == 0, report.output
    page = (out / "report.html").read_text()
    assert "servesim plan: 2 x h100-sxm tp=1" in page and page.count('<div class="chart"') == 2
    assert "Candidates: sustainable rate per replica" in page and "recommended: 2 x h100-sxm tp=1" in page
    assert all(f"<td>{c['candidate']}</td>" in page for c in data["candidates"])
    assert data["commands"]["vllm"] in page
    if CHROMIUM is not None:  # it draws in a browser without a script error
        title, _, _ = render(out / "report.html", tmp_path)
        assert title == "servesim report: 2 charts drawn"


def test_what_cannot_fit_is_pruned_without_simulating():
    ev = evaluate(chat(model="llama-3.1-70b"), SCENARIOS, Candidate("l4", 1), TARGET, 16, 0.05)
    assert ev.rejection == "does not fit" and "does not fit on l4" in ev.detail
    assert ev.capacity is None and not ev.can_start
    wide = evaluate(chat(), SCENARIOS, Candidate("l4", 16), TARGET, 16, 0.05)
    assert wide.rejection == "does not fit" and "GPUs per l4 node" in wide.detail


def test_a_sharding_the_engines_refuse_is_pruned_as_such_not_as_memory():
    """Qwen2.5-7B's 28 attention heads do not divide over 8 GPUs: vLLM refuses to start, whatever the memory."""
    ev = evaluate(chat(model="qwen2.5-7b"), SCENARIOS, Candidate("h100-sxm", 8), TARGET, 16, 0.05)
    assert ev.rejection == "cannot shard" and "must divide qwen2.5-7b's 28 attention heads" in ev.detail
    assert ev.capacity is None and not ev.can_start


def test_pipeline_stages_let_a_model_too_big_for_one_tp_group_start():
    """Llama 3.1 70B in bf16 (141 GB) does not fit four 24 GB L4s; two stages of four hold half its layers each.
    The PP2 replica is priced as its 8 GPUs and sized by simulation (here too slow for the SLOs: rejected for
    them, not pruned), and P/D units stage both pools."""
    base = chat(model="llama-3.1-70b")
    flat = evaluate(base, SCENARIOS, Candidate("l4", 4), TARGET, 16, 0.05)
    assert flat.rejection == "does not fit" and "at tp=4:" in flat.detail
    staged = evaluate(base, SCENARIOS, Candidate("l4", 4, pp=2), TARGET, 16, 0.05)
    assert staged.can_start and staged.capacity is not None and staged.gpus_per_replica == 8
    assert staged.candidate.label == "l4 tp=4 pp=2" and staged.as_dict()["pp"] == 2
    unit = Candidate("l4", 4, kind="pd", ratio=(1, 2), pp=2).scenario(base, replicas=2)
    assert (unit.disaggregation.prefill.pp, unit.disaggregation.decode.pp) == (2, 2)
    assert (unit.disaggregation.prefill.replicas, unit.disaggregation.decode.replicas) == (2, 4)
    with pytest.raises(SpecError, match=r"plan PP sizes \(--pp or plan.pp\): 0 is not a GPU count"):
        plan(base, SCENARIOS, gpus=["l4"], tps=[4], pps=[0], target_rate=TARGET)


def test_a_sizing_worker_that_dies_stops_the_plan_naming_its_candidate(monkeypatch):
    def first_killed(fn, jobs, engine, workers, on_died):
        yield 0, on_died(WorkerDied(0, -signal.SIGKILL))

    monkeypatch.setattr("servesim.simulator.planning.plan.run_jobs", first_killed)
    with pytest.raises(
        SpecError,
        match=r"plan: the worker process sizing h100-sxm tp=1 was killed by SIGKILL "
        r"\(most often the out-of-memory killer",
    ):
        plan(chat(), SCENARIOS, gpus=["h100-sxm"], tps=[1, 2], target_rate=TARGET)


def test_typos_in_gpus_or_knobs_stop_the_plan_with_one_line():
    with pytest.raises(SpecError, match="unknown GPU 'h100'"):
        plan(chat(), SCENARIOS, gpus=["h100"], tps=[1], target_rate=TARGET)
    with pytest.raises(SpecError, match="unknown engine knob 'max_seqs'"):
        plan(chat(), SCENARIOS, tps=[1], knobs={"max_seqs": [8]}, target_rate=TARGET)
    with pytest.raises(SpecError, match="knob scheduler='foo': engine: unknown scheduler 'foo'"):
        plan(chat(), SCENARIOS, tps=[1], knobs={"scheduler": ["vllm", "foo"]}, target_rate=TARGET)
    with pytest.raises(
        SpecError, match="knob max_num_seqs='abc': engine.max_num_seqs: Input should be a valid"
    ):
        plan(chat(), SCENARIOS, tps=[1], knobs={"max_num_seqs": ["abc"]}, target_rate=TARGET)
    from servesim.simulator.planning.plan import (
        _check_choices,
    )  # a value that runs in some combination passes: orca needs none

    _check_choices(
        chat(), ["h100-sxm"], [1], [1], {"scheduler": ["vllm", "orca"], "prefix_caching": ["vllm", "none"]}
    )
    with pytest.raises(SpecError, match="0 is not a GPU count"):
        plan(chat(), SCENARIOS, gpus=["h100-sxm"], tps=[0, 1], target_rate=TARGET)


def test_the_engines_batching_is_a_knob_like_any_other():
    """`--knob scheduler=vllm,sglang`: each engine's batching sized on the same traffic (parse_grid keeps the
    names as text)."""
    from servesim.simulator.planning.sweep import parse_grid

    assert parse_grid(["scheduler=vllm,sglang"]) == {"scheduler": ["vllm", "sglang"]}
    sized = {
        name: evaluate(chat(), SCENARIOS, Candidate("h100-sxm", 1, (("scheduler", name),)), TARGET, 4, 0.05)
        for name in ("vllm", "sglang")
    }
    assert all(ev.rejection is None and ev.capacity.rate_per_s > 0 for ev in sized.values())
    assert sized["sglang"].candidate.label == "h100-sxm tp=1 scheduler=sglang"


def test_knobs_that_contradict_each_other_are_invalid():
    ev = evaluate(
        chat(),
        SCENARIOS,
        Candidate("h100-sxm", 1, (("max_num_seqs", 512), ("max_num_batched_tokens", 256))),
        TARGET,
        4,
        0.05,
    )
    assert ev.rejection == "invalid" and "max_num_batched_tokens (256) < max_num_seqs (512)" in ev.detail


def test_a_candidate_whose_engine_refuses_requests_is_rejected_for_that():
    ev = evaluate(chat(engine={"max_model_len": 2048}), SCENARIOS, Candidate("h100-sxm", 1), TARGET, 4, 0.05)
    assert ev.rejection == "rejected" and ev.capacity.num_simulations == 1
    # the target, not target / 4
    assert ev.detail.startswith(f"fails even at {TARGET:.3g} req/s per replica: ")
    assert "requests rejected at any rate" in ev.detail


def test_a_candidate_that_fails_at_any_useful_rate_says_why():
    ev = evaluate(chat(slo={"tpot_ms": 3}), SCENARIOS, Candidate("h100-sxm", 1), TARGET, 4, 0.05)
    assert ev.rejection == "TPOT SLO" and "per replica (target / max_replicas)" in ev.detail
    assert ev.capacity.num_simulations == 3  # 40, 20, 10 req/s: no lower than target / max_replicas


def _evaluation(gpu: str, price: float) -> Evaluation:
    return Evaluation(Candidate(gpu, 1), gpus_per_replica=1, price_per_replica_hour_usd=price)


def test_next_cheaper_is_the_most_expensive_deployment_under_the_cost():
    evaluations = [_evaluation("a", 3.0), _evaluation("b", 1.0), _evaluation("c", 2.5)]
    assert _next_cheaper(evaluations, [0, 1, 2], 6.0, 16) == (1, 5)  # 5 x 1.0 beats 1 x 3.0 and 2 x 2.5
    assert _next_cheaper(evaluations, [0, 1, 2], 6.0, 4) == (2, 2)  # 4 x 1.0 < 2 x 2.5
    assert _next_cheaper(evaluations, [0, 2], 6.0, 16) == (2, 2)
    assert _next_cheaper(evaluations, [0], 3.0, 16) is None


def test_the_recommendation_is_tried_with_one_replica_fewer_before_any_other_cheaper(monkeypatch):
    """Sizing put candidate b ($10/h a replica) at 3 replicas, but 2 pass; the next-cheaper deployment of any
    candidate ($27.60: 12 x a at $2.30) would fail. The plan tries b with one replica fewer first, recommends 2 x b,
    then shows the cheaper that fails beside it (1 x b and 8 x a both fail: the closer in cost, 8 x a at $18.40)."""
    from servesim.simulator.planning import plan as planner

    a, b = _evaluation("a", 2.3), _evaluation("b", 10.0)
    a.replicas, b.replicas = 16, 3  # what sizing said
    passes = {("b", 2), ("b", 3), ("a", 16)}

    def verify(base, base_dir, ev, replicas, rate):
        ok = (ev.candidate.gpu, replicas) in passes
        return Deployment(
            ev, replicas, Verdict(rate, () if ok else ("TTFT SLO",), (), {"p90_ttft_ms": 100.0})
        )

    monkeypatch.setattr(planner, "verify", verify)
    for ev in (a, b):  # a NaN figure: a worker's copy of the candidate is never == the planner's own
        ev.capacity = CapacityResult(1.0, 1, [Verdict(1.0, (), (), {"p90_tpot_ms": float("nan")})])
    copies = {id(ev): pickle.loads(pickle.dumps(ev)) for ev in (a, b)}  # as from a worker process
    monkeypatch.setattr(
        planner,
        "verify",
        lambda base, base_dir, ev, replicas, rate: verify(base, base_dir, copies[id(ev)], replicas, rate),
    )
    result = PlanResult(10.0, [a, b], [], None, None)
    planner._choose(result, None, None, max_replicas=16)
    assert result.recommendation.label == "2 x b tp=1"
    assert result.next_cheaper.label == "8 x a tp=1" and not result.next_cheaper.verdict.ok
    assert [d.label for d in result.deployments] == [
        "16 x a tp=1",
        "3 x b tp=1",
        "2 x b tp=1",
        "1 x b tp=1",
        "8 x a tp=1",
    ]


def test_pareto_frontier_keeps_deployments_nobody_beats_on_cost_and_latency():
    def deployment(price: float, ttft: float) -> Deployment:
        return Deployment(_evaluation("g", price), 1, Verdict(1.0, (), (), {"p90_ttft_ms": ttft}))

    a, b, c, d = deployment(1, 900), deployment(2, 300), deployment(3, 400), deployment(4, 100)
    failing = Deployment(
        _evaluation("g", 0.5), 1, Verdict(1.0, ("TTFT SLO",), ("slow",), {"p90_ttft_ms": 50})
    )
    result = PlanResult(1.0, [], [c, a, failing, d, b], None, None)
    # c costs more than b and is slower; failing is no option
    assert result.pareto("p90_ttft_ms") == [
        a,
        b,
        d,
    ]


def test_launch_commands_follow_the_engine_knobs():
    s = chat(
        engine={"enable_chunked_prefill": False, "max_num_batched_tokens": 16384, "kv_dtype": "fp8"},
        parallelism={"tp": 4},
    )
    vllm, sglang = vllm_command(s, 16384), sglang_command(s, 16384)
    assert "--tensor-parallel-size 4" in vllm and "--no-enable-chunked-prefill" in vllm
    assert "--kv-cache-dtype fp8" in vllm and "--max-num-batched-tokens 16384" in vllm
    assert (
        "--tp 4" in sglang and "--chunked-prefill-size -1" in sglang and "--kv-cache-dtype fp8_e4m3" in sglang
    )
    assert "--disable-hybrid-kv-cache-manager" not in vllm
    whole = chat(engine={"disable_hybrid_kv_cache_manager": True, "long_prefill_token_threshold": 2048})
    assert "--disable-hybrid-kv-cache-manager" in vllm_command(whole, 16384)
    assert "--long-prefill-token-threshold 2048" in vllm_command(whole, 16384)
    assert "async" not in vllm  # vLLM schedules ahead by default, as the simulation did
    assert "--no-async-scheduling" in vllm_command(chat(engine={"async_scheduling": False}), 16384)
    # simulated synchronously
    assert "--no-async-scheduling" in vllm_command(chat(parallelism={"pp": 2}), 16384)
    pd = chat(
        disaggregation={
            "prefill": {"replicas": 1},
            "decode": {"replicas": 1},
            "transfer": {"link": "ib-ndr-400"},
        }
    )
    assert "--no-async-scheduling" in vllm_command(pd, 16384)  # P/D pools step synchronously
    # SGLang's default, as here
    assert "overlap" not in sglang_command(chat(engine={"scheduler": "sglang"}), 16384)
    assert "--disable-overlap-schedule" in sglang_command(
        chat(engine={"scheduler": "sglang", "async_scheduling": False}), 16384
    )
    assert "overlap" not in sglang  # a vLLM scenario's SGLang command is an approximation anyway
    assert "--long-prefill-token-threshold" not in vllm
    sg = chat(
        engine={
            "scheduler": "sglang",
            "prefix_caching": "radix",
            "queue_order": "lpm",
            "schedule_conservativeness": 0.5,
            "enable_mixed_chunk": True,
        }
    )
    command = sglang_command(sg, 16384)
    # SGLang's own
    assert "--chunked-prefill-size 8192" in command and "--max-running-requests" not in command
    assert "--mem-fraction-static 0.834" in command
    assert "--schedule-policy lpm" in command and "--schedule-conservativeness 0.5" in command
    assert "--enable-mixed-chunk" in command and "--max-prefill-tokens" not in command
    assert any(note.startswith("simulated with SGLang's scheduler") for note in launch_notes(sg))


def test_the_plan_section_supplies_the_choices():
    s = chat(
        plan={
            "gpus": ["h200"],
            "tp": [2],
            "max_replicas": 2,
            "target_rate_per_s": 20,
            "engine": {"max_num_seqs": [128]},
        }
    )
    result = plan(s, SCENARIOS)
    assert [e.candidate.label for e in result.evaluations] == ["h200 tp=2 max_num_seqs=128"]
    assert result.target_rate_per_s == 20 and result.recommendation.label == "1 x h200 tp=2 max_num_seqs=128"
    assert result.next_cheaper is None  # nothing cheaper than one replica of the only candidate
    assert "--max-num-seqs 128" in result.commands["vllm"] and "--tp 2" in result.commands["sglang"]
    assert result.commands["notes"][0] == "one replica of 2 GPU(s): no load balancer needed"


def test_layouts_that_change_nothing_are_planned_once_as_the_plain_one():
    """DP attention or expert parallel on one GPU, or expert parallel on a dense model, is the plain layout."""
    from servesim.simulator.planning.plan import shapes_of

    both = {"ep": [False, True], "dp_attention": [False, True]}
    plain, dp = (("ep", False), ("dp_attention", False)), (("ep", False), ("dp_attention", True))
    assert shapes_of(chat(), [1, 2], [1], both) == [(1, 1, plain), (2, 1, plain), (2, 1, dp)]
    moe = shapes_of(chat(model="qwen3-30b-a3b"), [1, 2], [1], both)
    assert [layout for tp, _, layout in moe] == [
        plain,
        plain,
        dp,
        (("ep", True), ("dp_attention", False)),
        (("ep", True), ("dp_attention", True)),
    ]
    assert shapes_of(chat(), [1, 2], [1, 2], {}) == [(1, 1, ()), (1, 2, ()), (2, 1, ()), (2, 2, ())]


def test_the_plan_compares_moe_layouts_and_launches_the_one_it_picks(tmp_path):
    """Qwen3-30B-A3B on two H100s, plain TP against vLLM's DP ranks (both expert parallel, the one from the plan
    section, the other as --ep gives it): both sized and verified, each priced as two GPUs; the recommendation's
    commands run its layout."""
    s = chat(
        model="qwen3-30b-a3b",
        plan={
            "gpus": ["h100-sxm"],
            "tp": [2],
            "max_replicas": 2,
            "target_rate_per_s": 20,
            "dp_attention": [False, True],
        },
    )
    result = plan(s, SCENARIOS, layouts={"ep": [True]})
    labels = [e.candidate.label for e in result.evaluations]
    assert labels == ["h100-sxm tp=2 ep", "h100-sxm tp=2 ep dp_attention"]
    assert [e.gpus_per_replica for e in result.evaluations] == [2, 2]
    assert [e.as_dict()["dp_attention"] for e in result.evaluations] == [False, True]
    assert {d.evaluation.candidate.label for d in result.deployments} == set(labels)
    dp = "--data-parallel-size 2" in result.commands["vllm"]
    assert dp == result.recommendation.label.endswith("dp_attention")
    # the layout is what runs, not only its label
    assert "--enable-expert-parallel" in result.commands["vllm"]
    assert result.as_dict()["recommendation"]["dp_attention"] == dp
    path = tmp_path / "moe.yaml"
    path.write_text(yaml.safe_dump({**s.model_dump(mode="json", exclude_none=True), "plan": None}))
    cli = CliRunner().invoke(
        app, ["plan", str(path), "--gpus", "h100-sxm", "--tp", "2", "--dp-attention", "maybe"]
    )
    assert cli.exit_code == 2 and "--dp-attention 'maybe': expected true and/or false" in cli.stderr


def test_pd_disaggregated_units_are_searched_and_sized_as_wholes():
    from servesim.simulator.planning.plan import plan
    from tests.simulator.study_helpers import SCENARIOS, chat

    base = chat(
        workload={
            "lengths": {
                "prompt": {"kind": "uniform", "low": 2000, "high": 4000},
                "output": {"kind": "uniform", "low": 20, "high": 120},
            },
            "trace": None,
            "arrivals": {"kind": "poisson", "rate_per_s": 6},
            "num_requests": 150,
        },
        plan={"gpus": ["h100-sxm"], "tp": [1], "max_replicas": 4, "pd_ratios": [[1, 1], [2, 1]]},
        slo={"ttft_ms": 1500, "tpot_ms": 30},
    )
    result = plan(base, SCENARIOS)
    kinds = {e.candidate.label: e for e in result.evaluations}
    assert set(kinds) == {"h100-sxm tp=1", "h100-sxm tp=1 1P1D", "h100-sxm tp=1 2P1D"}
    for label, ratio in (("h100-sxm tp=1 1P1D", 2), ("h100-sxm tp=1 2P1D", 3)):
        assert kinds[label].gpus_per_replica == ratio  # a unit of x + y single-GPU replicas
    unit = kinds["h100-sxm tp=1 1P1D"].candidate.scenario(base, replicas=2)
    assert (unit.disaggregation.prefill.replicas, unit.disaggregation.decode.replicas) == (2, 2)
    assert result.recommendation is not None
    json_out = result.as_dict()
    assert any(c["kind"] == "pd" for c in json_out["candidates"])


def test_a_deployment_whose_replicas_carry_a_failed_rate_is_flagged():
    """Sizing saw one replica pass at 19.4 req/s and fail at 20: two replicas at 40 req/s that pass whole carry
    20 each, so the plan says the margin is thin; at 38 req/s (19 each) it does not."""
    capacity = CapacityResult(19.375, 2, [Verdict(19.375, (), ()), Verdict(20.0, ("TTFT SLO",), ("slow",))])
    ev = Evaluation(
        Candidate("h100-sxm", 1), gpus_per_replica=1, price_per_replica_hour_usd=2.99, capacity=capacity
    )
    at_40 = Deployment(ev, 2, Verdict(40.0, (), (), {"p90_ttft_ms": 150.0}))
    assert (
        "each replica carries 20 req/s, where one replica alone failed in sizing (TTFT SLO at 20 req/s)"
        in at_40.thin_margin
    )
    assert Deployment(ev, 2, Verdict(38.0, (), ())).thin_margin is None
    # failing: nothing to add
    assert Deployment(ev, 2, Verdict(40.0, ("TTFT SLO",), ("slow",))).thin_margin is None


def test_pd_candidates_keep_the_scenarios_transfer_and_pool_settings():
    """A P/D candidate resizes the scenario's pools onto its GPU and parallelism; the link, layer-wise streaming,
    routers and pool engine knobs the scenario chose stay."""
    base = chat(
        disaggregation={
            "prefill": {"replicas": 1, "gpu": "h200", "tp": 4, "engine": {"max_num_batched_tokens": 4096}},
            "decode": {"replicas": 1, "tp": 4, "router": "round_robin"},
            "transfer": {"kind": "direct", "link": "ib-ndr-400", "streaming": True},
        }
    )
    unit = Candidate("h100-sxm", 2, kind="pd", ratio=(2, 1)).scenario(base, replicas=3).disaggregation
    assert unit.transfer == base.disaggregation.transfer
    assert (unit.prefill.replicas, unit.prefill.tp, unit.prefill.gpu, unit.prefill.engine) == (
        6,
        2,
        None,
        {"max_num_batched_tokens": 4096},
    )
    assert (unit.decode.replicas, unit.decode.tp, unit.decode.router) == (3, 2, "round_robin")
    # a knob the plan varies is the candidate's in both pools, over what a pool set for itself
    knobbed = Candidate("h100-sxm", 2, knobs=(("max_num_batched_tokens", 8192),), kind="pd").scenario(base)
    pools = knobbed.disaggregation
    assert pools.prefill.engine == pools.decode.engine == {"max_num_batched_tokens": 8192}


def test_a_colocated_candidate_of_a_pd_scenario_runs_colocated():
    """Planning a scenario written with P/D pools, a colocated candidate is that many plain replicas, not the
    scenario's pools (priced as one replica, and refused past one)."""
    base = chat(disaggregation={"prefill": {"replicas": 1, "tp": 4}, "decode": {"replicas": 1, "tp": 4}})
    s = Candidate("h100-sxm", 2).scenario(base, replicas=3)
    assert s.disaggregation is None and (s.cluster.replicas, s.parallelism.tp) == (3, 2)


def test_a_plan_of_what_it_cannot_scale_or_run_stops_with_one_line():
    """A multi-stage pipeline is refused before any sizing; an input error every candidate meets (one request:
    no arrival rate) is that error, not "no candidate meets the SLOs"."""
    omni, _ = load_scenario(SCENARIOS / "omni_thinker_talker.yaml")
    with pytest.raises(SpecError, match="stages: a plan scales replicas of one engine"):
        plan(omni, SCENARIOS, gpus=["h100-sxm"], tps=[1], target_rate=TARGET)
    with pytest.raises(SpecError, match="mean rate needs >= 2 arrivals"):
        plan(chat(workload={"num_requests": 1}), SCENARIOS, gpus=["h100-sxm"], tps=[1, 2])


def test_on_a_terminal_the_plan_shows_a_bar_of_candidates_with_an_eta():
    import io

    from rich.console import Console

    from servesim.simulator.progress import plan_progress

    screen = io.StringIO()
    with plan_progress(Console(file=screen, force_terminal=True, width=160)) as on_progress:
        on_progress("sized", 1, 4, "h100-sxm tp=1: 23.8 req/s per replica")
        on_progress("verified", 1, None, "2 x h100-sxm tp=1 ($5.98/h): ok")
    shown = screen.getvalue()
    assert "1/4" in shown and "sizing candidates" in shown and "verifying deployment 1" in shown


@pytest.mark.parametrize("rate", ["inf", "0"])  # below 0: a usage error of typer's own
def test_a_target_rate_that_is_no_finite_load_is_one_line(tmp_path, rate):
    out = tmp_path / "plan"
    result = CliRunner().invoke(
        app,
        [
            "plan",
            str(SCENARIOS / "quickstart.yaml"),
            "--target-rate",
            rate,
            "--out",
            str(out),
            "--workers",
            "1",
        ],
    )
    assert result.exit_code != 0 and "Traceback" not in result.output and not out.exists()
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) <= 2 and "--target-rate" in lines[0]
