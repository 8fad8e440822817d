"""The lock step of `interval_simplex` (numba): many simplex chains, one pivot each per step,
sharing one GEMM with A per step.

A pivot needs products with A (m × n): the dual pivot row e_pᵀB⁻¹A before the entering key
is chosen, and after the update the new tableau row ρ = (B⁻¹)_r A and, for steepest edge,
Aᵀv. Chain by chain these are matrix–vector products that read all of A (528 KB at
m = 129, n = 512) for 66k multiply-adds each: bound by the cache, ~9 µs apiece on this
machine. When the chains share A (the rows of a bidirectional head, nested causal rows,
the chains of one row), a step stacks those vectors and makes them one matrix product,
which reads A once for every chain. From a span of `simplex._SINGLE_MIN_KEYS` keys on, the
second product (ρ and Aᵀv, which only steer the pivots) is single precision, from A packed
once per problem (`panels.py`); the others go through OpenBLAS. Everything between the
products runs per chain in compiled loops (`kernel.py`). A step has three phases:

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

import hashlib
from pathlib import Path

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from identifiable.attention import crossover, kernel, panels
from identifiable.attention.kernel import (
    BROW,
    CAP,
    CHAIN,
    DEGEN,
    DRIFT,
    DRIFT_GAIN,
    DRIFT_STEPS,
    ENTER,
    FEAS_TOL,
    FRESH,
    LEAVE,
    MODE,
    PIVOT_TOL,
    POOL,
    PTR,
    REFACTOR,
    REFINE,
    RESTART,
    ROW,
    SINCE,
    SINGLE,
    SPAN,
    STEEP,
    STEPS,
    WAIT,
    ZROW,
    J,
    S,
    advance,
    column,
    dual_enter,
    dual_leave,
    fresh_d,
    jit,
    pivot_basis,
    pivot_pricing,
    price,
    primal_ratio,
    refactor,
    refined,
    reload,
    settle,
    times_a,
)  # fmt: skip
from identifiable.attention.panels import rows_padded, times_panels
from identifiable.utils.progress import status

DONE, PAUSED, FALLBACK, SINGULAR = range(4)  # what `run_chains` returns
_PRIMAL, _DUAL = 1, 2  # st[MODE]: this step's pivot


@intrinsic
def _borrowed(typingctx, arrays):
    """The tuple of arrays `arrays`, each without its reference count (a null meminfo).

    numba increfs and decrefs an array's meminfo, atomically, whenever a view is taken or an
    array is passed on; the per-chain functions take tuples of ten views, so that was about
    22 pairs of atomic operations a pivot (13 % of the engine's time on the 32 widest causal
    rows at n = 512, m = 129; 2 % after). Views
    of a borrowed array carry the null meminfo, for which NRT's incref is a null check. The
    caller's arrays stay alive for the whole `run_chains` call, which is the only place
    borrowed arrays exist, and none of them is returned or stored."""
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


@jit
def _view(slots, c):
    """The state tuple of slot c (see `kernel`): a view of every state array's row c."""
    return (slots[0][c], slots[1][c], slots[2][c], slots[3][c], slots[4][c], slots[5][c],
            slots[6][c], slots[7][c], slots[8][c], slots[9][c])  # fmt: skip


@jit
def _matrix(prob, row):
    """A `[m, n]` and Aᵀ `[n, m]` of a row (the shared one when all rows share it)."""
    a3, at3 = prob[0], prob[1]
    i = 0 if a3.shape[0] == 1 else row
    return a3[i], at3[i]


@jit
def _load(prob, bnd, slots, c, tasks, cfg, nxt, work):
    """Slot c takes the next chain not yet started, from the basis its row last settled
    (or the row's first vertex). Returns 1, 0 when no chain is left, −1: singular basis."""
    b, allowed = prob[2], prob[3]
    crow = tasks[0]
    while nxt[0] < crow.size:
        chain = nxt[0]
        nxt[0] += 1
        ch = _view(slots, c)
        basis, pos, blocked, st = ch[0], ch[1], ch[2], ch[7]
        row = crow[chain]
        st[:] = 0
        st[CHAIN], st[PTR], st[ROW], st[BROW], st[J] = chain, tasks[2][chain], row, row, -1
        basis[:] = bnd[5][row]
        pos[:] = -1
        st[SPAN] = 0 if cfg[POOL] != 0 else blocked.size  # see `kernel.SPAN`
        for k in range(blocked.size):
            blocked[k] = not allowed[row, k]
            if allowed[row, k] and cfg[POOL] != 0:
                st[SPAN] = k + 1
        for i in range(basis.size):
            pos[basis[i]] = i
            blocked[basis[i]] = True
        a, a_t = _matrix(prob, row)
        if not refactor(a, a_t, b, ch, work, cfg[STEEP] != 0):
            return -1
        advance(b, allowed, bnd, ch, tasks, cfg[POOL])
        if st[J] >= 0:
            return 1
    return 0


