"""Speculative decoding: the seed's formula and table, acceptance draws, the scheduler's rounds, rollback,
switching off under load, draft passes and the memory plan."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import Parallelism, step_cost
from servesim.hardware.gpu import get_gpu
from servesim.hardware.memory import EngineMemoryConfig, plan_memory, weight_bytes_per_gpu
from servesim.hardware.model import get_model
from servesim.hardware.profile import Profile
from servesim.hardware.step_timer import StepTimer
from servesim.policies.config import EngineConfig
from servesim.policies.spec_cost import draft_batches, draft_time, head_model, with_draft_memory
from servesim.policies.spec_decode import (
    SpeculativeConfig,
    Speculator,
    expected_tokens_per_round,
    speedup,
)
from servesim.policies.step import StepPlan
from tests.policies.helpers import drive, make_requests, make_scheduler
from servesim.workloads.request import Request


def drive_allowing_preempt_only_steps(sched, requests, max_steps=20_000):
    """Like helpers.drive, but a step may only preempt (the engine then schedules again at once)."""
    for req in requests:
        sched.add(req, 0.0)
    now = 0.0
    for _ in range(max_steps):
        if all(r.is_done for r in requests):
            break
        plan = sched.schedule(now)
        assert not plan.is_empty or plan.preempted, "requests left but nothing scheduled"
        now += 1.0
        sched.commit(plan, now)
        sched.kv.check_invariants()
    assert all(r.is_done for r in requests), "no progress"
    assert sched.kv.num_free_blocks == sched.kv.num_blocks, "blocks still held after every request finished"


DRAFT = {"method": "draft", "k": 4, "acceptance": 0.7, "draft_model": "llama-3.2-1b"}


def spec(**fields) -> SpeculativeConfig:
    return SpeculativeConfig(**{**DRAFT, **fields})


# ---- the seed's formula ----------------------------------------------------------------------------


def test_expected_tokens_per_round_matches_the_seed():
    assert expected_tokens_per_round(0.7, 4) == pytest.approx(2.7731)  # "(1 - a^5) / (1 - a) ~ 2.77"
    assert expected_tokens_per_round(0.85, 4) == pytest.approx(3.7086, abs=1e-4)  # 3.71
    assert expected_tokens_per_round(0.3, 4) == pytest.approx(1.4251, abs=1e-4)  # 1.42
    assert expected_tokens_per_round(1.0, 4) == 5 and expected_tokens_per_round(0.0, 4) == 1


@pytest.mark.parametrize(
    "c,alpha,seed_says",
    [
        (0.2, 0.7, 1.5),  # 8B target, 1B draft: 2.77 / 1.8
        (0.08, 0.7, 2.1),  # 70B on 4 GPUs, 1B draft: 2.77 / 1.32
        (0.08, 0.85, 2.8),  # the same with a better draft: 3.71 / 1.32
        (0.2, 0.3, 0.8),  # a poor draft: slower
    ],
)
def test_speedup_table_of_the_seed(c, alpha, seed_says):
    assert speedup(alpha, 4, c) == pytest.approx(seed_says, abs=0.05)


# ---- acceptance draws --------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.3, 0.7, 0.9])
def test_accepted_guesses_are_a_capped_geometric(alpha):
    sp, k = Speculator(spec(acceptance=alpha), seed=3), 4
    req = Request(0, 0.0, 10, 10)
    draws = np.array([sp.accept(req, k) for _ in range(40_000)])
    for j in range(1, k + 1):  # P(accepted >= j) = alpha^j
        assert (draws >= j).mean() == pytest.approx(alpha**j, abs=0.01)
    assert draws.max() == k
    assert (draws + 1).mean() == pytest.approx(expected_tokens_per_round(alpha, k), rel=0.01)


def test_acceptance_streams_are_per_request_and_seeded():
    def draws(seed, rid):
        sp, req = Speculator(spec(), seed), Request(rid, 0.0, 10, 10)
        return [sp.accept(req, 4) for _ in range(50)]

    assert draws(1, 5) == draws(1, 5)
    assert draws(1, 5) != draws(2, 5) and draws(1, 5) != draws(1, 6)
    sp = Speculator(spec(acceptance=1.0))
    assert sp.accept(Request(0, 0.0, 1, 1), 3) == 3
    assert Speculator(spec(acceptance=0.0)).accept(Request(0, 0.0, 1, 1), 3) == 0


def test_per_request_acceptance_from_a_beta_distribution():
    sp = Speculator(spec(acceptance={"kind": "beta", "a": 7, "b": 3}), seed=0)
    alphas = [sp.alpha(Request(i, 0.0, 1, 1)) for i in range(2000)]
    assert np.mean(alphas) == pytest.approx(0.7, abs=0.01)
    assert np.std(alphas) == pytest.approx(math.sqrt(7 * 3 / (10**2 * 11)), rel=0.1)
    assert (
        Speculator(spec(acceptance={"kind": "beta", "a": 7, "b": 3})).alpha(Request(4, 0.0, 1, 1))
        == alphas[4]
    )


def test_acceptance_per_position_as_vllm_logs_it():
    """Rates per position are P(accepted >= j): [a, a^2, a^3, a^4] draws exactly what alpha a does (the same
    uniform each round), and rates falling faster than a geometric give their own P(>= j)."""
    geometric = [Speculator(spec(acceptance=a), seed=2) for a in (0.7, [0.7, 0.49, 0.343, 0.2401])]
    req = Request(0, 0.0, 10, 10)
    assert [geometric[0].accept(req, 4) for _ in range(5000)] == [
        geometric[1].accept(req, 4) for _ in range(5000)
    ]
    rates = [0.8, 0.5, 0.25, 0.1]
    sp = Speculator(spec(acceptance=rates), seed=5)
    draws = np.array([sp.accept(req, 4) for _ in range(40_000)])
    for j, rate in enumerate(rates, 1):
        assert (draws >= j).mean() == pytest.approx(rate, abs=0.01)
    assert all(sp.accept(req, 2) <= 2 for _ in range(100))  # capped at the round's guesses
    with pytest.raises(ValueError, match=r"4 rates in \[0, 1\] \(one per guess\)"):
        spec(acceptance=[0.8, 0.5])
    with pytest.raises(ValueError, match="must not increase"):
        spec(acceptance=[0.8, 0.5, 0.6, 0.1])


def test_an_ngram_lookup_without_a_match_proposes_nothing():
    """vLLM's n-gram proposer has no guesses where the prompt holds no match: at a match rate of 0.3, 30% of the
    decode steps verify k guesses and the rest one token (drawn per request and step, seeded)."""
    ngram = {"method": "ngram", "draft_model": None, "k": 4, "acceptance": 0.5}
    sp = Speculator(spec(**ngram, ngram_match_rate=0.3), seed=1)
    reqs = [Request(i, 0.0, 10, 1000) for i in range(8)]
    drafts = np.array([[sp.num_drafts(r) for r in reqs] for _ in range(2000)])
    assert set(np.unique(drafts)) == {0, 4}
    assert (drafts == 4).mean() == pytest.approx(0.3, abs=0.01)
    again = Speculator(spec(**ngram, ngram_match_rate=0.3), seed=1)
    assert [again.num_drafts(r) for r in reqs] == drafts[0].tolist()
    sched, _ = spec_scheduler(num_blocks=400, **ngram, ngram_match_rate=0.3)
    requests = make_requests([8] * 16, [200] * 16)
    steps = drive(sched, requests)
    decoding = [n for st in steps for n in st.num_new if n < 8]
    assert np.mean([n > 1 for n in decoding]) == pytest.approx(0.3, abs=0.03)
    with pytest.raises(ValueError, match="ngram_match_rate is the n-gram lookup's, not 'draft'"):
        spec(ngram_match_rate=0.5)


def test_config_is_validated():
    with pytest.raises(ValueError, match="needs draft_model"):
        SpeculativeConfig(method="draft", k=4, acceptance=0.7)
    with pytest.raises(ValueError, match="only used by method 'draft'"):
        SpeculativeConfig(method="eagle", k=4, acceptance=0.7, draft_model="llama-3.2-1b")
    with pytest.raises(ValueError, match="unknown draft_model"):
        spec(draft_model="llama-0b")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        spec(acceptance=1.5)
    with pytest.raises(ValueError, match="head_cost_fraction prices eagle / mtp heads, not 'draft'"):
        spec(head_cost_fraction=0.2)
    with pytest.raises(ValueError, match="token-budget scheduler"):
        EngineConfig(scheduler="static", speculative=DRAFT)


# ---- the scheduler's rounds ---------------------------------------------------------------------------


def spec_scheduler(num_blocks=100, block_size=4, **fields):
    knobs = {k: fields.pop(k) for k in list(fields) if k in EngineConfig.model_fields}
    return make_scheduler(
        "vllm", num_blocks=num_blocks, block_size=block_size, speculative=spec(**fields), **knobs
    )


def test_all_guesses_accepted_yield_k_plus_one_tokens_a_step():
    sched, log = spec_scheduler(k=3, acceptance=1.0)
    (req,) = make_requests([8], [6])
    steps = drive(sched, [req])
    # prefill samples token 1; a round of 1 + 3 yields 4 (tokens 2-5); the last token needs no guess
    assert [s.num_new for s in steps] == [[8], [4], [1]]
    assert req.num_generated == 6 and req.num_computed_tokens == 8 + 5
    assert list(log.itl_s) == [1.0, 1.0]  # one gap per step, not per token
    assert (req.finish_s - req.first_token_s) / (6 - 1) == pytest.approx(0.4)  # TPOT counts every token


def test_all_guesses_rejected_still_yield_one_token_a_round():
    sched, _ = spec_scheduler(k=3, acceptance=0.0)
    (req,) = make_requests([8], [6])
    steps = drive(sched, [req])
    # guesses shrink near the end: never more than the tokens still to come, minus the round's own token
    assert [s.num_new for s in steps] == [[8], [4], [4], [3], [2], [1]]
    assert req.num_generated == 6


@pytest.mark.parametrize("method,lookahead", [("draft", 4), ("ngram", 0)])
def test_rejected_positions_roll_back_but_their_blocks_stay(method, lookahead):
    """A running request's KV covers the step's tokens plus vLLM's num_lookahead_tokens (k for a draft model or
    EAGLE/MTP heads, 0 for n-grams). Blocks of 4 tokens, k = 4, an 8-token prompt."""
    extra = {} if method == "draft" else {"method": "ngram", "draft_model": None}
    sched, _ = spec_scheduler(k=4, acceptance=0.0, block_size=4, **extra)
    (req,) = make_requests([8], [10])
    sched.add(req, 0.0)
    sched.commit(sched.schedule(0.0), 1.0)  # prefill: 2 blocks (a new request reserves no lookahead)
    assert len(sched.kv.table(req)) == 2
    plan = sched.schedule(1.0)
    assert plan.num_new == (5,) and plan.num_draft == (4,)
    assert plan.fed_to_draft == ((True,) if method == "draft" else ())  # n-grams run no draft model
    blocks = -(-(8 + 5 + lookahead) // 4)  # positions 8..12 and the lookahead: 17 tokens, 5 blocks (13: 4)
    assert len(sched.kv.table(req)) == blocks
    sched.commit(plan, 2.0)
    assert req.num_computed_tokens == 9 and req.num_generated == 2  # guesses cut off, 1 token gained
    assert len(sched.kv.table(req)) == blocks  # kept (vLLM rolls back num_computed_tokens only) ...
    plan = sched.schedule(2.0)
    assert plan.num_context == (9,) and plan.num_new == (5,)
    assert len(sched.kv.table(req)) == blocks  # ... and the next round reuses them: 9 + 5 + lookahead fit
    sched.kv.check_invariants()


def test_the_budget_truncates_guesses():
    sched, _ = spec_scheduler(k=4, acceptance=1.0, max_num_batched_tokens=8, max_num_seqs=4)
    requests = make_requests([2, 2, 2], [20, 20, 20])
    for req in requests:
        sched.add(req, 0.0)
    sched.commit(sched.schedule(0.0), 1.0)
    plan = sched.schedule(1.0)
    assert plan.num_new == (5, 3) and plan.num_draft == (4, 2)  # the third request gets no token this step
    assert plan.samples == (True, True)


def test_drafting_switches_off_above_a_batch_size_and_its_requests_speculate_no_more():
    """Three running > 2: no step drafts, and, as in vLLM v0, the requests of such a step never draft again (the
    draft model did not see their tokens). A request arriving later drafts as usual."""
    sched, _ = spec_scheduler(k=2, acceptance=1.0, disable_above_batch=2, max_num_seqs=8)
    requests = make_requests([4, 4, 4, 4], [3, 5, 5, 9])
    steps = drive(sched, requests, arrivals=[0.0, 0.0, 0.0, 10.0])
    assert steps[1].num_new == [1, 1, 1]  # 3 running > 2: plain decode
    assert steps[2].num_new == [1, 1, 1] and steps[2].batch == [0, 1, 2]  # r0 ends here
    assert steps[3].batch == [1, 2] and steps[3].num_new == [1, 1]  # 2 running, but they no longer speculate
    # the newcomer's prefill, then a round of 2 guesses
    assert steps[5].batch == [3] and steps[6].num_new == [3]
    assert all(r.num_generated == r.num_output_tokens for r in requests)


def test_drafting_switches_off_above_a_token_load():
    sched, _ = spec_scheduler(
        k=2, acceptance=1.0, disable_above_tokens=3, max_num_seqs=8, max_num_batched_tokens=16
    )
    requests = make_requests([4, 4, 40, 4], [9, 9, 2, 5])
    steps = drive(sched, requests, arrivals=[0.0, 0.0, 0.0, 4.0])
    assert steps[0].num_new == [4, 4, 8]
    # pending tokens of the running requests: 1 + 1 + 32, then 1 + 1 + 18, then 1 + 1 + 4: above 3, no guesses
    assert [s.num_new for s in steps[1:4]] == [[1, 1, 14], [1, 1, 14], [1, 1, 4]]
    # 1 + 1 + 1: on again, but the three ran without drafting; r3, admitted now, drafts from its next step on
    assert steps[4].num_new == [1, 1, 1, 4] and steps[5].num_new == [1, 1, 3]


def test_a_request_that_ran_without_drafting_speculates_no_more():
    sp = Speculator(spec())
    req = Request(0, 0.0, 100, 50)
    req.num_computed_tokens, req.num_generated = 100, 1
    assert sp.speculates(req) and sp.num_drafts(req) == 4
    sp.stop((req,))  # it ran in a step without drafting: no more guesses
    assert not sp.speculates(req) and sp.num_drafts(req) == 0


def test_draft_passes_of_a_mixed_step():
    """vLLM's proposer (v1/spec_decode/eagle.py `propose`): pass 0 over every token the target ran for the
    requests that speculate (a verify's 1 + k, a prompt's chunk), then k - 1 passes of one token each for all of
    them, the one mid-prefill too."""
    reqs = make_requests([10, 10, 500], [50, 50, 10])
    reqs[0].num_generated, reqs[1].num_generated = 11, 21  # decoding: context = prompt + generated - 1
    # r0 decodes with 4 guesses, r1 with 2 (the budget cut the rest), r2 prefills 64
    plan = StepPlan(
        tuple(reqs),
        (5, 3, 64),
        (20, 30, 100),
        (True, True, False),
        num_draft=(4, 2, 0),
        fed_to_draft=(True, True, True),
    )
    passes = draft_batches(plan, 4)
    assert [b.num_new.tolist() for b in passes] == [[5, 3, 64], [1, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert [b.num_context.tolist() for b in passes] == [
        [20, 30, 100],
        [25, 33, 164],
        [26, 34, 165],
        [27, 35, 166],
    ]
    assert all(b.needs_logits.tolist() == [True] * 3 for b in passes)  # one proposal each a pass
    assert plan.batch().num_logits == 5 + 3  # the verify pass scores every guess and the bonus position
    assert plan.num_decode_tokens == 8 and plan.num_prefill_tokens == 64
    # ngram: no draft model
    assert (
        draft_batches(
            StepPlan(tuple(reqs), (5, 3, 64), (20, 30, 100), (True, True, False), num_draft=(4, 2, 0)), 4
        )
        == []
    )
    # r1 no longer speculates: the draft model skips it
    stopped = dataclasses.replace(
        plan, num_new=(5, 1, 64), num_draft=(4, 0, 0), fed_to_draft=(True, False, True)
    )
    assert [b.num_new.tolist() for b in draft_batches(stopped, 4)] == [[5, 64], [1, 1], [1, 1], [1, 1]]
    ranked = dataclasses.replace(plan, rank=(1, 0, 1))  # DP attention: each pass keeps its requests' ranks
    assert [b.rank.tolist() for b in draft_batches(ranked, 4)] == [[1, 0, 1]] * 4
    assert all(b.rank is None for b in passes)


def test_an_eagle_head_is_one_target_layer_its_projection_and_the_lm_head():
    """Its layer's operators cost what one layer of the target's does, its LM head what the target's does, and
    its 2h x h input projection (EAGLE's fc, MTP's eh_proj) is priced beside them."""
    target, gpu, par = get_model("llama-3.1-70b"), get_gpu("h200"), Parallelism(tp=4)
    head = head_model(target)
    assert head.num_layers == 1 and head.extra_linear_params == 2 * 8192 * 8192
    gemma = head_model(get_model("gemma-3n-e4b"))  # the target's model-level extras are not the head's
    assert gemma.extra_linear_params == 2 * gemma.hidden_size**2
    batch = StepBatch.uniform(8, 3000)
    ops = {o.name: o for o in step_cost(batch, target, gpu, par).operators}
    head_ops = {o.name: o for o in step_cost(batch, head, gpu, par).operators}
    for name in ("qkv_proj", "attention_decode", "o_proj", "mlp", "lm_head"):
        assert head_ops[name].layers == 1
        assert head_ops[name].time_s == pytest.approx(ops[name].time_s / ops[name].layers, rel=1e-12)
    extras = head_ops["model_extras"]
    assert extras.flops == 2 * 8 * 2 * 8192 * 8192 / 4  # 8 rows through its quarter of the projection


def test_draft_passes_leave_the_hosts_step_time_to_the_target():
    """The scheduler's and sampler's host time is the engine step's, counted once by the target's step, not again
    per draft pass: drafting costs the same under a profile with 2 ms of it per step."""
    plan = StepPlan(
        tuple(make_requests([100, 100], [50, 50])),
        (4, 4),
        (200, 300),
        (True, True),
        num_draft=(3, 3),
        fed_to_draft=(True, True),
    )
    target, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    base = StepTimer(target, gpu)
    hosted = StepTimer(target, gpu, profile=Profile(host_step_s=2e-3, host_request_s=1e-4))
    assert hosted(plan.batch()) == pytest.approx(base(plan.batch()) + 2.2e-3)
    eagle = {"method": "eagle", "k": 3, "draft_model": None}
    for method in (spec(k=3), spec(**eagle), spec(**eagle, head_cost_fraction=0.1)):
        drafting = draft_time(method, base)(plan)
        assert drafting > 0 and draft_time(method, hosted)(plan) == drafting
    # an n-gram step whose lookups all miss still ran them
    ngram = spec(method="ngram", draft_model=None, k=3, ngram_match_rate=0.3, ngram_lookup_s=2e-4)
    missed = dataclasses.replace(plan, num_draft=(0, 0), fed_to_draft=())
    assert draft_time(ngram, base)(missed) == 2e-4
    assert (
        draft_time(ngram, base)(dataclasses.replace(missed, num_draft=())) == 0.0
    )  # a step that drafts nothing


def test_draft_weights_and_kv_shrink_the_pool():
    cfg = EngineMemoryConfig(max_model_len=8192)
    model, gpu, par = get_model("llama-3.1-8b"), get_gpu("h200"), Parallelism()
    alone = plan_memory(model, gpu, par, cfg)
    both = with_draft_memory(alone, spec(), model, gpu, par, cfg)
    draft = get_model("llama-3.2-1b")
    assert both.weight_bytes - alone.weight_bytes == pytest.approx(draft.total_params() * 2, rel=1e-5)  # tied
    assert both.kv_bytes_per_token == 131072 + 32768
    extra = both.weight_bytes - alone.weight_bytes
    assert both.num_blocks == int((alone.kv_cache_bytes - extra) // (16 * (131072 + 32768)))
    assert both.num_blocks < alone.num_blocks * 131072 / (131072 + 32768)
    eagle = with_draft_memory(
        alone, SpeculativeConfig(method="eagle", k=4, acceptance=0.7), model, gpu, par, cfg
    )
    assert eagle.kv_bytes_per_token == 131072 + 131072 / 32  # one layer's KV
    assert (
        with_draft_memory(alone, SpeculativeConfig(method="ngram", k=4, acceptance=0.7), model, gpu, par, cfg)
        is alone
    )


def test_an_mtp_head_under_dp_attention_is_laid_out_as_the_targets_layers():
    """DeepSeek-V3's MTP head on 8 H200s with DP attention: one more layer's latent per token, stored once in the
    group as the target's are (576 values of 2 bytes over 8 GPUs); its weights one MoE layer's as the target holds
    them per GPU (attention whole, routed experts over the 8); a request's KV whole on one rank."""
    v3, gpu, cfg = (
        get_model("deepseek-v3"),
        get_gpu("h200"),
        EngineMemoryConfig(max_model_len=16384, block_size=64, weight_dtype="fp8"),
    )
    mtp = SpeculativeConfig(method="mtp", k=1, acceptance=0.8)
    for par in (
        Parallelism(tp=8, ep=True, dp_attention=True),
        Parallelism(tp=8, ep=True, dp_attention=True, dense_replicated=True),
    ):
        alone = plan_memory(v3, gpu, par, cfg)
        both = with_draft_memory(alone, mtp, v3, gpu, par, cfg)
        assert both.kv_bytes_per_token == pytest.approx(alone.kv_bytes_per_token * 62 / 61)
        assert alone.kv_bytes_per_token == pytest.approx(61 * 576 * 2 / 8)
        one_more = dataclasses.replace(v3, layers=(*v3.layers, v3.layers[-1]))
        moe_layer = weight_bytes_per_gpu(one_more, par, "fp8") - weight_bytes_per_gpu(v3, par, "fp8")
        projection = 2 * 7168 * 7168 * 2  # eh_proj, a bf16 nn.Linear on every GPU
        assert both.weight_bytes - alone.weight_bytes == pytest.approx(moe_layer + projection)
        assert both.request_bytes_at_max_len == pytest.approx(alone.request_bytes_at_max_len * 62 / 61)
        # a request on one of 8 ranks
        assert both.max_concurrency == pytest.approx(
            both.num_blocks * both.block_bytes / both.request_bytes_at_max_len * 8
        )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    k=st.integers(1, 6),
    alpha=st.floats(0, 1),
    blocks=st.integers(30, 120),
    caching=st.sampled_from(["none", "vllm", "radix"]),
    budget=st.sampled_from([16, 64, 4096]),
    preemption=st.sampled_from(["recompute", "swap"]),
    off=st.sampled_from([None, 2, 4]),
    scheduler=st.sampled_from(["vllm", "sarathi", "orca"]),
)
def test_rounds_never_lose_or_duplicate_tokens_nor_leak_blocks(
    seed, k, alpha, blocks, caching, budget, preemption, off, scheduler
):
    if scheduler == "orca":
        caching = "none"  # contiguous reservation, shares nothing
    rng = np.random.default_rng(seed)
    n = 12
    prompts, outputs = rng.integers(1, 60, n).tolist(), rng.integers(1, 60, n).tolist()
    sched, _ = make_scheduler(
        scheduler,
        num_blocks=blocks,
        block_size=4,
        prefix_caching=caching,
        preemption_mode=preemption,
        host_blocks=40,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        chunk_size=16,
        speculative=spec(k=k, acceptance=alpha, disable_above_batch=off),
    )
    sched.speculator = Speculator(sched.speculator.cfg, seed)
    requests = make_requests(prompts, outputs)
    drive_allowing_preempt_only_steps(sched, requests)
    assert [r.num_generated for r in requests] == outputs
    assert all(r.num_computed_tokens == p + o - 1 for r, p, o in zip(requests, prompts, outputs))
    assert not sched.speculator._rng and not sched.speculator._stopped  # forgotten at finish


def test_lookahead_never_asks_for_slots_past_the_last_token():
    """A 4 x 16 = 64-token pool and one request of 40 + 24 tokens (63 to hold): it fits whole, and the k = 4
    lookahead slots past its last token would not. It must finish without preempting itself for them."""
    sched, _ = spec_scheduler(num_blocks=4, block_size=16, k=4, acceptance=0.0)
    (req,) = make_requests([40], [24])
    drive(sched, [req])
    assert req.is_done and req.num_preemptions == 0
