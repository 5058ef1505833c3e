"""Requests generated from an Alibaba ServeGen per-client workload model (a folder of files).

- `chunk-<client>-trace.csv`, no header, one row per 600-s window:
  `timestamp_s, rate_req_per_s, cv, dist_name, p1, p2`, where `dist_name` is `Gamma`, `Weibull` or empty
  (no traffic) and `p1`, `p2` are the fitted inter-arrival distribution's shape and scale (s).
- `chunk-<client>-dataset.json`: `{window_start_s: {"input_tokens": "{tokens: prob, ...}",
  "output_tokens": ...}}`, one entry per 6-h window; the PMFs are Python-literal strings, parsed with
  `ast.literal_eval` (never `eval`). Clients without this file cannot be generated: listing one is an
  error, and the run's notes say what share of the window's requests the left-out clients carry.

Per client and window we keep the fitted *shape* and rescale the gaps so their mean is exactly
1/rate: for Gamma windows the fitted scale already gives that (shape * scale = 1/rate); for Weibull
windows it often does not, and the window's measured rate wins. Each window is an ordinary renewal
process started at the window start (first arrival one gap in). Lengths are drawn from the PMFs of
the 6-h window containing the 600-s window; sampled lengths of 0 (present in some PMFs) are dropped
and counted like any other non-positive length.
"""

from __future__ import annotations

import ast
import bisect
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.workloads.tables import finish_table

WINDOW_S = 600.0  # span of one trace.csv row (s)
TRACE_COLUMNS = ("timestamp_s", "rate_req_per_s", "cv", "dist_name", "p1", "p2")
Pmf = tuple[np.ndarray, np.ndarray]  # (token counts, probabilities summing to 1)


def servegen_requests(
    folder: Path,
    rng: np.random.Generator,
    duration_s: float,
    clients: Sequence[int] | None = None,
    start_s: float = 0.0,
) -> pd.DataFrame:
    """Requests of all (or the listed) clients arriving in [start_s, start_s + duration_s) of the
    model's timeline, as the common request table plus a `client_id` column."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(
            f"{folder}: servegen folder not found (expected chunk-<client>-trace.csv and "
            f"chunk-<client>-dataset.json files, trace columns {list(TRACE_COLUMNS)})"
        )
    end_s = start_s + duration_s
    included, left_out = _client_ids(folder, clients)
    parts, window_ends = [], []
    for client in included:
        part, window_end_s = _client_requests(folder, client, rng, start_s, end_s)
        parts.append(part)
        window_ends.append(window_end_s)
    df = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["t", "p", "o", "c"])
    table = finish_table(  # drawn, not read: no file column or row to name
        folder,
        df["t"].to_numpy(),
        df["p"].to_numpy(),
        df["o"].to_numpy(),
        extra={"client_id": df["c"].to_numpy(np.int64)},
    )
    notes = []
    if left_out:
        share = _expected_requests(folder, left_out, start_s, end_s)
        total = share + _expected_requests(folder, included, start_s, end_s)
        notes.append(
            f"{folder}: clients {left_out} have no chunk-<client>-dataset.json (their lengths) "
            f"and are left out: {share / total if total else 0:.0%} of the requests their "
            "trace files give this window"
        )
    data_end_s = max(window_ends, default=0.0)
    if included and end_s > data_end_s:
        notes.append(
            f"{folder}: the model's windows end at {data_end_s:g} s, before start_s + duration_s = {end_s:g} s: "
            "no arrivals after that"
        )
    if len(df) and df["t"].min() - start_s > WINDOW_S:
        notes.append(
            f"{folder}: no client sends before {df['t'].min():.0f} s of the model's timeline (start_s {start_s:g} s); "
            "the run starts at that first arrival"
        )
    if notes:
        table.attrs["notes"] = tuple(notes)
    return table


def _trace_path(folder: Path, client: int) -> Path:
    return folder / f"chunk-{client}-trace.csv"


def _clients(folder: Path, kind: str) -> list[int]:
    return sorted(
        int(m.group(1))
        for p in folder.glob(f"chunk-*-{kind}")
        if (m := re.fullmatch(rf"chunk-(\d+)-{re.escape(kind)}", p.name))
    )


def _client_ids(folder: Path, wanted: Sequence[int] | None) -> tuple[list[int], list[int]]:
    """(clients to generate, ascending; clients with a trace but no dataset, left out). A listed client without
    both files is an error."""
    have, traced = _clients(folder, "dataset.json"), _clients(folder, "trace.csv")
    if wanted is None:
        return have, [c for c in traced if c not in set(have)]
    unknown = [c for c in wanted if c not in set(traced) or c not in set(have)]
    if unknown:
        raise ValueError(
            f"{folder}: servegen clients {unknown} lack chunk-<client>-trace.csv or "
            f"chunk-<client>-dataset.json; clients with both: {sorted(set(have) & set(traced))}"
        )
    return [c for c in have if c in set(wanted)], []


def _expected_requests(folder: Path, clients: Sequence[int], t0_s: float, t1_s: float) -> float:
    """Requests the clients' trace windows promise in [t0_s, t1_s): rate times the overlap."""
    total = 0.0
    for client in clients:
        trace = _read_trace(_trace_path(folder, client))
        start = trace["timestamp_s"].to_numpy(float)
        overlap = np.clip(np.minimum(start + WINDOW_S, t1_s) - np.maximum(start, t0_s), 0, None)
        total += float((trace["rate_req_per_s"].fillna(0).to_numpy(float) * overlap).sum())
    return total


