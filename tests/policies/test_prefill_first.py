"""SGLang's prefill-first scheduler (policies/prefill_first.py) against hand-derived admissions, chunks and
retractions, and invariants over random workloads."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.hardware.gpu import get_gpu
from servesim.policies.config import EngineConfig
from servesim.policies.families import sglang_batch_defaults, sglang_mem_fraction_static
from servesim.policies.catalog import kv_managers
from servesim.policies.ordering import by_arrival
from servesim.policies.prefill_first import PrefillFirstScheduler, default_max_running, kv_tokens
from servesim.policies.step import TokenLog
from servesim.policies.token_budget import max_blocks_of
from tests.policies.helpers import (
    assert_every_token_served,
    drive,
    make_requests,
    make_scheduler,
    scheduled,
    step,
)
from servesim.workloads.request import Request

DECAY = (0.7 - 0.7 * 0.14) / 600


@pytest.mark.parametrize("mixed", [False, True])
def test_a_prefill_step_stalls_the_decodes_unless_mixed(mixed):
    sched, _ = make_scheduler("sglang", num_blocks=1000, block_size=1, enable_mixed_chunk=mixed)
    r0, r1 = make_requests([10, 20], [5, 5])
    sched.add(r0, 0.0)
    assert scheduled(step(sched)) == [(0, 10)]
    sched.add(r1, 1.0)
    assert scheduled(step(sched)) == ([(1, 20), (0, 1)] if mixed else [(1, 20)])
    assert scheduled(step(sched)) == [(0, 1), (1, 1)]


def _running_with_reservation(output_1: int, caching: str = "radix"):
    """r0 (100 prompt, 500 out) prefilled alone; r1 (300 prompt, `output_1` out) then waits. Pool 1000 tokens:
    900 free, and r0's 499 outputs to go count 0.7 x 499 = 349.3, so r1 fits iff 300 + output_1 + a page (1) <
    550.7 (with prefix caching)."""
    sched, _ = make_scheduler("sglang", num_blocks=1000, block_size=1, prefix_caching=caching)
    r0, r1 = Request(0, 0.0, 100, 500), Request(1, 0.0, 300, output_1)
    sched.add(r0, 0.0)
    step(sched)
    sched.add(r1, 1.0)
    return sched, r0, r1


def test_admission_holds_back_the_running_requests_expected_outputs():
    sched, _, _ = _running_with_reservation(249)  # 550 < 550.7
    assert scheduled(step(sched)) == [(1, 300)]
    sched, _, _ = _running_with_reservation(250)  # 551 >= 550.7: no room, the running request decodes
    assert scheduled(step(sched)) == [(0, 1)]
    assert sched.batch_is_full


def test_without_prefix_caching_an_ignore_eos_request_is_admitted_if_the_batch_plays_out():
    """SGLang's add_one_req_ignore_eos: with r1 (300 prompt, O out) beside r0 (499 outputs to go), 600 tokens stay
    free; r1 finishing first needs 600 - 2 x O > 2 (a token each to spare), then r0 has 600 + 300 freed - 499.
    So O = 298 fits and 299 does not, where the ratio estimate already refused 250."""
    sched, _, _ = _running_with_reservation(298, caching="none")
    assert scheduled(step(sched)) == [(1, 300)]
    sched, _, _ = _running_with_reservation(299, caching="none")
    assert scheduled(step(sched)) == [(0, 1)] and sched.batch_is_full


def test_a_full_batch_that_drains_resets_the_ratio_before_admitting_again():
    """SGLang idles the pass in which a full batch empties, resetting new_token_ratio to 0.7, and admits on the
    next: r1 (600 + 300) waits out r0 (100 + 300) on a 1,000-token pool and goes in at a ratio of 0.7, so r2
    (100 + 100) then waits: 200 > 400 - 0.7 x 299, where the ratio r0's decodes had decayed to (0.40) admits it."""
    sched, _ = make_scheduler("sglang", num_blocks=1000, block_size=1, prefix_caching="radix")
    r0, r1 = Request(0, 0.0, 100, 300), Request(1, 0.0, 600, 300)
    sched.add(r0, 0.0)
    sched.add(r1, 0.0)
    now = 0.0
    while (1, 600) not in scheduled(step(sched, now)):
        now += 1.0
    assert r0.is_done and sched.new_token_ratio == pytest.approx(0.7)
    sched.add(Request(2, now, 100, 100), now)
    assert scheduled(step(sched, now + 1.0)) == [(1, 1)]


