"""TensorRT-LLM's family and scheduler: trtllm-serve's defaults, its KV pool as a share of the memory the weights
leave, GUARANTEED_NO_EVICT admission (whole sequences reserved, nobody preempted) and whole prompts."""

import shlex
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from servesim.hardware.cost import Parallelism
from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu
from servesim.hardware.memory import activation_bytes, plan_memory, weight_bytes_per_gpu
from servesim.hardware.model import get_model
from servesim.policies.config import EngineConfig
from servesim.policies.families import TRTLLM, OfflineRun, family_of, trtllm_bench_limits
from servesim.policies.kv_blocks import blocks_for
from servesim.simulator.cli.main import app
from servesim.simulator.planning.launch import launch_notes, sglang_command, trtllm_command, vllm_command
from servesim.simulator.scenario import load_scenario
from servesim.simulator.world.run import rejection, simulate
from servesim.workloads.request import Request

from tests.policies.helpers import (
    assert_every_token_served,
    drive,
    make_requests,
    make_scheduler,
    scheduled,
    step,
)
from tests.simulator.engine_flags import trtllm_inline_options, trtllm_parser

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


def test_unset_knobs_take_trtllm_serve_defaults():
    e = EngineConfig(scheduler="trtllm").with_defaults(get_gpu("h100-sxm"), 131072)
    assert family_of("trtllm") is TRTLLM
    # --max_num_tokens 8192, --max_batch_size 2048 (not capped at the budget), tokens_per_block 32, chunked
    # prefill off and the budget kept (no growth to max_model_len), free-memory fraction 0.9, overlap scheduler on
    assert (e.max_num_batched_tokens, e.max_num_seqs, e.block_size) == (8192, 2048, 32)
    assert (e.enable_chunked_prefill, e.gpu_memory_utilization, e.async_scheduling) == (False, 0.9, True)
    # what a user sets stands
    e = EngineConfig(scheduler="trtllm", enable_chunked_prefill=True, block_size=64).with_defaults(
        get_gpu("h100-sxm"), 131072
    )
    assert (e.enable_chunked_prefill, e.block_size) == (True, 64)
    # vLLM's defaults are unchanged
    v = EngineConfig().with_defaults(get_gpu("h100-sxm"), 131072)
    assert (v.block_size, v.enable_chunked_prefill, v.max_num_seqs) == (16, True, 1024)


