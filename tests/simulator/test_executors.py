"""Job engines: a worker process that dies costs only its own job, and says how it died."""

from __future__ import annotations

import os
import signal
import time

import pytest

import simulator.executors as executors
from simulator.executors import WorkerDied, run_jobs

JOBS = [(x,) for x in range(6)]


def square_or_die(x: int) -> int:
    """Job 3 kills its own process, as the out-of-memory killer would."""
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def test_a_killed_worker_costs_only_its_job_and_is_named():
    """The pool breaks for every job in flight; those left run one process each, so only job 3 is lost."""
    results = dict(run_jobs(square_or_die, JOBS, workers=2, on_died=lambda err: err))
    assert {i: r for i, r in results.items() if i != 3} == {x: x * x for x in range(6) if x != 3}
    assert isinstance(results[3], WorkerDied) and results[3].exitcode == -signal.SIGKILL
    assert "out-of-memory killer" in results[3].how
    with pytest.raises(WorkerDied, match="running job 3 was killed by SIGKILL"):
        list(run_jobs(square_or_die, JOBS, workers=2))  # without on_died the death ends the jobs


def die_on_zero_raise_on_four(x: int) -> int:
    if x == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)  # the others take long enough for the pool to break before job 4 starts in it
    if x == 4:
        raise ValueError("a bug in job 4")
    return x


def test_after_a_death_a_jobs_own_exception_still_reaches_the_caller(monkeypatch):
    """Job 0 breaks the pool at once, so job 4 runs in a process of its own: its exception is raised, as the
    pool's future.result() raises it (a sweep point records its own bugs)."""
    alone = []
    one_each = executors._one_process_each
    monkeypatch.setattr(executors, "_one_process_each", lambda fn, jobs, *args: alone.extend(jobs) or
                        one_each(fn, jobs, *args))
    with pytest.raises(ValueError, match="a bug in job 4"):
        list(run_jobs(die_on_zero_raise_on_four, JOBS, workers=2, on_died=lambda err: err))
    assert 0 in alone and 4 in alone


def test_dask_gives_up_on_a_job_that_kills_its_workers():
    """Dask blames every task on a worker that dies (here after no retry), so a job beside job 3 may be lost
    with it; the others finish and the sweep goes on."""
    distributed = pytest.importorskip("dask.distributed")
    import dask
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
        with cluster:
            results = dict(run_jobs(square_or_die, JOBS, "dask", dask_address=cluster.scheduler_address,
                                    on_died=lambda err: err))
    assert sorted(results) == list(range(6))
    assert isinstance(results[3], WorkerDied) and "died on every Dask worker" in results[3].how
    assert all(r == x * x for x, r in results.items() if not isinstance(r, WorkerDied))
