"""`MixingResult`: the one result type every context-mixing method returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from identifiable.results import Result


@dataclass(frozen=True)
class MixingResult(
    Result,
    dims={"layerwise": ("layer", "query", "key"), "rolled": ("layer", "query", "key")},
    plot={"fields": ("layerwise",), "layer": -1},
    summary=("method",),
):
    """How much each token j mixes into each token i, per layer, by one method.

    Shapes: L layers, n tokens; index [l, i, j] reads "token j → token i" (rows are the
    receiving token, as in attention). Layers are 0-based here (l = 0 is the first layer).

    Attributes:
        layerwise: `[L, n, n]` float64. For the per-layer methods (attention, rollout, flow,
            effective-rollout, norm, globenc, alti, value-zeroing) the map of layer l alone:
            token j at the input of layer l → token i at its output. For the model-based
            references (grad-input, erasure, hta) the map from input token j (layer-1 input)
            to token i at the output of layer l; `global_map` is then `layerwise` itself.
        rolled: `[L, n, n]` float64 or None: the layer maps composed from the input up to
            layer l (rollout-style), for the methods that define it; None otherwise.
        method: the registry name.
        tokens: the n token strings.
        options: the method's options as used (defaults filled in), JSON-ready.
        is_causal: decoder model; then every entry with j > i is exactly 0.
        model_name: where the model came from.
        seconds: wall time of the method (tracing included).
        meta: method-specific diagnostics (e.g. flow's resolution, rows that fell back).
    """

    layerwise: torch.Tensor
    rolled: torch.Tensor | None
    method: str
    tokens: list[str]
    options: Mapping[str, Any]
    is_causal: bool = False
    model_name: str = ""
    seconds: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.layerwise.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.layerwise.shape[-1])

    @property
    def global_map(self) -> torch.Tensor:
        """`[L, n, n]` the input → layer-l map: `rolled` where defined, else `layerwise`
        (for attention and norm that is the layer's own, local map)."""
        return self.rolled if self.rolled is not None else self.layerwise

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tokens, options and both maps as nested lists (layers 0-based, as everywhere)."""
        return {
            "method": self.method,
            "model": self.model_name,
            "tokens": list(self.tokens),
            "options": dict(self.options),
            "is_causal": self.is_causal,
            "seconds": self.seconds,
            "meta": dict(self.meta),
            "layers": list(range(1, self.n_layers + 1)),
            "layerwise": self.layerwise.tolist(),
            "rolled": None if self.rolled is None else self.rolled.tolist(),
        }