def test_deepseek_fp8_on_4_b200_fits_under_trtllm_not_under_vllm():
    """TensorRT-LLM sizes its pool as 0.9 of what weights, activations and the runtime leave, so DeepSeek-V3's
    169.4 GB of FP8 weights per GPU at TP 4 leave it ~16 GB, where vLLM's 0.9 of the device is short."""
    model, gpu, par = get_model("deepseek-v3"), get_gpu("b200"), Parallelism(tp=4)
    vllm = EngineConfig().with_defaults(gpu, 4096, tp=4, mla=True)
    with pytest.raises(SpecError, match="does not fit"):
        plan_memory(model, gpu, par, vllm.memory_config())
    trt = EngineConfig(scheduler="trtllm").with_defaults(gpu, 4096, tp=4, mla=True)
    cfg = trt.memory_config()
    plan = plan_memory(model, gpu, par, cfg)
    weights, act = weight_bytes_per_gpu(model, par, "fp8"), activation_bytes(model, par, cfg)
    free = gpu.reported_memory_bytes - weights - act - cfg.runtime_reserve_bytes
    assert plan.kv_cache_bytes == pytest.approx(0.9 * free)
    assert plan.num_blocks == int(0.9 * free // (32 * plan.kv_bytes_per_token))
    assert 14e9 < plan.kv_cache_bytes < 18e9


def test_a_request_waits_until_its_whole_sequence_fits():
    """A pool of 10 blocks of 4 tokens. A (8 + 8 tokens reserved: 4 blocks) is admitted; B (8 + 20: 28 tokens, 7
    blocks) needs 7 + A's 2 blocks still to come > 8 free, so it waits until A ends, where vLLM admits
    it on its prompt's 2 blocks and preempts later."""
    knobs = dict(num_blocks=10, block_size=4, max_num_batched_tokens=64, max_num_seqs=8)
    sched, _ = make_scheduler("trtllm", enable_chunked_prefill=False, **knobs)
    a, b = make_requests([8, 8], [8, 20])
    steps = drive(sched, [a, b])
    assert steps[0].batch == [0]
    admitted_b = next(i for i, s in enumerate(steps) if 1 in s.batch)
    assert all(s.batch == [0] for s in steps[:admitted_b])
    assert a.finish_s is not None and a.finish_s <= admitted_b + 1
    assert not any(s.preempted for s in steps)

    vllm, _ = make_scheduler("vllm", **knobs)
    a, b = make_requests([8, 8], [8, 20])
    assert drive(vllm, [a, b])[0].batch == [0, 1]


def test_the_reservation_counts_every_new_token_and_cached_blocks_once():
    """TensorRT-LLM reserves ceil((prompt + max new tokens) / block) (getRemainingBlocksToCompletion): three
    31 + 2-token requests take 2 blocks of 32 each, so one fits a 3-block pool. Cached blocks sitting free count
    as free and a prefix hit does not shrink the reservation: a 1,088 + 1,000-token request whose 1,024-token
    prefix is cached and free needs its 66 blocks of the 70 free, no more."""
    sched, _ = make_scheduler("trtllm", num_blocks=3, block_size=32, enable_chunked_prefill=False)
    for i in range(3):
        sched.add(Request(i, 0.0, 31, 2), 0.0)
    assert scheduled(sched.schedule(0.0)) == [(0, 31)]

    sched, _ = make_scheduler(
        "trtllm", num_blocks=70, block_size=32, enable_chunked_prefill=False, prefix_caching="vllm"
    )
    first = Request(0, 0.0, 1024, 1, prompt_segments=((7, 1024),))
    sched.add(first, 0.0)
    sched.commit(sched.schedule(0.0), 1.0)
    assert first.finish_s is not None and sched.kv.num_free_blocks == 70
    sched.add(Request(1, 1.0, 1088, 1000, prompt_segments=((7, 1024), (200, 64))), 1.0)
    assert scheduled(sched.schedule(1.0)) == [(1, 64)]  # its 1,024 cached tokens hit


def test_a_prompt_that_would_reuse_blocks_computed_this_step_waits_a_step_for_them():
    """Four prompts share a 1,024-token system prompt, a fifth shares nothing. The first computes the shared
    blocks; the other three would reuse blocks not stored before that step ends, so they sit it out
    (GUARANTEED_NO_EVICT's beneficialToSkip) while the fifth, behind them, goes in, and the next step they hit
    the 1,024 tokens."""
    sched, _ = make_scheduler(
        "trtllm", num_blocks=10_000, block_size=32, enable_chunked_prefill=False, prefix_caching="vllm"
    )
    shared = [Request(i, 0.0, 1088, 16, prompt_segments=((7, 1024), (100 + i, 64))) for i in range(4)]
    for req in [*shared, Request(4, 0.0, 500, 16)]:
        sched.add(req, 0.0)
    assert scheduled(step(sched, 0.0)) == [(0, 1088), (4, 500)]
    assert scheduled(step(sched, 1.0)) == [(0, 1), (4, 1), (1, 64), (2, 64), (3, 64)]
    assert [r.num_cached_tokens for r in shared] == [0, 1024, 1024, 1024]


def test_whole_prompts_wait_for_the_budget_and_decodes_count_against_it():
    """max_num_tokens 16: A's 10-token prompt runs; B's 10 do not fit beside it (20 > 16); next step A decodes
    (1 token) and B's prompt fits the 15 left."""
    sched, _ = make_scheduler(
        "trtllm", num_blocks=64, block_size=4, max_num_batched_tokens=16, enable_chunked_prefill=False
    )
    a, b = make_requests([10, 10], [4, 4])
    steps = drive(sched, [a, b])
    assert (steps[0].batch, steps[0].num_new) == ([0], [10])
    assert (steps[1].batch, steps[1].num_new) == ([0, 1], [1, 10])


def test_a_prompt_over_max_num_tokens_is_refused_at_arrival():
    engine = EngineConfig(scheduler="trtllm").with_defaults(get_gpu("h100-sxm"), 32768)
    sched, _ = make_scheduler("trtllm", num_blocks=100_000, block_size=32)
    long, short = Request(0, 0.0, 9000, 10), Request(1, 0.0, 8000, 10)
    reason = rejection(long, engine, 32768, 100_000, 32, scheduler=sched)
    assert reason == "prompt (9000 tokens) exceeds max_num_batched_tokens (8192) with chunked prefill off"
    assert rejection(short, engine, 32768, 100_000, 32, scheduler=sched) is None
    assert (
        rejection(short, engine, 32768, 100_000, 32) is None
    )  # no scheduler: the budget's chunks are counted
    chunked = engine.model_copy(update={"enable_chunked_prefill": True})
    assert rejection(long, chunked, 32768, 100_000, 32, scheduler=sched) is None
    # a pool too small for the whole sequence: refused, as it could never be admitted
    assert rejection(short, engine, 32768, 250, 32, scheduler=sched) == (
        "needs 251 KV blocks at full length; the pool has 250"
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30)), min_size=1, max_size=12),
    block_size=st.sampled_from([1, 4, 16]),
    spare_blocks=st.integers(0, 20),
    max_num_seqs=st.integers(1, 8),
    chunked=st.booleans(),
    ahead=st.booleans(),
    caching=st.booleans(),
    gap=st.sampled_from([0.0, 0.5, 1.5]),
)
def test_nobody_is_preempted_and_every_request_finishes(
    lengths, block_size, spare_blocks, max_num_seqs, chunked, ahead, caching, gap
):
    requests = make_requests([p for p, _ in lengths], [o for _, o in lengths])
    sched, log = make_scheduler(
        "trtllm",
        # what its reservation takes (prompt and every new token): a smaller pool refuses it at arrival
        num_blocks=max(blocks_for(p + o, block_size) for p, o in lengths) + spare_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(64, max(p for p, _ in lengths)),
        enable_chunked_prefill=chunked,
        async_scheduling=ahead,
        prefix_caching="vllm" if caching else "none",
    )
    steps = drive(sched, requests, arrivals=[i * gap for i in range(len(requests))])
    assert not any(s.preempted for s in steps)
    assert_every_token_served(requests, log)


