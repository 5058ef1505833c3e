"""Run independent jobs (sweep points) serially, on local processes, or on a Dask cluster.

Every engine yields `(index, result)` pairs as jobs finish, in completion order; callers that need
a fixed order sort by index. Jobs must be picklable module-level functions with picklable arguments.

Why Dask and not Ray for the distributed engine: `dask[distributed]` is a pure-Python wheel with no
daemon to start, its `LocalCluster` runs in-process for tests, and a scheduler address is all a
real cluster needs.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Literal

from hardware.errors import SpecError

Engine = Literal["local", "dask"]
DASK_CONNECT_TIMEOUT_S = 10
ENGINES = ("local", "dask")


def default_workers() -> int:
    return os.cpu_count() or 1


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], engine: Engine = "local", workers: int | None = None,
             dask_address: str | None = None) -> Iterator[tuple[int, Any]]:
    """Call `fn(*job)` for every job; yield `(index, result)` as each finishes.

    local with one worker (or one job) runs in this process, which keeps tracebacks and test
    monkeypatches simple; otherwise a process pool of `workers` (default: all cores).
    dask submits to the scheduler at `dask_address`, or to a LocalCluster of `workers` processes.
    """
    check_engine(engine)
    workers = workers or default_workers()
    if not jobs:
        return iter(())
    if engine == "local":
        if workers == 1 or len(jobs) <= 1:
            return ((i, fn(*job)) for i, job in enumerate(jobs))
        return _process_pool(fn, jobs, workers)
    return _dask(fn, jobs, workers, dask_address)


def check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")


def _process_pool(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int) -> Iterator[tuple[int, Any]]:
    # forkserver: workers start from a clean process, not a fork of one that may hold threads
    # (a progress bar's refresher, a Dask client) mid-lock.
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
        pending = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield pending.pop(future), future.result()
        finally:  # interrupted (Ctrl-C, an error): drop the jobs that have not started
            for future in pending:
                future.cancel()


def _dask(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int,
          address: str | None) -> Iterator[tuple[int, Any]]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise SpecError("engine 'dask' needs the distributed extra: pip install 'servesim[distributed]'") from None
    cluster = None if address else LocalCluster(n_workers=workers, threads_per_worker=1, processes=True)
    try:
        try:
            client = Client(address or cluster, timeout=DASK_CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as err:  # ValueError: an address Dask cannot parse
            where = f"--dask-address {address}" if address else "the local Dask cluster"
            raise SpecError(f"{where}: no Dask scheduler answered ({err})") from None
        with client:
            futures = {client.submit(fn, *job, pure=False): i for i, job in enumerate(jobs)}
            for future in as_completed(futures):
                yield futures[future], future.result()
    finally:
        if cluster is not None:
            cluster.close()
