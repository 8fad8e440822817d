"""Context mixing: how much each token mixes into each other token, by many accounts.

One call for every method: `context_mixing(model, text, method=…)` returns a
`MixingResult` with `[L, n, n]` layer maps and, where the method defines it, their
rollout. `METHODS` is the registry (`method_names()` lists it); docs/mixing.md gives
each method's definition. The pure pieces: `rollout` (rollout and residual maps),
`flow` (attention flow by max-flow), `decompose` (norm-based decompositions: norm,
GlobEnc, ALTI) and `perturb` (value zeroing, erasure, input × gradient).
"""

from identifiable.mixing.api import (
    METHODS,
    Method,
    context_mixing,
    get_method,
    method_names,
    register,
    unavailable,
)
from identifiable.mixing.result import MixingResult

__all__ = [
    "METHODS",
    "Method",
    "MixingResult",
    "context_mixing",
    "get_method",
    "method_names",
    "register",
    "unavailable",
]
