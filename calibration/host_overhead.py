"""The serving loop's CPU time between forward passes, which a grid of timed forwards cannot see.

Each served step's cycle is the time from its scheduling to the next step's: schedule, build the
inputs, run the forward, sample, commit, take arrivals. Minus the timed forward, what is left is
engine overhead that users feel in TPOT (vLLM overlaps part of it with async scheduling; this loop
does not). It is fitted as `host_step_s + host_request_s * requests` by robust (soft-L1) non-negative
least squares over back-to-back steps (not the ones that follow an idle wait for arrivals), so the odd
pause of the operating system does not pull it up.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares


def host_overhead(steps: pd.DataFrame) -> tuple[float, float]:
    """(seconds per step, seconds per scheduled request per step) from served step rows
    (`start_s`, `execute_s`, `num_requests`, `after_idle`)."""
    rows = steps.sort_values("start_s").reset_index(drop=True)
    cycle = rows["start_s"].shift(-1) - rows["start_s"]
    next_idle = rows["after_idle"].shift(-1, fill_value=True).astype(bool)
    host = (cycle - rows["execute_s"])[~next_idle & cycle.notna()]
    if len(host) < 10:
        raise ValueError(f"only {len(host)} back-to-back steps: serve a longer calibration trace")
    requests = rows.loc[host.index, "num_requests"].to_numpy(float)
    measured = host.to_numpy()
    scale = float(np.median(np.abs(measured))) or 1e-6
    fit = least_squares(
        lambda x: (x[0] + x[1] * requests - measured) / scale,
        x0=[scale, 0.0],
        bounds=([0.0, 0.0], [np.inf, np.inf]),
        loss="soft_l1",
        f_scale=0.1,
    )
    return float(fit.x[0]), float(fit.x[1])