def test_simulate_under_trtllm_refuses_prompts_over_its_budget(tmp_path):
    """The quickstart's Azure trace at max_num_tokens 2048: every prompt longer is refused with the reason, the
    rest finish, nobody is preempted, and the run records TensorRT-LLM's defaults."""
    out = tmp_path / "run"
    args = ["simulate", str(QUICKSTART), "--out", str(out), "--set", "engine.scheduler=trtllm"]
    args += ["--set", "engine.max_num_seqs=null", "--set", "engine.max_num_batched_tokens=2048"]
    args += ["--set", "workload.num_requests=300"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    engine = yaml.safe_load((out / "scenario.yaml").read_text())["engine"]
    assert (engine["max_num_seqs"], engine["block_size"], engine["enable_chunked_prefill"]) == (
        2048,
        32,
        False,
    )
    requests = pd.read_csv(out / "requests.csv")
    long = requests["prompt_tokens"] > 2048
    assert long.any() and (~long).any()
    assert (
        requests.loc[long, "reject_reason"].str.contains("exceeds max_num_batched_tokens (2048)", regex=False)
    ).all()
    assert requests.loc[~long, "reject_reason"].isna().all()
    assert requests.loc[~long, "finish_s"].notna().all()
    assert requests["preemptions"].sum() == 0


def test_trtllm_serve_command_carries_the_simulated_knobs():
    unset = ["engine.max_num_seqs=null", "engine.max_num_batched_tokens=null"]
    knobs = [
        "engine.prefix_caching=none",
        "engine.kv_dtype=fp8",
        "engine.async_scheduling=false",
        "engine.gpu_memory_utilization=0.8",
    ]
    s, _ = load_scenario(QUICKSTART, ["engine.scheduler=trtllm", *unset, *knobs])
    words, options = trtllm_inline_options(shlex.split(trtllm_command(s, 16384)))
    assert words[:2] == ["trtllm-serve", "meta-llama/Llama-3.1-8B"]
    args = trtllm_parser().parse_args(words[1:])
    assert (args.max_batch_size, args.max_num_tokens, args.max_seq_len) == (2048, 8192, 16384)
    assert (args.kv_cache_free_gpu_memory_fraction, args.enable_chunked_prefill) == (0.8, False)
    # trtllm-serve merges the options file over its flags key by key: its kv_cache_config replaces the flag's
    assert options == {
        "kv_cache_config": {"enable_block_reuse": False, "dtype": "fp8", "free_gpu_memory_fraction": 0.8},
        "disable_overlap_scheduler": True,
    }
    # TensorRT-LLM's own defaults need no options file
    s, _ = load_scenario(QUICKSTART, ["engine.scheduler=trtllm", *unset])
    assert "--extra_llm_api_options" not in trtllm_command(s, 16384)


def test_trtllm_bench_sizes_the_engine_to_the_runs_lengths():
    """trtllm-bench's heuristic, by hand for Llama-3.1-8B in FP8 on a 79 GiB GPU at a 0.95 KV share: a token's KV
    is 2 x 32 layers x 8 heads x 128 x 2 bytes = 1.2207e-4 GiB; (79 - 8.03e9 B of weights) x 0.95 = 67.94 GiB holds
    278.3 requests of 1000 + 1000 tokens -> 384 slots (128s above 256) and 556.6 tokens -> 2048 (the floor); at
    128 + 128 tokens 2174 requests -> 2304 slots (256s above 1024) and 4348 tokens -> 4608 (512s)."""
    model = get_model("llama-3.1-8b")
    assert 8.0e9 < model.total_params() < 8.06e9
    chat = OfflineRun(model, 1, 1, 1000, 1000, "fp8", "bf16", 0.95)
    assert trtllm_bench_limits(chat, 79.0) == (2048, 384)
    short = OfflineRun(model, 1, 1, 128, 128, "fp8", "bf16", 0.95)
    assert trtllm_bench_limits(short, 79.0) == (4608, 2304)
    # an FP8 KV cache halves a token's bytes: twice the requests
    assert trtllm_bench_limits(OfflineRun(model, 1, 1, 1000, 1000, "fp8", "fp8", 0.95), 79.0) == (2048, 640)
    # without chunked prefill the budget holds the prompt and the batch
    assert trtllm_bench_limits(OfflineRun(model, 1, 1, 20000, 2000, "fp8", "fp8", 0.95), 79.0) == (20064, 64)
    # a checkpoint trtllm-bench does not size (MXFP4) runs at the defaults, 8192 tokens and 2048 requests
    gpt_oss = get_model("gpt-oss-20b")
    assert trtllm_bench_limits(OfflineRun(gpt_oss, 1, 1, 1024, 1024, "mxfp4", "fp8", 0.95), 79.0) == (
        8192,
        2048,
    )
    assert trtllm_bench_limits(OfflineRun(gpt_oss, 1, 1, 8192, 1024, "mxfp4", "fp8", 0.95), 79.0) == (
        10240,
        2048,
    )


def test_a_trtllm_plans_other_commands_take_their_own_engines_defaults():
    """TensorRT-LLM's unset-knob defaults (2048 slots, whole prompts, 32-token blocks) are not vLLM's or SGLang's:
    their commands for a plan simulated under trtllm keep only what the scenario sets."""
    unset = ["engine.max_num_seqs=null", "engine.max_num_batched_tokens=null"]
    s, _ = load_scenario(QUICKSTART, ["engine.scheduler=trtllm", *unset])
    vllm, sglang = vllm_command(s, 16384), sglang_command(s, 16384)
    assert "--max-num-seqs 1024 --max-num-batched-tokens 8192" in vllm and "--enable-chunked-prefill" in vllm
    assert "--block-size" not in vllm and "--max-running-requests" not in sglang
    assert "--chunked-prefill-size 8192" in sglang
    assert any("TensorRT-LLM command runs it" in note for note in launch_notes(s))
    set_by_user, _ = load_scenario(QUICKSTART, ["engine.scheduler=trtllm", "engine.max_num_seqs=256"])
    assert "--max-num-seqs 256" in vllm_command(set_by_user, 16384)
    assert "--max-running-requests 256" in sglang_command(set_by_user, 16384)


def test_batch_waiting_holds_prompts_while_requests_decode_until_the_timeout_or_enough_tokens():
    """TensorRT-LLM's batch waiting (timeout 3 iterations, 0.9 of 1000 tokens): with one request decoding, a
    100-token prompt is held 3 steps and taken in the 4th; the count starts again; a prompt that brings the step to
    900 tokens goes at once; and with nothing decoding nobody waits. The overlap scheduler is off, so each step is
    planned after the one before ends."""
    sched, _ = make_scheduler(
        "trtllm",
        num_blocks=10_000,
        block_size=32,
        max_num_batched_tokens=1000,
        async_scheduling=False,
        batch_wait_timeout_iters=3,
        batch_wait_max_tokens_ratio=0.9,
    )
    sched.add(Request(0, 0.0, 100, 50), 0.0)
    assert scheduled(step(sched)) == [(0, 100)]  # nothing decodes: no wait
    sched.add(Request(1, 0.0, 100, 50), 0.0)
    assert [scheduled(step(sched)) for _ in range(4)] == [[(0, 1)], [(0, 1)], [(0, 1)], [(0, 1), (1, 100)]]
    sched.add(Request(2, 0.0, 100, 50), 0.0)
    assert scheduled(step(sched)) == [(0, 1), (1, 1)]  # held again, counted from 0
    sched.add(Request(3, 0.0, 800, 50), 0.0)  # 100 + 800 + 2 decodes >= 900
    assert scheduled(step(sched)) == [(0, 1), (1, 1), (2, 100), (3, 800)]


def test_trtllm_serve_command_carries_batch_waiting():
    knobs = [
        "engine.prefix_caching=none",
        "engine.batch_wait_timeout_iters=20",
        "engine.batch_wait_max_tokens_ratio=0.9",
    ]
    s, _ = load_scenario(QUICKSTART, ["engine.scheduler=trtllm", *knobs])
    _, options = trtllm_inline_options(shlex.split(trtllm_command(s, 16384)))
    assert (options["batch_wait_timeout_iters"], options["batch_wait_max_tokens_ratio"]) == (20, 0.9)
    with pytest.raises(SpecError, match="TensorRT-LLM waits to batch only without attention DP"):
        load_scenario(ROOT / "scenarios" / "deepseek_v3_8xh200.yaml", ["engine.scheduler=trtllm", *knobs])


def test_batch_waiting_is_trtllms_and_modelled_without_prefix_caching():
    with pytest.raises(
        ValueError, match="batch_wait_timeout_iters and batch_wait_max_tokens_ratio are TensorRT-LLM"
    ):
        EngineConfig(scheduler="vllm", batch_wait_timeout_iters=20)
    with pytest.raises(ValueError, match="batch waiting is modelled without prefix caching"):
        EngineConfig(scheduler="trtllm", batch_wait_timeout_iters=20, prefix_caching="vllm")
    assert EngineConfig(scheduler="trtllm", batch_wait_timeout_iters=20, prefix_caching="none")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), timeout=st.integers(1, 30), ratio=st.sampled_from([0.0, 0.5, 0.9]))
