"""Maximum sustainable rate: the highest arrival rate at which a scenario meets its SLOs with a stable queue.

A rate *passes* when, over the requests the run sent:
- the `slo.percentile`-th TTFT, TPOT and E2EL are within `slo.ttft_ms`, `tpot_ms`, `e2el_ms` (those given). A run
  cut off by `stop.max_sim_time_s` counts a request unfinished at the stop with the time it had waited by then
  (for TTFT, its TTFT if it has its first token), a lower bound, so a backlog cannot hide behind the early
  requests that completed;
- at least `slo.goodput_fraction` of them (rejected ones included) meet every limit (if given), leaving out
  requests unfinished at the stop that could still meet them;
- the queue is stable (see `queue_growth`), and some request completed.

A passing rate whose run's arrivals span under a minute gets a note (`CapacityResult.short_run`): too short a
run to show a queue that grows slowly.

The rate varied is `workload.arrivals.rate_per_s`: a Poisson/gamma/constant process's rate, or a trace
rescaled to that mean rate. The search assumes that load only hurts: a rate that fails means every
higher rate fails (early stopping) and a rate that passes means every lower one passes. It brackets
the answer by doubling or halving from the scenario's own rate, then bisects the bracket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.hardware.errors import SpecError
from servesim.simulator.world.metrics import sent_mask, unfinished_requests
from servesim.simulator.world.run import RunResult, simulate, workload_of
from servesim.simulator.scenario import Scenario, SloConfig, with_overrides
from servesim.workloads.config import WorkloadConfig
from servesim.workloads.arrivals import mean_rate_per_s

# "Unstable queue": arrivals outpace service during the arrival window, so the backlog, and with it the
# time a request waits in a queue before an engine takes it, keeps growing. Measured by the mean wait (see
# `queue_waits_s`) of the last third of requests (by arrival) against the first third: unstable when it is more than
# UNSTABLE_WAIT_GROWTH times larger AND larger by at least UNSTABLE_MIN_GROWTH_S (so that a moment's queue behind a
# burst is not mistaken for a growing one). The wait, not the TTFT: a workload whose later prompts are longer has
# later TTFTs longer by their own prefill on an idle server. (A preempted request's wait to be scheduled again is
# not counted: under FCFS the backlog shows in the later arrivals.) Requests still waiting for a first token when
# the run stops (stop.max_sim_time_s) after every scheduled arrival (see `backlog`) also make it unstable. A
# stop before the last scheduled arrival cuts requests off in flight by design; then the wait growth (with the
# waits of the requests cut off) and the TTFT and E2E percentiles over every request sent judge the backlog.
UNSTABLE_WAIT_GROWTH = 2.0
UNSTABLE_MIN_GROWTH_S = 0.25
# A run whose arrivals span less than this cannot show a backlog that grows slowly: its verdict gets a note.
SHORT_RUN_S = 60.0

REASONS = ("TTFT SLO", "TPOT SLO", "E2E SLO", "goodput", "unstable queue", "rejected")
_LIMITS = (("ttft", "ttft_ms", "TTFT SLO"), ("tpot", "tpot_ms", "TPOT SLO"), ("e2el", "e2el_ms", "E2E SLO"))


@dataclass(frozen=True)
class Verdict:
    """Whether one run meets the SLOs with a stable queue; `reasons` are codes from REASONS, `details`
    say by how much. Latencies in ms at the SLO percentile; `goodput_share` of all requests."""

    rate_per_s: float | None
    reasons: tuple[str, ...]
    details: tuple[str, ...]
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def as_dict(self) -> dict:
        return {
            "rate_per_s": self.rate_per_s,
            "ok": self.ok,
            "reasons": list(self.reasons),
            "details": list(self.details),
            **self.metrics,
        }


@dataclass(frozen=True)
class CapacityResult:
    """The highest passing rate found (0.0 if none), how many simulations it took, and every verdict by rate."""

    rate_per_s: float
    num_simulations: int
    verdicts: list[Verdict]
    unit: str = "req/s"  # what the rates count (WorkloadConfig.rate_unit)

    @property
    def best(self) -> Verdict | None:
        """The verdict at `rate_per_s` (None when no rate passed)."""
        return next((v for v in self.verdicts if v.ok and v.rate_per_s == self.rate_per_s), None)

    @property
    def limit(self) -> Verdict | None:
        """The lowest failing rate's verdict: what stops the rate from going higher."""
        return next((v for v in self.verdicts if not v.ok), None)

    @property
    def short_run(self) -> str | None:
        """A caution when the passing run's arrivals span under SHORT_RUN_S: a slowly growing queue may not
        have shown (the unstable-queue check compares the first and last third), so the rate may be high."""
        best = self.best
        span = best.metrics.get("arrival_span_s", math.inf) if best else math.inf
        if span >= SHORT_RUN_S:
            return None
        return (
            f"at {best.rate_per_s:.3g} {self.unit} the run's arrivals span only {span:.0f} s, too short for a slowly "
            "growing queue to show: more requests (workload.num_requests) give a firmer answer"
        )

    @property
    def search_limit_reached(self) -> bool:
        """Every rate tried passed: the answer is the search's ceiling, a lower bound of the capacity."""
        return self.rate_per_s > 0 and self.limit is None

    def as_dict(self) -> dict:
        return {
            "max_rate_per_s": self.rate_per_s,
            "rate_unit": self.unit,
            "num_simulations": self.num_simulations,
            "search_limit_reached": self.search_limit_reached,
            "short_run": self.short_run,
            "points": [v.as_dict() for v in self.verdicts],
        }


