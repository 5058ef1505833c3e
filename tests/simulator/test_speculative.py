"""Speculative decoding end to end: batch-1 TPOT speedups against the seed's formula (c from the cost model's
own step times), the gain fading as the batch grows, switching off under load, and run-level bookkeeping."""

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.batch import StepBatch
from servesim.hardware.model import get_model
from servesim.hardware.step_timer import StepTimer
from servesim.policies.spec_cost import head_model
from servesim.policies.spec_decode import expected_tokens_per_round, speedup
from servesim.simulator.world.replicas import build_timer
from tests.simulator.conftest import run, scenario

PROMPT, K = 1024, 4


def draft(alpha, **fields) -> dict:
    return {"method": "draft", "k": K, "acceptance": alpha, "draft_model": "llama-3.2-1b", **fields}


def closed_loop(spec, clients=1, num_requests=24, output=512, model="llama-3.1-8b", tp=1, seed=1, **engine):
    """`clients` closed-loop clients (vllm bench serve --max-concurrency) on one H200 replica, fixed lengths."""
    return scenario(
        model=model,
        seed=seed,
        hardware={"gpu": "h200"},
        parallelism={"tp": tp},
        engine={"max_model_len": 8192, "max_num_seqs": 256, "speculative": spec, **engine},
        workload={
            "trace": None,
            "arrivals": {"kind": "all_at_once"},
            "num_requests": num_requests,
            "lengths": {
                "prompt": {"kind": "fixed", "value": PROMPT},
                "output": {"kind": "fixed", "value": output},
            },
            "closed_loop": {"clients": clients},
        },
    )


def plain_timer(s) -> StepTimer:
    """The target's step times without speculation: its decode step is what a drafted round is weighed against
    (with it, CUDA graphs are captured at multiples of 1 + k tokens, a plain decode's padded to them)."""
    return build_timer(s.model_copy(update={"engine": s.engine.model_copy(update={"speculative": None})}))


def cost_model_c(s) -> float:
    """The seed's c from the simulator's own cost model: draft decode step / target decode step, batch 1,
    at the mean context of the run (prompt + half the output)."""
    _, gpu, par, profile, options = build_timer(s).args  # the draft runs in the speculating engine's graphs
    draft_timer = StepTimer(get_model("llama-3.2-1b"), gpu, par, profile, options)
    batch = StepBatch.uniform(1, PROMPT + 256)
    return draft_timer(batch) / plain_timer(s)(batch)


def verify_cost(s) -> float:
    """The verify pass (1 + k tokens over the context) in decode steps of the target, batch 1."""
    context = PROMPT + 256
    return build_timer(s)(StepBatch.of([1 + K], [context])) / plain_timer(s)(StepBatch.uniform(1, context))


def priced_speedup(alpha: float, c: float, v: float) -> float:
    """The seed's formula with the verify pass priced as what it costs (`v` decode steps) instead of one step."""
    return expected_tokens_per_round(alpha, K) / (K * c + v)


def tpot_speedup(spec, **kw) -> float:
    plain, fast = run(closed_loop(None, **kw)), run(closed_loop(spec, **kw))
    assert fast.summary["completed"] == plain.summary["completed"] == kw.get("num_requests", 24)
    return plain.summary["mean_tpot_ms"] / fast.summary["mean_tpot_ms"]


def test_the_cost_model_gives_c_near_the_seeds():
    """8B / 1B on an H200: the seed says 4.0 ms vs 0.8 ms, c = 0.2; 70B on 4 GPUs (~10 ms) with the 1B: 0.08.
    Our roofline gives 4.0 ms / 0.87 ms (c ~ 0.22) and 9.7 ms / 0.57 ms (c ~ 0.06: the 1B on 4 GPUs is mostly
    the fixed per-step overhead and 32 small all-reduces of ~5 us)."""
    assert cost_model_c(closed_loop(draft(0.7))) == pytest.approx(0.2, abs=0.03)
    assert cost_model_c(closed_loop(draft(0.7), model="llama-3.1-70b", tp=4)) == pytest.approx(
        0.08, abs=0.025
    )