def test_a_full_batch_admits_nobody_until_a_request_finishes():
    """Two decode steps later the decayed ratio would let r1 in (898 - 497 x (0.7 - 2 x decay) = 551.1 > 551),
    but SGLang tries no admission while the batch is marked full: r1 waits for r0's last token."""
    sched, r0, r1 = _running_with_reservation(251)
    now = 1.0
    while not r0.is_done:
        assert r1 not in step(sched, now).requests
        now += 1.0
    assert sched.new_token_ratio == pytest.approx(0.7 - 499 * DECAY)
    assert scheduled(step(sched, now)) == [(1, 300)]


def test_a_long_prompt_is_chunked_and_the_last_chunk_shares_its_step():
    """chunked_prefill_size 4096: 10000 tokens run as 4096 + 4096 + 1808, and the 1000-token prompt behind it
    takes 1000 of the 2288 left in the last chunk's step."""
    sched, _ = make_scheduler("sglang", num_blocks=2000, block_size=16, max_num_batched_tokens=4096)
    r0, r1 = make_requests([10000, 1000], [2, 2])
    sched.add(r0, 0.0)
    sched.add(r1, 0.0)
    assert [scheduled(step(sched)) for _ in range(4)] == [
        [(0, 4096)],
        [(0, 4096)],
        [(0, 1808), (1, 1000)],
        [(0, 1), (1, 1)],
    ]
    assert r0.is_done and r1.is_done


def test_decode_out_of_memory_retracts_the_fewest_outputs_longest_prompt_to_the_back():
    """30 one-token pages, 29 held: r0 (10 prompt, 3 out), r1 (8, 1), r2 (9, 1) cannot each grow one. r2 has
    the fewest outputs and, among those, the longest prompt: it is retracted, and queues behind r3, which
    arrived after it. The ratio becomes (3 + 1 + 20 x 2) / (50 + 50 + 1)."""
    sched, _ = make_scheduler("sglang", num_blocks=30, block_size=1)
    r0, r1, r2 = Request(0, 0.0, 10, 50), Request(1, 0.0, 8, 50), Request(2, 0.0, 9, 50)
    for req, computed, generated in ((r0, 12, 3), (r1, 8, 1), (r2, 9, 1)):
        sched.kv.allocate(req, computed)
        req.num_computed_tokens, req.num_generated = computed, generated
        sched.running.append(req)
    r3 = Request(3, 0.5, 5, 5)
    sched.add(r3, 0.5)
    plan = step(sched, now=1.0)
    assert [r.id for r in plan.preempted] == [2] and scheduled(plan) == [(0, 1), (1, 1)]
    assert sched.new_token_ratio == pytest.approx(44 / 101)
    assert r2.num_computed_tokens == 0 and r2.num_generated == 1 and r2.num_preemptions == 1
    assert [sched._waiting.pop().id for _ in range(2)] == [3, 2]


def test_after_a_finish_the_batch_decodes_once_more_before_admitting():
    """SGLang notices a finish in the next decode step (filter_batch), which clears batch_is_full; only the step
    after that tries the queue again."""
    sched, _ = make_scheduler("sglang", num_blocks=1000, block_size=1, prefix_caching="radix")
    r0, r1 = Request(0, 0.0, 100, 3), Request(1, 0.0, 100, 400)
    sched.add(r0, 0.0)
    sched.add(r1, 0.0)
    step(sched)  # both prefill in one batch
    waiting = Request(2, 0.0, 300, 300)  # 600 >= 800 free - 0.7 x (2 + 399) = 519.3: no room yet
    sched.add(waiting, 0.0)
    plans = [scheduled(step(sched, now)) for now in range(1, 6)]
    assert plans[:2] == [[(0, 1), (1, 1)], [(0, 1), (1, 1)]] and r0.is_done  # r0's last token: step 2
    assert plans[2] == [(1, 1)] and not sched.batch_is_full  # the decode that notices it
    assert plans[3] == [(2, 300)]


