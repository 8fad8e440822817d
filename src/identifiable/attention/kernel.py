"""Compiled pieces of one simplex chain of `interval_simplex` (numba): pricing, ratio tests,
pivots, refactors, certificates and the bookkeeping of settled LPs.

A chain keeps one basis of P = {x ≥ 0 : A x = b_row} (docs/certified_attention.md) and
walks through LP tasks (row, key j, sense s: maximise s·x_j), each warm-started from the
basis the previous task left. Its state is a tuple of arrays (one slot of the lock step in
`lockstep.py`):

    ch = (basis [m], pos [n], blocked [n], B⁻¹ [m, m], x_B [m], d [n], γ [n], st [N_ST],
          vm [4, m], vn [3, n])

pos[k] is k's row in the basis (−1: non-basic); blocked keys are basic or outside the row's
key set; d are the reduced costs of the current objective (0 at basic keys), γ the
steepest-edge weights 1 + ‖B⁻¹A_k‖² of the basis; st holds the integers below; vm and vn
are the chain's scratch vectors (vm[0:2] the new row of B⁻¹ and v, vm[2] the entering
column, vm[3] the primal ratios; vn[0:2] ρ and Aᵀv, vn[1] also the dual ratios and the
primal scores, vn[2] the dual pivot row; `refine` borrows vm and vn[2] between pivots). Each routine is written out as loops over contiguous rows, so that a
pivot reads B⁻¹ once for the entering column and once (with the write) for the rank-one
update, and the element-wise work between the products stays in registers: the numpy
engine this replaces spent more than half of each step in such passes.
"""

from __future__ import annotations

import numba
import numpy as np

from identifiable.attention.crossover import PIVOT_TOL

# Reassociation and FMA contraction let the dot products vectorise. No "nnan"/"ninf":
# the ratio tests rely on ±inf (error_model="numpy": x / 0 is ±inf, not an exception).
# Nothing here is cached on its own: `lockstep.run_chains` is, with all of this compiled
# into it, under a key that covers this file's source (see `lockstep`).
FASTMATH = {"reassoc", "contract", "nsz"}
jit = numba.njit(nogil=True, error_model="numpy", fastmath=FASTMATH)

OPT_TOL = 1e-11  # largest reduced cost accepted at an optimum (bounds the gap, simplex.py)
FEAS_TOL = 1e-10  # basic values down to −FEAS_TOL count as 0 (round-off)
# Largest residual (‖b − B x_B‖∞, ‖e_p − Bᵀy‖∞) before refinement for which an optimum is
# certified on refined values (`refined`); beyond it, a refactor.
REFINE_TOL = 1e-8

# st: the chain's place (CHAIN, PTR: its next task), its row and the row whose b gives x_B
# (ROW, BROW: they differ while catching up), its objective (J, S), whether d is fresh,
# pivots in this LP (STEPS), consecutive degenerate pivots (DEGEN), pivots since the last
# refactor (SINCE), and the lock step's per-step decisions (WAIT: the LP goes to HiGHS;
# RESTART: it came back; MODE, ENTER, LEAVE, ZROW: this step's pivot), and the updates of
# d from single-precision products since d was last computed in double (DRIFT), and the
# keys its row can use lie below SPAN (row order: the row's last key + 1, so that a nested
# causal row of k keys prices and multiplies k columns of A, not n; key order, whose chains
# move to rows with more keys: n). d, γ and the products are kept for keys below SPAN only.
CHAIN, PTR, ROW, BROW, J, S, FRESH, STEPS, DEGEN, SINCE = range(10)
WAIT, RESTART, MODE, ENTER, LEAVE, ZROW, DRIFT, SPAN = range(10, 18)
N_ST = 18
# Shared products with A run in single precision (`lockstep`): they only steer the pivots
# (d and γ), never a bound, which is certified on double-precision values (`refined`). d is
# recomputed in double when pricing finds no key that gains more than DRIFT_GAIN a unit, and
# after DRIFT_STEPS updates, so that the round-off of single precision (~1e-7 of ‖ρ‖) neither
# ends an LP nor steers more than a few pivots.
DRIFT_GAIN = 1e-6
DRIFT_STEPS = 32
# cfg: the pivot cap per LP, pivots between refactors, steepest-edge pricing (else
# Dantzig's), row order (chains draw keys from their row's pool: 1 basic keys first,
# 2 in index order), certify optima on refined values (else refactor at every optimum),
# and the widest SPAN of a lock step from which its shared second product runs in single
# precision (when the problem carries a single-precision A).
CAP, REFACTOR, STEEP, POOL, REFINE, SINGLE = range(6)


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
    """x_B = B⁻¹ b for the row whose right-hand side the chain holds (st[BROW])."""
    binv, xb, st = ch[3], ch[4], ch[7]
    bq = b[st[BROW]]
    for i in range(binv.shape[0]):
        acc = 0.0
        for c in range(binv.shape[1]):
            acc += binv[i, c] * bq[c]
        xb[i] = acc


