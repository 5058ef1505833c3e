"""Token identity and block hashing: the one-pass hash walk equals hashing each block's pieces on its own."""

from hypothesis import given
from hypothesis import strategies as st

from servesim.policies.token_ids import _code, block_hashes, pieces, request_runs
from servesim.workloads.request import Request, output_segment_id


@given(
    runs=st.lists(st.tuples(st.integers(-5, 5), st.integers(1, 40)), min_size=1, max_size=6),
    generated=st.integers(0, 30),
    block_size=st.sampled_from([1, 3, 4, 16]),
    first_part=st.floats(0, 1),
)
def test_incremental_walk_equals_per_block_hashing(runs, generated, block_size, first_part):
    r = Request(0, 0.0, sum(n for _, n in runs), 50, tuple(runs))
    r.num_generated = generated
    n = r.num_tokens
    block_hashes(r, int(n * first_part), block_size)  # memo filled in two goes, as a request grows
    got = block_hashes(r, n, block_size)[: n // block_size]
    parent, expected = None, []
    for i in range(n // block_size):
        block = [
            (_code(s), o, size)
            for s, o, size in pieces(request_runs(r), i * block_size, (i + 1) * block_size)
        ]
        parent = hash((parent, *block[0])) if len(block) == 1 else hash((parent, tuple(block)))
        expected.append(parent)
    assert got == expected


def test_generated_tokens_follow_the_prompt_runs():
    r = Request(7, 0.0, 10, 5, ((3, 6), (-8, 4)))
    r.num_generated = 2
    assert request_runs(r) == [(3, 6), (-8, 4), (output_segment_id(7), 2)]
    assert pieces(request_runs(r), 4, 11) == ((3, 4, 2), (-8, 0, 4), (output_segment_id(7), 0, 1))


def test_segment_codes_are_distinct_and_never_minus_one():
    codes = [_code(s) for s in range(-1000, 1000)]
    assert len(set(codes)) == len(codes) and min(codes) >= 0


@given(first=st.sampled_from([16, 32, 64]), second=st.sampled_from([16, 32, 64]))
def test_hashes_at_another_block_size_are_those_of_a_fresh_request(first, second):
    """A P/D request is hashed by both pools, whose block sizes may differ (FlashMLA's 64 beside 16): the memo of
    one size must not pass for the other's."""

    def request():
        return Request(0, 0.0, 200, 10, ((7, 48), (-1, 152)))

    r = request()
    block_hashes(r, 199, first)
    assert (
        block_hashes(r, 199, second)[: 199 // second] == block_hashes(request(), 199, second)[: 199 // second]
    )
