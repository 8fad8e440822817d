"""The lock step of `bound_keys` (numba): many simplex chains, one pivot each per step,
sharing one product with A per step.

A pivot needs products with A (m × n): the dual pivot row e_pᵀB⁻¹A before the entering key
is chosen, and after the update the new tableau row ρ = (B⁻¹)_r A and, for steepest edge,
Aᵀv. Chain by chain these are matrix–vector products that read all of A for few
multiply-adds each, bound by the cache. When the chains share A (the rows of a
bidirectional head, nested causal rows, the chains of one row), a step stacks those
vectors and makes them one matrix product, which reads A once for every chain. From a
span of `EngineOptions.single_min_keys` keys on, the second product (ρ and Aᵀv, which only
steer the pivots) is single precision, from A packed once per problem (`panels.py`); the
others go through BLAS. Everything between the products runs per chain in compiled loops
(`kernel.py`) on the chain's named state (`state.py`). A step has three phases:

1. each chain settles what is settled (an optimum is certified, a minimum proved 0, the
   next task taken) or picks its pivot: a primal pivot's entering key, column and leaving
   row; a dual pivot's leaving row (its row of B⁻¹ goes to the first product);
2. dual chains pick their entering key from the product's row; every pivoting chain
   updates x_B and B⁻¹, and its new row of B⁻¹ (and v) go to the second product;
3. every pivoting chain updates d, γ and its basis indices from that product.

Chains whose rows have their own A (windowed rows, short prefixes) take the same phases
with matrix–vector products of their own. A slot whose chain runs out of tasks takes the
next chain at once, so the step stays full until the last chains.
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from identifiable.attention.lp import kernel, panels
from identifiable.attention.lp.kernel import FEAS_TOL, PIVOT_TOL, jit, jit_inline
from identifiable.attention.lp.state import Buffers, Chain, Config

DONE, PAUSED, FALLBACK, SINGULAR = range(4)  # what `run_chains` returns
_PRIMAL, _DUAL = 1, 2  # state.mode: this step's pivot


@intrinsic
def borrowed(typingctx, arrays):
    """The (named) tuple of arrays `arrays`, each without its reference count (a null
    meminfo), for `run_chains` alone.

    numba increfs and decrefs an array's meminfo, atomically, whenever a view is taken or an
    array is passed on: about 22 pairs a pivot through the per-chain functions (the share
    it took and takes: benchmarks/records/engine.md). Views of a borrowed array carry the
    null meminfo, for which NRT's incref is a null check. The caller's arrays stay alive for
    the whole `run_chains` call, which is the only place borrowed arrays exist, and none of
    them is returned or stored."""
    if not isinstance(arrays, types.BaseTuple) or not all(
        isinstance(t, types.Array) for t in arrays
    ):
        return None

    def codegen(context, builder, sig, args):
        out = []
        for i, ty in enumerate(sig.args[0]):
            ary = context.make_array(ty)(context, builder, value=builder.extract_value(args[0], i))
            ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
            ary.parent = cgutils.get_null_value(ary.parent.type)
            out.append(ary._getvalue())
        return context.make_tuple(builder, sig.return_type, out)

    return arrays(arrays), codegen


@numba.njit(inline="always", nogil=True, error_model="numpy", fastmath=kernel.FASTMATH)
def view(slots, c):
    """Slot c's `Chain`: a view of every state array's row c (inlined: numba returns no
    record, `state`, from a function)."""
    return Chain(
        slots.basis[c],
        slots.pos[c],
        slots.blocked[c],
        slots.binv[c],
        slots.xb[c],
        slots.d[c],
        slots.gamma[c],
        slots.state[c],
        slots.prow[c],
        slots.v[c],
        slots.col[c],
        slots.ratios[c],
        slots.rho[c],
        slots.av[c],
        slots.scores[c],
        slots.trow[c],
        slots.xr[c],
        slots.yr[c],
        slots.rx[c],
        slots.ry[c],
    )


@jit
def _matrix(prob, row):
    """A `[m, n]` and Aᵀ `[n, m]` of a row (the shared one when all rows share it)."""
    i = 0 if prob.a.shape[0] == 1 else row
    return prob.a[i], prob.at[i]


@jit
def load(prob, shared, slots, c, tasks, cfg, counters, work):
    """Slot c takes the next chain not yet started, from the basis its row last settled
    (or the row's first vertex). Returns 1, 0 when no chain is left, −1: singular basis."""
    while counters.next_chain < tasks.first_row.size:
        chain = counters.next_chain
        counters.next_chain += 1
        ch = view(slots, c)
        basis, pos, blocked, st = ch.basis, ch.pos, ch.blocked, ch.state
        row = tasks.first_row[chain]
        _clear(st)
        st.chain, st.ptr, st.row, st.brow = chain, tasks.offsets[chain], row, row
        basis[:] = shared.start[row]
        pos[:] = -1
        st.span = 0 if cfg.pool != 0 else blocked.size  # see `state.STATE`
        for k in range(blocked.size):
            blocked[k] = not prob.allowed[row, k]
            if prob.allowed[row, k] and cfg.pool != 0:
                st.span = k + 1
        for i in range(basis.size):
            pos[basis[i]] = i
            blocked[basis[i]] = True
        a, a_t = _matrix(prob, row)
        if not kernel.refactor(a, a_t, prob.b, ch, work, cfg.steep != 0):
            return -1
        kernel.advance(prob.b, prob.allowed, shared, ch, tasks, cfg.pool)
        if st.j >= 0:
            return 1
    return 0


@jit
def _clear(st):
    """A chain's integers before it starts (j = −1: no task yet)."""
    st.chain = st.ptr = st.row = st.brow = st.s = st.fresh = st.steps = st.degen = 0
    st.since = st.wait = st.restart = st.mode = st.enter = st.leave = st.zrow = 0
    st.drift = st.span = 0
    st.j = -1


@jit_inline
def _settle_or_price(prob, shared, ch, tasks, certs, counters, cfg, work):
    """Phase 1 of a chain whose basis is primal feasible: settle what its vertex settles,
    or return the entering key of a primal pivot (−1: nothing to pivot this step)."""
    st, xb, pos = ch.state, ch.xb, ch.pos
    a, a_t = _matrix(prob, st.row)
    catching = st.brow != st.row  # x_B still solves an earlier row's b (see `advance`)
    slow = st.degen > 2 * xb.size
    if pos[st.j] < 0 and st.s < 0 and not catching:  # non-basic at a vertex: minimum 0
        kernel.settle(prob.allowed, shared, ch, certs, counters, 0.0)
        kernel.advance(prob.b, prob.allowed, shared, ch, tasks, cfg.pool)
        return -1
    q = kernel.price(ch, slow, cfg.steep != 0)
    if st.drift > 0 and (q < 0 or st.drift >= cfg.drift_steps or ch.d[q] <= cfg.drift_gain):
        kernel.fresh_d(a, ch)  # d in double again before it ends the LP or steers on round-off
        q = kernel.price(ch, slow, cfg.steep != 0)
    if q >= 0:
        return q
    if catching:  # optimal over the new keys at the old b: now load the row's b
        st.brow = st.row
        kernel.reload(prob.b, ch)
    elif st.since == 0 or (cfg.refine != 0 and kernel.refined(a, a_t, prob.b, ch)):
        p = pos[st.j]
        kernel.settle(prob.allowed, shared, ch, certs, counters, max(xb[p], 0.0) if p >= 0 else 0.0)
        kernel.advance(prob.b, prob.allowed, shared, ch, tasks, cfg.pool)
    elif not kernel.refactor(a, a_t, prob.b, ch, work, False):
        st.wait = 1
    return -1


@jit_inline
def decide(prob, shared, ch, tasks, certs, counters, cfg, work):
    """Phase 1 for one chain: settle what its vertex settles, or pick its pivot. Returns
    the pivot's mode (0: none this step); state.wait = 1 hands the LP to HiGHS."""
    st = ch.state
    if st.fresh == 0:
        kernel.fresh_d(_matrix(prob, st.row)[0], ch)
    infeasible = False
    for i in range(ch.xb.size):
        infeasible |= ch.xb[i] < -FEAS_TOL
    if infeasible:
        st.leave = kernel.dual_leave(ch, st.degen > 2 * ch.xb.size)
        return _DUAL
    q = _settle_or_price(prob, shared, ch, tasks, certs, counters, cfg, work)
    if q < 0:
        return 0
    col = ch.col
    kernel.column(ch.binv, _matrix(prob, st.row)[1], q, col)
    r = kernel.primal_ratio(ch, col, st.degen > 2 * ch.xb.size)
    st.steps += 1
    if r < 0 or st.steps > cfg.cap or abs(col[r]) <= PIVOT_TOL:
        st.wait = 1
        return 0
    if st.brow == st.row:  # a primal pivot between vertices of P: the leaving key is 0 there
        shared.zero_seen[st.row, ch.basis[r]] = True
    st.enter, st.leave = q, r
    kernel.pivot_basis(ch, r, col, cfg.steep != 0)  # now, while this B⁻¹ is in the cache
    return _PRIMAL


@jit_inline
def dual_pivot(prob, ch, alpha, cfg):
    """Phase 2 of a dual pivot on tableau row alpha: the entering key and column, then the
    first half of the pivot; ρ = alpha / α_rq into ch.rho. False: hand the LP to HiGHS."""
    st = ch.state
    q = kernel.dual_enter(ch, alpha, st.degen > 2 * ch.xb.size)
    st.steps += 1
    if q < 0:
        return False
    col, r = ch.col, st.leave
    kernel.column(ch.binv, _matrix(prob, st.row)[1], q, col)
    st.degen = st.degen + 1 if ch.d[q] >= -1e-14 else 0  # degenerate: d_q = 0
    if st.steps > cfg.cap or abs(col[r]) <= PIVOT_TOL:
        return False
    st.enter = q
    piv = col[r]
    for k in range(st.span):
        ch.rho[k] = alpha[k] / piv
    kernel.pivot_basis(ch, r, col, cfg.steep != 0)
    return True


@jit_inline
def queue_products(prob, ch, y, n_y, steep):
    """Phase 2, after the first half of the chain's pivot: queue its new row of B⁻¹
    (primal) and v (steepest edge) for the shared product at rows state.zrow…, or, when
    the row has its own A, take its products now. Returns the rows queued so far."""
    st = ch.state
    a = _matrix(prob, st.row)[0]
    shared = prob.a.shape[0] == 1
    st.zrow = n_y
    if st.mode == _PRIMAL:
        if shared:
            _put(ch.prow, y[n_y])
            n_y += 1
        else:
            kernel.times_a(ch.prow, a, ch.rho, st.span)
    if steep:
        if shared:
            _put(ch.v, y[n_y])
            n_y += 1
        else:
            kernel.times_a(ch.v, a, ch.av, st.span)
    return n_y


@jit
def product(y, a_t, buf, rows, cols):
    """y[:rows] · Aᵀ[:cols]ᵀ (BLAS, in y's precision) into buf, as a C-contiguous
    `[rows, cols]` array, so that a step allocates nothing."""
    out = buf[: rows * cols].reshape((rows, cols))
    np.dot(y[:rows], a_t[:cols].T, out)
    return out


@jit
def _put(x, out):
    """out = x, a row of the shared product's left factor (in single or double precision)."""
    for c in range(x.size):
        out[c] = x[c]


@jit_inline
def finish_pivot(allowed, ch, z2, steep, drift):
    """Phase 3 of a pivot whose products came from the shared product z2 (double or single
    precision): ρ of a primal pivot (and Aᵀv) from z2; a dual pivot's ρ is its tableau row
    (double). drift = 1: ρ was single precision, so d drifts (see `state.STATE`)."""
    st = ch.state
    r, q, z = st.leave, st.enter, st.zrow
    if st.mode == _PRIMAL:
        kernel.pivot_pricing(allowed, ch, r, q, ch.col, z2[z], z2[z + 1 if steep else z], steep)
        st.drift += drift
    elif steep:
        kernel.pivot_pricing(allowed, ch, r, q, ch.col, ch.rho, z2[z], steep)
    else:
        kernel.pivot_pricing(allowed, ch, r, q, ch.col, ch.rho, ch.av, steep)


@jit
def _phase1(prob, shared, slots, tasks, certs, counters, cfg, buf):
    """Phase 1 of every live slot (see the module docstring): (dual rows queued for the
    first product, the widest span among them, the widest span of all pivoting chains)."""
    is_shared = prob.a.shape[0] == 1
    n1 = s1 = s2 = 0
    for c in range(slots.state.size):
        st = slots.state[c]
        st.mode = 0
        if st.j < 0 or st.wait:
            continue
        ch = view(slots, c)
        st.mode = decide(prob, shared, ch, tasks, certs, counters, cfg, buf.work)
        if st.mode != 0:
            s2 = max(s2, st.span)
        if st.mode != _DUAL:
            continue
        st.zrow = n1
        if is_shared:
            buf.y1[n1] = ch.binv[st.leave]
            n1 += 1
            s1 = max(s1, st.span)
        else:
            kernel.times_a(ch.binv[st.leave], _matrix(prob, st.row)[0], ch.trow, st.span)
    return n1, s1, s2


@jit
def _phase2(prob, slots, cfg, buf, z1, single):
    """Phase 2: dual pivots choose on their tableau rows; every pivoting chain queues its
    second products (in single precision when `single`). Returns the rows queued."""
    is_shared, steep = prob.a.shape[0] == 1, cfg.steep != 0
    n2 = 0
    for c in range(slots.state.size):
        st = slots.state[c]
        if st.mode == 0:
            continue
        ch = view(slots, c)
        if st.mode == _DUAL:
            alpha = z1[st.zrow] if is_shared else ch.trow
            if not dual_pivot(prob, ch, alpha, cfg):
                st.mode, st.wait = 0, 1
                continue
        if single:
            n2 = queue_products(prob, ch, buf.y2s, n2, steep)
        else:
            n2 = queue_products(prob, ch, buf.y2, n2, steep)
    return n2


@jit
def _phase3(prob, shared, slots, cfg, buf, z2, single):
    """Phase 3: every pivoting chain updates d, γ and its basis from the second product z2
    (single precision when `single`), and refactors B⁻¹ every cfg.refactor pivots."""
    is_shared, steep = prob.a.shape[0] == 1, cfg.steep != 0
    for c in range(slots.state.size):
        st = slots.state[c]
        if st.mode == 0:
            continue
        ch = view(slots, c)
        if not is_shared:
            kernel.pivot_pricing(prob.allowed, ch, st.leave, st.enter, ch.col, ch.rho, ch.av, steep)
        else:
            finish_pivot(prob.allowed, ch, z2, steep, 1 if single else 0)
        shared.pivots[st.row] += 1
        if st.since >= cfg.refactor:
            a, a_t = _matrix(prob, st.row)
            if not kernel.refactor(a, a_t, prob.b, ch, buf.work, False):
                st.wait = 1


@jit
def step(prob, shared, slots, tasks, certs, counters, cfg, buf):
    """One lock step of every live slot. The shared products take the first s columns of
    A, s the widest span among the chains they serve (a C × F product through Aᵀ[:s])."""
    is_shared = prob.a.shape[0] == 1
    n1, s1, s2 = _phase1(prob, shared, slots, tasks, certs, counters, cfg, buf)
    none = buf.z[:0].reshape((0, 0))
    z1 = product(buf.y1, prob.at[0], buf.z, n1, s1) if is_shared and n1 > 0 else none
    # the second product in single precision (see `state.STATE`'s drift) when it is wide
    single = is_shared and prob.a32.shape[0] > 0 and s2 >= cfg.single
    n2 = _phase2(prob, slots, cfg, buf, z1, single)
    go = is_shared and n2 > 0
    # z1 is read in full before z2 is written, so both may use buf.z
    z2 = product(buf.y2, prob.at[0], buf.z, n2, s2) if go and not single else none
    z32 = buf.z32
    if go and single and cfg.packed:
        panels.times_panels(buf.y2s, prob.a32, buf.z32, n2, s2)
    elif go and single:
        z32 = product(buf.y2s, prob.at32, buf.z32.reshape(-1), n2, s2)
    if single:  # two dtypes: two compiled phases
        _phase3(prob, shared, slots, cfg, buf, z32, single)
    else:
        _phase3(prob, shared, slots, cfg, buf, z2, single)


@jit
def _refill(prob, shared, slots, tasks, cfg, counters, work):
    """Before a step: restart the slots whose LP came back from HiGHS and give empty
    slots their next chain. Returns FALLBACK (a slot waits for HiGHS), DONE (no chain
    left), SINGULAR, or −1: step on."""
    live = waiting = 0
    for c in range(slots.state.size):
        st = slots.state[c]
        if st.wait:
            waiting += 1
            continue
        if st.restart:  # its LP went to HiGHS: start clean on the next task
            ch = view(slots, c)
            a, a_t = _matrix(prob, st.row)
            if not kernel.refactor(a, a_t, prob.b, ch, work, cfg.steep != 0):
                return SINGULAR
            st.ptr += 1
            st.steps = st.degen = st.restart = 0
            kernel.advance(prob.b, prob.allowed, shared, ch, tasks, cfg.pool)
        if st.j < 0 and load(prob, shared, slots, c, tasks, cfg, counters, work) < 0:
            return SINGULAR
        live += st.j >= 0
    if waiting:
        return FALLBACK
    return DONE if live == 0 else -1


@jit
def run_steps(prob, shared, slots, tasks, certs, counters, cfg, budget):
    """The body of `compiled.run_chains` (see there), on arrays it has borrowed."""
    n_slots, m = slots.basis.shape
    n = slots.d.shape[1]
    rows = panels.rows_padded(2 * n_slots)  # whole tiles: `panels`
    buf = Buffers(
        np.empty((m, m)),
        np.empty((n_slots, m)),
        np.empty((2 * n_slots, m)),
        np.zeros((rows, m), np.float32),
        np.empty(2 * n_slots * n),
        np.empty((rows, panels.WIDTH * prob.a32.shape[0]), np.float32),
    )
    cnt = counters[0]
    for i in range(budget + 1):
        code = _refill(prob, shared, slots, tasks, cfg, cnt, buf.work)
        if code >= 0:
            return code
        if i == budget:
            return PAUSED
        step(prob, shared, slots, tasks, certs, cnt, cfg, buf)
    return PAUSED


def config(options, m: int, row_order: bool) -> Config:
    """`state.Config` from `EngineOptions`, for constraints of m rows."""
    return Config(
        cap=max(options.pivots_per_lp, options.pivots_per_m * m),
        refactor=max(options.refactor_every, options.refactor_per_m * m),
        steep=int(row_order),
        pool=options.pool_rule if row_order else 0,
        refine=int(options.refine),
        single=options.single_min_keys,
        drift_steps=options.drift_steps,
        drift_gain=options.drift_gain,
        packed=int(options.packed_product),
    )


def waiting(slots):
    """(row, key, sense) of each slot that handed its LP back (state.wait); each is marked
    to restart on its next task once the caller has solved its LP."""
    state = slots.state
    for c in np.flatnonzero(state["wait"]):
        yield int(state["row"][c]), int(state["j"][c]), int(state["s"][c])
        state["wait"][c], state["restart"][c] = 0, 1
