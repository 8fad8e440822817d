"""The billiard step of `billiard.step`, compiled for the CPU: the same path for each chain
(the same directions, lengths, facets and reflections), in numba loops instead of a dozen
small torch kernels per reflection, which cost launch overhead rather than arithmetic
(benchmarks/records/posterior.md). The chains are shared out over threads in contiguous
blocks; each chain's path depends only on its own draws, so the output does not depend on
the thread count.

The compiled function is cached on disk in the user cache's folder "posterior"
(`store.jitcache`); `ready()` loads or compiles it once per process, with a status line
while it compiles, and rebuilds a cache that does not load.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from identifiable.store import jitcache
from identifiable.utils.progress import status

KIND, WHAT = "posterior", "the posterior's billiard walk"
_ready: list[bool] = []
_pools: dict[int, ThreadPoolExecutor] = {}


def _compiled() -> Any:
    from identifiable.attention import billiard_paths

    return billiard_paths.paths


def ready(quiet: bool = False) -> None:
    """Load the compiled step from its disk cache, or compile it now, with a status line
    on stderr unless the cache's marker says it holds this code; a cache that does not
    load is cleared and rebuilt after one warning line."""
    if _ready:
        return
    paths = _compiled()

    def tiny() -> None:
        x = np.full((1, 2), 0.5)
        spread = np.array([[[1.0], [-1.0]]])
        metric = spread @ spread.transpose(0, 2, 1)
        out = np.empty_like(x)
        paths(x, spread, metric, np.ones(1), np.ones((1, 1)), np.full(1, 0.5), 8, 0, 1, out)

    mark = _marker()
    warm = mark is not None and mark.exists()
    with status(
        "compiling the posterior's billiard walk (once; cached on disk)",
        enabled=not (quiet or warm),
    ):
        if not jitcache.loads(KIND, WHAT, tiny):
            tiny()
    if mark is not None:
        with contextlib.suppress(OSError):
            mark.touch()
    _ready.append(True)


def _marker() -> Path | None:
    """The file that says the cache holds this code, compiled and loaded back (keyed by
    the compiled file's bytes); None without a cache folder."""
    from identifiable.attention import billiard_paths

    key = hashlib.sha256(Path(billiard_paths.__file__).read_bytes()).hexdigest()
    return jitcache.marker(KIND, WHAT, key)


def step(
    spread: Tensor,
    metric: Tensor,
    length: Tensor,
    x: Tensor,
    g: Tensor,
    pick: Tensor,
    most: int,
    threads: int,
) -> Tensor:
    """The end points of every chain's path (before any Metropolis-Hastings test):
    `x` `[R, C, s]` states, `g` `[R, C, k]` Gaussian directions (not normalised), `pick`
    `[R, C]` uniforms for the lengths, on `threads` threads; the other arguments as
    `billiard.step`'s."""
    ready()
    r, c, s = x.shape
    xs = x.detach().reshape(r * c, s).contiguous().numpy()
    args: tuple[Any, ...] = (
        xs,
        spread.detach().contiguous().numpy(),
        metric.detach().contiguous().numpy(),
        length.detach().contiguous().numpy(),
        g.detach().reshape(r * c, -1).contiguous().numpy(),
        pick.detach().reshape(r * c).contiguous().numpy(),
        int(most),
    )
    out = np.empty_like(xs)
    paths = _compiled()

    def block(lo: int, hi: int) -> None:
        paths(*args, lo, hi, out)

    cuts = np.linspace(0, r * c, min(threads, r * c) + 1).round().astype(np.int64).tolist()
    if len(cuts) <= 2:
        block(0, r * c)
    else:
        pool = _pool(len(cuts) - 1)
        for job in [pool.submit(block, lo, hi) for lo, hi in itertools.pairwise(cuts)]:
            job.result()
    return torch.from_numpy(out).reshape(r, c, s)


def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per thread count, kept for the process (at most a thread per core asked)."""
    if threads not in _pools:
        _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="identifiable-billiard")
    return _pools[threads]
