"""The engine's own pieces outside the pivots: the shared single-precision product from A
packed in panels (`panels.times_panels`, a register-tiled kernel in LLVM IR), when it is
used, and the crossover's compiled walk to the first vertex (`crossover`).

The product is checked against float64 numpy on shapes that do not fill whole tiles (rows
not a multiple of the tile's rows, keys not a multiple of two panels, odd m); the walk
against a plain per-row walk written here with fresh solves (no updated inverse), on
rows with their own A and on nested rows that share one.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from helpers.traces import shared_rows
from identifiable.attention.lp import BoundProblem, EngineOptions, crossover, panels, solve
from identifiable.attention.lp.crossover import PIVOT_TOL


@pytest.mark.parametrize(
    ("rows", "cols", "m"), [(1, 1, 1), (13, 40, 33), (62, 512, 129), (9, 97, 7)]
)
def test_the_tiled_product_equals_float64(rows, cols, m):
    rng = np.random.default_rng(rows * 1000 + cols)
    n = cols + 5  # A has keys past the ones asked for
    a = rng.standard_normal((m, n)).astype(np.float32)
    ap = panels.pack(np.ascontiguousarray(a.T))
    assert ap.shape == (2 * -(-n // 32), m, panels.WIDTH)
    padded = panels.rows_padded(rows)
    assert padded >= rows and padded % panels.ROWS == 0
    y = np.zeros((padded + 3, m), np.float32)
    y[:rows] = rng.standard_normal((rows, m))
    out = np.full((padded + 3, panels.WIDTH * ap.shape[0]), np.nan, np.float32)
    panels.times_panels(y, ap, out, rows, cols)
    exact = y[:rows].astype(np.float64) @ a[:, :cols].astype(np.float64)
    scale = np.abs(y[:rows]).astype(np.float64) @ np.abs(a[:, :cols]).astype(np.float64)
    assert np.all(np.abs(out[:rows, :cols] - exact) <= 1e-6 * scale + 1e-30)
    assert np.isnan(out[padded:]).all()  # whole tiles only: nothing past the padded rows


def test_the_pack_is_a_by_panels_of_keys():
    a = np.arange(3 * 40, dtype=np.float32).reshape(3, 40)
    ap = panels.pack(np.ascontiguousarray(a.T))
    assert ap.shape == (4, 3, 16)
    for p in range(4):
        for k in range(16):
            key = 16 * p + k
            np.testing.assert_array_equal(ap[p, :, k], a[:, key] if key < 40 else 0.0)


def _walk_reference(aq_row: np.ndarray, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The crossover's rule for one row, with B solved afresh for every column."""
    m = aq_row.shape[0]
    _, _, perm = scipy.linalg.qr(aq_row[:, keys], mode="economic", pivoting=True)
    basic = keys[perm[:m]].copy()
    x = x.copy()
    xb = x[basic].copy()
    for k in keys:
        if k in basic or not x[k] > 0.0:
            continue
        col = np.linalg.solve(aq_row[:, basic], aq_row[:, k])
        neg = col < -PIVOT_TOL
        ratios = np.where(neg, np.maximum(xb, 0.0) / np.where(neg, -col, 1.0), np.inf)
        r = int(ratios.argmin())
        best, xk = ratios[r], x[k]
        t = min(best, xk)
        xb += t * col
        x[k] = 0.0
        if best < xk:
            xb[r] = xk - t
            x[basic[r]] = 0.0
            basic[r] = k
    return basic


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_compiled_walk_follows_the_rule(shared, threads):
    rng = np.random.default_rng(7)
    rows, m, n = 24, 9, 40
    allowed = np.zeros((rows, n), bool)
    if shared:  # nested causal rows: row r sees keys 0 … 12 + r
        q, _ = np.linalg.qr(rng.standard_normal((n, m)))
        aq = q.T[None].copy()
        for r in range(rows):
            allowed[r, : 12 + r] = True
    else:  # each row its own A over its own keys
        aq = np.zeros((rows, m, n))
        for r in range(rows):
            allowed[r] = rng.random(n) < 0.7
            keys = np.flatnonzero(allowed[r])
            aq[r][:, keys] = np.linalg.qr(rng.standard_normal((keys.size, m)))[0].T
    a = rng.random((rows, n)) * allowed
    a /= a.sum(1, keepdims=True)
    basic = crossover.crossover(aq, a, allowed, threads)
    for r in range(rows):
        a_r = aq[0] if shared else aq[r]
        keys = np.flatnonzero(allowed[r])
        np.testing.assert_array_equal(basic[r], _walk_reference(a_r, a[r], keys))
        # a vertex of the row's P: its basic values solve A x = A a and are ≥ 0
        xb = np.linalg.solve(a_r[:, basic[r]], a_r @ a[r])
        assert xb.min() > -1e-10
        assert set(basic[r]) <= set(keys)


def test_the_narrow_tile_without_avx512(tmp_path):
    """Where numba compiles without AVX-512 the tile takes 8 lanes and 3 rows; compiled
    for a generic x86-64 (in a fresh process), it gives the same product."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from identifiable.attention.lp import panels\n"
        "assert (panels.LANES, panels.ROWS) == (8, 3), (panels.LANES, panels.ROWS)\n"
        "rng = np.random.default_rng(3)\n"
        "a = rng.standard_normal((33, 75)).astype(np.float32)\n"
        "ap = panels.pack(np.ascontiguousarray(a.T))\n"
        "y = rng.standard_normal((panels.rows_padded(10), 33)).astype(np.float32)\n"
        "out = np.zeros((y.shape[0], 16 * ap.shape[0]), np.float32)\n"
        "panels.times_panels(y, ap, out, 10, 75)\n"
        "exact = y[:10].astype(np.float64) @ a.astype(np.float64)\n"
        "print(float(np.abs(out[:10, :75] - exact).max()))\n"
    )
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert float(run.stdout) < 1e-4


def test_single_precision_from_the_threshold_on():
    keys = EngineOptions().single_min_keys
    for n, expect in ((keys - 1, False), (keys, True)):
        aq, a, _, _ = shared_rows(n=n, d_v=4, rows=2, seed=1)
        prob = solve._arrays(
            BoundProblem(aq, a, np.ones(a.shape, bool), np.ones(a.shape, bool)), EngineOptions()
        )
        assert (prob.a32.shape[0] > 0) is expect
        if expect:  # A in panels of 16 keys (`panels.pack`), 0 past the last key
            unpacked = prob.a32.transpose(1, 0, 2).reshape(aq.shape[1], -1)
            np.testing.assert_allclose(unpacked[:, :n], aq[0], rtol=1e-6, atol=1e-7)
            assert not unpacked[:, n:].any()
    # rows with their own A (windows, short prefixes) make no shared product
    aq, a, _, _ = shared_rows(n=400, d_v=4, rows=2, seed=1)
    prob = solve._arrays(
        BoundProblem(np.repeat(aq, 2, 0), a, np.ones(a.shape, bool), np.ones(a.shape, bool)),
        EngineOptions(),
    )
    assert prob.a32.shape[0] == 0