def test_overlapped_a_finished_request_decodes_once_more_for_nothing():
    """SGLang's overlap scheduler forms step 2 while step 1 runs, not knowing r0 ends in it: r0 decodes once more
    (no token), then its pages free; synchronously step 2 is r1's alone."""
    steps = {}
    for overlap in (False, True):
        sched, log = make_scheduler("sglang", num_blocks=100, block_size=1, async_scheduling=overlap)
        requests = make_requests([4, 4], [2, 5])
        steps[overlap] = [s.batch for s in drive(sched, requests)]
        assert requests[0].finish_s == 2.0 and requests[0].num_generated == 2
        assert_every_token_served(requests, log)
    assert steps[False][:4] == [[0, 1], [0, 1], [1], [1]]
    assert steps[True][:4] == [[0, 1], [0, 1], [1, 0], [1]]


def test_overlapped_an_arrival_is_seen_a_step_late():
    """r1 arrives at 1.5, while step 1 runs; SGLang formed step 2 as step 1 started: r1's prefill is step 3
    (first token at 4), not step 2 (first token at 3)."""
    first_token = {}
    for overlap in (False, True):
        sched, _ = make_scheduler("sglang", num_blocks=100, block_size=1, async_scheduling=overlap)
        requests = make_requests([4, 4], [10, 3])
        drive(sched, requests, arrivals=[0.0, 1.5])
        first_token[overlap] = requests[1].first_token_s
    assert first_token == {False: 3.0, True: 4.0}


@pytest.mark.parametrize("arrival, first_token", [(20.5, 24.0), (21.5, 35.0)])
def test_overlapped_a_retracted_request_goes_ahead_of_what_sglang_had_not_received(arrival, first_token):
    """r1 is retracted in the batch formed at 22, which SGLang formed as step 21 began: r2 arriving at 21.5 was
    not received yet, so it queues behind r1, re-admitted at 32; one arriving at 20.5 goes first. Re-admitted,
    r1 sets aside its whole 30-token output (SGLang's _prefill_one_req), not the 10 it has left: of the 30 tokens
    the budget had, 20 + 30 are taken, so r2 (4 + 3) waits for the next prefill, at 34 (first token at 35)."""
    sched, _ = make_scheduler(
        "sglang", num_blocks=60, block_size=1, async_scheduling=True, prefix_caching="radix"
    )
    sched.new_token_ratio = sched.min_ratio
    times = [0.0, 0.5, arrival]
    requests = [Request(i, t, p, o) for i, (t, p, o) in enumerate(zip(times, [10, 10, 4], [30, 30, 3]))]
    steps = drive(sched, requests, arrivals=times)
    assert [i for i, s in enumerate(steps) if s.preempted] == [22] and steps[22].preempted == [1]
    assert requests[2].first_token_s == first_token


def test_overlapped_the_play_out_counts_a_finished_request_as_sglang_still_sees_it():
    """No radix cache: admitting r2 plays the batch out. Overlapped, r0 (finished in step 1) still holds its pages
    with a token to go as SGLang sees it; counted so, r2 is admitted at once in step 2 (first token at 3)."""
    sched, _ = make_scheduler("sglang", num_blocks=70, block_size=1, async_scheduling=True)
    requests = make_requests([10, 10, 10], [2, 20, 20])
    steps = drive(sched, requests, arrivals=[0.0, 0.0, 0.5])
    assert [s.batch for s in steps[:3]] == [[0, 1], [0, 1], [2]] and requests[2].first_token_s == 3.0


