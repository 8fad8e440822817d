"""The work behind `interval_map`: each head's row sets, their pieces for worker processes,
the engine calls, and the time budget.

A head's rows go to `lp.bound_keys` as row sets (`RowSet`): all rows at once where they
share one key set (bidirectional), one set of nested causal rows in one constraint matrix
(`nested.nested_rows`), and the other rows `_ROW_CHUNK` at a time. With worker processes,
a set whose rows share A is cut into runs of consecutive rows (`_pieces`), so that one
head can use every process, not one.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from identifiable.attention.checks import check_finite
from identifiable.attention.keysets import layer_key_mask
from identifiable.attention.linalg import add_ones, column_basis, head_factors, row_ids
from identifiable.attention.lp import BoundProblem, EngineOptions, OutOfTime, bound_keys
from identifiable.attention.nested import nested_rows
from identifiable.errors import IdentifiableError, seconds
from identifiable.models.trace import Trace
from identifiable.utils.pools import available_cores
from identifiable.utils.threads import one_thread_per_process


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
    """Attention `[n, n_k]`, V' = V F `[n_k, k]`, key sets `[n, n_k]` (float64) and the
    `row_ids` `[n_k]` of V of one head,
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
    return att, values @ head_factors(out_proj)[0], mask, row_ids(values)


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
    att, vf, mask, ids = _head_inputs(trace, layer, head, rows, key_mask)
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
        qa, rank_a = add_ones(q_t, rank, ids[idx])
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


_ROW_CHUNK = 32  # rows built and solved at a time when rows have their own key sets
# Nested causal rows: "row" order, or "key" order in chains of _NESTED_BLOCK rows (kept
# for the benchmark that measures the choice, bench_causal_certify.py --nested-key).
_NESTED_ORDER = "row"
_NESTED_BLOCK = 16


def _solve_head(args: tuple) -> list[tuple]:
    """Row sets through `lp.bound_keys` (module-level: process pools). args: (row sets,
    chains per row or None, what, deadline, threads[, EngineOptions fields to override,
    as the benchmarks compare them])."""
    sets, chains, what, deadline, threads, *rest = args
    out = []
    for rs in sets:
        sol = bound_keys(_problem(rs, what), _options(rs, chains, deadline, threads, *rest))
        out.append(
            (rs.rows, sol.lower, sol.upper, sol.lp_solved, sol.pivots, int(sol.fallbacks.sum()))
        )
    return out


def _problem(rs: RowSet, what: str) -> BoundProblem:
    movable = rs.movable
    if movable is None:  # each row's own basis (nested rows bring theirs)
        # every key of a row with a null space (`certificates.movable_keys`)
        movable = rs.keys & (rs.null_dim > 0)[:, None]
    return BoundProblem(rs.aq, rs.raw, rs.keys, movable, what)