def queue_growth(requests: pd.DataFrame, stop_s: float | None = None) -> tuple[float, float]:
    """Mean queue wait (s, `queue_waits_s`) of the first and the last third of admitted requests, by arrival;
    requests never sent (due after the stop) are left out."""
    admitted = requests[requests["reject_reason"].isna() & sent_mask(requests, stop_s)]
    admitted = admitted.sort_values(["arrival_s", "request_id"])
    k = len(admitted) // 3
    if k == 0:
        return 0.0, 0.0
    waits = queue_waits_s(admitted, stop_s)
    return float(waits[:k].mean()), float(waits[-k:].mean())


def queue_waits_s(sent: pd.DataFrame, stop_s: float | None) -> np.ndarray:
    """Each request's time in queues, in seconds: arrival to its first schedule, plus under P/D its prefill's end to
    its first token from the decode pool (the wait for a decode reservation, the KV transfer, a batch slot), plus in
    a pipeline its waits in later stages' queues. One still waiting at the stop counts its wait to then, a lower
    bound of its own; one answered without an engine (an application cache) waited none."""
    arrival = sent["arrival_s"].to_numpy(dtype=float)
    scheduled = sent["scheduled_s"].to_numpy(dtype=float)
    first = sent["first_token_s"].to_numpy(dtype=float)
    prefill_end = sent["prefill_end_s"].to_numpy(dtype=float)
    answered = sent["finish_s"].notna().to_numpy()
    now = np.nan if stop_s is None else stop_s
    queued = np.where(np.isnan(scheduled), np.where(answered, 0.0, now - arrival), scheduled - arrival)
    handed = ~np.isnan(prefill_end)  # a P/D prefill passed it on (one-token requests end there)
    handoff = np.where(handed, np.where(np.isnan(first), now - prefill_end, first - prefill_end), 0.0)
    return queued + handoff + np.nan_to_num(sent["stage_wait_s"].to_numpy(dtype=float))


def backlog(requests: pd.DataFrame, stop_s: float) -> pd.DataFrame:
    """Requests a stop after the last arrival leaves in a queue that did not drain: sent, still without a first
    token, and having waited in queues (`queue_waits_s`) longer than any completed request waited for its first
    token (all unfinished ones if none completed). Requests merely in flight at the stop, or queued for a moment
    behind a step, are not."""
    open_ = unfinished_requests(requests, stop_s)
    done = requests["ttft_s"][requests["finish_s"].notna()]
    if done.empty:
        return open_
    open_ = open_[open_["first_token_s"].isna()]
    return open_[queue_waits_s(open_, stop_s) > done.max()]


def _censored_s(sent: pd.DataFrame, metric: str, stop_s: float | None) -> np.ndarray:
    """`metric` (ttft or e2el) of requests the run sent, in seconds; one unfinished at the stop (NaN) counts the
    time it had waited by then, a lower bound of its own."""
    values = sent[f"{metric}_s"].to_numpy(dtype=float)
    if stop_s is None:
        return values
    return np.where(np.isnan(values), stop_s - sent["arrival_s"].to_numpy(dtype=float), values)