def test_overlapped_a_mixed_batch_that_decoded_a_finished_request_frees_its_slot_for_the_next_try():
    """Mixed chunks, 3 slots: r0 finishes in step 1 and decodes once more, mixed into step 2's prefill of r2;
    SGLang filters that batch before its next try, so r3 is prefilled in step 3 (first token at 4)."""
    sched, _ = make_scheduler(
        "sglang",
        num_blocks=500,
        block_size=1,
        async_scheduling=True,
        max_num_seqs=3,
        enable_mixed_chunk=True,
        max_num_batched_tokens=64,
    )
    times = [0.0, 0.0, 0.5, 0.5]
    requests = [Request(i, t, 4, o) for i, (t, o) in enumerate(zip(times, [2, 20, 20, 20]))]
    steps = drive(sched, requests, arrivals=times)
    assert [s.batch for s in steps[:4]] == [[0, 1], [0, 1], [2, 1, 0], [3, 1, 2]]
    assert requests[3].first_token_s == 4.0


def test_overlapped_the_ratio_is_not_reset_while_the_engine_plans_again():
    """r0 ends in step 2; r1 arrives at 3.5, during the wasted decode of step 3. The empty first plan at 4 is
    not idleness (SGLang still has a last batch): the decayed ratio stays."""
    sched, _ = make_scheduler("sglang", num_blocks=200, block_size=1, async_scheduling=True)
    sched.new_token_ratio = sched.min_ratio
    r0, r1 = Request(0, 0.0, 10, 3), Request(1, 3.5, 10, 5)
    sched.add(r0, 0.0)
    for now in (0.0, 1.0, 2.0, 3.0):  # r0's prefill, two decodes, the wasted one
        sched.commit(sched.schedule(now), now + 1.0)
    sched.add(r1, 3.5)
    assert scheduled(sched.schedule(4.0)) == [(1, 10)]
    assert sched.new_token_ratio == sched.min_ratio


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("interval, first_token", [(1, 4.0), (3, 5.0), (10, 12.0)])
def test_a_request_sent_while_decoding_is_read_after_interval_decode_steps(overlap, interval, first_token):
    """r0 is prefilled in step 0 (an idle engine reads at once); the pass after that prefill reads (weight 1000)
    and restarts the count, so the passes forming steps 1, 2, 3 ... have counted 0, 1, 2 ... decodes. r1, sent
    at 2.5, is read by the pass that reaches `interval`: at 4 (interval 3: the count is 3), at 11 (10), and
    prefilled then. Read every pass, it is prefilled at 3; overlapped, the pass forming step 3 ran as step 2
    began, before r1 came, so at 4, as with interval 3."""
    sched, _ = make_scheduler(
        "sglang", num_blocks=200, block_size=1, async_scheduling=overlap, scheduler_recv_interval=interval
    )
    requests = make_requests([4, 4], [30, 3])
    drive(sched, requests, arrivals=[0.0, 2.5])
    assert requests[1].first_token_s == (first_token + 1.0 if overlap and interval == 1 else first_token)


def test_a_request_sent_during_a_prefill_is_read_at_once():
    """The pass after a prefill step adds 1000 and reads: r1, sent during r0's prefill, is prefilled next."""
    sched, _ = make_scheduler("sglang", num_blocks=200, block_size=1, scheduler_recv_interval=10)
    requests = make_requests([4, 4], [30, 3])
    steps = drive(sched, requests, arrivals=[0.0, 0.5])
    assert [s.batch for s in steps[:3]] == [[0], [1], [0, 1]]
    assert sched.num_waiting == 0


def test_unread_requests_count_as_waiting():
    sched, _ = make_scheduler("sglang", num_blocks=200, block_size=1, scheduler_recv_interval=10)
    r0, r1 = make_requests([4, 4], [30, 3])
    sched.add(r0, 0.0)
    step(sched, 0.0)
    step(sched, 1.0)  # the pass after the prefill read nothing more
    sched.add(r1, 1.5)
    assert scheduled(step(sched, 2.0)) == [(0, 1)] and sched.num_waiting == 1


def test_recv_interval_is_sglangs():
    with pytest.raises(ValueError, match="scheduler_recv_interval is SGLang's"):
        EngineConfig(scheduler="vllm", scheduler_recv_interval=10)
    assert EngineConfig(scheduler="sglang", scheduler_recv_interval=10).scheduler_recv_interval == 10


def test_a_prompt_cut_to_fit_the_chunk_ends_on_a_page_boundary():
    sched, _ = make_scheduler(
        "sglang", num_blocks=1000, block_size=16, max_num_batched_tokens=1000, prefix_caching="radix"
    )
    sched.add(Request(0, 0.0, 5000, 2), 0.0)
    assert scheduled(step(sched)) == [(0, 992)]  # 1000 // 16 x 16


