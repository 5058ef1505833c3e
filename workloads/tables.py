"""The common request table every trace loader returns, and the checks and cleaning they share.

Columns: `arrival_s` (float64 s from the first kept request, NaN when the source has no timestamps),
`num_prompt_tokens`, `num_output_tokens` (int64, >= 1), then format-specific extras (`hash_ids`,
`session_id`, ...). Rows are sorted by arrival (stable). `df.attrs["dropped"]` counts rows removed
by cleaning (non-positive or missing lengths, and failed requests where the format has them), and
`df.attrs["dropped_by"]` splits that count by reason ({reason: rows}, only reasons that dropped any).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.hardware.errors import choices
from servesim.hardware.spec_model import MAX_TOKENS

LENGTH_COLUMNS = ("num_prompt_tokens", "num_output_tokens")


def require_file(path: Path, fmt: str, expected: Sequence[str]) -> None:
    """Raise ValueError naming `path` and the expected columns when the file does not exist."""
    try:
        found = path.is_file()
    except OSError as err:  # a name too long for the file system, say
        raise ValueError(f"{path}: {fmt} trace file cannot be looked up ({err.strerror})") from None
    if not found:
        raise ValueError(
            f"{path}: {fmt} trace file not found (its columns: {choices(list(expected), width=80)})"
        )


def require_columns(
    df: pd.DataFrame, path: Path, fmt: str, required: Sequence[str], expected: Sequence[str] | None = None
) -> None:
    """Raise ValueError naming `path`, the missing columns and the expected ones."""
    missing = [c for c in required if c not in df.columns]
    if missing:
        found = choices([str(c) for c in df.columns], missing[0], width=50) or "none"
        expected = list(expected or required)
        raise ValueError(
            f"{path}: {fmt} trace lacks {', '.join(missing)}"
            + (f" (of {choices(expected, width=70)})" if expected != missing else "")
            + f"; found {found}"
        )


def finish_table(
    path: Path,
    arrival_s: pd.Series | np.ndarray,
    prompt: pd.Series | np.ndarray,
    output: pd.Series | np.ndarray,
    extra: dict[str, pd.Series | np.ndarray] | None = None,
    dropped: dict[str, int] | None = None,
) -> pd.DataFrame:
    """Assemble the common table: drop rows without positive lengths, shift times to start at 0, sort.

    `dropped`: rows the caller already removed, by reason; with this function's own they go to
    `df.attrs["dropped_by"]`, their total to `df.attrs["dropped"]`. A bad value is named by the file's column
    (the name of the Series passed) and data row (1-based, the Series' index: the row the file holds it on).
    """
    extras = {
        k: v.reset_index(drop=True) if isinstance(v, pd.Series) else v for k, v in (extra or {}).items()
    }
    df = pd.DataFrame(
        {
            "arrival_s": _numeric(arrival_s),
            "num_prompt_tokens": _numeric(prompt),
            "num_output_tokens": _numeric(output),
            **extras,
        }
    )
    df.index = prompt.index if isinstance(prompt, pd.Series) else pd.RangeIndex(len(df))
    keep = (df["num_prompt_tokens"] >= 1) & (df["num_output_tokens"] >= 1)  # NaN compares False
    df = df[keep]
    for col, given in zip(LENGTH_COLUMNS, (prompt, output)):
        name = given.name if isinstance(given, pd.Series) and isinstance(given.name, str) else col
        _require_integral(df[col], path, name)
        df[col] = df[col].astype(np.int64)
    df = _shift_and_sort(df, path).reset_index(drop=True)
    by_reason = {**(dropped or {}), BAD_LENGTH: int((~keep).sum())}
    df.attrs["dropped_by"] = {reason: int(rows) for reason, rows in by_reason.items() if rows}
    df.attrs["dropped"] = sum(df.attrs["dropped_by"].values())
    return df


BAD_LENGTH = "a length missing, not a number or below 1"


def dropped_text(table: pd.DataFrame) -> str:
    """'N dropped: reason (n), ...' for a cleaned table, '' when it dropped nothing."""
    by_reason = table.attrs.get("dropped_by", {})
    if not by_reason:
        return ""
    reasons = ", ".join(f"{reason} ({rows})" for reason, rows in by_reason.items())
    return f"{sum(by_reason.values())} dropped: {reasons}"


def _numeric(values: pd.Series | np.ndarray) -> np.ndarray:
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=np.float64)


def _require_integral(values: pd.Series, path: Path, name: str) -> None:
    numbers = values.to_numpy()
    frac = ~np.isfinite(numbers)
    frac[~frac] = numbers[~frac] % 1 != 0
    if frac.any():
        raise ValueError(
            f"{path}: {name} must be whole token counts; data rows {_rows(values, frac)} "
            f"are not (e.g. {values[frac].iloc[0]})"
        )
    huge = numbers > MAX_TOKENS
    if huge.any():
        raise ValueError(
            f"{path}: {name} must be at most 2^40 tokens; data rows {_rows(values, huge)} "
            f"are not (e.g. {values[huge].iloc[0]:g})"
        )


def _rows(values: pd.Series, bad: np.ndarray) -> list[int]:
    """The first few data rows (1-based, as the file holds them) of `values` where `bad`."""
    return [int(label) + 1 for label in values.index[bad][:5]]


def _shift_and_sort(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    times = df["arrival_s"]
    if times.isna().all():
        return df
    if times.isna().any():
        raise ValueError(
            f"{path}: arrival times must be given for all rows or none; "
            f"{int(times.isna().sum())} of {len(df)} are missing"
        )
    infinite = np.isinf(times.to_numpy())
    if infinite.any():
        raise ValueError(
            f"{path}: arrival times must be finite; data rows {_rows(times, infinite)} are "
            f"not (e.g. {times[infinite].iloc[0]})"
        )
    df["arrival_s"] = times - times.min()
    return df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
