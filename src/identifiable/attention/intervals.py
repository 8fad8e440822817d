"""`witness` and `attention_intervals` for one row of a `Trace`; `interval_map` for whole heads."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from identifiable.attention.certificates import output_residual, row_problem, witness_lp
from identifiable.attention.checks import check_finite, check_selection, check_trace
from identifiable.attention.effective import HeadFactors
from identifiable.attention.linalg import add_ones, column_basis, head_factors, row_ids
from identifiable.attention.lp import EngineOptions, bound_keys
from identifiable.attention.mapwork import check_budget, pool_plan, solve_jobs
from identifiable.attention.preflight import check_intervals
from identifiable.models.budget import available_memory
from identifiable.models.trace import Trace
from identifiable.results import Result
from identifiable.utils.checks import count, expect, indices, number
from identifiable.utils.pools import available_cores, worker_count
from identifiable.utils.progress import task_bar, watching
from identifiable.utils.threads import engine_threads


@dataclass(frozen=True)
class Witness(
    Result,
    dims={"raw": ("key",), "weights": ("key",)},
    plot={"fields": ("raw", "weights")},
    summary=("layer", "head", "row", "exists", "null_dim"),
):
    """A different attention row with the same head output, or why none exists.

    Arrays cover all n keys (float64); keys a causal row cannot see are 0.

    Attributes:
        exists: False when dim LN([T, 1]) = 0 for this row (then `reason` says so).
        weights: ã `[n]` (≥ 0, Σ = Σa, ã T = a T), or None.
        key: the key whose weight was minimised (the largest raw weight the
            null space can move; normally the argmax).
        moved_mass: a_key − ã_key.
        total_variation: ½ Σ|ã − a|, the mass moved in all.
        output_residual: ‖(ã − a) T‖ / ‖a T‖ with T = V H formed explicitly.
        null_dim: dim LN([T, 1]) for this row.
        tokens: the trace's tokens (labels for displays and tables).
    """

    layer: int
    head: int
    row: int
    exists: bool
    reason: str
    raw: Tensor
    weights: Tensor | None
    key: int | None
    moved_mass: float
    total_variation: float
    output_residual: float
    null_dim: int
    tokens: list[str] | None = None


@dataclass(frozen=True)
class AttentionIntervals(
    Result,
    dims={"raw": ("key",), "lower": ("key",), "upper": ("key",), "width": ("key",)},
    plot={"kind": "interval", "fields": ("lower", "upper", "raw")},
    summary=("layer", "head", "row", "null_dim"),
):
    """Per key, the min and max weight any valid row with the same output can give it.

    Attributes:
        raw, lower, upper: `[n]` float64 (keys a causal row cannot see: 0).
        null_dim: dim LN([T, 1]) for this row.
        lp_solved: LPs actually solved (at most 2n; the rest were settled by
            vertices already found or because the key cannot move).
    """

    layer: int
    head: int
    row: int
    raw: Tensor
    lower: Tensor
    upper: Tensor
    null_dim: int
    lp_solved: int
    tokens: list[str] | None = None

    @property
    def width(self) -> Tensor:
        """`[n]` upper − lower: 0 means the weight is identifiable."""
        return self.upper - self.lower


def _row_problem(trace: Trace, layer: int, head: int, row: int, factors: HeadFactors | None):
    check_trace(trace)
    trace.check_layer(layer)
    trace.check_head(head)
    trace.check_row(row)
    # the keys this row sees: all (encoder), ≤ row (decoder), a window, or the encoder's
    # keys (cross-attention, where there are n_keys ≠ n of them)
    seen = trace.keys_seen(layer)[row].nonzero().flatten()
    a = trace.attentions[layer, head, row].double()
    check_finite(a[None], "attention", layer=layer)
    values = trace.values[layer, head, seen].double()
    out_proj = trace.out_proj[layer, head].double()
    check_finite(values[None], "values (E·W_V)", layer=layer)
    # One head needs only its own factor, not the whole model's.
    factor = factors.factor[layer, head] if factors else head_factors(out_proj)[0]
    check_finite(factor[None, None], "output projection (W_O)", layer=layer)
    q, rank, _ = column_basis(values @ factor)
    qa, rank_a = add_ones(q, rank, row_ids(values))
    basis = qa[:, torch.linalg.vector_norm(qa, dim=0) > 0].numpy()
    return a, seen, values, out_proj, basis, len(seen) - int(rank_a)


def witness(
    trace: Trace, layer: int, head: int, row: int, *, factors: HeadFactors | None = None
) -> Witness:
    """Certificate that a row's attention is not identifiable (see `Witness`).

    Solves one LP: minimise the weight of the row's largest movable key over
    {ã ≥ 0, Σã = 1, ã T = a T}. Raises IdentifiableError for an out-of-range
    layer/head/row or non-finite inputs.
    """
    a, seen, values, out_proj, basis, null_dim = _row_problem(trace, layer, head, row, factors)
    sol = witness_lp(a[seen].numpy(), basis)
    if sol.weights is None:
        return Witness(
            layer,
            head,
            row,
            False,
            sol.reason,
            a,
            None,
            None,
            0.0,
            0.0,
            0.0,
            null_dim,
            tokens=list(trace.tokens),
        )
    x = torch.zeros_like(a)
    x[seen] = torch.from_numpy(sol.weights)
    key = int(seen[int(sol.key)])  # type: ignore[arg-type]
    return Witness(
        layer,
        head,
        row,
        True,
        "",
        a,
        x,
        key,
        float(a[key] - x[key]),
        float((x - a).abs().sum() / 2),
        output_residual(x[seen], a[seen], values, out_proj),
        null_dim,
        tokens=list(trace.tokens),
    )


def attention_intervals(
    trace: Trace,
    layer: int,
    head: int,
    row: int,
    *,
    factors: HeadFactors | None = None,
    threads: int | None = None,
) -> AttentionIntervals:
    """Min and max of every weight of one row consistent with its head output.

    The row's LPs run in the warm-started simplex (`lp.bound_keys`, row order: chains
    of keys warm-started across objectives, each bound certified); an LP it cannot
    certify goes to HiGHS. `lp_solved` counts both.

    threads: the row's chains split over this many threads, one per core at most (default:
    torch's thread count, `torch.get_num_threads()`); the bounds agree with one thread's to
    round-off.
    """
    threads = min(engine_threads(threads), available_cores())  # a thread pool per core at most
    a, seen, _, _, basis, null_dim = _row_problem(trace, layer, head, row, factors)
    problem = row_problem(a[seen].numpy(), basis, f"layer {layer}, head {head}, row {row}")
    # 32 chains: fastest on 512 keys, m = 33 and 129 (benchmarks/records/engine.md)
    chains = max(1, min(int(problem.movable.sum()) // 16, 32))
    sol = bound_keys(problem, EngineOptions(chains_per_row=chains, threads=threads))
    lo, hi = sol.lower[0], sol.upper[0]
    solved = int(sol.lp_solved[0] + sol.fallbacks[0])
    lower, upper = torch.zeros_like(a), torch.zeros_like(a)
    lower[seen], upper[seen] = torch.from_numpy(np.asarray(lo)), torch.from_numpy(hi)
    return AttentionIntervals(
        layer, head, row, a, lower, upper, null_dim, solved, tokens=list(trace.tokens)
    )


@dataclass(frozen=True)
class IntervalMap(
    Result,
    dims={
        "lower": ("layer", "head", "row", "key"),
        "upper": ("layer", "head", "row", "key"),
        "raw": ("layer", "head", "row", "key"),
        "width": ("layer", "head", "row", "key"),
        "keys": ("layer", "row", "key"),
        "null_dim": ("layer", "head", "row"),
        "lp_solved": ("layer", "head", "row"),
        "pivots": ("layer", "head", "row"),
        "movable_mass": ("layer", "head", "row"),
    },
    plot={"kind": "interval", "fields": ("lower", "upper", "raw")},
):
    """Attention intervals for whole heads: per key, the min and max weight that any
    valid attention row (≥ 0, summing to 1 over the row's keys) with the same head
    output can give it.

    Shapes: L' = len(layers), H' = len(heads), R = len(rows), n tokens.

    Attributes:
        layers, heads, rows: what was computed (0-based).
        raw, lower, upper: `[L', H', R, n]` float64; keys outside a row's key set are 0.
        keys: `[L', R, n]` bool, each row's key set (causal, windowed or full).
        null_dim: `[L', H', R]` int64, dim LN([T, 1]) over the row's keys.
        lp_solved: `[L', H', R]` int64, LPs certified by the simplex per row.
        pivots: `[L', H', R]` int64, simplex pivots per row.
        fallbacks: number of LPs handed to HiGHS (the simplex could not certify them).
        seconds: wall time of the computation.
        tokens: the trace's tokens (labels for displays and tables).
    """

    layers: tuple[int, ...]
    heads: tuple[int, ...]
    rows: tuple[int, ...]
    raw: Tensor
    lower: Tensor
    upper: Tensor
    keys: Tensor
    null_dim: Tensor
    lp_solved: Tensor
    pivots: Tensor
    fallbacks: int
    seconds: float
    tokens: list[str] | None = None

    @property
    def width(self) -> Tensor:
        """`[L', H', R, n]` upper − lower: 0 means the weight is identifiable."""
        return self.upper - self.lower

    @property
    def lps_solved(self) -> int:
        """LPs solved in all (certified by the simplex plus HiGHS fallbacks)."""
        return int(self.lp_solved.sum()) + self.fallbacks

    @property
    def movable_mass(self) -> Tensor:
        """`[L', H', R]` Σ_j (a_j − lower_j): an upper bound on the total variation
        ½‖ã − a‖₁ of any valid row ã with the same head output."""
        return (self.raw - self.lower).sum(-1)


def interval_map(
    trace: Trace,
    *,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    rows: list[int] | None = None,
    key_mask: Tensor | None = None,
    workers: int = 1,
    threads: int | None = None,
    time_budget: float | None = None,
    chains_per_row: int | None = None,
    progress: bool | None = None,
    memory_budget: int | None = None,
) -> IntervalMap:
    """Attention intervals of whole heads (default: every layer, head and row).

    Each row's bounds come from `lp.bound_keys`: simplex chains stepped together,
    exact shortcuts, each LP certified (see docs/certified_attention.md). The rows of a
    bidirectional head share their constraint matrix, so each key's optimal basis is
    carried from row to row (dual simplex warm start); a single row, or rows with their
    own key sets (causal, windowed), warm-start across keys instead. Results equal
    per-key LPs (`interval_lp`).

    Args:
        layers: 0-based layer subset (default all).
        heads: 0-based head subset (default all).
        rows: 0-based query rows (default all).
        key_mask: `[n, n]` or `[L, n, n]` bool key sets (default: the trace's own
            `key_mask` if it has one, else causal or full).
        workers: processes (1: in this process). Heads run in parallel, and a head's
            rows are cut into pieces when there are fewer heads than processes. At most
            one process per core starts, and no more than the memory available holds.
        threads: with workers=1, the chains of each row set split over this many
            threads of this process, at most one per core (default: torch's thread count,
            `torch.get_num_threads()`); worker processes run one thread each.
        time_budget: seconds; when one measured row says the map needs more,
            raise IdentifiableError saying how long it would take. The engine's one-time
            compilation (on a cold cache, docs/certified_attention.md "First use") runs
            before the clock starts.
        chains_per_row: simplex chains per row when rows are solved one by one
            (default: enough to keep ~128 in the lock step, ~32 for the nested rows of a
            causal head; unused for a bidirectional head of 8 rows or more, which runs
            one chain per key).
        progress: a bar of the rows solved on stderr (lines in a log); None: only when a
            person is watching. memory_budget: bytes the map may use (default: the memory
            free now), checked before any work (`preflight.interval_bytes`).
    Raises: IdentifiableError: bad indices or counts, a corrupt trace, a budget too small.
    """
    layers, heads = check_selection(trace, layers, heads)
    workers, threads, row_list = _check_map_request(
        trace, workers, threads, rows, time_budget, chains_per_row, progress
    )
    if time_budget is not None:  # the budget counts the work, not the one-time compiler
        from identifiable.attention.lp import ensure_compiled

        ensure_compiled()
    start = time.time()
    heads = list(range(trace.n_heads)) if heads is None else heads
    jobs = [(lyr, h) for lyr in layers for h in heads]
    plan = _pool(trace, workers, len(jobs), len(row_list), len(layers), len(heads), memory_budget)
    if plan[0] > 1:  # worker processes run one thread each
        threads = 1
    parallel = plan[0]
    deadline = None if time_budget is None else start + 1.05 * time_budget
    total = len(jobs) * len(row_list)
    if time_budget is not None:
        check_budget(
            trace, jobs[0], row_list, key_mask, total, parallel, time_budget, start, threads
        )
    shown = watching() if progress is None else progress
    work = (trace, jobs, row_list, key_mask, chains_per_row, plan, deadline, time_budget, start)
    with task_bar("attention intervals (rows)", total, enabled=shown) as bar:
        solved = solve_jobs(*work, bar, threads)
    return _assemble(trace, layers, heads, row_list, jobs, solved, start)


def _pool(
    trace: Trace,
    workers: int,
    jobs: int,
    rows: int,
    n_layers: int,
    n_heads: int,
    memory_budget: int | None,
) -> tuple[int, int]:
    """`pool_plan` of the map's jobs × rows: never more processes than cores, or than the
    memory left holds; the map's memory checked for that many processes."""
    workers = worker_count(
        workers, jobs=jobs * rows, per_worker=_worker_bytes(trace), available=available_memory()
    )
    plan = pool_plan(workers, jobs, rows)
    check_intervals(trace, n_layers, n_heads, rows, plan[0], memory_budget)
    return plan


# A spawned worker's resident memory once it has imported torch, numba and scipy (VmHWM of
# a worker of this pool, 396 MB, rounded up), before the rows it is given.
_WORKER_IMPORTS = 512 << 20


def _worker_bytes(trace: Trace) -> int:
    """Memory one worker process needs: its imports and one head's float64 row problems."""
    return _WORKER_IMPORTS + 16 * 8 * trace.n_tokens * trace.n_keys


def _check_map_request(
    trace: Trace,
    workers: object,
    threads: object,
    rows: object,
    time_budget: object,
    chains_per_row: object,
    progress: object,
) -> tuple[int, int, list[int]]:
    """(workers, threads, rows) of `interval_map`, each checked by the rule the CLI uses
    for its flags (`identifiable.utils.checks`)."""
    workers = count(workers, "workers", "--workers")
    threads = min(engine_threads(threads), available_cores())  # type: ignore[arg-type]
    if progress is not None:
        expect(progress, bool, "progress", "True, False or None (a bar when a person watches)")
    if time_budget is not None:
        number(time_budget, "time_budget", "--time-budget", low_open=True)
    if chains_per_row is not None:
        count(chains_per_row, "chains_per_row")
    row_list = (
        list(range(trace.n_tokens))
        if rows is None
        else indices(rows, trace.n_tokens, "rows", "--row")
    )
    return workers, threads, row_list


def _assemble(trace, layers, heads, row_list, jobs, solved, start) -> IntervalMap:
    n = trace.n_keys
    shape = (len(layers), len(heads), len(row_list))
    raw = torch.zeros(*shape, n, dtype=torch.float64)
    lower, upper = torch.zeros_like(raw), torch.zeros_like(raw)
    keys = torch.zeros(len(layers), len(row_list), n, dtype=torch.bool)
    null_dim = torch.zeros(shape, dtype=torch.long)
    lp_solved, pivots = torch.zeros_like(null_dim), torch.zeros_like(null_dim)
    where = {r: i for i, r in enumerate(row_list)}
    fallbacks = 0
    for lyr, h in jobs:
        li, hi = layers.index(lyr), heads.index(h)
        for rs, (rws, lo, up, lps, piv, fb) in solved.get((lyr, h), []):
            idx = torch.tensor([where[int(r)] for r in rws])
            raw[li, hi, idx] = torch.from_numpy(rs.raw)
            lower[li, hi, idx], upper[li, hi, idx] = torch.from_numpy(lo), torch.from_numpy(up)
            keys[li, idx] = torch.from_numpy(rs.keys.copy())
            null_dim[li, hi, idx] = torch.from_numpy(rs.null_dim)
            lp_solved[li, hi, idx] = torch.from_numpy(lps)
            pivots[li, hi, idx] = torch.from_numpy(piv)
            fallbacks += fb
    return IntervalMap(
        tuple(layers),
        tuple(heads),
        tuple(row_list),
        raw,
        lower,
        upper,
        keys,
        null_dim,
        lp_solved,
        pivots,
        fallbacks,
        time.time() - start,
        tokens=list(trace.tokens),
    )