def judge(result: RunResult, slo: SloConfig, rate_per_s: float | None = None) -> Verdict:
    """The verdict of one run against `slo` (percentile targets, goodput fraction) and queue stability."""
    s, requests = result.summary, result.requests
    pct = "median" if slo.percentile == 50 else f"p{slo.percentile}"
    reasons, details, metrics = [], [], {}
    stop_s = result.scenario.stop.max_sim_time_s
    lost_at_s = s.get("slo_lost_at_s")  # stopped there once an SLO was lost (simulator/world/slo_watch.py)
    cut = stop_s is not None and s["unfinished"] > 0  # some requests were in flight at the stop
    sent = requests[
        requests["reject_reason"].isna()
        & (requests["finish_s"].notna() | cut)
        & sent_mask(requests, stop_s if cut else None)
    ]
    for metric, field_name, reason in _LIMITS:
        value = s.get(f"{pct}_{metric}_ms", float("nan"))
        if cut and metric != "tpot":  # TTFT and E2E with the waits of the requests cut off
            value = float(np.percentile(_censored_s(sent, metric, stop_s), slo.percentile)) * 1e3
        metrics[f"{pct}_{metric}_ms"] = value
        limit = getattr(slo, field_name)
        if limit is not None and value > limit:
            reasons.append(reason)
            stopped = f" (run stopped at {lost_at_s:,.1f} s, once certain)" if lost_at_s is not None else ""
            details.append(f"{pct} {metric.upper()} {value:,.1f} ms > {limit:,.0f} ms{stopped}")
    # never sent (due at or after the stop, or session turns not released by then): no part of the verdict;
    # in flight at the stop and still able to meet every limit: undecided, left out of the goodput share
    undecided = s.get("slo_undecided", s["unfinished"]) if stop_s is not None else 0
    met = s.get("slo_met", s["completed"] + s["rejected"])  # without per-request limits: every answer
    judged = len(requests) - s["not_arrived"] - undecided
    share = met / judged if s["completed"] and judged else 0.0
    metrics["goodput_share"] = share
    if slo.goodput_fraction is not None and share < slo.goodput_fraction:
        reasons.append("goodput")
        details.append(f"{share:.1%} of requests meet every SLO < {slo.goodput_fraction:.1%}")
    first_s, last_s = queue_growth(requests, stop_s)
    # after the last scheduled arrival (session turns held back by a stuck queue are not scheduled ones) a stop
    # leaves a backlog that did not drain; before it, requests in flight by design; a stop at a lost SLO, neither
    cut_early = stop_s is not None and bool((requests["arrival_s"] >= stop_s).any())
    unfinished = 0 if cut_early or stop_s is None or lost_at_s is not None else len(backlog(requests, stop_s))
    arrivals = requests["arrival_s"].to_numpy(dtype=float)
    arrivals = arrivals[np.isfinite(arrivals)]
    metrics["arrival_span_s"] = float(arrivals.max() - arrivals.min()) if len(arrivals) else 0.0
    if lost_at_s is not None:  # its latencies are those of the requests so far, not the whole run's
        metrics["stopped_at_s"] = lost_at_s
    metrics |= {
        "wait_first_third_ms": first_s * 1e3,
        "wait_last_third_ms": last_s * 1e3,
        "output_throughput": s["output_throughput"],
        "output_tokens_per_arrival": output_tokens_per_arrival(requests, result.scenario.workload),
    }
    if unfinished or (last_s > UNSTABLE_WAIT_GROWTH * first_s and last_s - first_s >= UNSTABLE_MIN_GROWTH_S):
        reasons.append("unstable queue")
        details.append(
            f"{unfinished} requests without a first token at the stop time, each having waited in queues longer "
            "than any answered request waited for its first token"
            if unfinished
            else f"mean queue wait grows from {first_s * 1e3:,.0f} ms (first third) to {last_s * 1e3:,.0f} ms "
            "(last third)"
        )
    if not s["completed"] and not s["rejected"] and "unstable queue" not in reasons:
        reasons.append("unstable queue")
        details.append("no request completed before the stop")
    # no rate fixes these: the engine refuses them at any load (those a stop at a lost SLO kept from arriving too)
    rejected = s["rejected"] + s.get("rejected_unsent", 0)
    if rejected:
        reasons.append("rejected")
        why = requests["reject_reason"].dropna().iloc[0] if s["rejected"] else s["rejected_unsent_example"]
        details.append(f"{rejected} of {len(requests)} requests rejected at any rate, e.g. {why}")
    return Verdict(rate_per_s, tuple(reasons), tuple(details), metrics)


def output_tokens_per_arrival(requests: pd.DataFrame, workload: WorkloadConfig) -> float:
    """Output tokens the workload asks for per unit of its rate (a request, a prompt of n samples, a session of
    several turns), over every request it holds: the steady-state figure, which neither a stop that leaves the
    longest answers in flight nor turns not yet released can bias."""
    if workload.sessions is not None:
        arrivals = requests["session_id"].nunique()
    elif workload.parallel_sampling is not None:
        arrivals = len(requests) / workload.parallel_sampling.n
    else:
        arrivals = len(requests)
    return float(requests["requested_output_tokens"].sum()) / arrivals if arrivals else 0.0