def test_batch_waiting_runs_the_same_stepped_and_fused(seed, timeout, ratio):
    """Fast-forward refuses stretches while batch waiting holds prompts: results equal stepping's."""
    overrides = [
        "engine.scheduler=trtllm",
        "engine.prefix_caching=none",
        f"engine.batch_wait_timeout_iters={timeout}",
        f"engine.batch_wait_max_tokens_ratio={ratio}",
        "workload.num_requests=60",
        f"seed={seed}",
    ]
    tables = []
    for fused in ("true", "false"):
        s, base = load_scenario(QUICKSTART, [*overrides, f"simulation.fast_forward={fused}"])
        tables.append(simulate(s, base).requests)
    pd.testing.assert_frame_equal(tables[0], tables[1], check_exact=True)


def _sharing_prefix(n: int, budget: int, scheduler: str = "trtllm"):
    """A scheduler whose pool holds a cached 1,024-token prefix, and `n` waiting 1,088-token prompts sharing it."""
    sched, _ = make_scheduler(
        scheduler,
        num_blocks=4000,
        block_size=32,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=False,
        prefix_caching="vllm",
    )
    first = Request(0, 0.0, 1024, 1, prompt_segments=((7, 1024),))
    sched.add(first, 0.0)
    sched.commit(sched.schedule(0.0), 1.0)
    for i in range(1, n + 1):
        sched.add(Request(i, 1.0, 1088, 8, prompt_segments=((7, 1024), (100 + i, 64))), 1.0)
    return sched


