"""Run independent jobs (sweep points) serially, on local processes, or on a Dask cluster.

Every engine yields `(index, result)` pairs as jobs finish, in completion order; callers that need
a fixed order sort by index. Jobs must be picklable module-level functions with picklable arguments.

Why Dask and not Ray for the distributed engine: `dask[distributed]` is a pure-Python wheel with no
daemon to start, its `LocalCluster` runs in-process for tests, and a scheduler address is all a
real cluster needs.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from servesim.hardware.errors import SpecError

Engine = Literal["local", "dask"]
DASK_CONNECT_TIMEOUT_S = 10
ENGINES = ("local", "dask")


class WorkerDied(SpecError):
    """A job's worker process ended without a result: killed (most often by the out-of-memory killer) or crashed
    in native code. A SpecError, so a command that cannot go on says so in one line."""

    def __init__(self, index: int, exitcode: int | None):
        self.index, self.exitcode = index, exitcode
        if exitcode is None:  # Dask tells no exit code
            how = "died on every Dask worker that ran it (most often the out-of-memory killer)"
        elif exitcode < 0:
            try:
                name = signal.Signals(-exitcode).name
            except ValueError:  # a real-time signal has no name
                name = f"signal {-exitcode}"
            how = f"was killed by {name}"
            if -exitcode == signal.SIGKILL:
                how += " (most often the out-of-memory killer: try fewer --workers)"
        else:
            how = f"exited with code {exitcode}"
        self.how = how
        super().__init__(f"the worker process running job {index} {how}")

    def __reduce__(self) -> tuple:
        return WorkerDied, (self.index, self.exitcode)


def default_workers() -> int:
    return os.cpu_count() or 1


def run_jobs(
    fn: Callable[..., Any],
    jobs: Sequence[tuple],
    engine: Engine = "local",
    workers: int | None = None,
    dask_address: str | None = None,
    on_died: Callable[[WorkerDied], Any] | None = None,
) -> Iterator[tuple[int, Any]]:
    """Call `fn(*job)` for every job; yield `(index, result)` as each finishes.

    local with one worker (or one job) runs in this process, which keeps tracebacks and test
    monkeypatches simple; otherwise a process pool of `workers` (default: all cores).
    dask submits to the scheduler at `dask_address`, or to a LocalCluster of `workers` processes.
    A job whose worker process dies yields `on_died(WorkerDied)` as its result and the others go on; without
    `on_died` the WorkerDied is raised.
    """
    check_engine(engine)
    workers = workers or default_workers()
    if not jobs:
        return iter(())
    died = on_died or _raise
    if engine == "local":
        if workers == 1 or len(jobs) <= 1:
            return ((i, fn(*job)) for i, job in enumerate(jobs))
        return _process_pool(fn, jobs, workers, died)
    return _dask(fn, jobs, workers, dask_address, died)


def _raise(err: WorkerDied) -> Any:
    raise err


def check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")


def _process_pool(
    fn: Callable[..., Any], jobs: Sequence[tuple], workers: int, died: Callable[[WorkerDied], Any]
) -> Iterator[tuple[int, Any]]:
    """A pool of `workers` processes. A worker's death breaks the whole pool without saying whose job killed it.
    A pool starts its jobs in order, so the suspects are the first unfinished ones, as many as it may have started
    (each worker's own and a call queue of workers + 1): they then run one process each (`_one_process_each`),
    which names the job that dies, and a fresh pool runs the rest."""
    # forkserver: workers start from a clean process, not a fork of one that may hold threads
    # (a progress bar's refresher, a Dask client) mid-lock.
    context = multiprocessing.get_context("forkserver")
    # the server imports the job's module once (before it first starts), so each pool's workers fork with it loaded
    # instead of importing numpy, pandas and the simulator anew: a plan starts a pool per wave of candidates
    context.set_forkserver_preload([fn.__module__])
    left = dict(enumerate(jobs))
    while left:
        yield from _pool_round(fn, left, workers, context)
        suspects = dict(sorted(left.items())[: 2 * workers + 1])
        yield from _one_process_each(fn, suspects, workers, context, died)
        for index in suspects:
            del left[index]


def _pool_round(
    fn: Callable[..., Any], left: dict[int, tuple], workers: int, context: Any
) -> Iterator[tuple[int, Any]]:
    """Run `left` (job index -> job) on one pool until it is done or breaks, deleting each job as it finishes."""
    with ProcessPoolExecutor(max_workers=min(workers, len(left)), mp_context=context) as pool:
        pending = {}
        try:
            try:
                for index, job in left.items():
                    pending[pool.submit(fn, *job)] = index
            except BrokenProcessPool:  # broke while the jobs went in: the rest were never submitted
                pass
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    index = pending.pop(future)
                    if isinstance(future.exception(), BrokenProcessPool):
                        continue  # as is every job unfinished when it broke
                    del left[index]
                    yield index, future.result()
        except BaseException:
            # interrupted (SIGTERM to this process alone, an error): stop the running jobs too, which the pool's
            # shutdown would otherwise wait out
            _stop_workers(pool)
            raise
        finally:  # drop the jobs that have not started
            for future in pending:
                future.cancel()


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a job's own process, shown as its cause."""


def _one_process_each(
    fn: Callable[..., Any],
    jobs: dict[int, tuple],
    workers: int,
    context: Any,
    died: Callable[[WorkerDied], Any],
) -> Iterator[tuple[int, Any]]:
    """Run each job in a process of its own, `workers` at a time, so a death is its job's alone."""
    queue, running = list(jobs.items()), {}  # a result pipe -> (job index, its process)
    try:
        while queue or running:
            while queue and len(running) < workers:
                index, job = queue.pop(0)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_send_result, args=(send, fn, job), daemon=True)
                process.start()
                send.close()  # the child holds the only sending end: its death reads as end of file
                running[receive] = index, process
            for receive in multiprocessing.connection.wait(list(running)):
                index, process = running.pop(receive)
                try:
                    ok, value, remote = receive.recv()
                except (EOFError, OSError):  # ended before, or while, sending its result
                    process.join()
                    yield index, died(WorkerDied(index, process.exitcode))
                    continue
                except Exception as err:  # pickled in the child, but not to be rebuilt here
                    process.join()
                    raise RuntimeError(
                        f"job {index}'s outcome cannot be read back: {type(err).__name__}: {err}"
                    ) from err
                finally:
                    receive.close()
                process.join()
                if not ok:
                    raise value from _RemoteTraceback(remote)
                yield index, value
    finally:  # interrupted: stop the jobs still running
        for _, process in running.values():
            process.terminate()