@jit
def refactor(a, a_t, b, ch, work, weights):
    """B⁻¹ afresh from the basis indices, and x_B (no accumulated round-off); with
    `weights`, γ_k = 1 + ‖B⁻¹A_k‖² exactly (steepest edge only). False: B is singular."""
    basis, binv, w, st, vn = ch[0], ch[3], ch[6], ch[7], ch[9]
    m = binv.shape[0]
    for i in range(m):
        col = a_t[basis[i]]
        for r in range(m):
            work[r, i] = col[r]
    if not invert(work, binv):
        return False
    reload(b, ch)
    st[SINCE] = 0
    st[FRESH] = 0
    if weights:
        row, span = vn[2], st[SPAN]
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
    basis, pos, binv, d, st = ch[0], ch[1], ch[3], ch[5], ch[7]
    j, s, span = st[J], st[S], st[SPAN]
    p = pos[j]
    if p >= 0:
        times_a(binv[p], a, d, span)
        for k in range(span):
            d[k] *= -s
        for i in range(basis.size):
            d[basis[i]] = 0.0
    else:
        d[:span] = 0.0
        d[j] = s
    st[FRESH] = 1
    st[DRIFT] = 0


@jit
def price(ch, slow, steep):
    """Primal entering key: the largest d_k² / γ_k (steepest edge) or d_k (Dantzig) over
    unblocked keys with d_k > OPT_TOL; the lowest such key when slow (Bland); −1: optimal.
    The scores go to vn[1] (free in phase 1 of a step) in one branch-free pass that
    vectorises, and the first key with the best score is taken: the same key as a scan
    that keeps the first strict maximum. That scan, with a branch and a division per key,
    took 18 % of the time of the 32 widest causal rows at n = 512; this takes 2 %."""
    blocked, d, w, sc, span = ch[2], ch[5], ch[6], ch[9][1], ch[7][SPAN]
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


@jit
def primal_ratio(ch, col, slow):
    """Leaving row of a primal pivot (ties to the largest pivot, the lowest basic key when
    slow), −1 if no row bounds the step; counts degenerate pivots."""
    basis, xb, st, ratios = ch[0], ch[4], ch[7], ch[8][3]
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
    st[DEGEN] = st[DEGEN] + 1 if best <= 1e-14 else 0
    return r


@jit
def dual_leave(ch, slow):
    """Leaving row of a dual pivot: the largest x_p² / ‖e_pᵀB⁻¹‖² over x_p < −FEAS_TOL (dual
    steepest edge, exact weights); the lowest basic key when slow."""
    basis, binv, xb = ch[0], ch[3], ch[4]
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


@jit
def dual_enter(ch, alpha, slow):
    """Entering key of a dual pivot on tableau row alpha: the smallest d_k / α_k over
    unblocked α_k < −PIVOT_TOL (ties to the largest |α_k|, the lowest key when slow).
    The ratios go to vn[1] (free during a dual pivot's choice) in one branch-free pass."""
    blocked, d, ratios, span = ch[2], ch[5], ch[9][1], ch[7][SPAN]
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


@jit
def pivot_basis(ch, r, col, steep):
    """First half of a pivot at basis row r (col = B⁻¹A_q): x_B and B⁻¹ −= col ⊗ prow (the
    new row r of B⁻¹, prow = (B⁻¹)_r / α_rq, into vm[0]). With steepest edge the same pass
    accumulates v = B⁻ᵀα_q with the old B⁻¹ (into vm[1]), four rows at a time so that v is
    loaded and stored once per four rows (2.7 µs against 4.0 µs a row at a time, m = 129);
    without it, a row at a time is fastest (2.2 µs against 3.3 µs in blocks of four)."""
    binv, xb, vm = ch[3], ch[4], ch[8]
    prow, v = vm[0], vm[1]
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


@jit
def pivot_pricing(allowed, ch, r, q, col, rho, av, steep):
    """Second half of the pivot (key q enters at row r), given ρ = (new B⁻¹)[r]·A and, for
    steepest edge, Aᵀv: d −= d_q ρ; γ_k by Goldfarb and Reid (γ_q exactly from col, at least
    1 + ρ_k², the leaving key γ_q / α_rq²); the basis indices."""
    basis, pos, blocked, d, w, st = ch[0], ch[1], ch[2], ch[5], ch[6], ch[7]
    dq, span = d[q], st[SPAN]
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
    pos[leaving] = -1
    pos[q] = r
    blocked[leaving] = not allowed[st[ROW], leaving]
    blocked[q] = True
    st[SINCE] += 1