def test_a_prompts_prefix_hit_still_counts_against_the_token_budget():
    """TensorRT-LLM 1.0-1.2's MicroBatchScheduler counts a prompt whole (getNumTokens) and finds its prefix hit
    only when the KV is allocated: at max_num_tokens 2,048, 1,088-token prompts whose 1,024-token prefix is
    cached go in one a step (each computing 64 tokens), where vLLM, charging the 64, takes all eight."""
    sched = _sharing_prefix(8, 2048)
    assert scheduled(step(sched, 1.0)) == [(1, 64)]
    assert scheduled(step(sched, 2.0)) == [(1, 1), (2, 64)]  # 1 + 1,088 fits; a second 1,088 does not
    vllm = _sharing_prefix(8, 2048, "vllm")
    assert scheduled(step(vllm, 1.0)) == [(i, 64) for i in range(1, 9)]


def test_a_chunk_the_budget_cuts_is_whole_blocks():
    """With chunked prefill, a context chunk cut by the budget is rounded down to tokens_per_block (32): a
    200-token prompt under max_num_tokens 100 runs 96, 96, then its last 8 whole; vLLM runs 100, 100."""
    trt, _ = make_scheduler(
        "trtllm", num_blocks=100, block_size=32, max_num_batched_tokens=100, enable_chunked_prefill=True
    )
    steps = drive(trt, make_requests([200], [2]))
    assert [s.num_new for s in steps[:3]] == [[96], [96], [8]]
    vllm, _ = make_scheduler(
        "vllm", num_blocks=100, block_size=32, max_num_batched_tokens=100, max_num_seqs=8
    )
    assert [s.num_new for s in drive(vllm, make_requests([200], [2]))[:2]] == [[100], [100]]