def _client_requests(
    folder: Path, client: int, rng: np.random.Generator, t0_s: float, t1_s: float
) -> tuple[pd.DataFrame, float]:
    """One client's arrivals (s, absolute) in [t0_s, t1_s) with sampled prompt/output lengths, and where its
    trace's windows end (s)."""
    trace_path = _trace_path(folder, client)
    trace = _read_trace(trace_path)
    dataset = _read_dataset(folder / f"chunk-{client}-dataset.json")
    starts = sorted(dataset)
    active = trace[
        (trace["timestamp_s"] + WINDOW_S > t0_s)
        & (trace["timestamp_s"] < t1_s)
        & (trace["rate_req_per_s"] > 0)
        & trace["dist_name"].notna()
    ]
    cols: dict[str, list[np.ndarray]] = {"t": [], "p": [], "o": []}
    parsed: dict[float, tuple[Pmf, Pmf] | None] = {}  # PMF strings are large: parse each window once
    for row in active.itertuples(index=False):
        times = _window_arrivals(row.timestamp_s, _Gaps(row, rng, trace_path), row.rate_req_per_s)
        times = times[(times >= t0_s) & (times < t1_s)]
        pos = bisect.bisect_right(starts, row.timestamp_s) - 1
        if pos >= 0 and starts[pos] not in parsed:
            parsed[starts[pos]] = _pmfs(dataset[starts[pos]], folder / f"chunk-{client}-dataset.json")
        pmfs = parsed[starts[pos]] if pos >= 0 else None
        if pmfs is None:  # no length data for this window: lengths NaN, so the rows are dropped and counted
            lengths = [np.full(times.size, np.nan)] * 2
        else:
            lengths = [rng.choice(values, size=times.size, p=probs) for values, probs in pmfs]
        for key, arr in zip("tpo", [times, *lengths]):
            cols[key].append(arr)
    out = pd.DataFrame({k: np.concatenate(v) if v else np.empty(0) for k, v in cols.items()})
    out["c"] = client
    return out, float(trace["timestamp_s"].max()) + WINDOW_S


