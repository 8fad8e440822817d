"""`witness` and `attention_intervals` for one row of a `Trace`; `interval_map` for whole heads."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from identifiable.attention.certificates import (
    MOVABLE_TOL,
    OutOfTime,
    interval_simplex,
    output_residual,
    row_problem,
    witness_lp,
)
from identifiable.attention.checks import check_finite, check_selection
from identifiable.attention.effective import HeadFactors
from identifiable.attention.keysets import layer_key_mask
from identifiable.attention.linalg import add_ones, column_basis, head_factors
from identifiable.attention.nested import nested_rows
from identifiable.errors import IdentifiableError, seconds
from identifiable.models.trace import Trace
from identifiable.progress import task_bar, watching
from identifiable.results import Result


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
    qa, rank_a = add_ones(q, rank)
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
            layer, head, row, False, sol.reason, a, None, None, 0.0, 0.0, 0.0, null_dim,
            tokens=list(trace.tokens),
        )  # fmt: skip
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
    trace: Trace, layer: int, head: int, row: int, *, factors: HeadFactors | None = None
) -> AttentionIntervals:
    """Min and max of every weight of one row consistent with its head output.

    The row's LPs run in the warm-started simplex (`interval_simplex`, row order: chains
    of keys warm-started across objectives, each bound certified); an LP it cannot
    certify goes to HiGHS. `lp_solved` counts both.
    """
    a, seen, _, _, basis, null_dim = _row_problem(trace, layer, head, row, factors)
    aq, allowed, movable = row_problem(a[seen].numpy(), basis)
    chains = max(1, min(int(movable.sum()) // 16, 32))  # 32: fastest on 512 keys, m = 33 and 129
    where = f"layer {layer}, head {head}, row {row}"
    sol = interval_simplex(aq, a[seen].numpy()[None], allowed, movable, chains_per_row=chains,
                           what=where)  # fmt: skip
    lo, hi = sol.lower[0], sol.upper[0]
    solved = int(sol.lp_solved[0] + sol.fallbacks[0])
    lower, upper = torch.zeros_like(a), torch.zeros_like(a)
    lower[seen], upper[seen] = torch.from_numpy(np.asarray(lo)), torch.from_numpy(hi)
    return AttentionIntervals(
        layer, head, row, a, lower, upper, null_dim, solved, tokens=list(trace.tokens)
    )


# ---- whole heads and models ----------------------------------------------------------------


@dataclass(frozen=True)
class RowSet:
    """The LP data of some rows of one head (one group of rows sharing their key-set size).

    Attributes:
        rows: query rows (0-based) in this set.
        keys: `[R, n]` bool, each row's key set.
        raw: `[R, n]` float64 raw weights (0 outside the key set).
        aq: `[R, m, n]` (or `[1, m, n]` when all rows share their key set) Qᵀ with Q an
            orthonormal basis of col([T, 1]) over the row's keys; m = rank([T, 1]).
        paper_basis: `[R or 1, n, k]` orthonormal basis of col(T) over the row's keys
            (zero columns allowed): the paper's effective row is a Q_T Q_Tᵀ.
        null_dim: `[R]` dim LN([T, 1]) over the row's keys.
        movable: `[R, n]` bool keys the null space can move, where `aq` is shared by rows
            with their own key sets (nested causal rows); None: computed from `aq`.
    """

    rows: np.ndarray
    keys: np.ndarray
    raw: np.ndarray
    aq: np.ndarray
    paper_basis: np.ndarray
    null_dim: np.ndarray
    movable: np.ndarray | None = None


def _head_inputs(trace: Trace, layer: int, head: int, rows: list[int], key_mask):
    """Attention `[n, n_k]`, V' = V F `[n_k, k]` and key sets `[n, n_k]` of one head (float64),
    checked: a row whose raw weights are negative, do not sum to 1 over its key set, or
    put weight outside it cannot come from a softmax over that key set, so the LP would be
    infeasible; that is reported instead (numbers from a corrupt trace)."""
    where = f"layer {layer}, head {head}"
    att = trace.attentions[layer, head].double()
    values = trace.values[layer, head].double()
    out_proj = trace.out_proj[layer, head].double()
    check_finite(att[None], "attention", layer=layer)
    check_finite(values[None], "values (E·W_V)", layer=layer)
    check_finite(out_proj[None, None], "output projection (W_O)", layer=layer)
    mask = layer_key_mask(trace, layer, key_mask)
    for r in rows:
        a, keys = att[r], mask[r]
        outside = float(a[~keys].abs().sum())
        total = float(a[keys].sum())
        if float(a.min()) < -1e-6 or abs(total - 1.0) > 1e-3 or outside > 1e-6:
            raise IdentifiableError(
                f"{where}, row {r}: the attention row is not a distribution over its keys "
                f"(min {float(a.min()):.3g}, sum {total:.6g}, weight outside the key set "
                f"{outside:.3g}), so no valid row can match it (numerically infeasible): "
                "the trace is corrupt; trace the text again"
            )
    return att, values @ head_factors(out_proj)[0], mask


def head_rows(
    trace: Trace,
    layer: int,
    head: int,
    rows: list[int] | None = None,
    *,
    key_mask: Tensor | None = None,
) -> list[RowSet]:
    """Build the row problems of one head; raise naming layer and head on corrupt input.

    Rows whose weights are not a distribution over their keys are refused
    (`_head_inputs`).
    """
    trace.check_layer(layer)
    trace.check_head(head)
    rows = list(range(trace.n_tokens)) if rows is None else [int(r) for r in rows]
    for r in rows:
        trace.check_row(r)
    att, vf, mask = _head_inputs(trace, layer, head, rows, key_mask)
    n = trace.n_keys
    by_key_set: dict[bytes, list[int]] = {}
    for r in rows:
        by_key_set.setdefault(mask[r].numpy().tobytes(), []).append(r)
    groups: dict[
        tuple[int, int], list[tuple[list[int], np.ndarray, np.ndarray, np.ndarray, int]]
    ] = {}
    for key_bytes, members in by_key_set.items():
        key_set = np.frombuffer(key_bytes, dtype=bool)
        idx = np.flatnonzero(key_set)
        q_t, rank, _ = column_basis(vf[idx])
        qa, rank_a = add_ones(q_t, rank)
        basis = qa[:, torch.linalg.vector_norm(qa, dim=0) > 0].numpy()
        aq = np.zeros((basis.shape[1], n))
        aq[:, idx] = basis.T
        pb = np.zeros((n, q_t.shape[1]))
        pb[idx] = q_t.numpy()
        # Rows stack only with rows of the same constraint count m and paper-basis width
        # (rank-deficient prefixes give equal m with different widths).
        groups.setdefault((aq.shape[0], pb.shape[1]), []).append(
            (members, key_set, aq, pb, idx.size - int(rank_a))
        )
    out = []
    for sets in groups.values():
        shared = len(sets) == 1
        rs = [r for members, *_ in sets for r in members]
        per_row = [(keys, aq, pb, nd) for members, keys, aq, pb, nd in sets for _ in members]
        out.append(
            RowSet(
                rows=np.array(rs, dtype=np.int64),
                keys=np.stack([p[0] for p in per_row]),
                raw=np.where(np.stack([p[0] for p in per_row]), att[rs].numpy(), 0.0),
                aq=sets[0][2][None] if shared else np.stack([p[1] for p in per_row]),
                paper_basis=sets[0][3][None] if shared else np.stack([p[2] for p in per_row]),
                null_dim=np.array([p[3] for p in per_row], dtype=np.int64),
            )
        )
    return out


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


_ROW_CHUNK = 32  # rows built and solved at a time when rows have their own key sets
_NESTED_BLOCK = 16  # rows per key-order chain of nested rows


def _solve_head(args: tuple) -> list[tuple]:
    """Row sets through `interval_simplex` (module-level: process pools)."""
    sets, chains, what, deadline = args
    out = []
    for rs in sets:
        n_rows = rs.rows.size
        movable = rs.movable
        if movable is None:  # each row's own basis (nested rows bring theirs)
            movable = np.zeros_like(rs.keys)
            for i in range(n_rows):
                aq = rs.aq[0 if rs.aq.shape[0] == 1 else i]
                if rs.null_dim[i] > 0:
                    movable[i] = (1.0 - (aq**2).sum(0) > MOVABLE_TOL) & rs.keys[i]
        k = chains or max(1, min(int(rs.keys.sum(1).max()) // 16, 128 // max(n_rows, 1)))
        # Nested rows: chains of _NESTED_BLOCK rows, not one chain down the whole head,
        # keep the lock step full (one long chain per key leaves the last steps near-empty).
        block = _NESTED_BLOCK if rs.movable is not None else None
        sol = interval_simplex(rs.aq, rs.raw, rs.keys, movable, chains_per_row=k, what=what,
                               deadline=deadline, block=block)  # fmt: skip
        out.append(
            (rs.rows, sol.lower, sol.upper, sol.lp_solved, sol.pivots, int(sol.fallbacks.sum()))
        )
    return out


def _head_sets(trace: Trace, layer: int, head: int, rows: list[int], key_mask):
    """The row sets of one head, a list at a time: all rows together where they share one
    key set, or one constraint matrix (nested causal rows, `nested.nested_rows`): key order
    carries bases across them. Other rows go `_ROW_CHUNK` at a time, so that the bases of
    rows with their own key sets (n·(d_v + 1) floats each) never exist for a whole head."""
    mask = layer_key_mask(trace, layer, key_mask)[rows]
    if bool((mask == mask[:1]).all()):
        yield head_rows(trace, layer, head, rows, key_mask=key_mask)
        return
    att, vf, _ = _head_inputs(trace, layer, head, rows, key_mask)
    nested = nested_rows(vf, mask)
    rest = rows if nested is None else [rows[i] for i in nested.rest]
    if nested is not None and nested.shared.size:
        shared = np.array(rows)[nested.shared]
        keys = mask[torch.from_numpy(nested.shared)].numpy()
        raw = np.where(keys, att[torch.from_numpy(shared)].numpy(), 0.0)
        empty = np.zeros((0, 0, 0))
        yield [RowSet(shared, keys, raw, nested.aq, empty, nested.null_dim, nested.movable)]
    for i in range(0, len(rest), _ROW_CHUNK):
        yield head_rows(trace, layer, head, rest[i : i + _ROW_CHUNK], key_mask=key_mask)


def interval_map(
    trace: Trace,
    *,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    rows: list[int] | None = None,
    key_mask: Tensor | None = None,
    workers: int = 1,
    time_budget: float | None = None,
    chains_per_row: int | None = None,
    progress: bool | None = None,
) -> IntervalMap:
    """Attention intervals of whole heads (default: every layer, head and row).

    Each row's bounds come from `interval_simplex`: simplex chains stepped together,
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
        workers: processes, one head at a time each (1: in this process).
        time_budget: seconds; when one measured row says the map needs more,
            raise IdentifiableError saying how long it would take.
        chains_per_row: simplex chains per row when rows are solved one by one
            (default: enough to keep ~128 in step; unused for a bidirectional head of
            8 rows or more, which runs one chain per key).
        progress: a bar of the rows solved on stderr (lines in a log); None: only when a
            person is watching (a terminal or Jupyter).
    Raises: IdentifiableError for out-of-range indices, a corrupt trace (naming layer
        and head) or a budget that is too small.
    """
    start = time.time()
    if time_budget is not None and not time_budget > 0:  # NaN too: it would refuse nothing
        raise IdentifiableError(
            f"time_budget must be a positive number of seconds, got {time_budget!r}"
        )
    layers, heads = check_selection(trace, layers, heads)
    heads = list(range(trace.n_heads)) if heads is None else heads
    row_list = list(range(trace.n_tokens)) if rows is None else [int(r) for r in rows]
    for r in row_list:
        trace.check_row(r)
    jobs = [(lyr, h) for lyr in layers for h in heads]
    # More processes than heads would idle, and more than the machine's cores cannot
    # shorten the estimate: the budget check assumes neither.
    pool_size = min(max(workers, 1), len(jobs))
    parallel = min(pool_size, os.cpu_count() or 1)
    deadline = None if time_budget is None else start + 1.05 * time_budget
    if time_budget is not None:
        _check_budget(trace, jobs[0], row_list, key_mask, len(jobs) * len(row_list), parallel,
                      time_budget, start)  # fmt: skip
    shown = watching() if progress is None else progress
    with task_bar("attention intervals (rows)", len(jobs) * len(row_list), enabled=shown) as bar:
        solved = _solve_jobs(trace, jobs, row_list, key_mask, chains_per_row, pool_size,
                             deadline, time_budget, start, bar)  # fmt: skip
    return _assemble(trace, layers, heads, row_list, jobs, solved, start)


def _solve_jobs(trace, jobs, row_list, key_mask, chains, pool_size, deadline, budget, start, bar):
    """Per job, the list of (light row set, result) pairs; one line if the budget runs out."""
    done = 0
    out: dict = {}

    def tasks(job):
        lyr, h = job
        what = f"layer {lyr}, head {h}"
        for sets in _head_sets(trace, lyr, h, row_list, key_mask):
            yield sets, (chains, what, deadline)

    try:
        if pool_size > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=pool_size, mp_context=ctx) as pool:
                futures = []
                for job in jobs:
                    for sets, extra in tasks(job):
                        futures.append((job, sets, pool.submit(_solve_head, (sets, *extra))))
                for job, sets, fut in futures:
                    out.setdefault(job, []).extend(
                        zip(map(_light, sets), fut.result(), strict=True)
                    )
                    done += sum(rs.rows.size for rs in sets)
                    bar.update(done)
        else:
            for job in jobs:
                for sets, extra in tasks(job):
                    out.setdefault(job, []).extend(
                        zip(map(_light, sets), _solve_head((sets, *extra)), strict=True)
                    )
                    done += sum(rs.rows.size for rs in sets)
                    bar.update(done)
    except OutOfTime:
        total = len(jobs) * len(row_list)
        raise IdentifiableError(
            f"the interval map did not finish within its time budget of {budget:g} s "
            f"({done} of {total} rows done in {seconds(time.time() - start)}): raise the "
            "budget (time_budget=, CLI --time-budget) or choose fewer layers, heads or rows "
            "(layers=/heads=/rows=, CLI --layer/--head)"
        ) from None
    return out


def _light(rs: RowSet) -> RowSet:
    """A row set without its bases (what the result needs), so they are freed when solved."""
    empty = np.zeros((0, 0, 0))
    return RowSet(rs.rows, rs.keys, rs.raw, empty, empty, rs.null_dim)


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
        tuple(layers), tuple(heads), tuple(row_list), raw, lower, upper, keys, null_dim,
        lp_solved, pivots, fallbacks, time.time() - start, tokens=list(trace.tokens),
    )  # fmt: skip


def _row_weight(mask: np.ndarray, d_v: int) -> float:
    """The rows `mask` `[R, n]` (key sets) in units of the probe, the row with most keys.

    A row of k keys costs ~(k / k_max)² of the probe (k LPs, each pivot prices k keys); rows
    of ≤ d_v + 1 keys have no null space unless tokens repeat: 0. Rows that all see one key
    set share A (key order), ~2× cheaper per row (MiniLM, bench_certify.py "probe_ratio");
    other rows cost 1.15×, fitted on a Llama-3-sized causal head (m = 129): estimates of
    1.10× (n = 256) and 0.94× (n = 512) the measured 118 s and 1,174 s.
    """
    keys = mask.sum(1).astype(float)
    share = float(((keys / keys.max()) ** 2 * (keys > d_v + 1)).sum())
    return share / 2.0 if bool((mask == mask[:1]).all()) else 1.15 * share


def _check_budget(trace, job, rows, key_mask, n_rows, workers, budget, start) -> None:
    """Time one row (the one with the most keys) and refuse a map that cannot fit.

    Only that row's problem is built; a row that alone outlasts the budget is stopped
    when the budget (and its 10 % slack) runs out, not when it ends.
    """
    mask = layer_key_mask(trace, job[0], key_mask)[rows]
    probe = rows[int(mask.sum(1).argmax())]
    what = f"layer {job[0]}, head {job[1]}"
    t0 = time.time()
    try:  # the probe may use the budget and half its 10 % slack, no more
        _solve_head((head_rows(trace, job[0], job[1], [probe], key_mask=key_mask), None, what,
                     start + 1.05 * budget))  # fmt: skip
        cut = False
    except OutOfTime:
        cut = True
    per_row = time.time() - t0
    heads = n_rows / len(rows)
    weight = _row_weight(mask.numpy(), trace.values.shape[-1]) * heads / max(workers, 1)
    estimate = (time.time() - start) + per_row * weight
    if cut or estimate > budget:
        took = f"over {seconds(per_row)}, stopped there" if cut else seconds(per_row)
        raise IdentifiableError(
            f"the interval map of {n_rows} rows needs about {seconds(estimate)}"
            f"{' or more' if cut else ''} (one row, {int(mask.sum(1).max())} keys, took "
            f"{took}), more than the time budget of {budget:g} s: raise the budget "
            "(time_budget=, CLI --time-budget) or choose one head with --layer and --head "
            "(layers=, heads=)"
        )
