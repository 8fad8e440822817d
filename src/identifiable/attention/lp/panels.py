"""The lock step's shared single-precision product with A, from A packed once (numba).

Every lock step of chains that share A multiplies a stack of row vectors y `[R, m]` (each
chain's new row of B⁻¹ and v) by A `[m, n]`. Through BLAS, each call packs A into the
layout of its micro-kernel again: on a causal head at n = 512 (m = 129, two threads of
~31 chains), OpenBLAS spent 15 % of the engine's time packing A and 25 % multiplying, and
the scipy and numpy builds of OpenBLAS 0.3.30–0.3.31 take their Haswell (AVX2) kernels on
this machine's AVX-512 cores (AMD family 26), which they do not recognise. A is the same
at every step, so it is packed once per problem (`pack`) into panels of 16 keys,
`[P, m, 16]`, and each step runs only a register-tiled micro-kernel over them
(`times_panels`): a tile of ROWS rows of y by 2 panels keeps its 2·ROWS accumulator
vectors in registers for the whole sum over m, loading two vectors of A and one scalar of
y per row for each term. The tile is written in LLVM IR (`_tile`) because numba's loops
keep such accumulators in memory.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from identifiable.attention.lp.kernel import jit

WIDTH = 16  # keys per panel


def _host_vector() -> int:
    """Single-precision lanes of the widest vector registers numba compiles for (16 with
    AVX-512, else 8): the tile's shape follows, so that its accumulators fit the register file
    (32 registers with AVX-512, 16 without)."""
    import llvmlite.binding as llvm

    config = numba.core.config  # NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, as numba compiles
    feats = getattr(config, "CPU_FEATURES", None)
    if feats is None and getattr(config, "CPU_NAME", None) is None:
        feats = llvm.get_host_cpu_features().flatten()
    return 16 if feats and "+avx512f" in feats.split(",") else 8


LANES = _host_vector()
# Rows of y per tile: with 16 lanes, 8 rows × 2 panels = 16 accumulators, A's 2 vectors and
# y's broadcast (of 32 registers); with 8 lanes, 3 rows × 2 panels × 2 vectors = 12
# accumulators and A's 4 vectors (of 16, so y's broadcast may spill: only the AVX-512 tile
# was timed, on this machine; the narrow one is tested for its values).
ROWS = 8 if LANES == 16 else 3


def pack(at: np.ndarray) -> np.ndarray:
    """A in panels: `[P, m, WIDTH]` float32 from Aᵀ `[n, m]`, P = 2·⌈n / (2·WIDTH)⌉ (the
    micro-kernel takes panels in pairs; keys past n are 0)."""
    n, m = at.shape
    p = 2 * -(-n // (2 * WIDTH))
    padded = np.zeros((p * WIDTH, m), np.float32)
    padded[:n] = at
    return np.ascontiguousarray(padded.reshape(p, WIDTH, m).transpose(0, 2, 1))


@jit
def rows_padded(rows):
    """Rows of y and of the product's output that `times_panels` may touch for `rows` rows."""
    return -(-rows // ROWS) * ROWS


@intrinsic
def _tile(typingctx, y, ap, out, r0, p0):
    """out[r0 : r0 + ROWS, WIDTH·p0 : WIDTH·(p0 + 2)] = y[r0 : r0 + ROWS] · A's panels p0
    and p0 + 1 (y `[≥ r0 + ROWS, ≥ m]`, ap `[P, m, WIDTH]`, out `[≥ r0 + ROWS, ≥ WIDTH·(p0 + 2)]`,
    all C-contiguous float32; no bounds are checked)."""
    return types.void(y, ap, out, r0, p0), _emit_tile


_I64 = ir.IntType(64)
_VEC = ir.VectorType(ir.FloatType(), LANES)
_PER_ROW = 2 * WIDTH // LANES  # accumulator vectors per row of the tile


def _emit_tile(context, builder, sig, args):
    """The tile's LLVM IR: a loop over m whose 2·ROWS accumulators stay in registers (phi
    nodes), then one store of each."""
    y_a, ap_a, out_a = (
        context.make_array(t)(context, builder, value=v)
        for t, v in zip(sig.args[:3], args[:3], strict=True)
    )
    r0, p0 = args[3], args[4]  # the row and panel of the tile (values, not types)
    m = cgutils.unpack_tuple(builder, ap_a.shape, 3)[1]
    entry = builder.block
    loop = builder.append_basic_block("tile.loop")
    done = builder.append_basic_block("tile.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    i = builder.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    acc = []
    for _ in range(ROWS * _PER_ROW):
        phi = builder.phi(_VEC)
        phi.add_incoming(ir.Constant(_VEC, [0.0] * LANES), entry)
        acc.append(phi)
    panel = _load_panels(builder, ap_a, p0, m, i)
    new = _multiply_add(builder, y_a, r0, i, panel, acc)
    nxt = builder.add(i, ir.Constant(_I64, 1))
    i.add_incoming(nxt, builder.block)
    for phi, value in zip(acc, new, strict=True):
        phi.add_incoming(value, builder.block)
    builder.cbranch(builder.icmp_signed("<", nxt, m), loop, done)
    builder.position_at_end(done)
    _store(builder, out_a, r0, p0, new)
    return context.get_dummy_value()


def _load_panels(builder, ap_a, p0, m, i) -> list:
    """A's row i of panels p0 and p0 + 1 (ap[p0 + w, i, :]), as vectors."""
    panel = []
    for w in range(2):
        base = builder.mul(
            builder.add(builder.mul(builder.add(p0, ir.Constant(_I64, w)), m), i),
            ir.Constant(_I64, WIDTH),
        )
        for h in range(WIDTH // LANES):
            ptr = builder.gep(ap_a.data, [builder.add(base, ir.Constant(_I64, h * LANES))])
            panel.append(builder.load(builder.bitcast(ptr, _VEC.as_pointer()), align=4))
    return panel


def _multiply_add(builder, y_a, r0, i, panel, acc) -> list:
    """acc + y[r0 + r, i] · panel for each row r of the tile (fused multiply-adds)."""
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_VEC, [_VEC, _VEC, _VEC]), f"llvm.fma.v{LANES}f32"
    )
    ldy = cgutils.unpack_tuple(builder, y_a.shape, 2)[1]
    splat = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
    new = []
    for r in range(ROWS):
        row = builder.add(r0, ir.Constant(_I64, r))
        ys = builder.load(builder.gep(y_a.data, [builder.add(builder.mul(row, ldy), i)]))
        yv = builder.insert_element(
            ir.Constant(_VEC, ir.Undefined), ys, ir.Constant(ir.IntType(32), 0)
        )
        yv = builder.shuffle_vector(yv, ir.Constant(_VEC, ir.Undefined), splat)
        for v in range(_PER_ROW):
            new.append(builder.call(fma, [yv, panel[v], acc[r * _PER_ROW + v]]))
    return new


def _store(builder, out_a, r0, p0, new) -> None:
    """The tile's accumulators into out[r0 : r0 + ROWS, WIDTH·p0 : WIDTH·(p0 + 2)]."""
    ldo = cgutils.unpack_tuple(builder, out_a.shape, 2)[1]
    first = builder.mul(p0, ir.Constant(_I64, WIDTH))
    for r in range(ROWS):
        start = builder.add(builder.mul(builder.add(r0, ir.Constant(_I64, r)), ldo), first)
        for v in range(_PER_ROW):
            ptr = builder.gep(out_a.data, [builder.add(start, ir.Constant(_I64, v * LANES))])
            builder.store(new[r * _PER_ROW + v], builder.bitcast(ptr, _VEC.as_pointer()), align=4)


@jit
def times_panels(y, ap, out, rows, cols):
    """out[:rows, :cols] = y[:rows] · A[:, :cols] for A packed by `pack` (y `[R, m]`, out
    `[R, n]`, C-contiguous float32, with R ≥ rows_padded(rows) and n ≥ WIDTH · P). Whole
    tiles are computed: rows up to rows_padded(rows) and keys up to the next pair of
    panels are written too (from whatever y holds there)."""
    if ap.shape[1] == 0:  # the tile's loop runs at least once
        return
    pairs = -(-cols // (2 * WIDTH))
    for p in range(0, 2 * pairs, 2):
        for r in range(0, rows, ROWS):
            _tile(y, ap, out, r, p)
