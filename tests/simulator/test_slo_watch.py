"""A run stopped once its SLO is certainly lost gets the verdict the whole run gets; passing runs are untouched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.simulator.planning.capacity import at_rate, judge
from servesim.simulator.world.run import simulate
from servesim.simulator.world.slo_watch import violators_needed
from tests.simulator.study_helpers import SCENARIOS, chat


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 3000),
    percentile=st.sampled_from([50, 90, 95, 99, 99.9, 37.5]),
    seed=st.integers(0, 2**32 - 1),
)
def test_that_many_violators_put_the_percentile_over_the_limit(n, percentile, seed):
    rng = np.random.default_rng(seed)
    k = violators_needed(n, percentile)
    assert 1 <= k <= n
    limit = 1.0
    values = np.concatenate([limit + rng.uniform(1e-9, 1.0, k), rng.uniform(0.0, limit, n - k)])
    rng.shuffle(values)
    assert np.percentile(values, percentile) > limit
    # and the bound is tight within the index slack: two fewer can leave the percentile at the limit
    if k > 2:
        values = np.concatenate([np.full(k - 2, 2 * limit), np.full(n - k + 2, limit)])
        assert np.percentile(values, percentile) <= limit + 1e-9


def test_by_hand_p90_of_1000_needs_101_violators():
    assert violators_needed(1000, 90) == 101  # index floor(999 * 0.9) = 899: values 899..999 must all violate
    assert violators_needed(1, 90) == 1
    # the median of 11 is the 6th largest (index exactly 5); an index that lands on an integer takes one more, in
    # case numpy's floating-point index falls just below it
    assert violators_needed(11, 50) == 7


@pytest.mark.parametrize("slo", [{"ttft_ms": 300}, {"tpot_ms": 15}, {"ttft_ms": 2000, "tpot_ms": 25}])
def test_a_stopped_run_gets_the_whole_runs_verdict_at_every_rate(slo):
    s = chat(slo=slo)
    stopped_any = False
    for rate in (5.0, 20.0, 40.0, 80.0):
        whole = simulate(at_rate(s, rate), SCENARIOS)
        early = simulate(at_rate(s, rate), SCENARIOS, stop_when_slo_lost=True)
        whole_v, early_v = judge(whole, s.slo, rate), judge(early, s.slo, rate)
        assert whole_v.ok == early_v.ok
        if "slo_lost_at_s" in early.summary:
            stopped_any = True
            assert not early_v.ok and early.summary["num_steps"] <= whole.summary["num_steps"]
            assert set(early_v.reasons) & {"TTFT SLO", "TPOT SLO"} <= set(whole_v.reasons) | {
                "TTFT SLO",
                "TPOT SLO",
            }
            assert any("once certain" in d for d in early_v.details)
        else:  # never stopped: the very same run
            assert early.summary == whole.summary
    assert stopped_any


def test_an_overloaded_run_stops_long_before_it_would_drain():
    s = chat(slo={"ttft_ms": 300})
    whole = simulate(at_rate(s, 80.0), SCENARIOS)
    early = simulate(at_rate(s, 80.0), SCENARIOS, stop_when_slo_lost=True)
    assert early.summary["slo_lost_at_s"] < whole.summary["duration_s"] / 2
    assert early.summary["num_steps"] < whole.summary["num_steps"] / 2


def test_without_a_ttft_or_tpot_limit_nothing_is_watched():
    s = chat(slo={"ttft_ms": None, "tpot_ms": None})
    early = simulate(at_rate(s, 80.0), SCENARIOS, stop_when_slo_lost=True)
    assert "slo_lost_at_s" not in early.summary