@jit
def _decide(prob, bnd, ch, tasks, vert, nvert, cfg, work):
    """Phase 1 for one chain: settle what its vertex settles, or pick its pivot. Returns
    st[MODE] (0: no pivot this step); st[WAIT] = 1 hands the LP to HiGHS."""
    a, a_t = _matrix(prob, ch[7][ROW])
    b, allowed = prob[2], prob[3]
    basis, pos, binv, xb, st, vm = ch[0], ch[1], ch[3], ch[4], ch[7], ch[8]
    m = binv.shape[0]
    if st[FRESH] == 0:
        fresh_d(a, ch)
    infeasible = False
    for i in range(m):
        infeasible |= xb[i] < -FEAS_TOL
    catching = st[BROW] != st[ROW]  # x_B still solves an earlier row's b (see `advance`)
    slow = st[DEGEN] > 2 * m
    if infeasible:
        st[LEAVE] = dual_leave(ch, slow)
        return _DUAL
    row_order = cfg[POOL]
    if pos[st[J]] < 0 and st[S] < 0 and not catching:  # non-basic at a vertex: minimum 0
        settle(allowed, bnd, ch, vert, nvert, 0.0)
        advance(b, allowed, bnd, ch, tasks, row_order)
        return 0
    q = price(ch, slow, cfg[STEEP] != 0)
    if st[DRIFT] > 0 and (q < 0 or st[DRIFT] >= DRIFT_STEPS or ch[5][q] <= DRIFT_GAIN):
        fresh_d(a, ch)  # d in double again before it ends the LP or steers on round-off
        q = price(ch, slow, cfg[STEEP] != 0)
    if q < 0:
        if catching:  # optimal over the new keys at the old b: now load the row's b
            st[BROW] = st[ROW]
            reload(b, ch)
        elif st[SINCE] == 0 or (cfg[REFINE] != 0 and refined(a, a_t, b, ch)):
            p = pos[st[J]]
            settle(allowed, bnd, ch, vert, nvert, max(xb[p], 0.0) if p >= 0 else 0.0)
            advance(b, allowed, bnd, ch, tasks, row_order)
        elif not refactor(a, a_t, b, ch, work, False):
            st[WAIT] = 1
        return 0
    col = vm[2]
    column(binv, a_t, q, col)
    r = primal_ratio(ch, col, slow)
    st[STEPS] += 1
    if r < 0 or st[STEPS] > cfg[CAP] or abs(col[r]) <= PIVOT_TOL:
        st[WAIT] = 1
        return 0
    if not catching:  # a primal pivot between vertices of P: the leaving key is 0 there
        bnd[2][st[ROW], basis[r]] = True
    st[ENTER], st[LEAVE] = q, r
    pivot_basis(ch, r, col, cfg[STEEP] != 0)  # now, while this B⁻¹ is in the cache
    return _PRIMAL


@jit
def _dual_pivot(prob, ch, alpha, cfg):
    """Phase 2 of a dual pivot on tableau row alpha: the entering key and column, then the
    first half of the pivot; ρ = alpha / α_rq into vn[0]. False: hand the LP to HiGHS."""
    binv, d, st, vm, vn = ch[3], ch[5], ch[7], ch[8], ch[9]
    a_t = _matrix(prob, st[ROW])[1]
    q = dual_enter(ch, alpha, st[DEGEN] > 2 * binv.shape[0])
    st[STEPS] += 1
    if q < 0:
        return False
    col, r = vm[2], st[LEAVE]
    column(binv, a_t, q, col)
    st[DEGEN] = st[DEGEN] + 1 if d[q] >= -1e-14 else 0  # degenerate: d_q = 0
    if st[STEPS] > cfg[CAP] or abs(col[r]) <= PIVOT_TOL:
        return False
    st[ENTER] = q
    piv = col[r]
    rho = vn[0]
    for k in range(st[SPAN]):
        rho[k] = alpha[k] / piv
    pivot_basis(ch, r, col, cfg[STEEP] != 0)
    return True