class _Gaps:
    """A window's fitted inter-arrival gaps (s): Gamma or Weibull of shape p1 and mean 1 / rate."""

    def __init__(self, row, rng: np.random.Generator, path: Path):
        self.shape, self.mean_s, self.rng, self.kind = (
            float(row.p1),
            1.0 / float(row.rate_req_per_s),
            rng,
            row.dist_name,
        )
        if not self.shape > 0:
            raise ValueError(f"{path}: servegen window at {row.timestamp_s} s: shape p1={row.p1} must be > 0")
        if self.kind not in ("Gamma", "Weibull"):
            raise ValueError(
                f"{path}: servegen window at {row.timestamp_s} s: unknown distribution {row.dist_name!r} "
                "(expected Gamma, Weibull or empty)"
            )

    def draw(self, k: int) -> np.ndarray:
        if self.kind == "Gamma":
            return self.rng.gamma(self.shape, self.mean_s / self.shape, size=k)
        return self._weibull_scale_s() * self.rng.weibull(self.shape, size=k)

    def first(self) -> float:
        """The wait from the window's start to its first arrival, as in a process already running (the
        stationary forward recurrence time: a uniform share of a length-biased gap). Starting each window one
        whole gap in would add about (cv^2 - 1) / 2 arrivals per window to a bursty one."""
        if self.kind == "Gamma":
            biased = self.rng.gamma(self.shape + 1.0, self.mean_s / self.shape)
        else:  # a length-biased Weibull gap: (gap / scale)^shape is Gamma(1 + 1/shape)
            biased = self._weibull_scale_s() * self.rng.gamma(1.0 + 1.0 / self.shape) ** (1.0 / self.shape)
        return float(self.rng.random() * biased)

    def _weibull_scale_s(self) -> float:
        return self.mean_s / math.gamma(1.0 + 1.0 / self.shape)


def _window_arrivals(start_s: float, gaps: _Gaps, rate_per_s: float) -> np.ndarray:
    """Renewal arrivals (s) in [start_s, start_s + WINDOW_S), the process in its steady state at start_s."""
    end_s, chunk = start_s + WINDOW_S, int(rate_per_s * WINDOW_S * 1.2) + 16
    first_s = start_s + gaps.first()
    parts, last_s = [np.array([first_s])], first_s
    while last_s < end_s:
        times = last_s + np.cumsum(gaps.draw(chunk))
        parts.append(times)
        last_s = float(times[-1])
    times = np.concatenate(parts)
    return times[times < end_s]


def _read_trace(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ValueError(f"{path}: servegen trace file not found (expected columns {list(TRACE_COLUMNS)})")
    try:
        df = pd.read_csv(path, header=None)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{path}: not a servegen trace CSV ({str(err)[:80]}; expected columns {list(TRACE_COLUMNS)})"
        ) from None
    if df.shape[1] != len(TRACE_COLUMNS):
        raise ValueError(
            f"{path}: servegen trace has {df.shape[1]} columns; expected {len(TRACE_COLUMNS)}: "
            f"{list(TRACE_COLUMNS)}"
        )
    df.columns = list(TRACE_COLUMNS)
    return df


def _read_dataset(path: Path) -> dict[float, dict]:
    """Window start (s) -> raw entry with PMF strings."""
    try:
        raw = json.loads(path.read_text())
        return {float(k): v for k, v in raw.items()}
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(
            f"{path}: not a servegen dataset JSON ({{window_start_s: {{input_tokens, "
            f"output_tokens}}}}): {err}"
        ) from err


def _pmfs(entry: dict, path: Path) -> tuple[Pmf, Pmf] | None:
    """(input, output) PMFs of one 6-h window, or None when the window has no length data."""
    missing = [k for k in ("input_tokens", "output_tokens") if k not in entry]
    if missing:
        raise ValueError(
            f"{path}: a window is missing keys {missing}; expected ['input_tokens', 'output_tokens']"
        )
    pmf_in, pmf_out = _parse_pmf(entry["input_tokens"], path), _parse_pmf(entry["output_tokens"], path)
    return None if pmf_in is None or pmf_out is None else (pmf_in, pmf_out)


def _parse_pmf(text: str | dict, path: Path) -> Pmf | None:
    """A '{tokens: prob}' literal (or dict) as arrays; None if empty."""
    try:
        pmf = ast.literal_eval(text) if isinstance(text, str) else text
        values = np.array(list(pmf.keys()), dtype=np.float64)
        probs = np.array(list(pmf.values()), dtype=np.float64)
    except (ValueError, SyntaxError, AttributeError, TypeError) as err:
        raise ValueError(f"{path}: a PMF is not a {{tokens: probability}} literal: {err}") from err
    if values.size == 0 or probs.sum() <= 0:
        return None
    return values, probs / probs.sum()