@pytest.mark.parametrize(
    "model,tp,alpha,seed_says",
    [
        ("llama-3.1-8b", 1, 0.7, 1.5),
        ("llama-3.1-70b", 4, 0.7, 2.1),
        ("llama-3.1-70b", 4, 0.85, 2.8),
        ("llama-3.1-8b", 1, 0.3, 0.8),  # a poor draft is slower than none
    ],
)
def test_batch_one_tpot_speedup_agrees_with_the_formula(model, tp, alpha, seed_says):
    """Within 1% of tokens per round / (k c + v), v the verify pass in decode steps (1.001 for the 8B on one
    H200, 1.03 for the 70B on four: its 5 tokens are not free); the seed's formula (v = 1) is up to 3% high."""
    kw = {"model": model, "tp": tp}
    measured = tpot_speedup(draft(alpha), **kw)
    s = closed_loop(draft(alpha), **kw)
    c = cost_model_c(s)
    assert measured == pytest.approx(priced_speedup(alpha, c, verify_cost(s)), rel=0.01)
    assert measured == pytest.approx(speedup(alpha, K, c), rel=0.035)
    assert measured == pytest.approx(seed_says, rel=0.10)
    assert (measured < 1) == (seed_says < 1)


def test_the_gain_shrinks_with_the_batch_until_it_disappears():
    """At batch 256 a verify pass is 1280 tokens: compute-bound, the guesses stop being free."""
    ratios = [
        tpot_speedup(draft(0.7), clients=b, num_requests=max(24, 2 * b), output=256)
        for b in (1, 8, 32, 128, 256)
    ]
    assert all(a > b for a, b in pairwise(ratios)), ratios
    assert ratios[0] > 1.35 and ratios[-1] < 1.0
    assert ratios[3] == pytest.approx(0.86, abs=0.02)  # docs/engine-model.md: a loss of ~14% at batch 128


def test_switching_off_above_a_batch_size_recovers_plain_decoding():
    big = {"clients": 256, "num_requests": 512, "output": 256}
    assert tpot_speedup(draft(0.7, disable_above_batch=32), **big) == pytest.approx(1.0, abs=0.02)
    assert tpot_speedup(draft(0.7, disable_above_batch=32), num_requests=24, output=256) > 1.35  # batch 1: on


def test_drafting_back_on_never_catches_a_lagging_draft_up_in_one_step():
    """64 clients over a threshold of 32: the first requests decode without drafting, and when the batch shrinks
    below it they do not draft again (their draft KV fell behind; catching it up took one ~100 ms step of ~30k
    draft tokens): no decode step takes more than twice the median one."""
    steps = run(
        closed_loop(draft(0.7, disable_above_batch=32), clients=64, num_requests=128, output=256)
    ).steps
    decodes = steps.loc[steps["prefill_tokens"] == 0, "duration_s"]
    assert decodes.max() < 2 * decodes.median()


def test_heads_and_prompt_lookup_speed_up_batch_one():
    eagle = {"method": "eagle", "k": K, "acceptance": 0.7, "head_cost_fraction": 0.05}
    ngram = {"method": "ngram", "k": K, "acceptance": 0.5, "ngram_lookup_s": 1e-4}
    v = verify_cost(closed_loop(eagle))  # 256-token outputs: their last, shorter rounds cost ~1.5%
    assert tpot_speedup(eagle, output=256) == pytest.approx(priced_speedup(0.7, 0.05, v), rel=0.025)
    step_s = build_timer(closed_loop(ngram))(StepBatch.uniform(1, PROMPT + 256))
    lookup = 1e-4 / (K * step_s)  # the CPU lookup, as a share of k decode steps
    assert tpot_speedup(ngram, output=256) == pytest.approx(priced_speedup(0.5, lookup, v), rel=0.025)


def head_pass_share(s) -> float:
    """The seed's c for an EAGLE / MTP head priced as one target layer: a head pass / a target decode step, batch 1."""
    timer = build_timer(s)
    head = StepTimer(head_model(timer.model), timer.gpu, timer.parallelism, timer.profile, timer.options)
    batch = StepBatch.uniform(1, PROMPT + 256)
    return head(batch) / plain_timer(s)(batch)