def test_a_budget_left_under_a_block_admits_no_chunk():
    """Ten 4-token prompts fill a 40-token budget; as they decode, the 30 tokens left are under a block of 32, so
    a 100-token prompt behind them gets no chunk until they finish (vLLM would feed it 30 a step)."""
    sched, _ = make_scheduler(
        "trtllm", num_blocks=200, block_size=32, max_num_batched_tokens=40, enable_chunked_prefill=True
    )
    decoders = make_requests([4] * 10, [3] * 10)
    late = Request(10, 0.0, 100, 2)
    steps = drive(sched, [*decoders, late], arrivals=[0.0] * 10 + [0.5])
    first = next(i for i, s in enumerate(steps) if 10 in s.batch)
    assert all(len(s.batch) == 10 for s in steps[1:first])
    assert all(r.finish_s is not None and r.finish_s <= first + 1 for r in decoders)
    assert steps[first].num_new[steps[first].batch.index(10)] == 32


@pytest.mark.parametrize("scheduler", ["trtllm", "sglang"])
def test_a_long_prefill_cap_is_refused_where_the_engine_has_none(scheduler):
    with pytest.raises(ValueError, match=f"long_prefill_token_threshold is vLLM's.*'{scheduler}' has none"):
        EngineConfig(scheduler=scheduler, long_prefill_token_threshold=512)
    assert (
        EngineConfig(scheduler="vllm", long_prefill_token_threshold=512).long_prefill_token_threshold == 512
    )