def _send_result(send: Any, fn: Callable[..., Any], job: tuple) -> None:
    """(ok, result or exception, traceback text) back to the parent; what cannot be pickled comes back as a
    RuntimeError saying so, a bug of the job's, not a death."""
    try:
        outcome = True, fn(*job), ""
    except Exception as err:  # noqa: BLE001 (raised again in the parent, as a pool's future.result() does)
        outcome = False, err, traceback.format_exc()
    try:
        send.send(outcome)
    except Exception as err:  # noqa: BLE001
        what = "result" if outcome[0] else f"exception ({type(outcome[1]).__name__}: {outcome[1]})"
        send.send(
            (
                False,
                RuntimeError(f"the job's {what} cannot be sent back: {type(err).__name__}: {err}"),
                outcome[2] or traceback.format_exc(),
            )
        )


def _dask(
    fn: Callable[..., Any],
    jobs: Sequence[tuple],
    workers: int,
    address: str | None,
    died: Callable[[WorkerDied], Any],
) -> Iterator[tuple[int, Any]]:
    try:
        from dask.distributed import Client, KilledWorker, LocalCluster, as_completed
    except ImportError:
        raise SpecError(
            "engine 'dask' needs the distributed extra: pip install 'servesim[distributed]'"
        ) from None
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
                index = futures[future]
                try:
                    result = future.result()
                except KilledWorker:  # Dask retried it on other workers and they died too
                    result = died(WorkerDied(index, None))
                yield index, result
    finally:
        if cluster is not None:
            cluster.close()
