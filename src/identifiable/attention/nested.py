"""Causal rows of one head in one constraint matrix, so that interval maps can walk down them.

Row i of a causal head sees the keys S_i = {0, …, i}; its polytope is
    P_i = {x ≥ 0 on S_i, x = 0 elsewhere : C[:, S_i] x = C[:, S_i] a_i},
with C = [V F, 1]ᵀ (one column per key: key k's column does not depend on the row).
Take one orthonormal basis Q of col([V F, 1]) over the largest key set and A = Qᵀ
(m × n, m its rank). A = G C for an invertible G, so wherever C[:, S_i] has rank m,
A[:, S_i] x = A[:, S_i] a_i is the same system as row i's own: all those rows share A and
differ only in b_i and in the keys they may use, which grow from row to row. That is what
`lp.bound_keys`'s key order needs to carry each objective's optimal basis down the rows
(dual simplex), as it does for bidirectional heads.

A row qualifies when its Gram matrix G_i = A[:, S_i] A[:, S_i]ᵀ has λ_min ≥ WELL_CONDITIONED
(λ_max ≤ 1, since A has orthonormal rows over the largest set): its constraints in A's
coordinates are then at most 1/√WELL_CONDITIONED = 1e3 times worse conditioned than in an
orthonormal basis of its own. Adding keys only raises λ_min (G_{i+1} = G_i + Σ new columns'
outer products), so the qualifying rows are the longest ones; the others (short prefixes,
below rank m or nearly so) keep their own bases. Every key of a shared row is movable
(`certificates.movable_keys`: no computed test proves a key fixed; its LP does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from identifiable.attention.linalg import add_ones, column_basis

WELL_CONDITIONED = 1e-6  # smallest λ_min(G_i) of a row solved in the shared coordinates


@dataclass(frozen=True)
class NestedRows:
    """Rows whose key sets grow, in one coordinate system (see the module docstring).

    Attributes:
        shared: `[R']` int64 positions (into the rows given) of the rows solved together,
            in growing key-set order.
        rest: `[R − R']` int64 positions of the other rows, ascending.
        aq: `[1, m, n]` float64 A = Qᵀ (zero columns outside the largest key set).
        movable: `[R', n]` bool, keys the null space can move in each shared row.
        null_dim: `[R']` int64, dim LN([T, 1]) over each shared row's keys (|S_i| − m).
    """

    shared: np.ndarray
    rest: np.ndarray
    aq: np.ndarray
    movable: np.ndarray
    null_dim: np.ndarray


def nested_rows(vf: Tensor, mask: Tensor, ids: Tensor | None = None) -> NestedRows | None:
    """The rows of one head that can share one constraint matrix, and the rest.

    Args:
        vf: `[n, k]` float64, V' = V F of the head (k ≥ rank(T)).
        mask: `[R, n]` bool, each row's key set.
        ids: `[n]` `linalg.row_ids` of V (for `add_ones`).
    Returns: None when all key sets are equal (bidirectional: rows share A already) or
        when they are not nested (windows).
    """
    order = torch.argsort(mask.sum(1), stable=True)
    sets = mask[order].numpy()
    if (sets == sets[:1]).all() or (sets[:-1] & ~sets[1:]).any():
        return None
    idx = np.flatnonzero(sets[-1])
    q_t, rank, _ = column_basis(vf[torch.from_numpy(idx)])
    qa, _ = add_ones(q_t, rank, None if ids is None else ids[torch.from_numpy(idx)])
    basis = qa[:, torch.linalg.vector_norm(qa, dim=0) > 0].numpy()  # [|S_max|, m]
    m, n = basis.shape[1], sets.shape[1]
    aq = np.zeros((m, n))
    aq[:, idx] = basis.T
    gram = np.zeros((m, m))
    prev = np.zeros(n, dtype=bool)
    first, movable = sets.shape[0], []
    for pos, keys in enumerate(sets):
        cols = aq[:, keys & ~prev]
        gram += cols @ cols.T
        prev = keys
        if first == sets.shape[0]:  # λ_min only grows: test until the first row qualifies
            if np.linalg.eigvalsh(gram)[0] < WELL_CONDITIONED:
                continue
            first = pos
        movable.append(keys.copy() if keys.sum() > m else np.zeros(n, dtype=bool))
    perm = order.numpy()
    return NestedRows(
        shared=perm[first:],
        rest=np.sort(perm[:first]),
        aq=aq[None],
        movable=np.stack(movable) if movable else np.zeros((0, n), dtype=bool),
        null_dim=sets[first:].sum(1) - m,
    )