@jit
def refine(a_t, b, ch):
    """x_B and y = e_pᵀB⁻¹ (p the basis row of j) each corrected by one step of iterative
    refinement against B itself, into vm[0] and vm[1]: x ← x + B⁻¹(b − Bx), y ← y +
    (e_p − Bᵀy)ᵀB⁻¹. With B⁻¹ off by δ, one step leaves an error of order δ times the
    first. Returns the larger residual before the step (∞ when j is not basic)."""
    basis, pos, binv, xb, st, vm = ch[0], ch[1], ch[3], ch[4], ch[7], ch[8]
    m = binv.shape[0]
    p = pos[st[J]]
    if p < 0:
        return np.inf
    x, y, rx, ry = vm[0], vm[1], vm[2], vm[3]
    rx[:] = b[st[BROW]]
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
    basis, blocked, xb, d, st, vm, vn = ch[0], ch[2], ch[4], ch[5], ch[7], ch[8], ch[9]
    if refine(a_t, b, ch) > REFINE_TOL:
        return False
    x, y = vm[0], vm[1]
    for i in range(x.size):
        if x[i] < -FEAS_TOL:
            return False
    dd, s, span = vn[2], st[S], st[SPAN]
    times_a(y, a, dd, span)
    for k in range(span):
        dd[k] *= -s
        if not blocked[k] and dd[k] > OPT_TOL:
            return False
    xb[:] = x
    d[:span] = dd[:span]
    for i in range(basis.size):
        d[basis[i]] = 0.0
    st[FRESH] = 1
    st[DRIFT] = 0
    return True


@jit
def settle(allowed, bnd, ch, vert, nvert, value):
    """The current LP is optimal with `value` at the chain's (feasible) vertex: record the
    bound and what the vertex proves (its non-basic keys are 0; its basic values are seen),
    and the vertex itself as a witness and certificate (its basis) for every nvert[2]-th
    LP settled (nvert[1] counts them) while `vert` has room (nvert[0]: used)."""
    lower, upper, zero_seen, seen_max, _, start, solved, _ = bnd
    basis, pos, xb, st = ch[0], ch[1], ch[4], ch[7]
    q, j = st[ROW], st[J]
    if st[S] > 0:
        upper[q, j] = value
    else:
        lower[q, j] = value
    solved[q] += 1
    for k in range(pos.size):
        if pos[k] < 0 and allowed[q, k]:
            zero_seen[q, k] = True
    for i in range(basis.size):
        seen_max[q, basis[i]] = max(seen_max[q, basis[i]], xb[i])
    start[q] = basis
    vrow, vkey, vsense, vbasis, vx = vert
    t = nvert[0]
    if t < vrow.size and nvert[1] % nvert[2] == 0:  # every nvert[2]-th LP, while room lasts
        vrow[t], vkey[t], vsense[t] = q, j, st[S]
        vbasis[t] = basis
        vx[t] = xb
        nvert[0] = t + 1
    nvert[1] += 1
    st[PTR] += 1
    st[STEPS] = 0
    st[DEGEN] = 0


@jit
def pool_next(ch, pool, s, basic_first):
    """Row order: the next open key of the row's pool, the open key basic at the current
    vertex with the largest x_k when maximising (smallest when minimising), since its LP
    starts where x_k already is high (low); else (or without `basic_first`) the lowest
    open key; −1: none left."""
    basis, xb = ch[0], ch[4]
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
def advance(b, allowed, bnd, ch, tasks, row_order):
    """Move the chain to its next task that no visited point settles already (st[J] = −1:
    none left). Under the same objective a new row keeps the basis: keys the row adds are
    unblocked at once; without new keys x_B = B⁻¹b_q at once, else the chain first catches
    up (primal pivots at the old b, see `lockstep`)."""
    lower, upper, zero_seen, seen_max, total = bnd[0], bnd[1], bnd[2], bnd[3], bnd[4]
    pos, blocked, st = ch[1], ch[2], ch[7]
    crow, csense, toffs, trow, tkey, pool = tasks
    chain = st[CHAIN]
    while True:
        if row_order:
            q, s = crow[chain], csense[chain]
            j = pool_next(ch, pool[q], s, row_order == 1)
        elif st[PTR] < toffs[chain + 1]:
            q, j, s = trow[st[PTR]], tkey[st[PTR]], csense[chain]
        else:
            j = -1
        if j < 0:
            st[J] = -1
            return
        if s > 0 and seen_max[q, j] >= total[q] - 1e-12:
            upper[q, j] = total[q]
        elif s < 0 and zero_seen[q, j]:
            lower[q, j] = 0.0
        else:
            if st[J] != j or st[S] != s:  # d does not depend on b: kept across rows
                st[J], st[S], st[FRESH] = j, s, 0
            if q != st[ROW]:
                old, new = st[ROW], False
                st[ROW] = q
                for k in range(pos.size):
                    if allowed[q, k] and not allowed[old, k]:
                        blocked[k] = False
                        new = True
                if not new:
                    st[BROW] = q
                    reload(b, ch)
            return
        st[PTR] += 1
