"""Length sampling: every length is an int >= 1 within the distribution's declared bounds."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from servesim.workloads.config import FixedDist, LognormalDist, NormalDist, UniformDist
from servesim.workloads.dist_config import MAX_VALUE
from servesim.workloads.distributions import sample_lengths, sample_values

sizes = st.floats(0, 1e5)


@st.composite
def dists(draw):
    kind = draw(st.sampled_from(["fixed", "uniform", "normal", "lognormal"]))
    if kind == "fixed":
        return FixedDist(kind="fixed", value=draw(sizes))
    if kind == "uniform":
        low, high = sorted([draw(sizes), draw(sizes)])
        return UniformDist(kind="uniform", low=low, high=high)
    if kind == "lognormal":
        return LognormalDist(kind="lognormal", median=draw(st.floats(0.01, 1e4)), sigma=draw(st.floats(0, 3)))
    bounds = [draw(st.one_of(st.none(), st.floats(-1e4, 1e5))) for _ in range(2)]
    if None not in bounds:
        bounds.sort()
    try:
        return NormalDist(
            kind="normal",
            mean=draw(st.floats(-1e3, 1e5)),
            std=draw(st.floats(0.1, 1e4)),
            min=bounds[0],
            max=bounds[1],
        )
    except ValidationError:
        assume(False)


def declared_bounds(dist) -> tuple[float, float]:
    """[lo, hi] a length can take: the distribution's own bounds, rounded, then raised to 1."""
    lo, hi = {
        "fixed": lambda d: (d.value, d.value),
        "uniform": lambda d: (d.low, d.high),
        "normal": lambda d: (-np.inf if d.min is None else d.min, np.inf if d.max is None else d.max),
        "lognormal": lambda d: (0.0, np.inf),
    }[dist.kind](dist)
    return max(1, np.rint(lo)), max(1, np.rint(hi))


@settings(max_examples=300, deadline=None)
@given(dist=dists(), seed=st.integers(0, 2**32 - 1))
def test_lengths_are_ints_at_least_one_within_bounds(dist, seed):
    lengths = sample_lengths(dist, 200, np.random.default_rng(seed))
    lo, hi = declared_bounds(dist)
    assert lengths.dtype == np.int64 and lengths.shape == (200,)
    assert (lengths >= 1).all() and (lengths >= lo).all() and (lengths <= hi).all()


def test_truncated_normal_resamples_instead_of_piling_up_at_the_bounds():
    dist = NormalDist(kind="normal", mean=100, std=50, min=80, max=200)
    x = sample_values(dist, 50_000, np.random.default_rng(0))
    assert x.min() >= 80 and x.max() <= 200
    assert (x == 80).sum() == 0  # clipping would put ~34 % of the draws exactly at 80


def test_lognormal_median_and_normal_without_bounds():
    x = sample_values(
        LognormalDist(kind="lognormal", median=300, sigma=1.2), 50_000, np.random.default_rng(0)
    )
    assert np.median(x) == pytest.approx(300, rel=0.03)
    y = sample_values(NormalDist(kind="normal", mean=0, std=1), 50_000, np.random.default_rng(0))
    assert y.min() < -3 and y.max() > 3  # no silent tail removal


def test_same_seed_same_lengths():
    dist = LognormalDist(kind="lognormal", median=300, sigma=1.2)
    a, b = (sample_lengths(dist, 100, np.random.default_rng(9)) for _ in range(2))
    assert np.array_equal(a, b)


def test_a_uniform_count_takes_every_integer_equally_often():
    """Session turns 1-6: a sixth each, not a tenth for 1 and 6 as rounding a continuous draw would give."""
    turns = sample_lengths(UniformDist(kind="uniform", low=1, high=6), 60_000, np.random.default_rng(0))
    counts = np.bincount(turns, minlength=7)[1:] / turns.size
    assert counts == pytest.approx([1 / 6] * 6, abs=0.01)
    ones = sample_lengths(UniformDist(kind="uniform", low=0, high=3), 60_000, np.random.default_rng(0))
    # 0 is no length
    assert np.bincount(ones, minlength=4)[1:] / ones.size == pytest.approx([1 / 3] * 3, abs=0.01)


def test_a_far_tail_is_clipped_to_a_count_int64_holds():
    """sigma 10 around a median of 2^39 draws values past 2^63; every count stays within [1, 2^40]."""
    values = sample_lengths(
        LognormalDist(kind="lognormal", median=2.0**39, sigma=10), 1000, np.random.default_rng(0)
    )
    assert values.dtype == np.int64 and values.min() >= 1 and values.max() == MAX_VALUE
