"""Arrival processes: means and CVs over ~20k-50k gaps, stop rules, no tail clipping, determinism."""

import numpy as np
import pytest

from servesim.workloads.arrivals import (
    constant_arrivals,
    gamma_arrivals,
    mean_rate_per_s,
    poisson_arrivals,
    rescale_times,
)


def gaps(times: np.ndarray) -> np.ndarray:
    return np.diff(times)


def cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def test_poisson_mean_gap_and_cv():
    g = gaps(poisson_arrivals(8.0, np.random.default_rng(0), num_requests=20_001))
    assert g.size == 20_000
    assert g.mean() == pytest.approx(1 / 8.0, rel=0.03)
    assert cv(g) == pytest.approx(1.0, rel=0.03)


def test_poisson_tail_is_not_clipped():
    # P(no gap > 5/rate in 20k exponential gaps) = (1 - e^-5)^20000 ~ 1e-58: a cap (Vidur's 3/rate) would show
    g = gaps(poisson_arrivals(2.0, np.random.default_rng(1), num_requests=20_001))
    assert g.max() > 5 / 2.0


@pytest.mark.parametrize("asked_cv", [0.5, 1.0, 2.0])
def test_gamma_mean_gap_and_cv(asked_cv):
    g = gaps(gamma_arrivals(5.0, asked_cv, np.random.default_rng(2), num_requests=50_001))
    assert g.mean() == pytest.approx(1 / 5.0, rel=0.03)
    assert cv(g) == pytest.approx(asked_cv, rel=0.05)


def test_constant_gaps_are_exact():
    times = constant_arrivals(4.0, num_requests=20_000)
    assert times[0] == 0 and np.allclose(gaps(times), 0.25)


def test_stop_rules():
    rng = np.random.default_rng(3)
    by_time = poisson_arrivals(10.0, rng, duration_s=2_000.0)
    assert by_time[0] == 0 and by_time.max() < 2_000.0
    assert by_time.size == pytest.approx(20_000, rel=0.03)
    assert poisson_arrivals(10.0, rng, num_requests=7).size == 7
    assert gamma_arrivals(10.0, 3.0, rng, num_requests=10**9, duration_s=100.0).max() < 100.0
    assert poisson_arrivals(10.0, rng, num_requests=5, duration_s=1e6).size == 5
    assert constant_arrivals(2.0, duration_s=10.0).tolist() == [i / 2 for i in range(20)]
    assert constant_arrivals(2.0, num_requests=3, duration_s=10.0).size == 3
    with pytest.raises(ValueError, match="num_requests or duration_s"):
        poisson_arrivals(1.0, rng)


def test_same_seed_same_arrivals_different_seed_different():
    def draw(seed: int) -> np.ndarray:
        return gamma_arrivals(3.0, 2.0, np.random.default_rng(seed), duration_s=500.0)

    assert np.array_equal(draw(11), draw(11))
    assert not np.array_equal(draw(11)[:50], draw(12)[:50])


def test_rescaling_hits_the_target_rate():
    times = np.cumsum(np.random.default_rng(4).exponential(0.3, size=1_000))
    times -= times[0]
    assert mean_rate_per_s(rescale_times(times, rate_per_s=12.5)) == pytest.approx(12.5, rel=1e-12)
    assert np.allclose(rescale_times(times, time_scale=2.0), 2 * times)
    assert rescale_times(times) is times
    with pytest.raises(ValueError, match=">= 2 arrivals"):
        mean_rate_per_s(np.zeros(1))


@pytest.mark.parametrize(
    "arrivals",
    [
        lambda rng, **kw: poisson_arrivals(4.0, rng, **kw),
        lambda rng, **kw: gamma_arrivals(4.0, 2.0, rng, **kw),
        lambda rng, **kw: constant_arrivals(4.0, **kw),
    ],
)
def test_paced_arrivals_end_at_count_over_rate(arrivals):
    """vllm bench serve >= 0.10.1: n drawn gaps, the first included, scaled so the last request leaves at n / rate."""
    paced = arrivals(np.random.default_rng(5), num_requests=50, paced=True)
    plain = arrivals(np.random.default_rng(5), num_requests=51)  # t = 0, then the same 50 gaps
    assert paced.size == 50 and paced[0] > 0 and np.all(np.diff(paced) > 0)
    assert paced[-1] == pytest.approx(50 / 4.0, rel=1e-12)
    assert np.allclose(paced / paced[-1], plain[1:] / plain[-1], rtol=1e-12)
    with pytest.raises(ValueError, match="paced arrivals need num_requests and no duration_s"):
        arrivals(np.random.default_rng(5), num_requests=50, duration_s=10.0, paced=True)


@pytest.mark.parametrize("rate, scale", [(None, 1e308), (1e-300, None)])
def test_a_trace_stretched_past_2_40_seconds_is_refused(rate, scale):
    """Found by the fuzzer: time_scale 1e308 made every arrival infinite, and the run reported NaN latencies."""
    with pytest.raises(
        ValueError, match="stretches the trace to end at .* s, past the 2\\^40 s a run may span"
    ):
        rescale_times(np.array([0.0, 1.0, 2.0]), rate, scale)
