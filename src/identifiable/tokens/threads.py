"""One intra-op thread for the probe fits (see `one_thread`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import torch

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
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def single_threaded(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run inside `one_thread()` (the probe fitters: `refine_linear`, `fit_adam`)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with one_thread():
            return fn(*args, **kwargs)

    return wrapper