@jit
def _products(prob, slots, c, y, n_y, steep):
    """Phase 2, after the first half of slot c's pivot: queue its new row of B⁻¹ (primal)
    and v (steepest edge) for the shared product at rows st[ZROW]…, or, when the row has
    its own A, take its products now. Returns the rows queued so far."""
    ch = _view(slots, c)
    st, vm, vn = ch[7], ch[8], ch[9]
    a = _matrix(prob, st[ROW])[0]
    shared = prob[0].shape[0] == 1
    st[ZROW] = n_y
    if st[MODE] == _PRIMAL:
        if shared:
            _put(vm[0], y[n_y])
            n_y += 1
        else:
            times_a(vm[0], a, vn[0], st[SPAN])
    if steep:
        if shared:
            _put(vm[1], y[n_y])
            n_y += 1
        else:
            times_a(vm[1], a, vn[1], st[SPAN])
    return n_y


@jit
def _product(y, a_t, buf, rows, cols):
    """y[:rows] · Aᵀ[:cols]ᵀ (double precision, OpenBLAS) into buf, as a C-contiguous
    `[rows, cols]` array, so that a step allocates nothing."""
    out = buf[: rows * cols].reshape((rows, cols))
    np.dot(y[:rows], a_t[:cols].T, out)
    return out


@jit
def _put(x, out):
    """out = x, a row of the shared product's left factor (in single or double precision)."""
    for c in range(x.size):
        out[c] = x[c]


@jit
def _shared_pricing(allowed, ch, z2, steep, drift):
    """Phase 3 of a pivot whose products came from the shared product z2 (double or single
    precision): ρ of a primal pivot (and Aᵀv) from z2; a dual pivot's ρ is its tableau row
    (double). drift = 1: ρ was single precision, so d drifts (see `kernel.DRIFT`)."""
    st = ch[7]
    r, q, col, z = st[LEAVE], st[ENTER], ch[8][2], st[ZROW]
    if st[MODE] == _PRIMAL:
        pivot_pricing(allowed, ch, r, q, col, z2[z], z2[z + 1 if steep else z], steep)
        st[DRIFT] += drift
    elif steep:
        pivot_pricing(allowed, ch, r, q, col, ch[9][0], z2[z], steep)
    else:
        pivot_pricing(allowed, ch, r, q, col, ch[9][0], ch[9][1], steep)


