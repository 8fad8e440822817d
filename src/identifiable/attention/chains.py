"""The simplex state of `interval_simplex`: many revised-simplex runs ("chains") in lock step.

Each chain keeps a basis of P = {x ≥ 0 : A x = b} (docs/certified_attention.md), its B⁻¹
and basic values, and its pricing state: the reduced costs of its objective and the
steepest-edge weights of its basis, both updated pivot by pivot. What to pivot, and when
an LP is done, is decided in `simplex.py`.
"""

from __future__ import annotations

import numpy as np
import torch


class _Simplex:
    """Many revised-simplex runs ("chains") advanced in lock step, one pivot each per step.

    Every chain walks through its own list of LP tasks (row, key j, sense s): maximise
    s·x_j over the row's P = {x ≥ 0 : A x = b_row}. It keeps only its basis, B⁻¹ (m × m)
    and the basic values x_B = B⁻¹ b_row. Two consecutive tasks of a chain share either
    the row or the objective, so the basis the chain carries is always a warm start:
    - same row, new objective: the basis stays primal feasible (x_B ≥ 0), and primal
      simplex pivots restore optimality. With `steepest` they price by steepest edge
      (d_k² / γ_k, γ_k = 1 + ‖B⁻¹A_k‖², see `_update_pricing`), otherwise by Dantzig's
      largest d_k. Steepest edge costs one more pass over B⁻¹ and one more GEMM with A
      per pivot, and pays where chains stay on one row ("row" order): 218 against 396
      pivots per LP on a 512-key row at m = 129. In "key" order, where most pivots are
      dual, it did not (8 rows at n = 512: 10 % fewer pivots, 51.9 s against 43.2 s);
    - same objective, new row (rows of a bidirectional head share A; only b = A a
      changes): the reduced costs do not depend on b, so the basis stays dual feasible,
      and dual simplex pivots (dual steepest edge: the leaving row maximises
      x_p² / ‖e_pᵀB⁻¹‖², with exact weights; ratio test ties broken by the largest
      pivot) restore primal feasibility.
    Each step a chain pivots in the mode its basis calls for: dual while some basic value
    is below −_FEAS_TOL, primal otherwise. State arrays hold live chains only (`compact`),
    so a step updates them in place; a chain that does not pivot in a step takes the
    exact no-op pivot (column e_p), which leaves its B⁻¹, x_B, d and γ bit for bit
    unchanged.
    """

    def __init__(self, aq, a, allowed, tasks, start, steepest: bool = False):
        self.shared = aq.shape[0] == 1
        self.steepest = steepest
        self.m, self.n = aq.shape[1:]
        first = np.array([t[0][0] for t in tasks], dtype=np.int64)
        # Chains of an unshared head never leave their row (see interval_simplex).
        self.a_one = aq[0]
        self.a_cols = np.ascontiguousarray(aq[0].T)  # [n, m], the columns B⁻¹ multiplies
        self.aq = aq if self.shared else np.ascontiguousarray(aq[first])
        self.b = a @ aq[0].T if self.shared else np.einsum("rmn,rn->rm", aq, a)  # [R, m]
        self.row_allowed = allowed
        self.basic = start[first].copy()
        n_chains = first.size
        self.pos = np.full((n_chains, self.n), -1, dtype=np.int64)
        np.put_along_axis(self.pos, self.basic, np.arange(self.m)[None, :], axis=1)
        self.blocked = ~allowed[first]
        np.put_along_axis(self.blocked, self.basic, True, axis=1)
        self.row = first.copy()
        self.b_row = first.copy()  # the row whose b = A a gives x_B (see `move`)
        self.binv = np.empty((n_chains, self.m, self.m))
        self.xb = np.empty((n_chains, self.m))
        self.since = np.zeros(n_chains, dtype=np.int64)
        # Reduced costs d [C, n] of each chain's objective, kept up to date pivot by pivot
        # (d' = d − d_q/α_rq · α_r, from the pivot row α_r every pivot computes anyway) and
        # recomputed from a fresh B⁻¹ when `fresh_d` is False: a new objective, a refactor.
        # Optimality is only ever certified on recomputed reduced costs (see _finish).
        self.d = np.zeros((n_chains, self.n))
        self.fresh_d = np.zeros(n_chains, dtype=bool)
        # Steepest-edge weights γ [C, n] (see _update_pricing): they belong to the basis,
        # not to the objective, so they carry across LPs; computed exactly when a chain
        # starts and when it restarts after a HiGHS fallback (`refactor(weights=True)`).
        self.w = np.ones((n_chains, self.n))
        self.refactor(np.arange(n_chains), weights=True)

    def compact(self, keep: np.ndarray) -> None:
        """Keep only the chains `keep` (in that order)."""
        for name in ("basic", "pos", "blocked", "row", "b_row", "binv", "xb", "since", "d",
                     "fresh_d", "w"):  # fmt: skip
            setattr(self, name, getattr(self, name)[keep])
        if not self.shared:
            self.aq = self.aq[keep]

    def refactor(self, cs: np.ndarray, weights: bool = False) -> None:
        """B⁻¹ and x_B afresh from the basis indices (no accumulated round-off); with
        `weights`, the steepest-edge weights too (their updates keep them to ~1e-14, see
        `_update_pricing`, so the periodic refactors leave them)."""
        if cs.size == 0:
            return
        self.binv[cs] = np.linalg.inv(self.basis_matrices(cs))
        self.reload(cs)
        self.since[cs] = 0
        self.fresh_d[cs] = False
        todo = cs if weights and self.steepest else cs[:0]
        for i in range(0, todo.size, 8):  # γ_k = 1 + ‖B⁻¹A_k‖² exactly, 8 chains at a time
            c8 = todo[i : i + 8]
            aq = self.a_one[None] if self.shared else self.aq[c8]
            full = np.matmul(self.binv[c8], aq)
            self.w[c8] = 1.0 + np.einsum("cmn,cmn->cn", full, full)

    def basis_matrices(self, cs: np.ndarray) -> np.ndarray:
        """`[C, m, m]` the basis matrices B (columns of A at the basic keys) of chains cs."""
        if self.shared:
            return self.a_one[:, self.basic[cs]].transpose(1, 0, 2)
        return np.take_along_axis(self.aq[cs], self.basic[cs][:, None, :], axis=2)

    def refined(self, cs: np.ndarray, ps: np.ndarray):
        """x_B and the row ps of B⁻¹ (y, yᵀB = e_p) of chains cs, each corrected by one step
        of iterative refinement against B itself, and the largest residual before it `[C]`.

        B⁻¹ drifts over the rank-one updates since the last refactor (δ = ‖I − B⁻¹B‖); one
        step leaves an error of order δ times the first one, so with residuals ≤
        `REFINE_TOL` the two vectors are as exact as from a fresh factorisation, at O(m²)
        per chain instead of the O(m³) of `refactor`."""
        bmat, binv, ar = self.basis_matrices(cs), self.binv[cs], np.arange(cs.size)
        rx = self.b[self.b_row[cs]] - np.matmul(bmat, self.xb[cs][:, :, None])[:, :, 0]
        x = self.xb[cs] + np.matmul(binv, rx[:, :, None])[:, :, 0]
        y = binv[ar, ps]
        ry = -np.matmul(y[:, None, :], bmat)[:, 0]
        ry[ar, ps] += 1.0
        y = y + np.matmul(ry[:, None, :], binv)[:, 0]
        return x, y, np.maximum(np.abs(rx).max(1), np.abs(ry).max(1))

    def move(self, c: int, q: int) -> bool:
        """Chain c keeps its objective and takes row q; True: reload x_B = B⁻¹ b_q.

        Rows sharing A may see nested key sets (causal rows, walked in increasing order).
        The old optimal basis is dual feasible over the old row's keys only. So when row q
        adds keys, they are unblocked at once, but x_B keeps the old row's b (`b_row`):
        the basis is primal feasible there, and primal pivots first make it optimal over
        all of row q's keys ("catching up"); then b_q is loaded, the basis is dual feasible
        over every key, and dual pivots finish. (Blocking the new keys until x_B ≥ 0
        instead fails whenever b_q needs them: the restricted LP is infeasible.)"""
        new = self.row_allowed[q] & ~self.row_allowed[self.row[c]]
        self.row[c] = q
        if new.any():
            self.blocked[c] &= ~new
            return False
        self.b_row[c] = q
        return True

    def catching_up(self) -> np.ndarray:
        """`[C]` bool: chains whose x_B still solves an earlier row's b (see `move`)."""
        return self.b_row != self.row

    def reload(self, cs: np.ndarray) -> None:
        """x_B = B⁻¹ b for each chain's current row."""
        self.xb[cs] = np.matmul(self.binv[cs], self.b[self.b_row[cs]][:, :, None])[:, :, 0]

    def tableau_rows(self, ps: np.ndarray, cs: np.ndarray | None = None) -> np.ndarray:
        """`[C, n]` tableau rows (B⁻¹ A)[p] of the chains cs (default: every chain)."""
        cs = np.arange(ps.size) if cs is None else cs
        return self.times_a(self.binv[cs, ps][:, None], cs)[:, 0]

    def times_a(self, rows: np.ndarray, cs: np.ndarray | None = None) -> np.ndarray:
        """`[C, k, n]` rows `[C, k, m]` times each chain's A (chains cs, default all)."""
        if self.shared:  # one GEMM for all chains
            return (rows.reshape(-1, self.m) @ self.a_one).reshape(*rows.shape[:2], self.n)
        return np.matmul(rows, self.aq if cs is None else self.aq[cs])

    def columns(self, ks: np.ndarray) -> np.ndarray:
        """`[C, m]` tableau columns B⁻¹ A_k of every chain."""
        cols = self.a_cols[ks] if self.shared else self.aq[np.arange(ks.size), :, ks]
        return np.matmul(self.binv, cols[:, :, None])[:, :, 0]

    def pivot(self, ps, ks, col, go, alpha=None, have=None) -> None:
        """Chains `go`: key ks enters at basis row ps (col = B⁻¹ A_k). Every other chain
        must come with col = e_ps and ks = its basic key at ps (the no-op pivot). alpha
        `[C, n]`: the pivot rows (B⁻¹A)[ps] already computed for the chains `have`."""
        ar = np.arange(ps.size)
        piv = col[ar, ps]
        # B⁻ᵀ α_q, with the old B, for the Goldfarb–Reid update of γ
        v = np.matmul(col[:, None, :], self.binv)[:, 0] if self.steepest else None
        theta = self.xb[ar, ps] / piv
        self.xb -= theta[:, None] * col
        self.xb[ar, ps] = theta
        prow = self.binv[ar, ps] / piv[:, None]
        # B⁻¹ −= col ⊗ prow in place, one pass over the chains' inverses (no m×m temporary)
        torch.from_numpy(self.binv).baddbmm_(
            torch.from_numpy(col)[:, :, None], torch.from_numpy(prow)[:, None, :], alpha=-1.0
        )
        self.binv[ar, ps] = prow
        # ρ = α_r / α_rq, the new tableau row r, and Aᵀv: one GEMM for the rows not at hand
        av = None
        if have is None or not have.any():
            if v is None:
                rho = self.times_a(prow[:, None])[:, 0]
            elif self.shared:  # [2C, m] @ A, so that ρ and Aᵀv come out contiguous
                rho, av = (np.concatenate([prow, v]) @ self.a_one).reshape(2, ps.size, self.n)
            else:
                both = self.times_a(np.stack([prow, v], 1))
                rho, av = both[:, 0], both[:, 1]
        else:  # (aq[cs] would copy an unshared A: only for the few chains it needs)
            rho = np.empty((ps.size, self.n))
            need = ar[~have]
            rho[need] = self.times_a(prow[need][:, None], need)[:, 0]
            rho[have] = alpha[have] / piv[have][:, None]
            av = None if v is None else self.times_a(v[:, None])[:, 0]
        self._update_pricing(ps, ks, col, go, rho, av)
        cs, ps, ks = ar[go], ps[go], ks[go]
        leaving = self.basic[cs, ps]
        self.basic[cs, ps] = ks
        self.pos[cs, leaving] = -1
        self.pos[cs, ks] = ps
        self.blocked[cs, leaving] = ~self.row_allowed[self.row[cs], leaving]
        self.blocked[cs, ks] = True
        self.since[cs] += 1

    def _update_pricing(self, ps, ks, col, go, rho, av) -> None:
        """d and the steepest-edge weights γ after the pivot of chains `go`.

        rho, av `[C, n]`: ρ = α_r / α_rq (the new tableau row r) and Aᵀ B⁻ᵀ α_q. For every
        key k: d_k −= d_q ρ_k, and γ_k = 1 + ‖B⁻¹A_k‖² follows Goldfarb and Reid,
        γ_k −= 2 ρ_k (A_kᵀ B⁻ᵀ α_q) − ρ_k² γ_q (at least 1 + ρ_k²), with γ_q = 1 + ‖α_q‖²
        taken exactly from the column at hand: that keeps the update from amplifying its
        own round-off (measured: 3e-8 relative error after 50 pivots otherwise, 1e-14 so).
        The leaving key gets γ_q / α_rq²."""
        ar = np.arange(ps.size)
        dq = np.where(go, self.d[ar, ks], 0.0)
        self.d -= dq[:, None] * rho
        cs = ar[go]
        self.d[cs, ks[go]] = 0.0
        if av is None:
            return
        wq = 1.0 + np.einsum("cm,cm->c", col, col)
        av *= -2.0
        av += wq[:, None] * rho
        av *= rho  # ρ²γ_q − 2ρ(A_kᵀv)
        av += self.w
        rho *= rho
        rho += 1.0
        np.maximum(av, rho, out=av)
        if go.all():
            self.w[:] = av
        else:
            np.copyto(self.w, av, where=go[:, None])
        piv = col[cs, ps[go]]
        self.w[cs, self.basic[cs, ps[go]]] = wq[go] / (piv * piv)

    def vertex(self, c: int) -> np.ndarray:
        x = np.zeros(self.n)
        x[self.basic[c]] = np.maximum(self.xb[c], 0.0)
        return x
