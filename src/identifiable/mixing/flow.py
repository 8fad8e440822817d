"""Attention flow (Abnar & Zuidema 2020): maximum flow through the layered attention graph.

The graph has a node (k, t) for every layer boundary k = 0..L and token t; an edge
(k−1, j) → (k, i) carries capacity M_k[i, j], the residual-augmented head-averaged
attention of layer k (the rollout layer map 0.5·A + 0.5·I). The flow of input token j
into token i at the output of layer l is the maximum flow from source (0, j) to sink
(l, i). Every (layer, i, j) is its own max-flow problem: there is no all-pairs shortcut
for directed graphs, which is what makes flow expensive (see `estimate_seconds`).

Exactness. scipy's max-flow needs integer capacities, so each capacity is rounded to
the nearest multiple of 1/resolution (default 1/1e6). A flow value is the capacity of a
minimum cut, so rounding moves it by at most (edges crossing that cut)/(2·resolution):
below n/(2·resolution) when the cut is at the source or the sink (≤ 6.4e-5 at n = 128),
and in practice far less because the roundings cancel. Layers 1 and 2 need no solver:
the flow into layer 1 is the capacity itself and into layer 2 it is Σ_k min(M_1[k, j],
M_2[i, k]) (the paths j → k → i share no edge), computed exactly in float64.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from identifiable.errors import IdentifiableError
from identifiable.models.budget import available_memory
from identifiable.utils.checks import count
from identifiable.utils.pools import worker_count

DEFAULT_RESOLUTION = 1_000_000
SECONDS_PER_EDGE = 5e-8
"""Cost model of one scipy max-flow call: about 5e-8 s per edge of the graph, on one CPU
thread (MiniLM at n = 128, all layers: 247 s for 4.8e9 edge visits, benchmarks/bench_mixing.py;
random attention graphs measured 3e-8)."""


def _edges(layer_maps: np.ndarray, resolution: int) -> tuple[np.ndarray, ...]:
    n = layer_maps.shape[-1]
    rows, cols, data = [], [], []
    for k, m in enumerate(layer_maps, start=1):
        q = np.rint(m * resolution).astype(np.int64)
        i, j = np.nonzero(q > 0)
        rows.append((k - 1) * n + j)
        cols.append(k * n + i)
        data.append(q[i, j])
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(data)


def estimate_seconds(n_tokens: int, n_layers: int) -> float:
    """Predicted seconds for all layers at n tokens (dense graph, one solver call per pair)."""
    n = n_tokens
    return sum(n * n * (k + 1) * n * n * SECONDS_PER_EDGE for k in range(2, n_layers))


def max_tokens(n_layers: int, budget_s: float) -> int:
    """The longest sequence whose predicted flow time fits `budget_s` seconds."""
    n = 1
    while n < 100_000 and estimate_seconds(n + 1, n_layers) <= budget_s:
        n += 1
    return n


def check_workers(workers: object) -> None:
    """One line unless `workers` is a positive integer (bool is not a count)."""
    count(workers, "workers", "--workers")  # the rule of interval_map and the CLI


def attention_flow(
    capacities: Tensor,
    *,
    resolution: int = DEFAULT_RESOLUTION,
    causal: bool = False,
    workers: int = 1,
) -> Tensor:
    """Maximum flow from every input token to every token at every layer.

    Args:
        capacities: `[L, n, n]` layer maps M_l (entries in [0, 1], rows = receiving token).
        resolution: capacities are rounded to multiples of 1/resolution (see module docstring).
        causal: skip pairs j > i, which have no path (their flow is exactly 0).
        workers: processes that share the receiving tokens of each layer (scipy's max-flow
            holds the GIL, so threads would not help); the values do not depend on it.
    Returns:
        `[L, n, n]` float64, [l, i, j] = max flow from input token j to token i after layer l.
    """
    from scipy.sparse import csr_matrix

    if capacities.dim() != 3 or capacities.shape[1] != capacities.shape[2]:
        raise IdentifiableError(f"capacities must be [L, n, n], got {tuple(capacities.shape)}")
    if not 1 <= resolution <= 10**8:
        raise IdentifiableError(f"flow resolution must be in 1..1e8, got {resolution}")
    check_workers(workers)
    caps = capacities.double().cpu().numpy()
    if (caps < 0).any() or not np.isfinite(caps).all():
        raise IdentifiableError("flow capacities must be finite and non-negative")
    n_layers, n, _ = caps.shape
    out = np.zeros((n_layers, n, n))
    out[0] = caps[0]
    if n_layers > 1:
        # Two hops: Σ_k min(M_1[k, j], M_2[i, k]).
        out[1] = np.minimum(caps[0][None, :, :], caps[1][:, :, None]).sum(1)
    graphs = {}
    for layer in range(2, n_layers):
        rows, cols, data = _edges(caps[: layer + 1], resolution)
        size = (layer + 2) * n
        graphs[layer] = csr_matrix((data.astype(np.int32), (rows, cols)), shape=(size, size))
    jobs = [(layer, i) for layer in graphs for i in range(n)]
    # at most one process per job and per core, and as many as the memory left holds
    graph_bytes = sum(g.data.nbytes + g.indices.nbytes + g.indptr.nbytes for g in graphs.values())
    workers = worker_count(
        workers,
        jobs=len(jobs),
        per_worker=_WORKER_BASE + 2 * graph_bytes,
        available=available_memory(),
    )
    if workers == 1:
        results = [_solve(graphs, n, causal, job) for job in jobs]
    else:
        import multiprocessing

        from identifiable.utils.pools import process_pool

        # fork where the platform has it (no re-import of torch in each worker); the graphs
        # travel once per worker, the jobs are (layer, token) pairs; workers ignore Ctrl-C
        fork = "fork" in multiprocessing.get_all_start_methods()
        chunk = max(1, len(jobs) // (4 * workers))
        with process_pool(
            workers,
            method="fork" if fork else "spawn",
            initializer=_use_graphs,
            initargs=(graphs, n, causal),
        ) as pool:
            results = list(pool.map(_sink_flows, jobs, chunksize=chunk))
    for (layer, i), values in zip(jobs, results, strict=True):
        out[layer, i, : len(values)] = values / resolution
    return torch.from_numpy(out)


# An allowance (not measured) for a forked worker's own pages besides the graphs it is
# sent: its solver's buffers and the parent's pages it writes to after the fork.
_WORKER_BASE = 64 << 20


# In a worker process: the graphs of the `attention_flow` call it serves (`_use_graphs`).
_WORKER: dict[str, object] = {}


def _use_graphs(graphs: dict, n: int, causal: bool) -> None:
    _WORKER.update(graphs=graphs, n=n, causal=causal)


def _sink_flows(job: tuple[int, int]) -> np.ndarray:
    return _solve(_WORKER["graphs"], _WORKER["n"], _WORKER["causal"], job)  # type: ignore[arg-type]


def _solve(graphs: dict, n: int, causal: bool, job: tuple[int, int]) -> np.ndarray:
    """Integer max-flow values into receiving token (layer, i) from every source j."""
    from scipy.sparse.csgraph import maximum_flow

    layer, i = job
    sink = (layer + 1) * n + i
    return np.array(
        [maximum_flow(graphs[layer], j, sink).flow_value for j in range(i + 1 if causal else n)],
        dtype=np.float64,
    )
