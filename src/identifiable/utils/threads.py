"""One intra-op torch thread around work that gains nothing from more (see `one_thread`).

Used by the probe fitters (`tokens`); `one_blas_thread` by the simplex engine of certified
intervals (`attention.lp`); `one_thread_per_process` starts the worker processes of
interval maps; `engine_threads` resolves the threads that engine may use.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import torch

from identifiable.utils.checks import count

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch's CPU kernels on one intra-op thread, then restore the previous count.

    An Adam step on a probe is a few dozen small kernels (256 × 384 by 384 × 512 on MiniLM).
    On a shared 2-core machine a second OpenMP thread waits on a descheduled peer at every
    kernel: measured side by side in one process under a load of 15, one step of the 512-wide
    MLP took 20 ms on one thread and 121-243 ms on two (the 256-wide one: 13 ms against
    90-167 ms). The full-batch L-BFGS refinement of linear-cos (5,830 × 384 products) gains
    too: 40 iterations at layer 5 took 21-30 s on one thread and 55-74 s on two (load 8),
    with the same validation loss.

    The numpy simplex engine of certified intervals that the compiled `attention.lp` replaced
    needed it more: each lock step alternated numpy's OpenBLAS calls with one torch kernel,
    and the two libraries' thread pools, each spinning after its call, waited on each
    other (one 512-key causal row, m = 129, 2 cores: 30 s with torch's default 2 threads,
    2.4 s with 1). The compiled engine calls no torch; it runs under `one_blas_thread`.

    torch's thread count is process-wide: another Python thread running torch during the
    call runs on one thread too. Nested and concurrent blocks (probe fits of several layers
    in worker threads, `tokens.evaluate`) share one count: the first to enter sets 1, the
    last to leave restores what the first found.
    """
    with _ONE_LOCK:
        if not _ONE_STATE:
            _ONE_STATE.append(torch.get_num_threads())
            torch.set_num_threads(1)
        _ONE_STATE.append(0)
    try:
        yield
    finally:
        with _ONE_LOCK:
            _ONE_STATE.pop()
            if len(_ONE_STATE) == 1:
                torch.set_num_threads(_ONE_STATE.pop())


_ONE_LOCK = threading.Lock()
_ONE_STATE: list[int] = []  # [threads before the first block, one entry per open block]


def single_threaded(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run inside `one_thread()` (`refine_linear`, `fit_adam`)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with one_thread():
            return fn(*args, **kwargs)

    return wrapper


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Every BLAS pool of this process on one thread while the block runs (threadpoolctl).

    The compiled simplex engine of certified intervals (`attention.lp`) makes two
    small GEMMs per lock step ([2C, m] × [m, n]) between stretches of single-threaded
    compiled code; a second BLAS thread gains nothing on them and spins on the other core
    in between. A Llama-3-sized causal head (n = 256) took 37.5-39.0 s with one BLAS thread
    and 45.4-46.4 s with the default two, alternating in one process; a 512-key row
    1.99-2.16 s with one and 1.78-2.10 s with two.

    The controller is made once (finding the loaded libraries takes 3 ms, a limit with it
    0.03 ms; the engine enters this once per `bound_keys` call and sense), so it
    limits the BLAS libraries loaded by the first call: numpy's, and scipy's, which the
    engine's products use.
    """
    if not _BLAS:
        from threadpoolctl import ThreadpoolController

        _BLAS.append(ThreadpoolController())
    with _BLAS[0].limit(limits=1, user_api="blas"):
        yield


_BLAS: list = []  # the ThreadpoolController of `one_blas_thread`, made at its first use


def one_thread_per_process() -> None:
    """Limit every BLAS and OpenMP pool of this process to one thread (for ever): the
    initializer of worker processes, which share the machine's cores between them.

    numpy's and scipy's OpenBLAS keep one thread per core each by default, so k worker
    processes on k cores run k² BLAS threads that spin waiting for each other. The interval
    map of one causal head (n = 256, m = 129, 2 cores) took 188 s in 2 processes with their
    default threads against 77 s in one process; with one thread each, 57.9 s against
    95.0 s in one process, in a later run (benchmarks/bench_causal_certify.py --workers 2).
    scipy is imported first so that its own OpenBLAS (the pivoted QR of the engine's first
    vertex, in `attention.lp`) is loaded, and limited, too.
    """
    import scipy.optimize  # noqa: F401
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    torch.set_num_threads(1)


def engine_threads(threads: int | None) -> int:
    """The threads the interval engine may use: `threads`, or by default torch's intra-op
    thread count (one per core unless the caller set it: `torch.set_num_threads`,
    OMP_NUM_THREADS; 1 in the worker processes of `one_thread_per_process`).

    The engine's threads each run a lock step of their own (`attention.lp`); its
    compiled code releases the GIL.
    """
    if threads is None:
        return max(1, torch.get_num_threads())
    return count(threads, "threads", "--threads")  # the rule of the CLI's --threads too
