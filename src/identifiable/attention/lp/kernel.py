"""Compiled pieces of one simplex chain of `bound_keys` (numba): pricing, ratio tests,
pivots, refactors, certificates and the bookkeeping of settled LPs, on a chain's named
state (`state.Chain`).

Each routine is written out as loops over contiguous rows, so that a pivot reads B⁻¹ once
for the entering column and once (with the write) for the rank-one update, and the
element-wise work between the products stays in registers (benchmarks/records/engine.md).
"""

from __future__ import annotations

import numba
import numpy as np

from identifiable.attention.lp.crossover import PIVOT_TOL

# Reassociation and FMA contraction let the dot products vectorise. No "nnan"/"ninf":
# the ratio tests rely on ±inf (error_model="numpy": x / 0 is ±inf, not an exception).
# Nothing here is cached on its own: `lockstep.run_chains` is, with all of this compiled
# into it, under a key that covers this file's source (see `lockstep`).
FASTMATH = {"reassoc", "contract", "nsz"}
jit = numba.njit(nogil=True, error_model="numpy", fastmath=FASTMATH)
# Per-pivot functions on a whole `state.Chain` are inlined: a call passes all its arrays
# field by field, at a cost per call (benchmarks/bench_chain_call.py, records/engine.md).
jit_inline = numba.njit(inline="always", nogil=True, error_model="numpy", fastmath=FASTMATH)

OPT_TOL = 1e-11  # largest reduced cost accepted at an optimum (bounds the gap, `solve.OPT_TOL`)
FEAS_TOL = 1e-10  # basic values down to −FEAS_TOL count as 0 (round-off)
# Largest residual (‖b − B x_B‖∞, ‖e_p − Bᵀy‖∞) before refinement for which an optimum is
# certified on refined values (`refined`); beyond it, a refactor.
REFINE_TOL = 1e-8


@jit
def invert(bmat, out):
    """out = bmat⁻¹ by LAPACK's LU (0.31 ms at m = 129, against 1.1 ms for Gauss–Jordan
    elimination compiled by numba); False if bmat is singular."""
    try:
        out[:, :] = np.linalg.inv(bmat)
    except Exception:
        return False
    return True


@jit
def times_a(y, a, out, cols):
    """out[:cols] = yᵀA[:, :cols] for y `[m]`, A `[m, n]`: four rows of A per pass over out
    (1.5× the speed of one row per pass at m = 129, n = 512)."""
    out[:cols] = 0.0
    m, i = a.shape[0], 0
    while i + 4 <= m:
        y0, y1, y2, y3 = y[i], y[i + 1], y[i + 2], y[i + 3]
        for k in range(cols):
            out[k] += y0 * a[i, k] + y1 * a[i + 1, k] + y2 * a[i + 2, k] + y3 * a[i + 3, k]
        i += 4
    for r in range(i, m):
        yr = y[r]
        for k in range(cols):
            out[k] += yr * a[r, k]


@jit
def column(binv, a_t, q, col):
    """col = B⁻¹ A_q (a_t `[n, m]` holds A's columns contiguously), four rows at a time."""
    aq = a_t[q]
    m, i = binv.shape[0], 0
    while i + 4 <= m:
        s0 = s1 = s2 = s3 = 0.0
        for c in range(m):
            x = aq[c]
            s0 += binv[i, c] * x
            s1 += binv[i + 1, c] * x
            s2 += binv[i + 2, c] * x
            s3 += binv[i + 3, c] * x
        col[i], col[i + 1], col[i + 2], col[i + 3] = s0, s1, s2, s3
        i += 4
    for r in range(i, m):
        acc = 0.0
        for c in range(m):
            acc += binv[r, c] * aq[c]
        col[r] = acc


@jit
def reload(b, ch):
    """x_B = B⁻¹ b for the row whose right-hand side the chain holds (state.brow)."""
    binv, xb = ch.binv, ch.xb
    bq = b[ch.state.brow]
    for i in range(binv.shape[0]):
        acc = 0.0
        for c in range(binv.shape[1]):
            acc += binv[i, c] * bq[c]
        xb[i] = acc


@jit
def refactor(a, a_t, b, ch, work, weights):
    """B⁻¹ afresh from the basis indices, and x_B (no accumulated round-off); with
    `weights`, γ_k = 1 + ‖B⁻¹A_k‖² exactly (steepest edge only). False: B is singular."""
    basis, binv, w, st = ch.basis, ch.binv, ch.gamma, ch.state
    m = binv.shape[0]
    for i in range(m):
        col = a_t[basis[i]]
        for r in range(m):
            work[r, i] = col[r]
    if not invert(work, binv):
        return False
    reload(b, ch)
    st.since = 0
    st.fresh = 0
    if weights:
        row, span = ch.trow, st.span
        w[:span] = 1.0
        for i in range(m):
            times_a(binv[i], a, row, span)
            for k in range(span):
                w[k] += row[k] * row[k]
    return True


