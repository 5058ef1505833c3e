"""Multi-turn sessions: every drawn prompt starts a conversation whose later turns resend the whole history.

Turn k+1's prompt is turn k's prompt runs, turn k's answer (output_segment_id(k's id), its output tokens),
then a new user message (-(id + 1), new_message_tokens). Its send time depends on when turn k finishes,
so it is not in `Workload.requests` but in `Workload.followups[turn k's id]`, with `arrival_s` NaN and
the `think_time_s` the simulator waits after turn k finishes.

Ids: first turns 0..m-1 in arrival order (session id = first turn's id), then every later turn, session by
session and turn by turn, from m on. `num_requests` counts all turns: sessions are taken in start order
until it is reached, and the last one may be cut short. `duration_s` bounds when sessions start; their
later turns may run past it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.workloads.arrivals import rescale_times
from servesim.workloads.config import MAX_REQUESTS, WorkloadConfig
from servesim.workloads.distributions import draw_outputs, sample_lengths, sample_values
from servesim.workloads.prefixes import with_unique_rest
from servesim.workloads.request import Request, output_segment_id


def session_requests(
    table: pd.DataFrame, cfg: WorkloadConfig, rng: np.random.Generator, base_dir: Path = Path(".")
) -> tuple[list[Request], dict[int, Request]]:
    """(first turns in arrival order, follow-ups by previous turn id) for the prompts of `table`.

    Draws, in order: turns per session (one per row), then for every possible follow-up turn its message
    length, output length and think time (s). Follow-up j of session i uses draw number
    sum(turns[:i] - 1) + j, so cutting a session short never shifts another session's draws.
    """
    sessions = cfg.sessions
    turns = sample_lengths(sessions.turns, len(table), rng, base_dir)
    first_draw = np.concatenate(([0], np.cumsum(turns - 1)))
    num_draws = int(first_draw[-1])
    if num_draws > MAX_REQUESTS:  # each possible follow-up is drawn up front, before num_requests cuts them
        raise ValueError(
            f"sessions.turns gives {len(table):,} sessions {num_draws:,} follow-up turns, more than "
            f"the {MAX_REQUESTS:,} requests a run takes; lower sessions.turns"
        )
    message = sample_lengths(sessions.new_message_tokens, num_draws, rng, base_dir)
    output = draw_outputs(cfg, table, num_draws, rng, base_dir)
    think_s = sample_values(sessions.think_time_s, num_draws, rng, base_dir)
    kept = _followups_kept(
        table, turns, first_draw, message, output, sessions.max_prompt_tokens, cfg.num_requests
    )
    table = _at_rate(table, len(kept), cfg)
    requests, followups = [], {}
    next_id = len(kept)
    for i, (row, num_followups) in enumerate(zip(table.itertuples(index=False), kept)):
        prev = _first_turn(row, i)
        requests.append(prev)
        for draw in range(first_draw[i], first_draw[i] + num_followups):
            followups[prev.id] = prev = _next_turn(
                prev, next_id, int(message[draw]), int(output[draw]), float(think_s[draw])
            )
            next_id += 1
    return requests, followups


def _followups_kept(
    table: pd.DataFrame,
    turns: np.ndarray,
    first_draw: np.ndarray,
    message: np.ndarray,
    output: np.ndarray,
    max_prompt_tokens: int | None,
    num_requests: int | None,
) -> list[int]:
    """Follow-up turns kept per session, for the sessions kept (a prefix of the table's rows).

    A session ends after `turns` turns, before a turn whose prompt would exceed `max_prompt_tokens`, or
    when the workload holds `num_requests` requests.
    """
    budget = math.inf if num_requests is None else num_requests
    cap = math.inf if max_prompt_tokens is None else max_prompt_tokens
    prompts, outputs = table["num_prompt_tokens"].to_numpy(), table["num_output_tokens"].to_numpy()
    kept = []
    for i in range(len(table)):
        if budget < 1:
            break
        budget -= 1
        prompt, answer, j = int(prompts[i]), int(outputs[i]), 0
        while j < turns[i] - 1 and budget >= 1:
            prompt += answer + int(message[first_draw[i] + j])
            if prompt > cap:
                break
            answer = int(output[first_draw[i] + j])
            j += 1
            budget -= 1
        kept.append(j)
    return kept


def _at_rate(table: pd.DataFrame, num_sessions: int, cfg: WorkloadConfig) -> pd.DataFrame:
    """A trace stretched to `rate_per_s` was stretched over all its rows; when `num_requests` (counting turns)
    keeps fewer sessions, stretch the ones kept to that rate, so sessions start at the rate asked for."""
    if cfg.arrivals.kind != "trace" or cfg.arrivals.rate_per_s is None or num_sessions >= len(table):
        return table
    times = table["arrival_s"].to_numpy()[:num_sessions]
    if num_sessions < 2 or times[-1] <= times[0]:
        return table
    return table.assign(
        arrival_s=np.concatenate(
            (
                rescale_times(times - times[0], cfg.arrivals.rate_per_s),
                table["arrival_s"].to_numpy()[num_sessions:],
            )
        )
    )


def _first_turn(row, request_id: int) -> Request:
    """Turn 0 of session `request_id`: the table row as it is (its trace session id is replaced)."""
    return Request(
        id=request_id,
        arrival_s=float(row.arrival_s),
        num_prompt_tokens=int(row.num_prompt_tokens),
        num_output_tokens=int(row.num_output_tokens),
        prompt_segments=with_unique_rest(row.shared_segments, int(row.num_prompt_tokens), request_id),
        session_id=request_id,
        priority=int(row.priority),
    )


def _next_turn(
    prev: Request, request_id: int, message_tokens: int, output_tokens: int, think_s: float
) -> Request:
    """The turn after `prev`: its prompt, its answer, then a new message; sent `think_s` after it finishes."""
    answer = (output_segment_id(prev.id), prev.num_output_tokens)
    return Request(
        id=request_id,
        arrival_s=math.nan,
        num_prompt_tokens=prev.num_prompt_tokens + prev.num_output_tokens + message_tokens,
        num_output_tokens=output_tokens,
        prompt_segments=prev.segments() + (answer, (-(request_id + 1), message_tokens)),
        session_id=prev.session_id,
        priority=prev.priority,
        turn=prev.turn + 1,
        think_time_s=think_s,
    )
