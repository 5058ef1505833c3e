"""The serving loop's host overhead fit: recovers known per-step and per-request costs, ignores idle gaps."""

import numpy as np
import pandas as pd
import pytest

from servesim.calibration.host_overhead import host_overhead
from servesim.hardware.batch import StepBatch
from servesim.hardware.cost import step_cost
from servesim.hardware.gpu import get_gpu
from servesim.hardware.model import get_model
from servesim.hardware.profile import Profile


def test_recovers_per_step_and_per_request_host_time_and_skips_idle_waits():
    rng = np.random.default_rng(0)
    requests = rng.integers(1, 32, 400)
    execute = rng.uniform(2e-3, 6e-3, 400)
    host = 3e-4 + 2e-5 * requests + rng.normal(0, 1e-6, 400)
    host[::37] += 5e-3  # operating-system pauses: the robust loss must not follow them
    idle = np.zeros(400, bool)
    idle[100] = True  # the loop slept for arrivals before step 100
    gaps = execute + host
    gaps[99] += 1.0
    start = np.concatenate([[0.0], np.cumsum(gaps)[:-1]])
    per_step, per_request = host_overhead(
        pd.DataFrame({"start_s": start, "execute_s": execute, "num_requests": requests, "after_idle": idle})
    )
    assert per_step == pytest.approx(3e-4, rel=0.05) and per_request == pytest.approx(2e-5, rel=0.05)


def test_host_time_is_priced_as_step_overhead():
    model, gpu, batch = get_model("llama-3.1-8b"), get_gpu("h100-sxm"), StepBatch.uniform(10, 500)
    base = step_cost(batch, model, gpu).total_s
    with_host = step_cost(batch, model, gpu, profile=Profile(host_step_s=1e-3, host_request_s=1e-4)).total_s
    assert with_host - base == pytest.approx(1e-3 + 10 * 1e-4)