@jit
def _step(prob, bnd, slots, tasks, vert, nvert, cfg, work, y1, y2, y2s, zbuf, zbuf32):
    """One lock step of every live slot (see the module docstring). The shared products
    take the first s columns of A, s the widest SPAN among the chains they serve (a C × F
    product through Aᵀ[:s], as fast as C × C at s = n)."""
    at3, allowed, a32p = prob[1], prob[3], prob[4]
    n_slots, shared, steep = slots[0].shape[0], prob[0].shape[0] == 1, cfg[STEEP] != 0
    n1 = s1 = s2 = 0
    for c in range(n_slots):
        st = slots[7][c]
        st[MODE] = 0
        if st[J] < 0 or st[WAIT]:
            continue
        ch = _view(slots, c)
        st[MODE] = _decide(prob, bnd, ch, tasks, vert, nvert, cfg, work)
        if st[MODE] != 0:
            s2 = max(s2, st[SPAN])
        if st[MODE] == _DUAL:
            st[ZROW] = n1
            if shared:
                y1[n1] = ch[3][st[LEAVE]]
                n1 += 1
                s1 = max(s1, st[SPAN])
            else:
                times_a(ch[3][st[LEAVE]], _matrix(prob, st[ROW])[0], ch[9][2], st[SPAN])
    z1 = _product(y1, at3[0], zbuf, n1, s1) if shared and n1 > 0 else zbuf[:0].reshape((0, 0))
    # the second product in single precision (see `kernel.DRIFT`) when its span is wide
    single = shared and a32p.shape[0] > 0 and s2 >= cfg[SINGLE]
    n2 = 0
    for c in range(n_slots):
        st = slots[7][c]
        if st[MODE] == _DUAL:
            alpha = z1[st[ZROW]] if shared else slots[9][c, 2]
            if not _dual_pivot(prob, _view(slots, c), alpha, cfg):
                st[MODE], st[WAIT] = 0, 1
                continue
        elif st[MODE] != _PRIMAL:
            continue
        if single:
            n2 = _products(prob, slots, c, y2s, n2, steep)
        else:
            n2 = _products(prob, slots, c, y2, n2, steep)
    go = shared and n2 > 0
    # z1 is read in full before z2 is written, so both may use zbuf
    z2 = _product(y2, at3[0], zbuf, n2, s2) if go and not single else zbuf[:0].reshape((0, 0))
    if go and single:
        times_panels(y2s, a32p, zbuf32, n2, s2)
    for c in range(n_slots):
        st = slots[7][c]
        if st[MODE] == 0:
            continue
        ch = _view(slots, c)
        if not shared:
            pivot_pricing(allowed, ch, st[LEAVE], st[ENTER], ch[8][2], ch[9][0], ch[9][1], steep)
        elif single:
            _shared_pricing(allowed, ch, zbuf32, steep, 1)
        else:
            _shared_pricing(allowed, ch, z2, steep, 0)
        bnd[7][st[ROW]] += 1
        if st[SINCE] >= cfg[REFACTOR]:
            a, a_t = _matrix(prob, st[ROW])
            if not refactor(a, a_t, prob[2], ch, work, False):
                st[WAIT] = 1


def _sources_hash() -> str:
    """sha256 of this file, `kernel.py` and `panels.py`: the cache key of `run_chains` (see
    `_compile`)."""
    digest = hashlib.sha256()
    for path in (Path(__file__), Path(kernel.__file__), Path(panels.__file__)):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _compile(stamp: str):
    """`run_chains`, cached on disk by numba (25–40 s to compile, 0.3–1 s to load).

    numba keys a cached function by its own bytecode and its own file's time stamp, not by
    the functions it calls, so an edit to `kernel.py` alone would load a stale engine. The
    closure over `stamp` (the sources' hash) puts both files into the key.
    """

    @numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=kernel.FASTMATH)
    def run_chains(prob, bnd, slots, tasks, vert, nvert, cfg, nxt, budget):
        """Run the chains of `tasks` in the lock step of `slots` for up to `budget` steps.

        Returns DONE (every chain finished), PAUSED (budget spent: call again), FALLBACK (some
        slots have st[WAIT] = 1: the caller solves their LPs (st[ROW], st[J], st[S]), sets
        st[RESTART] = 1 and st[WAIT] = 0, and calls again) or SINGULAR (a basis matrix was
        singular).

        prob: (A `[1 or R, m, n]`, Aᵀ `[1 or R, n, m]`, b `[R, m]`, allowed `[R, n]`, A in
        single precision packed in panels `[P or 0, m, 16]` (`panels.pack`): with them, the
        shared second product runs in
        single precision from a span of cfg[SINGLE] keys on, see `kernel.DRIFT`); bnd:
        (lower, upper, zero_seen, seen_max `[R, n]`, total `[R]`, start `[R, m]`, solved,
        pivots `[R]`); slots: the chain states (see `kernel`), each `[C, …]`; tasks: (first
        row, sense `[N]` and task offsets `[N + 1]` per chain, rows and keys `[T]` of the
        tasks, pool `[R, n]`: row order's open keys); vert: (rows, keys, senses `[V]`, bases,
        values `[V, m]`) witnesses, nvert `[3]`: used, LPs settled, stride (`kernel.settle`); cfg: see `kernel`; nxt `[1]`:
        the next chain to start.
        """
        if len(stamp) == 0:  # never: keeps the sources' hash in the cache key (above)
            return SINGULAR
        prob, bnd, slots = _borrowed(prob), _borrowed(bnd), _borrowed(slots)
        tasks, vert = _borrowed(tasks), _borrowed(vert)
        nvert, cfg, nxt = _borrowed((nvert, cfg, nxt))
        b, allowed = prob[2], prob[3]
        n_slots, m = slots[0].shape
        work = np.empty((m, m))
        y1, y2 = np.empty((n_slots, m)), np.empty((2 * n_slots, m))
        n = slots[5].shape[1]
        y2s = np.zeros((rows_padded(2 * n_slots), m), np.float32)  # whole tiles: `panels`
        zbuf = np.empty(2 * n_slots * n)
        zbuf32 = np.empty((rows_padded(2 * n_slots), panels.WIDTH * prob[4].shape[0]), np.float32)
        for step in range(budget + 1):
            live = waiting = 0
            for c in range(n_slots):
                st = slots[7][c]
                if st[WAIT]:
                    waiting += 1
                    continue
                if st[RESTART]:  # its LP went to HiGHS: start clean on the next task
                    ch = _view(slots, c)
                    a, a_t = _matrix(prob, st[ROW])
                    if not refactor(a, a_t, b, ch, work, cfg[STEEP] != 0):
                        return SINGULAR
                    st[PTR] += 1
                    st[STEPS] = st[DEGEN] = st[RESTART] = 0
                    advance(b, allowed, bnd, ch, tasks, cfg[POOL])
                if st[J] < 0 and _load(prob, bnd, slots, c, tasks, cfg, nxt, work) < 0:
                    return SINGULAR
                live += st[J] >= 0
            if waiting:
                return FALLBACK
            if live == 0:
                return DONE
            if step == budget:
                return PAUSED
            _step(prob, bnd, slots, tasks, vert, nvert, cfg, work, y1, y2, y2s, zbuf, zbuf32)
        return PAUSED

    return run_chains