def test_max_prefill_tokens_bounds_an_unchunked_batch_but_never_its_first_request():
    for limit, expected in ((16384, [(0, 10000)]), (30000, [(0, 10000), (1, 10000)])):
        sched, _ = make_scheduler(
            "sglang",
            num_blocks=100_000,
            block_size=1,
            enable_chunked_prefill=False,
            max_num_batched_tokens=30000,
            max_prefill_tokens=limit,
            prefix_caching="radix",
        )
        for r in make_requests([10000, 10000], [2, 2]):
            sched.add(r, 0.0)
        assert scheduled(step(sched)) == expected
    sched, _ = make_scheduler(
        "sglang",
        num_blocks=100_000,
        block_size=1,
        enable_chunked_prefill=False,
        max_prefill_tokens=100,
        prefix_caching="radix",
    )
    sched.add(Request(0, 0.0, 10000, 2), 0.0)
    assert scheduled(step(sched)) == [(0, 10000)]  # over the limit, but first


def test_mixed_chunks_leave_a_token_of_the_chunk_budget_per_decode():
    sched, _ = make_scheduler(
        "sglang", num_blocks=10_000, block_size=1, max_num_batched_tokens=1000, enable_mixed_chunk=True
    )
    decoders = make_requests([10] * 5, [50] * 5)
    for r in decoders:
        sched.add(r, 0.0)
    step(sched)
    sched.add(Request(9, 0.0, 4000, 2), 0.0)
    assert scheduled(step(sched)) == [(9, 995)] + [(i, 1) for i in range(5)]


def test_an_idle_engine_admits_a_request_whose_prompt_and_output_fill_the_pool():
    """100 pages; 60 + 41 = 101 >= 100 fails SGLang's estimate, but its KV (100 tokens at most) fits."""
    sched, _ = make_scheduler("sglang", num_blocks=100, block_size=1)
    req = Request(0, 0.0, 60, 41)
    drive(sched, [req])
    assert req.num_generated == 41


def test_retraction_drops_what_the_radix_tree_had_not_cached():
    """SGLang frees a retracted request's uncached KV without inserting it: its prompt (cached as prefilled)
    can be matched again, its decoded tokens not."""
    sched, _ = make_scheduler("sglang", num_blocks=40, block_size=1, prefix_caching="radix")
    r0, r1 = Request(0, 0.0, 16, 30), Request(1, 0.0, 16, 30)
    sched.new_token_ratio = sched.min_ratio
    sched.add(r0, 0.0)
    sched.add(r1, 0.0)
    while not any(step(sched).preempted):
        pass
    victim = r1 if r1.num_preemptions else r0
    assert victim.num_generated > 1 and sched.kv.lookup(victim) == victim.num_prompt_tokens


@pytest.mark.parametrize(
    "chunk, lengths",
    [
        (8192, ((15, 3), (10, 2))),  # the second waits for the first's pages
        (8192, ((5, 12), (5, 12))),  # neither can finish beside the other
        (4, ((15, 2), (15, 2))),  # both prompts stall halfway through their chunks
    ],
)
def test_pipeline_engines_sharing_a_pool_never_stall(chunk, lengths):
    """Two micro-batch engines over one pool (simulator/world/run.py): an idle engine whose admission failed on its
    sibling's pages must not stay marked full, and a lone request (or a stalled prompt) that cannot grow is
    retracted so the other can finish."""
    kv = kv_managers.get("none")(20, 1, 0.0)
    cfg = EngineConfig(
        scheduler="sglang", block_size=1, prefix_caching="none", max_num_seqs=8, max_num_batched_tokens=chunk
    )
    engines = [PrefillFirstScheduler(kv, cfg, by_arrival, TokenLog()) for _ in range(2)]
    requests = make_requests(*zip(*lengths))
    for engine, req in zip(engines, requests):
        engine.add(req, 0.0)
    now = 0.0
    while not all(r.is_done for r in requests):
        assert now < 500, "stalled"
        for engine in engines:
            plan = engine.schedule(now)
            now += 1.0
            engine.commit(plan, now)
            kv.check_invariants()
    assert kv.num_free_blocks == 20


