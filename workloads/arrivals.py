"""Arrival processes: pure functions from parameters (and an injected Generator) to sorted arrival
times in seconds.

Renewal processes start with a request at t = 0, as `vllm bench serve` sends its first request
immediately, and continue with i.i.d. inter-arrival gaps. Gaps are never capped: the tail of the
distribution is part of the workload (a Poisson stream has the occasional 5/rate gap).
Stop rules: `num_requests` arrivals, or every arrival before `duration_s` (strictly), whichever
comes first; at least one must be given.

Paced processes (`paced=True`) are `vllm bench serve`'s since v0.10.1 (PR #21108, July 2025): it draws a gap
for every request, the first included, and scales their running sums so the last request leaves at exactly
num_requests / rate, which fixes the offered rate of a short run. SGLang's bench_serving and older vLLM
send as the plain renewal process does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from servesim.workloads.dist_config import MAX_VALUE

Draw = Callable[[int], np.ndarray]  # k -> k inter-arrival gaps (s)


def poisson_arrivals(
    rate_per_s: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
    paced: bool = False,
) -> np.ndarray:
    """Arrival times (s) of a Poisson process of `rate_per_s` requests/s: exponential gaps."""
    return _arrivals(
        lambda k: rng.exponential(1.0 / rate_per_s, size=k), rate_per_s, num_requests, duration_s, paced
    )


def gamma_arrivals(
    rate_per_s: float,
    cv: float,
    rng: np.random.Generator,
    num_requests: int | None = None,
    duration_s: float | None = None,
    paced: bool = False,
) -> np.ndarray:
    """Arrival times (s) of a gamma renewal process: mean gap 1/rate_per_s, gap CV `cv` (1 = Poisson).

    Gamma with shape k has CV 1/sqrt(k), so k = 1/cv**2 and scale = 1/(rate_per_s * k).
    """
    shape = 1.0 / cv**2
    scale_s = 1.0 / (rate_per_s * shape)
    return _arrivals(lambda k: rng.gamma(shape, scale_s, size=k), rate_per_s, num_requests, duration_s, paced)


def constant_arrivals(
    rate_per_s: float, num_requests: int | None = None, duration_s: float | None = None, paced: bool = False
) -> np.ndarray:
    """Arrival times (s) i / rate_per_s for i = 0, 1, ...; paced, i = 1 .. num_requests (every request waits its
    gap, the first included); needs no randomness."""
    if paced:
        return _paced(lambda k: np.full(k, 1.0 / rate_per_s), rate_per_s, num_requests, duration_s)
    _check_stop(num_requests, duration_s)
    count = num_requests if duration_s is None else math.ceil(rate_per_s * duration_s) + 1
    if num_requests is not None:
        count = min(count, num_requests)
    times = np.arange(count, dtype=np.float64) / rate_per_s
    return times if duration_s is None else times[times < duration_s]


def mean_rate_per_s(arrival_s: np.ndarray) -> float:
    """Mean arrival rate (requests/s) = (n - 1) / (last - first), as in the traces README."""
    span_s = float(arrival_s[-1] - arrival_s[0]) if arrival_s.size else 0.0
    if arrival_s.size < 2 or span_s <= 0:
        raise ValueError(
            f"mean rate needs >= 2 arrivals spread over time (got {arrival_s.size} over {span_s} s)"
        )
    return (arrival_s.size - 1) / span_s


def rescale_times(
    arrival_s: np.ndarray, rate_per_s: float | None = None, time_scale: float | None = None
) -> np.ndarray:
    """Trace times (s, starting at 0) stretched so their mean rate is `rate_per_s`, or times `time_scale`; a
    stretch past 2^40 s (a time scale of 10^308 made every time infinite) is refused."""
    with np.errstate(over="ignore"):  # an overflow is refused below, not warned about
        if rate_per_s is not None:
            arrival_s = arrival_s * (mean_rate_per_s(arrival_s) / rate_per_s)
        elif time_scale is not None:
            arrival_s = arrival_s * time_scale
    last = float(arrival_s.max()) if arrival_s.size else 0.0
    if not last <= MAX_VALUE:  # NaN and inf too
        raise ValueError(f"stretches the trace to end at {last:.3g} s, past the 2^40 s a run may span")
    return arrival_s


def _arrivals(
    draw: Draw, rate_per_s: float, num_requests: int | None, duration_s: float | None, paced: bool
) -> np.ndarray:
    if paced:
        return _paced(draw, rate_per_s, num_requests, duration_s)
    return _renewal(draw, rate_per_s, num_requests, duration_s)


def _renewal(draw: Draw, rate_per_s: float, num_requests: int | None, duration_s: float | None) -> np.ndarray:
    """First arrival at 0, then cumulative gaps, drawn in chunks until a stop rule is met."""
    _check_stop(num_requests, duration_s)
    limit_n = num_requests if num_requests is not None else math.inf
    limit_s = duration_s if duration_s is not None else math.inf
    # Chunk size: the whole count when it is known, else ~10 % over the expected count.
    chunk = limit_n if duration_s is None else min(limit_n, int(rate_per_s * duration_s * 1.1) + 16)
    parts, count, last_s = [np.zeros(1)], 1, 0.0
    while count < limit_n and last_s < limit_s:
        times = last_s + np.cumsum(draw(int(min(chunk, limit_n - count))))
        parts.append(times)
        count, last_s = count + times.size, float(times[-1])
    times = np.concatenate(parts)
    times = times[: int(min(limit_n, times.size))]
    return times[times < limit_s]


def _paced(draw: Draw, rate_per_s: float, num_requests: int | None, duration_s: float | None) -> np.ndarray:
    """One gap per request, the first included; running sums scaled so the last is num_requests / rate."""
    if num_requests is None or duration_s is not None:
        raise ValueError(
            "paced arrivals need num_requests and no duration_s (the last request leaves at "
            "num_requests / rate)"
        )
    times = np.cumsum(draw(num_requests))
    return times * (num_requests / rate_per_s / times[-1])


def _check_stop(num_requests: int | None, duration_s: float | None) -> None:
    if num_requests is None and duration_s is None:
        raise ValueError("an arrival process needs num_requests or duration_s to know when to stop")