run_chains = _compile(_sources_hash())
_ready: list[bool] = []  # [True] once `run_chains` is compiled or loaded in this process


def ensure_compiled() -> None:
    """Compile (or load from the disk cache) `run_chains` and the crossover's walk now, with
    a status line on stderr when they compile: on a fresh install that is 25–40 s, once. Callers with a time
    budget call this first, so that the budget counts the work, not the compiler."""
    if _ready:
        return
    try:  # numba's cache file for this source; internal, so only a hint for the message
        cold = not Path(run_chains._cache._cache_file._index_path).exists()
    except AttributeError:
        cold = False
    m, n = 1, 1
    prob = (np.zeros((1, m, n)), np.zeros((1, n, m)), np.zeros((1, m)), np.ones((1, n), bool),
            np.zeros((2, m, panels.WIDTH), np.float32))  # fmt: skip
    ints = np.zeros(1, dtype=np.int64)
    bnd = (np.zeros((1, n)), np.zeros((1, n)), np.zeros((1, n), bool), np.zeros((1, n)),
           np.zeros(1), np.zeros((1, m), dtype=np.int64), ints.copy(), ints.copy())  # fmt: skip
    slots = new_slots(1, m, n)
    tasks = (ints[:0], ints[:0], ints.copy(), ints[:0], ints[:0], np.zeros((1, n), bool))
    vert = (ints[:0], ints[:0], ints[:0], np.zeros((0, m), dtype=np.int64), np.zeros((0, m)))
    cfg = np.zeros(6, dtype=np.int64)
    with status("compiling the interval engine (once; cached on disk)", enabled=cold):
        run_chains(prob, bnd, slots, tasks, vert, np.ones(3, dtype=np.int64), cfg, ints.copy(), 1)
        crossover._walker()(prob[0], np.ones((1, n)), prob[3], ints.reshape(1, 1), ints[:0])
    _ready.append(True)


def new_slots(n_slots: int, m: int, n: int) -> tuple:
    """Empty chain states for `n_slots` slots of the lock step (see `kernel`)."""
    state = np.zeros((n_slots, kernel.N_ST), dtype=np.int64)
    state[:, kernel.J] = -1  # empty: takes the next chain
    state[:, kernel.SPAN] = n  # every key, until `_load` gives a row-order chain its own
    return (
        np.zeros((n_slots, m), dtype=np.int64), np.full((n_slots, n), -1, dtype=np.int64),
        np.ones((n_slots, n), dtype=bool), np.zeros((n_slots, m, m)), np.zeros((n_slots, m)),
        np.zeros((n_slots, n)), np.ones((n_slots, n)), state, np.zeros((n_slots, 4, m)),
        np.zeros((n_slots, 3, n)),
    )  # fmt: skip
