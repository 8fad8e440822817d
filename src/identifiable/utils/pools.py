"""Worker processes: how many a machine can take, and pools that stop quietly on Ctrl-C.

`worker_count` bounds the processes asked for by the work there is, the cores this
process may run on (its CPU affinity, which containers and `taskset` narrow) and the
memory each worker needs. `process_pool` starts workers that ignore SIGINT from their
first instruction: the parent sets SIGINT to SIG_IGN around each start, and a child
inherits an ignored signal through fork and exec alike (Python then leaves it ignored).
Ctrl-C thus reaches the parent alone, which terminates the workers and re-raises, so the
CLI prints its one line at any worker count.
"""

from __future__ import annotations

import contextlib
import multiprocessing.context as mpc
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def available_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_count(asked: int, *, jobs: int, per_worker: int, available: int | None) -> int:
    """Processes to start for `asked` workers and `jobs` independent jobs: at most one per
    job and per core, and no more than `available` bytes hold at `per_worker` bytes each
    (`available` None: not known, so not bounded). At least 1: the work then runs here."""
    n = min(max(int(asked), 1), max(int(jobs), 1), available_cores())
    if available is not None and per_worker > 0:
        n = min(n, max(1, available // per_worker))
    return n


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the block runs (in the main thread; elsewhere unchanged, since
    only the main thread may set handlers): children started inside inherit SIG_IGN."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _QuietSpawnProcess(mpc.SpawnProcess):
    """A spawned process started with SIGINT ignored (module level: spawn pickles it)."""

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        with sigint_ignored():
            return mpc.SpawnProcess._Popen(process_obj)


class _QuietSpawnContext(mpc.SpawnContext):
    Process = _QuietSpawnProcess


_CONTEXTS: dict[str, type] = {"spawn": _QuietSpawnContext}

if hasattr(mpc, "ForkProcess"):  # POSIX

    class _QuietForkProcess(mpc.ForkProcess):
        """A forked process started with SIGINT ignored."""

        @staticmethod
        def _Popen(process_obj: Any) -> Any:
            with sigint_ignored():
                return mpc.ForkProcess._Popen(process_obj)

    class _QuietForkContext(mpc.ForkContext):
        Process = _QuietForkProcess

    _CONTEXTS["fork"] = _QuietForkContext


def _quiet_context(method: str) -> Any:
    """A multiprocessing context of `method` whose processes start with SIGINT ignored."""
    return _CONTEXTS[method]()


def _start_worker(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """A worker's first step (and a second guard where it was started from a thread)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def process_pool(
    workers: int,
    *,
    method: str = "spawn",
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
) -> Iterator[ProcessPoolExecutor]:
    """A `ProcessPoolExecutor` of `workers` processes that ignore SIGINT. An exception in
    the block (Ctrl-C's KeyboardInterrupt too) terminates the workers, cancels what they
    had not started and is re-raised; on success the pool is shut down as usual."""
    pool = ProcessPoolExecutor(
        workers,
        mp_context=_quiet_context(method),
        initializer=_start_worker,
        initargs=(initializer, initargs),
    )
    try:
        yield pool
    except BaseException:
        cancel(pool)
        raise
    pool.shutdown(wait=True)


def cancel(pool: ProcessPoolExecutor) -> None:
    """Terminate the workers of `pool` (SIGTERM, which they do not ignore) and drop the jobs
    they had not started; returns once they are gone."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for p in processes:
        with contextlib.suppress(Exception):
            p.terminate()
    for p in processes:
        with contextlib.suppress(Exception):
            p.join(timeout=5)
    pool.shutdown(wait=True, cancel_futures=True)