def test_a_finish_in_a_prefill_step_lets_the_next_step_admit():
    """SGLang filters a finished prefill batch before its next try, so a one-token request that ends in its
    prefill clears batch_is_full at once (a decode-step finish clears it one decode later)."""
    sched, _ = make_scheduler("sglang", num_blocks=2000, block_size=1, prefix_caching="radix")
    short, long = Request(0, 0.0, 100, 1), Request(1, 0.0, 100, 900)
    sched.add(short, 0.0)
    sched.add(long, 0.0)
    sched.add(Request(2, 0.0, 100, 800), 0.0)  # 900 >= 1800 free - 901 reserved in the same batch: refused
    assert scheduled(step(sched)) == [(0, 100), (1, 100)] and short.is_done
    assert not sched.batch_is_full  # 900 < 1900 - 0.7 x 899 now
    assert scheduled(step(sched)) == [(2, 100)]


def test_a_finish_in_the_prefill_that_refills_an_emptied_batch_lets_the_next_step_admit():
    """The same when the batch had emptied while full: SGLang clears the flag, prefills again, and filters that
    prefill batch too, so r3, refused beside the one-token request, is prefilled in the very next step."""
    sched, _ = make_scheduler("sglang", num_blocks=2000, block_size=1, prefix_caching="radix")
    first = Request(0, 0.0, 1700, 2)
    sched.add(first, 0.0)
    assert scheduled(step(sched)) == [(0, 1700)]
    sched.add(Request(1, 0.0, 100, 900), 0.0)
    # refused while the first request holds the pool, which empties as it finishes
    assert scheduled(step(sched)) == [(0, 1)] and sched.batch_is_full and first.is_done
    short = Request(2, 0.0, 100, 1)
    sched.add(short, 0.0)
    sched.add(Request(3, 0.0, 100, 800), 0.0)
    assert scheduled(step(sched)) == [(1, 100), (2, 100)] and short.is_done  # the emptied batch refilled
    assert not sched.batch_is_full
    assert scheduled(step(sched)) == [(3, 100)]


def test_fused_decode_steps_decay_the_ratio_to_the_same_float_as_stepping():
    stepped, _ = make_scheduler("sglang", num_blocks=10_000, block_size=1)
    fused, _ = make_scheduler("sglang", num_blocks=10_000, block_size=1)
    for sched in (stepped, fused):
        sched.add(Request(0, 0.0, 10, 500), 0.0)
        step(sched)  # prefill
        step(sched)  # one decode
    for _ in range(377):
        step(stepped)
    fused.fused_decode_steps(377, 0.0)
    assert stepped.new_token_ratio == fused.new_token_ratio


def test_defaults_follow_sglang():
    assert sglang_batch_defaults(get_gpu("h100-sxm"))[0] == 8192
    assert sglang_batch_defaults(get_gpu("h200"))[0] == 8192  # 139.8 GiB < 160
    assert sglang_batch_defaults(get_gpu("b200"))[0] == 16384
    assert sglang_batch_defaults(get_gpu("a100-40gb-pcie"))[0] == 4096
    assert sglang_batch_defaults(get_gpu("l4"))[0] == 2048
    engine = EngineConfig(scheduler="sglang").with_defaults(get_gpu("h100-sxm"), 131072)
    assert (engine.max_num_batched_tokens, engine.max_num_seqs) == (8192, 4096)
    # mem_fraction_static: H200 at TP8 reserves 512 + 1.5 x 8192 + 2 x 512 + 8/8 x 1024 = 14,848 of 143,156 MiB;
    # an L4 (22 GiB) 512 + 1.5 x 2048 + 2 x 24 + 1/8 x 1024 = 3,760 of 22,518; past 60 GiB at least 10 GiB
    assert sglang_mem_fraction_static(get_gpu("h200"), 8192, tp=8) == 0.896
    assert sglang_mem_fraction_static(get_gpu("l4"), 2048) == 0.833
    assert sglang_mem_fraction_static(get_gpu("h100-sxm"), 2048) == round((81089.875 - 10240) / 81089.875, 3)
    # stated: kept
    assert (
        EngineConfig(scheduler="sglang", gpu_memory_utilization=0.7)
        .with_defaults(get_gpu("h100-sxm"), 4096)
        .gpu_memory_utilization
        == 0.7
    )
    assert default_max_running(400_000, 131072) == 2048  # 400000 / 131072 x 512 = 1562 slots, at least 2048
    assert default_max_running(2_000_000, 8192) == 4096  # 125000 slots, at most 4096
    assert default_max_running(3000, 8192) == 1500  # half the pool's tokens