@pytest.mark.parametrize("model,tp", [("llama-3.1-8b", 1), ("llama-3.1-70b", 4)])
def test_a_head_is_priced_as_one_target_layer_and_speeds_up_batch_one_by_the_formula(model, tp):
    """Without head_cost_fraction an EAGLE head costs one decoder layer, its 2h x h input projection and the LM
    head: on the 70B at TP 4 ~5% of a decode step (a fixed 10% overstated it 2x), on the 8B, whose LM head is a
    larger share, ~16%; batch-1 TPOT gains follow tokens per round / (k c + v)."""
    eagle = {"method": "eagle", "k": K, "acceptance": 0.7}
    s = closed_loop(eagle, model=model, tp=tp)
    c = head_pass_share(s)
    assert 0.03 < c < 0.07 if tp == 4 else 0.12 < c < 0.2
    measured = tpot_speedup(eagle, model=model, tp=tp, output=256)
    assert measured == pytest.approx(priced_speedup(0.7, c, verify_cost(s)), rel=0.025)


def test_several_tokens_per_step_give_one_itl_gap_each():
    result = run(closed_loop(draft(0.7), output=256))
    df, s = result.requests, result.summary
    assert (df["output_tokens"] == 256).all()
    np.testing.assert_allclose(df["e2el_s"], df["ttft_s"] + df["tpot_s"] * 255, rtol=1e-12)
    assert s["mean_itl_ms"] > 2 * s["mean_tpot_ms"]  # ~2.77 tokens per streamed chunk
    assert s["mean_itl_ms"] / s["mean_tpot_ms"] == pytest.approx(2.77, rel=0.1)  # tokens per round at 0.7


def test_speculative_runs_are_deterministic_per_seed():
    spec = draft({"kind": "beta", "a": 7, "b": 3})
    first, again, other = (run(closed_loop(spec, output=128, seed=s)) for s in (1, 1, 2))
    assert first.summary == again.summary
    assert first.summary["mean_tpot_ms"] != other.summary["mean_tpot_ms"]


def test_the_draft_shrinks_the_kv_pool():
    plain, spec = (
        run(closed_loop(None, output=8, num_requests=2)),
        run(closed_loop(draft(0.7), output=8, num_requests=2)),
    )
    assert spec.memory.kv_bytes_per_token == plain.memory.kv_bytes_per_token + 32768
    assert spec.num_blocks < plain.num_blocks


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    rate=st.floats(5, 200),
    blocks=st.integers(300, 1200),
    caching=st.sampled_from(["none", "vllm", "radix"]),
    preemption=st.sampled_from(["recompute", "swap"]),
    method=st.sampled_from(["draft", "eagle", "ngram"]),
    off=st.sampled_from([None, 4, 16]),
)
def test_speculative_runs_finish_every_request_with_every_token(
    seed, rate, blocks, caching, preemption, method, off
):
    spec = {
        "method": method,
        "k": 3,
        "acceptance": {"kind": "beta", "a": 3, "b": 2},
        "disable_above_batch": off,
        **({"draft_model": "llama-3.2-1b"} if method == "draft" else {}),
    }
    s = scenario(
        seed=seed,
        engine={
            "max_model_len": 4096,
            "num_gpu_blocks_override": blocks,
            "max_num_seqs": 32,
            "prefix_caching": caching,
            "preemption_mode": preemption,
            "speculative": spec,
        },
        workload={
            "trace": None,
            "arrivals": {"kind": "poisson", "rate_per_s": rate},
            "num_requests": 40,
            "lengths": {
                "prompt": {"kind": "lognormal", "median": 300, "sigma": 1.0},
                "output": {"kind": "lognormal", "median": 80, "sigma": 1.0},
            },
        },
    )
    result = run(s)
    df = result.requests
    done = df[df["finish_s"].notna()]
    assert (df["finish_s"].notna() ^ df["reject_reason"].notna()).all()
    assert (done["output_tokens"] == done["requested_output_tokens"]).all()
    assert result.steps["kv_usage"].max() <= 1.0


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_speculation_with_pipeline_stages_is_refused(method):
    """Not modelled: a pipelined step's tokens count when scheduled, a verify's only when accepted. n-gram
    lookup, with no draft memory to plan, slipped past the check and stalled its requests."""
    from servesim.hardware.errors import SpecError

    spec = draft(0.7) if method == "draft" else {"method": "ngram", "k": 3, "acceptance": 0.6}
    with pytest.raises(SpecError, match="speculative decoding with pipeline parallelism is not modelled"):
        run(scenario(parallelism={"pp": 2}, engine={"speculative": spec}))
