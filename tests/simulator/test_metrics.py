"""SLO judgement of requests a run's stop time cut off: a miss only when no future can save it."""

import numpy as np
import pandas as pd

from simulator.metrics import known_misses

SLO = {"ttft": 500.0, "tpot": 50.0, "e2el": 9000.0}


def _unfinished(arrival_s, first_token_s, requested):
    frame = pd.DataFrame({"arrival_s": arrival_s, "first_token_s": first_token_s,
                          "requested_output_tokens": requested})
    return frame.assign(ttft_s=frame["first_token_s"] - frame["arrival_s"])


def test_unfinished_requests_miss_only_what_they_can_no_longer_meet():
    stop_s = 10.0
    rows = _unfinished([9.8, 9.0, 9.0, 8.0, 0.5, 9.0],
                       [np.nan, np.nan, 9.2, 8.3, 0.6, 9.1],
                       [10, 10, 100, 11, 2000, 10])
    # 0: waited 200 ms for its first token: could still make 500 ms
    # 1: waited 1 s without one: TTFT > 500 ms whatever comes
    # 2: TTFT 200 ms; its 99 gaps take longer than 0.8 s: a TPOT bound of 8.1 ms, fine
    # 3: TTFT 300 ms; 10 gaps after 1.7 s already: TPOT > 170 ms
    # 4: 9.5 s old: past the 9 s E2EL limit (its TPOT bound, 4.7 ms, would pass)
    # 5: TTFT 100 ms, 9 gaps after 0.9 s: TPOT > 100 ms
    assert known_misses(rows, SLO, stop_s).tolist() == [False, True, False, True, True, True]
    assert known_misses(rows, {"ttft": 500.0}, stop_s).tolist() == [False, True, False, False, False, False]
    assert known_misses(rows, {"tpot": 50.0}, stop_s).tolist() == [False, False, False, True, False, True]