def test_sglang_refuses_swap_and_speculation():
    with pytest.raises(ValueError, match="retracts"):
        EngineConfig(scheduler="sglang", preemption_mode="swap")
    with pytest.raises(ValueError, match="token-budget scheduler"):
        EngineConfig(scheduler="sglang", speculative={"method": "ngram", "k": 3, "acceptance": 0.5})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(
        st.tuples(st.integers(1, 60), st.integers(1, 30), st.integers(0, 3)), min_size=1, max_size=12
    ),
    block_size=st.sampled_from([1, 4, 16]),
    spare_blocks=st.integers(0, 20),
    max_num_seqs=st.integers(1, 8),
    budget=st.integers(16, 256),
    chunked=st.booleans(),
    mixed=st.booleans(),
    caching=st.sampled_from(["none", "vllm", "radix"]),
    conservativeness=st.sampled_from([0.3, 1.0, 2.0]),
    decayed=st.booleans(),
    overlap=st.booleans(),
    gap=st.sampled_from([0.0, 0.5, 1.5]),
    recv_interval=st.sampled_from([1, 3, 10]),
)
def test_every_request_finishes_with_no_page_leaked(
    lengths,
    block_size,
    spare_blocks,
    max_num_seqs,
    budget,
    chunked,
    mixed,
    caching,
    conservativeness,
    decayed,
    overlap,
    gap,
    recv_interval,
):
    """Shared leading segments (ids 0-2) give prefix hits; tiny pools, with the ratio decayed as after a long run
    of decodes (`decayed`), force retractions; `overlap`: SGLang's overlap scheduler, `gap` s between arrivals,
    read every `recv_interval` decode steps."""
    requests = [
        Request(i, 0.0, p, o, prompt_segments=((seg, min(p, 8)),) + (((-(i + 1), p - 8),) if p > 8 else ()))
        if seg
        else Request(i, 0.0, p, o)
        for i, (p, o, seg) in enumerate(lengths)
    ]
    biggest = max(max_blocks_of(r, block_size) for r in requests)
    budget = budget if chunked else max(budget, max(p + o for p, o, _ in lengths))
    sched, log = make_scheduler(
        "sglang",
        num_blocks=biggest + spare_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_mixed_chunk=mixed,
        prefix_caching=caching,
        schedule_conservativeness=conservativeness,
        async_scheduling=overlap,
        scheduler_recv_interval=recv_interval,
    )
    if decayed:
        sched.new_token_ratio = sched.min_ratio
    # checks invariants after
    steps = drive(sched, requests, arrivals=[i * gap for i in range(len(requests))])
    # every step and that every page came back
    assert_every_token_served(requests, log)
    assert all(len(s.batch) <= max_num_seqs + 1 for s in steps)  # + a prompt in chunks beside the batch


@pytest.mark.parametrize("caching,batch", [("radix", [0, 2, 1]), ("none", [0, 1, 2])])
def test_lpm_without_a_prefix_cache_runs_first_come_first_served(caching, batch):
    """r0 and r1 share their first 64 prompt tokens, r2 shares nothing. Under lpm with the radix cache SGLang holds
    r1 back behind r2 in the batch (its in-batch prefix check: r0 will cache what r1 shares); without a tree cache
    it runs lpm as fcfs (SchedulePolicy._validate_and_adjust_policy)."""
    sched, _ = make_scheduler(
        "sglang", num_blocks=100_000, block_size=1, prefix_caching=caching, queue_order="lpm"
    )
    shared = [Request(i, 0.1 * i, 100, 10, ((7, 64), (100 + i, 36))) for i in range(2)]
    for req in [*shared, Request(2, 0.2, 100, 10)]:
        sched.add(req, req.arrival_s)
    assert [r.id for r in step(sched).requests] == batch