def at_rate(s: Scenario, rate_per_s: float) -> Scenario:
    """`s` with its arrivals at `rate_per_s` (a trace is rescaled to that mean rate)."""
    kind = s.workload.arrivals.kind
    if kind not in ("poisson", "gamma", "constant", "trace"):
        raise SpecError(
            f"workload.arrivals.kind: arrivals {kind!r} have no rate; capacity search needs poisson, "
            "gamma, constant or trace"
        )
    if s.workload.closed_loop is not None:
        raise SpecError("closed_loop clients set their own pace; capacity search needs open-loop arrivals")
    overrides = {"workload.arrivals.rate_per_s": rate_per_s}
    if kind == "trace" and s.workload.arrivals.time_scale is not None:
        overrides["workload.arrivals.time_scale"] = None
    return with_overrides(s, overrides)


def offered_rate(s: Scenario, base_dir: Path) -> float:
    """The scenario's own arrival rate in its unit (`rate_unit`; for an unscaled trace: its mean over the run's rows)."""
    rate = getattr(s.workload.arrivals, "rate_per_s", None)
    if rate is not None:
        return rate
    at_rate(s, 1.0)  # the same clear error for arrivals without a rate
    times = np.array([r.arrival_s for r in workload_of(s, base_dir).requests])
    n = s.workload.parallel_sampling.n if s.workload.parallel_sampling is not None else 1
    try:  # a prompt's n samples arrive together: the rate counts prompts, as at_rate sets it
        return mean_rate_per_s(times[::n])
    except ValueError as err:
        raise SpecError(f"workload: {err}") from None


def check_rate(s: Scenario, base_dir: Path, rate_per_s: float) -> Verdict:
    """Simulate `s` at `rate_per_s` and judge it against its own SLOs."""
    return judge(simulate(at_rate(s, rate_per_s), base_dir, stop_when_slo_lost=True), s.slo, rate_per_s)


def max_sustainable_rate(
    s: Scenario,
    base_dir: Path,
    start_rate_per_s: float | None = None,
    rel_tol: float = 0.02,
    max_factor: float = 1024.0,
    decided: Callable[[float, float], bool] | None = None,
    split: Callable[[float, float], float] | None = None,
    min_factor: float | None = None,
    on_verdict: Callable[[Verdict], None] | None = None,
) -> CapacityResult:
    """Bisect the arrival rate for the highest one that passes, to within `rel_tol` of the failing bound.

    Starts at `start_rate_per_s` (default: the scenario's rate), doubles while passing or halves while
    failing (at most `max_factor` either way), then bisects. Returns 0.0 when even the lowest rate fails.
    `decided(passing, failing)`: the caller needs no finer bracket (a planner sizing replicas stops once every
    rate in it gives the same count). `split(passing, failing)`: the next rate to try, strictly between (default: the
    midpoint). `min_factor`: halve at most this far below the start (default `max_factor`), for a caller with no use
    for lower rates. `on_verdict` hears each rate's verdict as it comes (progress).
    """
    start = start_rate_per_s or offered_rate(s, base_dir)
    verdicts: dict[float, Verdict] = {}

    def passes(rate: float) -> bool:
        verdicts[rate] = check_rate(s, base_dir, rate)
        if on_verdict is not None:
            on_verdict(verdicts[rate])
        return verdicts[rate].ok

    if not passes(start) and "rejected" in verdicts[start].reasons:
        return CapacityResult(0.0, 1, [verdicts[start]], s.workload.rate_unit)  # refused whatever the rate
    lo, hi = _bracket(passes, start, max_factor, verdicts[start].ok, min_factor or max_factor)
    while lo is not None and hi is not None and hi - lo > rel_tol * hi and not (decided and decided(lo, hi)):
        mid = split(lo, hi) if split else (lo + hi) / 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    ordered = [verdicts[r] for r in sorted(verdicts)]
    return CapacityResult(lo or 0.0, len(ordered), ordered, s.workload.rate_unit)


def _bracket(
    passes, start: float, max_factor: float, start_passes: bool, min_factor: float
) -> tuple[float | None, float | None]:
    """(highest passing, lowest failing) rates found by doubling from `start` (already judged: `start_passes`) up to
    `max_factor` x, or halving until below start / `min_factor`; None = not found."""
    if start_passes:
        lo = start
        while lo < start * max_factor:
            if not passes(lo * 2):
                return lo, lo * 2
            lo *= 2
        return lo, None  # still passing at max_factor x the start rate: report that as the answer
    hi = start
    while hi > start / min_factor:
        if passes(hi / 2):
            return hi / 2, hi
        hi /= 2
    return None, hi
