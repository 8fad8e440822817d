"""The pivot choices of the interval engine (`kernel.price`, `kernel.primal_ratio`) against
plain-Python scans with the rules they document.

Both routines were rewritten so that their loops vectorise: scores into a scratch vector,
then an integer maximum (minimum) over the scores' bits, which orders non-negative doubles
as the floats do. The references below are the scans they replaced. A wrong rewrite (a
signed score, a tie taken from the wrong end, a blocked or non-improving key taken) picks
another key on these fabricated chains, which mix ties, blocked keys, keys just above and
below the optimality tolerance, zero and negative pivots, and +inf ratios.
"""

from __future__ import annotations

import numpy as np
import pytest

from identifiable.attention.lp import kernel, state

M, N = 7, 40


def _chain(rng: np.random.Generator) -> tuple:
    """One slot's state (`kernel`'s ch tuple) with fabricated d, γ, blocked keys and x_B."""
    slots = state.new_slots(1, M, N)
    ch = state.chain(slots, 0)
    basis, blocked, xb, d, w, st = ch.basis, ch.blocked, ch.xb, ch.d, ch.gamma, ch.state
    basis[:] = rng.permutation(N)[:M]
    blocked[:] = rng.random(N) < 0.3
    d[:] = rng.choice([-1.0, 0.0, kernel.OPT_TOL / 2, 2 * kernel.OPT_TOL, 0.5, 1.0, 2.0], N)
    w[:] = rng.choice([1.0, 2.0, 4.0, 8.0], N)  # small grids: many exact ties
    xb[:] = rng.choice([-1e-12, -0.0, 0.0, 0.5, 1.0, 3.0], M)
    st["span"] = N - int(rng.integers(0, 5))
    return ch


def _price_reference(ch, slow: bool, steep: bool) -> int:
    blocked, d, w, span = ch.blocked, ch.d, ch.gamma, ch.state["span"]
    best, score = -1, 0.0
    for k in range(span):
        if d[k] > kernel.OPT_TOL and not blocked[k]:
            if slow:
                return k
            sc = d[k] * d[k] / w[k] if steep else d[k]
            if sc > score:
                best, score = k, sc
    return best


def _ratio_reference(ch, col: np.ndarray, slow: bool) -> tuple[int, int]:
    basis, xb = ch.basis, ch.xb
    ratios = [max(xb[i], 0.0) / col[i] if col[i] > kernel.PIVOT_TOL else np.inf
              for i in range(col.size)]  # fmt: skip
    best = min(ratios)
    if best == np.inf:
        return -1, -1
    r = -1
    for i in range(col.size):
        if ratios[i] <= best + 1e-12 and (
            r < 0 or (basis[i] < basis[r] if slow else col[i] > col[r])
        ):
            r = i
    return r, int(best <= 1e-14)


@pytest.mark.parametrize("steep", [True, False])
@pytest.mark.parametrize("slow", [False, True])
def test_price_takes_the_key_the_scan_takes(steep, slow):
    rng = np.random.default_rng(3)
    taken = set()
    for _ in range(300):
        ch = _chain(rng)
        expect = _price_reference(ch, slow, steep)
        assert kernel.price(ch, slow, steep) == expect
        taken.add(expect)
    assert len(taken) > 5  # many different keys (none at all: the next test)


def test_price_finds_no_key_at_an_optimum():
    ch = _chain(np.random.default_rng(0))
    ch.d[:] = np.where(np.arange(N) % 2 == 0, -1.0, kernel.OPT_TOL)  # none above the tolerance
    assert kernel.price(ch, False, True) == -1
    ch.d[N // 2] = 1.0
    ch.blocked[N // 2] = True  # the only improving key is blocked
    assert kernel.price(ch, False, True) == -1


@pytest.mark.parametrize("slow", [False, True])
def test_primal_ratio_takes_the_row_the_scan_takes(slow):
    rng = np.random.default_rng(5)
    seen = set()
    for _ in range(300):
        ch = _chain(rng)
        col = rng.choice([-1.0, 0.0, kernel.PIVOT_TOL, 0.25, 0.5, 1.0, 2.0], M)
        ch.state["degen"] = 4
        expect, degenerate = _ratio_reference(ch, col, slow)
        got = kernel.primal_ratio(ch, col, slow)
        assert got == expect
        if got >= 0:  # degenerate steps count up, others reset the count
            assert ch.state["degen"] == (5 if degenerate else 0)
        seen.add((got >= 0, degenerate))
    assert seen == {(False, -1), (True, 0), (True, 1)}