@pytest.mark.parametrize("overlap", [False, True])
def test_overlapped_batches_cannot_hit_a_prompt_the_step_in_flight_prefills(overlap):
    """Three prompts share 2,000 tokens; a prefill batch takes 2,100 (the first request is exempt). Without
    overlap, r0's prompt is in the tree when the next batch forms, so r1 and r2 both hit it. Overlapped, SGLang
    inserts r0's prompt as it processes r0's results, after the next batch is formed: r1 prefills all 2,050
    tokens, and only r2, formed after that, hits the shared 2,000."""
    sched, _ = make_scheduler(
        "sglang",
        num_blocks=100_000,
        block_size=1,
        prefix_caching="radix",
        queue_order="lpm",
        async_scheduling=overlap,
        enable_chunked_prefill=False,
        max_prefill_tokens=2100,
    )
    requests = [Request(i, 0.0, 2050, 8, ((7, 2000), (-(i + 1), 50))) for i in range(3)]
    for req in requests:
        sched.add(req, 0.0)
    batches = [
        [(r.id, n) for r, n in zip(plan.requests, plan.num_new)]
        for plan in (step(sched, float(t)) for t in range(3))
    ]
    if overlap:
        assert batches == [[(0, 2050)], [(1, 2050)], [(2, 50)]]
    else:
        assert batches[:2] == [[(0, 2050)], [(1, 50), (2, 50)]]
    assert [r.num_cached_tokens for r in requests] == ([0, 0, 2000] if overlap else [0, 2000, 2000])


def test_a_chunked_prompt_goes_on_when_the_reserve_leaves_no_room():
    """SGLang's add_chunked_req takes a full chunk when rem_total_tokens is not positive ("otherwise, it will
    cause a memory leak"). A (4,000 outputs to come) runs while B's 2,000-token prompt is prefilled 500 at a time
    in a 5,000-token pool. With the ratio back at 1 (as after a retraction), after B's second chunk the reserve
    (4,000) exceeds the free tokens (3,990); B's third chunk still takes 500."""
    sched, _ = make_scheduler(
        "sglang", num_blocks=5000, block_size=1, max_num_batched_tokens=500, async_scheduling=False
    )
    a, b = Request(0, 0.0, 10, 4001), Request(1, 0.0, 2000, 10)
    sched.add(a, 0.0)
    step(sched)  # A's prefill samples its first token
    sched.add(b, 1.0)
    batches = []
    for t in (1.0, 2.0, 3.0):
        if t == 3.0:
            sched.new_token_ratio = 1.0
            assert kv_tokens(sched.kv, sched.kv.num_free_blocks) - 4000 < 0
        plan = step(sched, t)
        batches.append([(r.id, n) for r, n in zip(plan.requests, plan.num_new)])
    assert batches == [[(1, 500)]] * 3


def test_a_retracted_request_caches_its_outputs_again_as_it_reprefills():
    """SGLang's cache_unfinished_req inserts everything an extend computed: after a retraction that is the prompt
    and the outputs so far, so a second retraction finds them all in the tree (page 1: every token)."""
    sched, _ = make_scheduler("sglang", num_blocks=100, block_size=1, prefix_caching="radix")
    requests = [Request(i, 0.0, 16, 40) for i in range(3)]
    for req in requests:
        sched.add(req, 0.0)
    checked, now = 0, 0.0
    while not all(r.is_done for r in requests):
        sched.new_token_ratio = sched.min_ratio  # admit greedily, so decodes run out of pages and retract
        plan = step(sched, now)
        now += 1.0
        for req, n in zip(plan.requests, plan.num_new):
            if (
                req.num_preemptions
                and n > 1
                and req.num_computed_tokens > req.num_prompt_tokens
                and not req.is_done
            ):
                assert sched.kv.lookup(req) == req.num_computed_tokens
                checked += 1
    assert checked > 0
