"""What the effective-attention routes need of W_O, computed only for the layers and heads
asked for (docs/definitions.md#computing-without-forming-t).

Per head H (d_v × d): whether κ(H) < 1e3, proved from one float32 Gram
(`linalg.certified_well_conditioned`) or decided exactly in float64, and the exact factor
F with F Fᵀ = H Hᵀ (`linalg.head_factors`) where a route needs it. Both are cached by the
W_O tensor's identity and version (an in-place change invalidates them), per layer; the
caches hold no reference that keeps a W_O alive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from identifiable.attention.checks import check_finite, check_trace_shapes
from identifiable.attention.linalg import certified_well_conditioned, head_factors
from identifiable.errors import IdentifiableError
from identifiable.models.trace import Trace
from identifiable.utils.precision import exact_device


@dataclass(frozen=True)
class HeadFactors:
    """Per-head output-projection factors of one model (compute once, reuse across traces).

    Attributes:
        factor: `[L, H, d_v, k]` float64 F with sing(V F) = sing(V H).
        full_row_rank: `[L, H]` bool; True where col(T) = col(V) (the
            route that never forms T). Where False, V F is still exact for T.
        well_conditioned: `[L, H]` bool, κ(H) < 1e3: the routes then use V
            itself where its rank decisions are safe (same column space and
            rank, one small matrix product fewer).
    """

    factor: Tensor
    full_row_rank: Tensor
    well_conditioned: Tensor


# W_O tensor → (its version when factored, whole-model factors). Keys by identity (a
# tensor's == is elementwise) and weak: a dropped trace or model frees its entry.
_FACTOR_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()
# W_O tensor → (version, {layer: (factor, full, well) of every head}), factored on demand.
_LAYER_FACTORS: WeakIdKeyDictionary = WeakIdKeyDictionary()
# W_O tensor → (version, {layer: `[H]` flags of `certified_well_conditioned`}).
_FLAGS_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _cached(cache: WeakIdKeyDictionary, w_o: Tensor) -> object | None:
    hit = cache.get(w_o)
    return hit[1] if hit is not None and hit[0] == w_o._version else None


def _per_layer(cache: WeakIdKeyDictionary, w_o: Tensor) -> dict:
    """The live per-layer dict of `cache` for this W_O (a new one after a weight change)."""
    hit = _cached(cache, w_o)
    if hit is None:
        hit = {}
        cache[w_o] = (w_o._version, hit)
    return hit  # type: ignore[return-value]


def compute_head_factors(trace: Trace) -> HeadFactors:
    """Factor every head's output projection H once (reusable for any trace of the same model).

    Traces of one `Model` share one W_O tensor, so the factors are cached by that tensor's
    identity and version.
    """
    check_trace_shapes(trace)
    w_o = trace.out_proj
    hit = _cached(_FACTOR_CACHE, w_o)
    if hit is not None:
        return hit  # type: ignore[return-value]
    check_finite(w_o, "output projection (W_O)", per_layer_head=True)
    # Layer by layer: a float64 copy of all of W_O (54 MB at BERT-base) is not needed at once.
    parts = [_layer_factors(w_o, layer) for layer in range(trace.n_layers)]
    factors = HeadFactors(*(torch.stack(p) for p in zip(*parts, strict=True)))
    _FACTOR_CACHE[w_o] = (w_o._version, factors)
    return factors


def _layer_factors(w_o: Tensor, layer: int) -> tuple[Tensor, Tensor, Tensor]:
    """(factor, full, well) of every head of one layer, cached per layer."""
    layers = _per_layer(_LAYER_FACTORS, w_o)
    if layer not in layers:
        layers[layer] = head_factors(w_o[layer].to(exact_device(w_o.device), torch.float64))
    return layers[layer]


class OutProj:
    """The κ(H) flags and exact factors of the selected heads, layer by layer.

    Exact `HeadFactors` are used when given or cached. Otherwise a layer's flags come
    from `certified_well_conditioned` (one float32 Gram, no float64 copy or product)
    when it proves every selected head well-conditioned, which is all the usual routes
    need; F is factored only for a layer whose route uses it. Every decision is the
    same either way: a proved head is well-conditioned, and of full row rank, in the
    exact test too.
    """

    def __init__(
        self, trace: Trace, factors: HeadFactors | None, heads: Sequence[int] | None = None
    ) -> None:
        check_trace_shapes(trace)  # also when the factors are given or cached
        if factors is not None and not isinstance(factors, HeadFactors):
            raise IdentifiableError(
                "factors= takes the HeadFactors of this trace (compute_head_factors(trace)) or "
                f"None, got {type(factors).__name__}"
            )
        self._trace = trace
        self._heads = None if heads is None else list(heads)
        self._device = exact_device(trace.out_proj.device)  # float64 work: MPS's on the CPU
        cached = _cached(_FACTOR_CACHE, trace.out_proj)
        self._exact: HeadFactors | None = factors or cached  # type: ignore[assignment]
        self._flags: dict[int, Tensor] = {}
        self._factors: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def _sel(self, x: Tensor) -> Tensor:
        return (x if self._heads is None else x[self._heads]).to(self._device)

    def well_conditioned(self, layer: int) -> Tensor:
        """`[H']` κ(H) < 1e3 (proved, or decided exactly) for the selected heads."""
        if layer not in self._flags:
            if self._exact is not None:
                self._flags[layer] = self._sel(self._exact.well_conditioned[layer])
            else:
                proved = self._proved(layer)
                self._flags[layer] = proved if bool(proved.all()) else self._exact_layer(layer)[2]
        return self._flags[layer]

    def full_row_rank(self, layer: int) -> Tensor:
        """`[H']` rank(H) = d_v (implied by a proof of κ(H) < 1e3)."""
        flags = self.well_conditioned(layer)
        if self._exact is not None:
            return self._sel(self._exact.full_row_rank[layer])
        if layer in self._factors:
            return self._factors[layer][1]
        return flags  # proved κ(H) < 1e3: rank d_v

    def factor(self, layer: int) -> Tensor:
        """`[H', d_v, k]` F of one layer (see `HeadFactors`)."""
        if self._exact is not None:
            return self._sel(self._exact.factor[layer])
        return self._exact_layer(layer)[0]

    def _exact_layer(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        if layer not in self._factors:
            w_o = self._trace.out_proj
            check_finite(w_o[layer], "output projection (W_O)", layer=layer)
            if self._heads is None or layer in _per_layer(_LAYER_FACTORS, w_o):
                f, full, well = _layer_factors(w_o, layer)
                self._factors[layer] = (self._sel(f), self._sel(full), self._sel(well))
            else:  # a few heads of a layer: factor only those, uncached
                part = w_o[layer, self._heads].to(self._device, torch.float64)
                self._factors[layer] = head_factors(part)
        return self._factors[layer]

    def _proved(self, layer: int) -> Tensor:
        """`[H']` flags of `certified_well_conditioned` (cached per layer for all heads)."""
        w_o = self._trace.out_proj
        layers = _per_layer(_FLAGS_CACHE, w_o)
        if layer in layers:
            return self._sel(layers[layer])
        if self._heads is not None:
            return certified_well_conditioned(w_o[layer, self._heads].to(self._device))
        layers[layer] = certified_well_conditioned(w_o[layer].to(self._device))
        return layers[layer]
