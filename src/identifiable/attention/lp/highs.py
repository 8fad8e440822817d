"""One linear program over the polytope P = {ã ≥ 0 : (ã − a) Q = 0}, solved by HiGHS.

Shared by the certificates (`certificates.witness_lp`, `interval_lp`) and by the
compiled engine (`groups.fallback`), which hands a chain's LP to HiGHS when it stalls.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from identifiable.errors import IdentifiableError

LP_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


def solve_lp(c: np.ndarray, basis: np.ndarray, a: np.ndarray, what: str) -> np.ndarray:
    """argmin c·ã over P, polished back onto P; `what` names the LP in an error.

    Args: c `[n]`; basis `[n, r']` orthonormal columns spanning col([T, 1]); a `[n]`.
    Returns: `[n]` float64.
    """
    res = linprog(
        c, A_eq=basis.T, b_eq=basis.T @ a, bounds=(0, None), method="highs", options=LP_OPTIONS
    )
    if res.status != 0 or res.x is None:
        raise IdentifiableError(f"the LP solver (HiGHS) failed while {what}: {res.message}")
    return polish(np.asarray(res.x, dtype=np.float64), basis, a)


def polish(x: np.ndarray, basis: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Put an LP solution back on the affine set (ã − a) Q = 0 exactly, then clip rounding negatives."""
    x = x - basis @ (basis.T @ (x - a))
    return np.where(x < 0, 0.0, x)
