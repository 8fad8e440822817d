"""The maintained backend (`backend="highs"`: one HiGHS model per row, hot starts between
keys) against the compiled engine and per-key scipy LPs, every LP verified; the same
bounds from scipy's linprog where highspy is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers.traces import assert_certified, engine, shared_rows


@pytest.mark.parametrize("own_a", [False, True])
def test_highs_gives_the_engines_bounds_with_a_certificate_for_every_lp(own_a):
    aq, a, movable, v = shared_rows(n=36, d_v=5, rows=3, seed=8)
    allowed = np.ones(a.shape, bool)
    if own_a:  # each row its own copy of A: one model per row
        aq = np.repeat(aq, 3, 0)
    compiled = engine(aq, a, allowed, movable, chains_per_row=4, backend="engine")
    highs = engine(aq, a, allowed, movable, backend="highs", keep_vertices=True, threads=2)
    np.testing.assert_allclose(highs.lower, compiled.lower, atol=1e-9, rtol=0)
    np.testing.assert_allclose(highs.upper, compiled.upper, atol=1e-9, rtol=0)
    assert_certified(highs, a, v)
    assert len(highs.certificates) == int(highs.lp_solved.sum()) > 0
    assert (highs.backend, compiled.backend) == ("highs", "engine")


def test_highs_on_nested_rows_opens_each_rows_keys():
    """Rows that share A but see growing key sets share one model: each row closes the
    keys it cannot see (their bounds stay 0, every basis lies in the row's keys)."""
    aq, a, movable, _ = shared_rows(n=30, d_v=4, rows=3, seed=9)
    allowed = np.zeros(a.shape, bool)
    for r, k in enumerate((18, 24, 30)):
        allowed[r, :k] = True
    a = np.where(allowed, a, 0.0)
    a /= a.sum(1, keepdims=True)
    movable = allowed.copy()
    sol = engine(aq, a, allowed, movable, backend="highs")
    assert not sol.upper[~allowed].any()
    for t in range(len(sol.certificates)):
        assert allowed[sol.certificates.rows[t], sol.certificates.bases[t]].all()
    compiled = engine(aq, a, allowed, movable, order="row", backend="engine")
    np.testing.assert_allclose(sol.lower, compiled.lower, atol=1e-9, rtol=0)
    np.testing.assert_allclose(sol.upper, compiled.upper, atol=1e-9, rtol=0)


def test_without_highspy_the_backend_runs_on_scipy():
    """highspy made unimportable in a fresh process: the same bounds from scipy's linprog
    (no certificates: linprog reports no basis), no error."""
    code = (
        "import sys; sys.modules['highspy'] = None\n"
        "import numpy as np\n"
        "from helpers.traces import shared_rows\n"
        "from helpers.traces import engine\n"
        "aq, a, movable, v = shared_rows(n=20, d_v=4, rows=2, seed=3)\n"
        "ok = np.ones(a.shape, bool)\n"
        "h = engine(aq, a, ok, movable, backend='highs')\n"
        "e = engine(aq, a, ok, movable, backend='engine')\n"
        "print(len(h.certificates), max(np.abs(h.lower - e.lower).max(),"
        " np.abs(h.upper - e.upper).max()))\n"
    )
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, *sys.path])}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    certs, diff = run.stdout.split()
    assert int(certs) == 0 and float(diff) < 1e-9