@jit
def fresh_d(a, ch):
    """d of maximising s·x_j at the current basis: −s (B⁻¹A)[p_j] if j is basic (0 at
    basic keys), else s at j and 0 elsewhere."""
    basis, d, st = ch.basis, ch.d, ch.state
    j, s, span = st.j, st.s, st.span
    p = ch.pos[j]
    if p >= 0:
        times_a(ch.binv[p], a, d, span)
        for k in range(span):
            d[k] *= -s
        for i in range(basis.size):
            d[basis[i]] = 0.0
    else:
        d[:span] = 0.0
        d[j] = s
    st.fresh = 1
    st.drift = 0


@jit_inline
def price(ch, slow, steep):
    """Primal entering key: the largest d_k² / γ_k (steepest edge) or d_k (Dantzig) over
    unblocked keys with d_k > OPT_TOL; the lowest such key when slow (Bland); −1: optimal.
    The scores go to ch.scores in one branch-free pass that vectorises, and the first key
    with the best score is taken: the key a scan keeping the first strict maximum takes."""
    blocked, d, w, sc, span = ch.blocked, ch.d, ch.gamma, ch.scores, ch.state.span
    if slow:
        for k in range(span):
            if d[k] > OPT_TOL and not blocked[k]:
                return k
        return -1
    for k in range(span):
        dk = d[k]
        s = dk * dk / w[k] if steep else dk  # γ_k ≥ 1: the division is always defined
        sc[k] = s if (dk > OPT_TOL) & (not blocked[k]) else 0.0
    # Scores are ≥ 0, and non-negative doubles order as their bits do as integers: an
    # integer maximum vectorises, where a float one would need fastmath's "no NaNs".
    bits = sc.view(np.int64)
    best = 0
    for k in range(span):
        best = max(best, bits[k])
    if best == 0:
        return -1
    for k in range(span):
        if bits[k] == best:
            return k
    return -1


@jit_inline
def primal_ratio(ch, col, slow):
    """Leaving row of a primal pivot (ties to the largest pivot, the lowest basic key when
    slow), −1 if no row bounds the step; counts degenerate pivots."""
    basis, xb, ratios = ch.basis, ch.xb, ch.ratios
    for i in range(col.size):  # branch-free (the division unguarded), so that it vectorises
        ok = col[i] > PIVOT_TOL
        ratio = max(xb[i], 0.0) / (col[i] if ok else 1.0)
        ratios[i] = ratio if ok else np.inf
    bits = ratios.view(np.int64)  # ratios are ≥ 0 (or +inf): ordered as integers (`price`)
    low = bits[0]
    for i in range(col.size):
        low = min(low, bits[i])
    best = np.inf
    for i in range(col.size):
        if bits[i] == low:
            best = ratios[i]
            break
    if best == np.inf:
        return -1
    r = -1
    for i in range(col.size):
        if ratios[i] <= best + 1e-12 and (
            r < 0 or (basis[i] < basis[r] if slow else col[i] > col[r])
        ):
            r = i
    ch.state.degen = ch.state.degen + 1 if best <= 1e-14 else 0
    return r


@jit_inline
def dual_leave(ch, slow):
    """Leaving row of a dual pivot: the largest x_p² / ‖e_pᵀB⁻¹‖² over x_p < −FEAS_TOL (dual
    steepest edge, exact weights); the lowest basic key when slow."""
    basis, binv, xb = ch.basis, ch.binv, ch.xb
    p, score = -1, -1.0
    for i in range(xb.size):
        if xb[i] < -FEAS_TOL:
            if slow:
                if p < 0 or basis[i] < basis[p]:
                    p = i
                continue
            nrm = 0.0
            for c in range(binv.shape[1]):
                nrm += binv[i, c] * binv[i, c]
            sc = xb[i] * xb[i] / nrm
            if sc > score:
                p, score = i, sc
    return p


@jit_inline
def dual_enter(ch, alpha, slow):
    """Entering key of a dual pivot on tableau row alpha: the smallest d_k / α_k over
    unblocked α_k < −PIVOT_TOL (ties to the largest |α_k|, the lowest key when slow).
    The ratios go to ch.scores in one branch-free pass."""
    blocked, d, ratios, span = ch.blocked, ch.d, ch.scores, ch.state.span
    best = np.inf
    for k in range(span):
        ok = (alpha[k] < -PIVOT_TOL) & (not blocked[k])
        ratios[k] = min(d[k], 0.0) / alpha[k] if ok else np.inf
        best = min(best, ratios[k])
    if best == np.inf:
        return -1
    e = -1
    for k in range(span):
        if ratios[k] <= best + 1e-12:
            if slow:
                return k
            if e < 0 or alpha[k] < alpha[e]:
                e = k
    return e


