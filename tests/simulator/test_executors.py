"""Job engines: a worker process that dies costs only its own job, and says how it died."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time

import pytest

import servesim.simulator.planning.executors as executors
from servesim.simulator.planning.executors import WorkerDied, run_jobs

JOBS = [(x,) for x in range(6)]
CONTEXT = multiprocessing.get_context("forkserver")


def square_or_die(x: int) -> int:
    """Job 3 kills its own process, as the out-of-memory killer would."""
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def test_a_killed_worker_costs_only_its_job_and_is_named(monkeypatch):
    """The pool breaks for every job in flight. The suspects (the first unfinished jobs, as many as the pool may
    have started: 2 x 2 + 1) run one process each, so only job 3 is lost, and a fresh pool runs the rest."""
    alone = []
    one_each = executors._one_process_each
    monkeypatch.setattr(
        executors,
        "_one_process_each",
        lambda fn, jobs, *args: alone.extend(jobs) or one_each(fn, jobs, *args),
    )
    many = [(x,) for x in range(40)]
    results = dict(run_jobs(square_or_die, many, workers=2, on_died=lambda err: err))
    assert 3 in alone and len(alone) <= 5
    assert {i: r for i, r in results.items() if i != 3} == {x: x * x for x in range(40) if x != 3}
    assert isinstance(results[3], WorkerDied) and results[3].exitcode == -signal.SIGKILL
    monkeypatch.undo()
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
    monkeypatch.setattr(
        executors,
        "_one_process_each",
        lambda fn, jobs, *args: alone.extend(jobs) or one_each(fn, jobs, *args),
    )
    with pytest.raises(ValueError, match="a bug in job 4"):
        list(run_jobs(die_on_zero_raise_on_four, JOBS, workers=2, on_died=lambda err: err))
    assert 0 in alone and 4 in alone


def unsendable_on_one(x: int) -> object:
    if x == 1:
        return threading.Lock()  # cannot be pickled back
    if x == 2:
        raise KeyError("a bug in job 2")
    return x


def test_a_job_run_on_its_own_returns_what_it_can_and_says_what_it_cannot():
    """A result that cannot be sent back is the job's bug, not a death; a job's exception keeps its traceback."""
    with pytest.raises(RuntimeError, match="the job's result cannot be sent back: TypeError"):
        list(executors._one_process_each(unsendable_on_one, {0: (0,), 1: (1,)}, 1, CONTEXT, lambda err: err))
    with pytest.raises(KeyError, match="a bug in job 2") as raised:
        list(executors._one_process_each(unsendable_on_one, {2: (2,)}, 1, CONTEXT, lambda err: err))
    assert "in unsendable_on_one" in str(raised.value.__cause__)  # the child's traceback
    assert list(executors._one_process_each(unsendable_on_one, {0: (0,), 3: (3,)}, 2, CONTEXT, None)) in (
        [(0, 0), (3, 3)],
        [(3, 3), (0, 0)],
    )


def test_a_death_says_how_and_survives_pickling():
    assert WorkerDied(0, -40).how == "was killed by signal 40"  # a real-time signal has no name
    assert WorkerDied(1, 3).how == "exited with code 3"
    copy = pickle.loads(pickle.dumps(WorkerDied(2, -signal.SIGKILL)))
    assert (copy.index, copy.exitcode, str(copy)) == (2, -9, str(WorkerDied(2, -9)))


def test_dask_gives_up_on_a_job_that_kills_its_workers():
    """Dask blames every task on a worker that dies (here after no retry), so a job beside job 3 may be lost
    with it; the others finish and the sweep goes on."""
    distributed = pytest.importorskip("dask.distributed")
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        )
        with cluster:
            results = dict(
                run_jobs(
                    square_or_die,
                    JOBS,
                    "dask",
                    dask_address=cluster.scheduler_address,
                    on_died=lambda err: err,
                )
            )
    assert sorted(results) == list(range(6))
    assert isinstance(results[3], WorkerDied) and "died on every Dask worker" in results[3].how
    assert all(r == x * x for x, r in results.items() if not isinstance(r, WorkerDied))


def wait_for_release(folder: str) -> str:
    """Runs until `folder`/release appears (60 s at most), then says it finished."""
    for _ in range(600):
        if os.path.exists(os.path.join(folder, "release")):
            break
        time.sleep(0.1)
    open(os.path.join(folder, f"finished-{os.getpid()}"), "w").close()
    return folder


class _Stopped(Exception):
    pass


def test_an_interrupt_stops_the_running_jobs_not_only_the_queued(tmp_path):
    """SIGTERM sent to servesim alone (its workers not signalled, as Kubernetes stops a container's main process):
    the running jobs are stopped with the pool, not waited out, so the sweep's table is written in time."""

    def stop(signum, frame):
        raise _Stopped

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(3)  # the jobs have started by then
    try:
        with pytest.raises(_Stopped):
            list(run_jobs(wait_for_release, [(str(tmp_path),)] * 4, workers=2))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    (tmp_path / "release").touch()
    time.sleep(1.0)  # a job still running would finish now
    assert list(tmp_path.glob("finished-*")) == []