def test_chunks_in_blocks_need_a_budget_of_a_block():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(16\) < block_size \(32\): trtllm chunks"):
        EngineConfig(
            scheduler="trtllm", block_size=32, max_num_batched_tokens=16, enable_chunked_prefill=True
        )


def test_trtllm_keeps_every_layer_of_a_sliding_window_model_whole():
    """trtllm-serve sizes gpt-oss-120b's KV with one attention window for all 36 layers (its startup log: "kv size
    is 73728", 36 x 2 x 8 KV heads x 64 x 2 B), where vLLM frees the sliding layers' old blocks: on an H200 the pool
    holds 63.51 GiB / 73,728 B = 925k tokens, 7.06 requests of 131,072 tokens."""
    model, gpu = get_model("gpt-oss-120b"), get_gpu("h200")
    trt = EngineConfig(scheduler="trtllm").with_defaults(gpu, 131072, architecture=model.architecture)
    plan = plan_memory(model, gpu, Parallelism(), trt.memory_config())
    assert trt.disable_hybrid_kv_cache_manager
    assert plan.kv_bytes_per_token == 36 * 2 * 8 * 64 * 2 and plan.kv_windows == (None,)
    assert plan.max_concurrency == pytest.approx(plan.kv_cache_bytes / (73728 * 131072), rel=0.01)
    vllm = EngineConfig().with_defaults(gpu, 131072, architecture=model.architecture)
    assert len(plan_memory(model, gpu, Parallelism(), vllm.memory_config()).kv_windows) == 2
    what_if = EngineConfig(scheduler="trtllm", disable_hybrid_kv_cache_manager=False).with_defaults(
        gpu, 131072, architecture=model.architecture
    )
    assert not what_if.disable_hybrid_kv_cache_manager  # a user's setting stands


def test_batch_waiting_counts_the_chunk_a_block_rounding_leaves():
    """Ten requests decode under a 100-token budget; a 200-token prompt arrives. Its chunk would be the 90 tokens
    left, rounded down to 64, so the step would hold 74 tokens, under 0.8 x 100: batch waiting holds it for its 3
    iterations (counting 90 it would have gone in at once)."""
    sched, _ = make_scheduler(
        "trtllm",
        num_blocks=1000,
        block_size=32,
        max_num_batched_tokens=100,
        enable_chunked_prefill=True,
        batch_wait_timeout_iters=3,
        batch_wait_max_tokens_ratio=0.8,
    )
    decoders = make_requests([4] * 10, [30] * 10)
    late = Request(10, 0.5, 200, 2)
    steps = drive(sched, [*decoders, late], arrivals=[0.0] * 10 + [0.5])
    first = next(i for i, s in enumerate(steps) if 10 in s.batch)
    assert first == 4  # arrived during step 0, held in steps 1-3, in once the timeout is reached
    assert steps[first].num_new[steps[first].batch.index(10)] == 64