@jit_inline
def pivot_basis(ch, r, col, steep):
    """First half of a pivot at basis row r (col = B⁻¹A_q): x_B and B⁻¹ −= col ⊗ prow (prow
    = (B⁻¹)_r / α_rq, the new row r). With steepest edge the same pass accumulates v =
    B⁻ᵀα_q with the old B⁻¹, four rows at a time so that v is loaded and stored once per
    four rows; without it, a row at a time is fastest (benchmarks/records/engine.md)."""
    binv, xb, prow, v = ch.binv, ch.xb, ch.prow, ch.v
    m = binv.shape[0]
    piv = col[r]
    theta = xb[r] / piv
    for i in range(m):
        xb[i] -= theta * col[i]
    xb[r] = theta
    cr = col[r] if steep else 0.0
    for c in range(m):
        prow[c] = binv[r, c] / piv
        v[c] = cr * binv[r, c]
        binv[r, c] = 0.0  # row r takes prow below; the pass must not add col_r·(B⁻¹)_r twice
    if not steep:
        for i in range(m):
            ci = col[i]
            for c in range(m):
                binv[i, c] -= ci * prow[c]
        binv[r] = prow
        return
    i = 0
    while i + 4 <= m:
        c0, c1, c2, c3 = col[i], col[i + 1], col[i + 2], col[i + 3]
        for c in range(m):
            x0, x1, x2, x3, p = binv[i, c], binv[i + 1, c], binv[i + 2, c], binv[i + 3, c], prow[c]
            v[c] += c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3
            binv[i, c] = x0 - c0 * p
            binv[i + 1, c] = x1 - c1 * p
            binv[i + 2, c] = x2 - c2 * p
            binv[i + 3, c] = x3 - c3 * p
        i += 4
    for k in range(i, m):
        ck = col[k]
        for c in range(m):
            x = binv[k, c]
            v[c] += ck * x
            binv[k, c] = x - ck * prow[c]
    binv[r] = prow


@jit_inline
def pivot_pricing(allowed, ch, r, q, col, rho, av, steep):
    """Second half of the pivot (key q enters at row r), given ρ = (new B⁻¹)[r]·A and, for
    steepest edge, Aᵀv: d −= d_q ρ; γ_k by Goldfarb and Reid (γ_q exactly from col, at least
    1 + ρ_k², the leaving key γ_q / α_rq²); the basis indices."""
    basis, d, w, st = ch.basis, ch.d, ch.gamma, ch.state
    dq, span = d[q], st.span
    for k in range(span):
        d[k] -= dq * rho[k]
    d[q] = 0.0
    leaving = basis[r]
    if steep:
        wq = 1.0
        for i in range(col.size):
            wq += col[i] * col[i]
        for k in range(span):
            rk = rho[k]
            g = w[k] + rk * (rk * wq - 2.0 * av[k])
            w[k] = max(g, 1.0 + rk * rk)
        w[leaving] = wq / (col[r] * col[r])
    basis[r] = q
    ch.pos[leaving] = -1
    ch.pos[q] = r
    ch.blocked[leaving] = not allowed[st.row, leaving]
    ch.blocked[q] = True
    st.since += 1


@jit
def refine(a_t, b, ch):
    """x_B and y = e_pᵀB⁻¹ (p the basis row of j) each corrected by one step of iterative
    refinement against B itself, into ch.xr and ch.yr: x ← x + B⁻¹(b − Bx), y ← y +
    (e_p − Bᵀy)ᵀB⁻¹. With B⁻¹ off by δ, one step leaves an error of order δ times the
    first. Returns the larger residual before the step (∞ when j is not basic)."""
    basis, binv, xb = ch.basis, ch.binv, ch.xb
    m = binv.shape[0]
    p = ch.pos[ch.state.j]
    if p < 0:
        return np.inf
    x, y, rx, ry = ch.xr, ch.yr, ch.rx, ch.ry
    rx[:] = b[ch.state.brow]
    for c in range(m):  # rx = b − B x_B
        col, xc = a_t[basis[c]], xb[c]
        for i in range(m):
            rx[i] -= col[i] * xc
    resid = 0.0
    for i in range(m):
        resid = max(resid, abs(rx[i]))
        acc = 0.0
        for c in range(m):
            acc += binv[i, c] * rx[c]
        x[i] = xb[i] + acc
    for i in range(m):  # ry = e_p − Bᵀy with y = e_pᵀB⁻¹
        col = a_t[basis[i]]
        acc = 0.0
        for c in range(m):
            acc += col[c] * binv[p, c]
        ry[i] = (1.0 if i == p else 0.0) - acc
        resid = max(resid, abs(ry[i]))
    y[:] = binv[p]
    for i in range(m):
        for c in range(m):
            y[c] += ry[i] * binv[i, c]
    return resid


