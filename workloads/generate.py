"""From a `WorkloadConfig` to the requests of one run: a pure function of (config, rng, files).

Order of work; each step draws from its own stream spawned from `rng`, so a seed fixes everything and one
step's draws never shift another's:
1. the trace table, if any (servegen draws its arrivals and lengths here); `skip_requests` leading
   rows are dropped and the rest shifted to start at t = 0;
2. arrival times: the trace's (first rows, rescaled, then rows at or after `duration_s` dropped) or a
   synthetic process (workloads/arrivals.py), capped at the trace's row count. One arrival per drawn
   prompt: `num_requests / parallel_sampling.n` of them at most;
3. lengths: `lengths` sampled (prompt and output, a stream each), or the trace's rows in order. A trace's
   `session_id` and `priority` columns (servesim format) pass through either way;
4. shared prefixes (workloads/prefixes.py): prefix lengths, who uses one, which one;
5. sessions (workloads/sessions.py), or parallel samples: extra output lengths for copies 1..n-1;
6. semantic clusters (workloads/prefixes.py).

Prefix identity (`Request.prompt_segments`, rules in workloads/request.py), always filled:
- Mooncake rows: one run per hash id, (hash id, 512), the last one (hash id, input_length - 512 * (k - 1)).
- servesim rows with a `prefix_id`: `((prefix_id, prefix_tokens), (-(id + 1), rest))`.
- With `shared_prefix`: `((prefix index, prefix_tokens), (-(id + 1), own part))` for requests that use one.
- A trace turn of a `session_id` whose prompt holds the session's previous turn and its answer (prompt_tokens at
  least their sum, as a chat client resends its history): the previous turn's runs, its answer
  `(output_segment_id(prev.id), prev.num_output_tokens)`, then `(-(id + 1), rest)`; not with `lengths` or
  `shared_prefix`, whose drawn tokens say nothing of what a turn resends. A session's turns count `turn` on
  either way.
- Everything else, and any trace whose lengths `lengths` replaces: `((-(id + 1), num_prompt_tokens),)`.
A unique run (-(id + 1), ...) is named after the first request with that prompt: parallel samples
share their first copy's runs, so their prompts are identical.
With `closed_loop`, the simulator sends the requests in this order as its clients free up and decides
their send times; the `arrival_s` computed here are then not used for issuing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.workloads.arrivals import constant_arrivals, gamma_arrivals, poisson_arrivals, rescale_times
from servesim.workloads.config import ClosedLoopConfig, WorkloadConfig
from servesim.workloads.distributions import draw_outputs, sample_lengths
from servesim.workloads.prefixes import (
    Segments,
    add_shared_prefixes,
    assign_semantic_clusters,
    with_unique_rest,
)
from servesim.workloads.request import Request, output_segment_id
from servesim.workloads.sessions import session_requests
from servesim.workloads.tables import dropped_text
from servesim.workloads.traces import MOONCAKE_BLOCK_TOKENS, load_source, resolve_path

__all__ = [
    "Workload",
    "build_table",
    "build_workload",
    "constant_arrivals",
    "gamma_arrivals",
    "poisson_arrivals",
]


@dataclass(frozen=True)
class Workload:
    """The requests of one run and how the simulator should issue them.

    `requests`: those whose arrival is known up front (first turns of sessions and every request outside
    a session), ids 0..len-1 in arrival order. `followups`: request id -> the next turn of its session,
    released `think_time_s` after that request finishes (the simulator sets its `arrival_s`, NaN until
    then); their ids continue from len(requests), so ids are dense over both.
    """

    requests: list[Request]
    closed_loop: ClosedLoopConfig | None = None
    followups: dict[int, Request] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what the user should know about the input (trace rows dropped, and why)


def build_workload(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path) -> Workload:
    """Requests for `cfg`; relative trace paths resolve against `base_dir` (the scenario's folder). Each kind of
    draw has its own stream spawned from `rng` (see `build_table`)."""
    table_rng, prefix_rng, request_rng, cluster_rng = rng.spawn(4)  # request_rng: turns or samples
    table = build_table(cfg, table_rng, base_dir)
    notes = table.attrs.get("notes", ())
    table = add_shared_prefixes(table, cfg.shared_prefix, prefix_rng, base_dir)
    if cfg.sessions is not None:
        requests, followups = session_requests(table, cfg, request_rng, base_dir)
        total = len(requests) + len(followups)
        if cfg.trace is not None and cfg.num_requests is not None and total < cfg.num_requests:
            notes += (
                f"{resolve_path(cfg.trace.path, base_dir)}: its {len(table)} usable rows ran out before "
                f"num_requests {cfg.num_requests}: the run has {total} requests in {len(requests)} sessions",
            )
    else:
        n = 1 if cfg.parallel_sampling is None else cfg.parallel_sampling.n
        extra_outputs = draw_outputs(cfg, table, len(table) * (n - 1), request_rng, base_dir)
        # drawn lengths or prefixes say nothing of what a turn resends
        history = cfg.lengths is None and cfg.shared_prefix is None
        requests, followups = _parallel_requests(table, n, extra_outputs, history), {}
    if cfg.semantic_clusters is not None:
        assign_semantic_clusters([*requests, *followups.values()], cfg.semantic_clusters, cluster_rng)
    return Workload(requests=requests, closed_loop=cfg.closed_loop, followups=followups, notes=notes)


def _parallel_requests(
    table: pd.DataFrame, n: int, extra_outputs: np.ndarray, history: bool = True
) -> list[Request]:
    """n requests per table row with one prompt (named after the first copy) and arrival; copy 0 keeps the
    row's output length, copies 1..n-1 take `extra_outputs` in order. `history`: a session's turn that holds the
    previous turn and its answer starts with them (the module docstring); turns count on within a session either
    way."""
    requests, last_turn = [], {}  # session id -> its latest turn's first copy
    for i, row in enumerate(table.itertuples(index=False)):
        prompt = int(row.num_prompt_tokens)
        session_id = None if pd.isna(row.session_id) else int(row.session_id)
        prev = last_turn.get(session_id) if session_id is not None else None
        resends = history and prev is not None and prompt >= prev.num_prompt_tokens + prev.num_output_tokens
        shared = (*prev.segments(), (output_segment_id(prev.id), prev.num_output_tokens)) if resends else None
        segments = with_unique_rest(row.shared_segments if shared is None else shared, prompt, i * n)
        outputs = [int(row.num_output_tokens), *extra_outputs[i * (n - 1) : (i + 1) * (n - 1)].tolist()]
        requests += [
            Request(
                id=i * n + c,
                arrival_s=float(row.arrival_s),
                num_prompt_tokens=prompt,
                num_output_tokens=outputs[c],
                prompt_segments=segments,
                session_id=session_id,
                priority=int(row.priority),
                turn=0 if prev is None else prev.turn + 1,
            )
            for c in range(n)
        ]
        if session_id is not None:
            last_turn[session_id] = requests[-n]
    return requests


def build_table(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path) -> pd.DataFrame:
    """The drawn prompts as columns: arrival_s (s), num_prompt_tokens, num_output_tokens, shared_segments
    (the trace's shared runs: Mooncake blocks or a servesim prefix; the unique rest is not listed),
    session_id (Int64, may be NA), priority; one row per prompt in arrival order. `attrs["notes"]`: what
    cleaning the trace dropped.

    The trace source, the arrivals, the prompt lengths and the output lengths draw from streams of their own
    (spawned from `rng`), so the i-th request's lengths do not depend on how many arrivals a rate gives: the
    points of a sweep over `duration_s` share their length samples (common random numbers). Shared prefixes
    and sessions each draw several kinds from one stream, so theirs still shift with the count."""
    source_rng, arrival_rng, prompt_rng, output_rng = rng.spawn(4)
    rows = _trace_rows(cfg, source_rng, base_dir)
    arrival_s = _arrival_times(cfg, rows, arrival_rng)
    n = arrival_s.size
    src = None if rows is None else rows.iloc[:n].reset_index(drop=True)
    if cfg.lengths is not None:
        prompt = sample_lengths(cfg.lengths.prompt, n, prompt_rng, base_dir)
        output = sample_lengths(cfg.lengths.output, n, output_rng, base_dir)
        segments = pd.Series([()] * n, dtype=object)
    else:
        prompt, output = src["num_prompt_tokens"].to_numpy(), src["num_output_tokens"].to_numpy()
        segments = _shared_segments(src)
    table = pd.DataFrame(
        {
            "arrival_s": arrival_s,
            "num_prompt_tokens": prompt,
            "num_output_tokens": output,
            "shared_segments": segments,
            "session_id": _column(src, "session_id", pd.NA, "Int64", n),
            "priority": _column(src, "priority", 0, "int64", n),
        }
    )
    table.attrs["notes"] = (
        ()
        if rows is None
        else rows.attrs["notes"]
        + _shortfall(cfg, len(rows), arrival_s, resolve_path(cfg.trace.path, base_dir))
    )
    return table


def _shortfall(cfg: WorkloadConfig, num_rows: int, arrival_s: np.ndarray, path: Path) -> tuple[str, ...]:
    """A note when the trace's rows ran out before the run's `num_requests`, or before the `duration_s` of a
    synthetic arrival process (one request per row: a rate sweep on a short trace would otherwise end early
    without a word). Trace-timed arrivals end with their trace."""
    per_arrival = cfg.parallel_sampling.n if cfg.parallel_sampling is not None else 1
    # sessions' num_requests counts turns, not rows: `session_requests` tells whether the rows ran out
    short_of_count = (
        cfg.num_requests is not None and cfg.num_requests // per_arrival > num_rows and cfg.sessions is None
    )
    if arrival_s.size < num_rows or not (short_of_count or cfg.num_requests is None):
        return ()
    wanted = [f"num_requests {cfg.num_requests}"] if short_of_count else []
    if cfg.duration_s is not None and cfg.arrivals.kind in ("constant", "poisson", "gamma"):
        wanted.append(f"duration_s {cfg.duration_s:g}")
    if not wanted:
        return ()
    last = f", the last at {arrival_s[-1]:.1f} s" if arrival_s.size else ""
    return (
        f"{path}: its {num_rows} usable rows ran out before {' and '.join(wanted)}: the run has "
        f"{arrival_s.size} arrivals{last}",
    )


def _column(src: pd.DataFrame | None, name: str, default: object, dtype: str, n: int) -> pd.Series:
    """A pass-through trace column, or `default` everywhere when the trace has none."""
    if src is not None and name in src:
        return src[name].astype(dtype)
    return pd.Series([default] * n, dtype=dtype)


def _trace_rows(cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path) -> pd.DataFrame | None:
    """The trace table after `skip_requests`, times shifted to start at 0; None without a trace."""
    if cfg.trace is None:
        return None
    table, path = (
        load_source(cfg.trace, base_dir, rng, cfg.duration_s),
        resolve_path(cfg.trace.path, base_dir),
    )
    if cfg.skip_requests >= len(table):
        why = f" ({dropped_text(table)})" if table.attrs.get("dropped") else ""
        if not len(table):
            raise ValueError(
                f"{path}: no usable rows{why}"
                + (
                    ": its clients (trace.clients) send nothing in the first duration_s"
                    if cfg.trace.format == "servegen"
                    else ""
                )
            )
        raise ValueError(
            f"{path}: skip_requests ({cfg.skip_requests}) leaves none of its {len(table)} usable rows{why}"
        )
    rows = table.iloc[cfg.skip_requests :].reset_index(drop=True)
    rows["arrival_s"] = rows["arrival_s"] - rows["arrival_s"].iloc[0]
    dropped = table.attrs.get("dropped", 0)
    cleaned = (f"{path}: {dropped_text(table)} (of its {len(table) + dropped} rows)",) if dropped else ()
    rows.attrs["notes"] = table.attrs.get("notes", ()) + cleaned  # the loader's own, then cleaning's
    return rows


def _arrival_times(cfg: WorkloadConfig, rows: pd.DataFrame | None, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s), ascending, one per request of the run."""
    arrivals, n_max = cfg.arrivals, cfg.num_requests
    if n_max is not None and cfg.parallel_sampling is not None:
        n_max //= cfg.parallel_sampling.n  # num_requests counts requests; one arrival per prompt
    if rows is not None:
        n_max = len(rows) if n_max is None else min(n_max, len(rows))
    match arrivals.kind:
        case "trace":
            return _trace_times(cfg, rows, n_max)
        case "all_at_once":
            return np.zeros(n_max)
        case "constant":
            return constant_arrivals(arrivals.rate_per_s, n_max, cfg.duration_s, arrivals.paced)
        case "poisson":
            return poisson_arrivals(arrivals.rate_per_s, rng, n_max, cfg.duration_s, arrivals.paced)
        case "gamma":
            return gamma_arrivals(
                arrivals.rate_per_s, arrivals.cv, rng, n_max, cfg.duration_s, arrivals.paced
            )
    raise ValueError(f"unknown arrival kind {arrivals.kind!r}")


def _trace_times(cfg: WorkloadConfig, rows: pd.DataFrame, n_max: int) -> np.ndarray:
    """The trace's times, stretched to `rate_per_s` (or by `time_scale`), within `duration_s`. With both a rate and
    a duration the run keeps rate x duration rows and stretches those to the rate, so the arrivals that run hold
    the rate asked for, not the whole trace's (a busy first hour would otherwise run fast)."""
    rate = cfg.arrivals.rate_per_s
    if rate is not None and cfg.duration_s is not None:
        n_max = min(n_max, max(2, round(rate * cfg.duration_s)))
    times = rows["arrival_s"].to_numpy()[:n_max]
    if np.isnan(times).any():
        raise ValueError(f"{cfg.trace.path}: arrivals.kind 'trace' but the trace has no timestamps")
    try:
        times = rescale_times(times, rate, cfg.arrivals.time_scale)
    except ValueError as err:
        field = "time_scale" if cfg.arrivals.time_scale is not None else "rate_per_s"
        raise ValueError(f"{cfg.trace.path}: arrivals.{field}: {err}") from None
    return times if cfg.duration_s is None else times[times < cfg.duration_s]


def _shared_segments(rows: pd.DataFrame) -> pd.Series:
    """The shared runs of each row (see the module docstring); the unique rest is added per request."""
    prompt = rows["num_prompt_tokens"].to_numpy()
    if "hash_ids" in rows:
        segs = [_block_segments(ids, int(p)) for ids, p in zip(rows["hash_ids"], prompt)]
    elif "prefix_id" in rows:
        segs = [
            () if pd.isna(pid) else ((int(pid), int(plen)),)
            for pid, plen in zip(rows["prefix_id"], rows["prefix_tokens"])
        ]
    else:
        segs = [()] * len(rows)
    return pd.Series(segs, dtype=object)


def _block_segments(hash_ids: tuple[int, ...], num_prompt_tokens: int) -> Segments:
    """Mooncake blocks: every block 512 tokens but the last, which holds the remainder."""
    last = num_prompt_tokens - MOONCAKE_BLOCK_TOKENS * (len(hash_ids) - 1)
    return tuple(
        (int(h), MOONCAKE_BLOCK_TOKENS if k < len(hash_ids) - 1 else last) for k, h in enumerate(hash_ids)
    )