def _options(rs: RowSet, chains, deadline, threads, override: dict | None = None) -> EngineOptions:
    """The layout of a row set: nested causal rows in row order, one chain per row (32
    chains in all at most when rows are few): on a Llama-3-sized head 0.60x the pivots of
    key order and 0.56x the time at n = 256, 0.91x and 0.77x on the widest 32 rows at
    n = 512 (benchmarks/records/engine.md); other rows as `bound_keys` chooses."""
    nested = rs.movable is not None
    order = _NESTED_ORDER if nested else "auto"
    most = 32 if order == "row" else 128
    n_rows = rs.rows.size
    k = chains or max(1, min(int(rs.keys.sum(1).max()) // 16, most // max(n_rows, 1)))
    block = _NESTED_BLOCK if order == "key" else None
    options = EngineOptions(
        threads=threads, order=order, chains_per_row=k, block=block, deadline=deadline
    )
    return dataclasses.replace(options, **(override or {}))


def _head_sets(trace: Trace, layer: int, head: int, rows: list[int], key_mask, pieces: int = 1):
    """The row sets of one head, a list at a time: all rows together where they share one
    key set, or one constraint matrix (nested causal rows, `nested.nested_rows`), so that
    one product with A per lock step serves all their chains. Other rows go `_ROW_CHUNK`
    at a time, so that the bases of rows with their own key sets (n·(d_v + 1) floats each)
    never exist for a whole head.
    With `pieces` > 1 (worker processes), a set of rows sharing A comes as up to that many
    lists of one piece each (`_pieces`)."""
    mask = layer_key_mask(trace, layer, key_mask)[rows]
    if bool((mask == mask[:1]).all()):
        sets = head_rows(trace, layer, head, rows, key_mask=key_mask)
        yield from ([[p] for p in _pieces(sets[0], pieces)] if len(sets) == 1 else [sets])
        return
    att, vf, _, ids = _head_inputs(trace, layer, head, rows, key_mask)
    nested = nested_rows(vf, mask, ids)
    rest = rows if nested is None else [rows[i] for i in nested.rest]
    if nested is not None and nested.shared.size:
        shared = np.array(rows)[nested.shared]
        keys = mask[torch.from_numpy(nested.shared)].numpy()
        raw = np.where(keys, att[torch.from_numpy(shared)].numpy(), 0.0)
        empty = np.zeros((0, 0, 0))
        whole = RowSet(shared, keys, raw, nested.aq, empty, nested.null_dim, nested.movable)
        yield from ([p] for p in _pieces(whole, pieces))
    for i in range(0, len(rest), _ROW_CHUNK):
        yield head_rows(trace, layer, head, rest[i : i + _ROW_CHUNK], key_mask=key_mask)


_MIN_PIECE = 16  # rows per piece at least


def _pieces(rs: RowSet, pieces: int) -> list[RowSet]:
    """A row set whose rows share A (`aq` `[1, m, n]`), cut into up to `pieces` runs of
    consecutive rows (at least `_MIN_PIECE` each) of about equal work.

    A row of k keys with a null space costs ~k² (k LPs, each pivot prices k keys), as in
    `_row_weight`. The rows keep their order, so nested key sets stay nested. A cut costs
    little: row order solves each nested row on its own, and in a bidirectional set (key
    order) a piece's first row is solved without a warm start.
    """
    count = min(pieces, rs.rows.size // _MIN_PIECE)
    if count <= 1 or rs.aq.shape[0] != 1:
        return [rs]
    work = np.cumsum(rs.keys.sum(1).astype(float) ** 2 * (rs.null_dim > 0))
    cuts = np.searchsorted(work, work[-1] * np.arange(1, count) / count, side="right")
    bounds = [0]
    for c in cuts.tolist():  # every piece, the last one too, keeps _MIN_PIECE rows
        c = max(c, bounds[-1] + _MIN_PIECE)
        if rs.rows.size - c < _MIN_PIECE:
            break
        bounds.append(c)
    bounds.append(rs.rows.size)
    return [_rows_of(rs, s, e) for s, e in itertools.pairwise(bounds)]


def _rows_of(rs: RowSet, s: int, e: int) -> RowSet:
    """Rows s..e−1 of a row set whose rows share A."""
    movable = None if rs.movable is None else rs.movable[s:e]
    return RowSet(
        rs.rows[s:e], rs.keys[s:e], rs.raw[s:e], rs.aq, rs.paper_basis, rs.null_dim[s:e], movable
    )


def pool_plan(workers: int, n_jobs: int, n_rows: int) -> tuple[int, int]:
    """(processes, pieces per head) for `workers` asked, `n_jobs` heads of `n_rows` rows.

    Heads run in separate processes; a head is also cut into pieces (`_pieces`) unless
    there are heads enough to keep every process busy, twice as many pieces as processes
    so that pieces whose work was misjudged even out. More processes than pieces and heads
    would idle, and more pieces than the machine's cores would not help one head.
    """
    workers = max(int(workers), 1)
    cores = available_cores()
    splits = min(workers, cores, n_rows // _MIN_PIECE) if n_jobs < 2 * min(workers, cores) else 1
    pool_size = min(workers, cores, max(n_jobs, splits))  # never more processes than cores
    return pool_size, (2 * splits if splits > 1 else 1)


def solve_jobs(
    trace, jobs, row_list, key_mask, chains, plan, deadline, budget, start, bar, threads=1
):
    """Per job, the list of (light row set, result) pairs; one line if the budget runs out.
    `threads`: the engine's threads per row set (1 with worker processes)."""
    done = 0
    out: dict = {}
    pool_size, pieces = plan

    def tasks(job):
        lyr, h = job
        what = f"layer {lyr}, head {h}"
        for sets in _head_sets(trace, lyr, h, row_list, key_mask, pieces):
            yield sets, (chains, what, deadline, threads)

    try:
        if pool_size > 1:
            from identifiable.attention.lp import ensure_compiled
            from identifiable.utils.pools import process_pool

            ensure_compiled()  # here, once: the workers then load it from the disk cache

            # workers ignore Ctrl-C; the parent terminates them and re-raises
            with process_pool(pool_size, initializer=one_thread_per_process) as pool:
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


_OWN_KEYS_FACTOR = 0.9  # rows that do not share one key set, in k·(k − d_v − 1) probes


def _row_weight(mask: np.ndarray, d_v: int) -> float:
    """The rows `mask` `[R, n]` (key sets) in units of the probe, the row with most keys.

    A row of k keys costs ~k·(k − d_v − 1) / (k_max·(k_max − d_v − 1)) of the probe: k LPs,
    whose pivots grow with the null space (k − d_v − 1 dimensions; 0 for rows of ≤ d_v + 1
    keys, which have none unless tokens repeat), at a nearly constant cost a pivot. Rows
    that all see one key set share A (key order), 2.8× cheaper per row; other rows (causal,
    windowed) cost _OWN_KEYS_FACTOR×, fitted on a Llama-3-sized causal head (the fits:
    benchmarks/records/engine.md, "Time budget").
    """
    keys = mask.sum(1).astype(float)
    null = np.maximum(keys - (d_v + 1), 0.0)
    probe = float(keys.max() * null.max())
    if probe == 0.0:  # no row has a null space (unless tokens repeat): nothing to price
        return 0.0
    share = float((keys * null).sum()) / probe
    return share / 2.8 if bool((mask == mask[:1]).all()) else _OWN_KEYS_FACTOR * share


def _narrower(heads: int, rows: int) -> tuple[str, str]:
    """The end of a time-budget refusal: a smaller choice than the caller's, if any
    (Python arguments, CLI flags)."""
    if heads > 1:
        return (
            " or choose one head (layers=, heads=)",
            " or choose one head with --layer and --head",
        )
    if rows > 1:
        return " or choose fewer rows (rows=)", " or choose one row with --row"
    return "", ""


def check_budget(trace, job, rows, key_mask, n_rows, workers, budget, start, threads=1) -> None:
    """Time one row (the one with the most keys) and refuse a map that cannot fit. The
    probe runs on the map's `threads`, as its rows will.

    Only that row's problem is built; a row that alone outlasts the budget is stopped
    when the budget (and its 10 % slack) runs out, not when it ends.
    """
    mask = layer_key_mask(trace, job[0], key_mask)[rows]
    probe = rows[int(mask.sum(1).argmax())]
    what = f"layer {job[0]}, head {job[1]}"
    t0 = time.time()
    try:  # the probe may use the budget and half its 10 % slack, no more
        _solve_head(
            (
                head_rows(trace, job[0], job[1], [probe], key_mask=key_mask),
                None,
                what,
                start + 1.05 * budget,
                threads,
            )
        )
        cut = False
    except OutOfTime:
        cut = True
    per_row = time.time() - t0
    heads = n_rows / len(rows)
    weight = _row_weight(mask.numpy(), trace.values.shape[-1]) * heads / max(workers, 1)
    estimate = (time.time() - start) + per_row * weight
    if cut or estimate > budget:
        took = f"over {seconds(per_row)}, stopped there" if cut else seconds(per_row)
        head = (
            f"the interval map of {n_rows} rows needs about {seconds(estimate)}"
            f"{' or more' if cut else ''} (one row, {int(mask.sum(1).max())} keys, took "
            f"{took}), more than the time budget of {budget:g} s: raise "
        )
        # advise only a narrower choice than the caller made (one head: fewer rows)
        python, cli = _narrower(round(heads), len(rows))
        raise IdentifiableError(head + "time_budget=" + python, cli=head + "--time-budget" + cli)