@jit
def refined(a, a_t, b, ch):
    """Whether the chain's optimum holds on refined values (`refine`; O(m²), against the
    O(m³) of a refactor): residual before refinement ≤ REFINE_TOL, refined x_B ≥ −FEAS_TOL,
    reduced costs from the refined row ≤ OPT_TOL on unblocked keys. If so, x_B and d take
    those values."""
    if refine(a_t, b, ch) > REFINE_TOL:
        return False
    x, st = ch.xr, ch.state
    for i in range(x.size):
        if x[i] < -FEAS_TOL:
            return False
    dd, s, span = ch.trow, st.s, st.span
    times_a(ch.yr, a, dd, span)
    for k in range(span):
        dd[k] *= -s
        if not ch.blocked[k] and dd[k] > OPT_TOL:
            return False
    ch.xb[:] = x
    ch.d[:span] = dd[:span]
    for i in range(ch.basis.size):
        ch.d[ch.basis[i]] = 0.0
    st.fresh = 1
    st.drift = 0
    return True


@jit
def settle(allowed, shared, ch, certs, counters, value):
    """The current LP is optimal with `value` at the chain's (feasible) vertex: record the
    bound and what the vertex proves (its non-basic keys are 0; its basic values are seen),
    and the vertex as a witness and certificate (its basis) for every counters.stride-th
    LP settled while `certs` has room."""
    basis, xb, st = ch.basis, ch.xb, ch.state
    q, j = st.row, st.j
    if st.s > 0:
        shared.upper[q, j] = value
    else:
        shared.lower[q, j] = value
    shared.solved[q] += 1
    for k in range(ch.pos.size):
        if ch.pos[k] < 0 and allowed[q, k]:
            shared.zero_seen[q, k] = True
    for i in range(basis.size):
        shared.seen_max[q, basis[i]] = max(shared.seen_max[q, basis[i]], xb[i])
    shared.start[q] = basis
    t = counters.kept
    if t < certs.rows.size and counters.settled % counters.stride == 0:
        certs.rows[t], certs.keys[t], certs.senses[t] = q, j, st.s
        certs.bases[t] = basis
        certs.values[t] = xb
        counters.kept = t + 1
    counters.settled += 1
    st.ptr += 1
    st.steps = 0
    st.degen = 0


@jit
def pool_next(ch, pool, s, basic_first):
    """Row order: the next open key of the row's pool, the open key basic at the current
    vertex with the largest x_k when maximising (smallest when minimising), since its LP
    starts where x_k already is high (low); else (or without `basic_first`) the lowest
    open key; −1: none left."""
    basis, xb = ch.basis, ch.xb
    best, score = -1, -np.inf
    for i in range(basis.size if basic_first else 0):
        k = basis[i]
        if pool[k]:
            sc = xb[i] if s > 0 else -xb[i]
            if sc > score:
                best, score = k, sc
    if best < 0:
        for k in range(pool.size):
            if pool[k]:
                best = k
                break
    if best >= 0:
        pool[best] = False
    return best


@jit
def _next_task(ch, tasks, row_order):
    """(row, key, sense) of the chain's next task (key −1: none left)."""
    st = ch.state
    if row_order:
        q, s = tasks.first_row[st.chain], tasks.sense[st.chain]
        return q, pool_next(ch, tasks.pool[q], s, row_order == 1), s
    if st.ptr < tasks.offsets[st.chain + 1]:
        return tasks.rows[st.ptr], tasks.keys[st.ptr], tasks.sense[st.chain]
    return 0, -1, 0


@jit
def advance(b, allowed, shared, ch, tasks, row_order):
    """Move the chain to its next task that no visited point settles already (state.j = −1:
    none left). Under the same objective a new row keeps the basis: keys the row adds are
    unblocked at once; without new keys x_B = B⁻¹b_q at once, else the chain first catches
    up (primal pivots at the old b, see `lockstep`)."""
    st = ch.state
    while True:
        q, j, s = _next_task(ch, tasks, row_order)
        if j < 0:
            st.j = -1
            return
        if s > 0 and shared.seen_max[q, j] >= shared.total[q] - 1e-12:
            shared.upper[q, j] = shared.total[q]
        elif s < 0 and shared.zero_seen[q, j]:
            shared.lower[q, j] = 0.0
        else:
            if st.j != j or st.s != s:  # d does not depend on b: kept across rows
                st.j, st.s, st.fresh = j, s, 0
            if q != st.row:
                old, new = st.row, False
                st.row = q
                for k in range(ch.pos.size):
                    if allowed[q, k] and not allowed[old, k]:
                        ch.blocked[k] = False
                        new = True
                if not new:
                    st.brow = q
                    reload(b, ch)
            return
        st.ptr += 1
