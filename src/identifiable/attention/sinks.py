"""Attention sinks: how much attention the first token takes, and how much of it is effective.

Trained decoders park much of their attention on the first token (an "attention sink"). How
much of that mass reaches the head's output is what effective attention says: the part of
a row in the left null space of T changes nothing (docs/definitions.md#null-spaces). For
each layer and head, `sink_mass` averages the first key's weight over the query rows that
see it, in A and in A_eff (definitions: effective attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from identifiable.attention.checks import check_selection
from identifiable.attention.effective import (
    HeadFactors,
    Variant,
    _labels,
    iter_effective_attention,
)
from identifiable.models.trace import Trace
from identifiable.results import Result
from identifiable.utils.precision import has_float64


@dataclass(frozen=True)
class SinkMass(
    Result,
    dims={"raw": ("layer", "head"), "effective": ("layer", "head"), "rows": ("layer",)},
    plot={"fields": ("raw", "effective"), "axes": ("layer", "head")},
    summary=("variant",),
):
    """Attention on the first token per layer and head, raw and effective.

    Attributes:
        raw: `[L, H]` float64, mean over the query rows i that see key 0 of A[l, h, i, 0].
        effective: `[L, H]` float64, the same mean of A_eff[l, h, i, 0] (not a probability:
            it can be negative).
        variant: the effective attention's variant ("paper" or "row-stochastic").
        rows: how many query rows each mean covers (`[L]` int64: those that see the first
            token).
        first_token: the first key's token; tokens (the rows' tokens, so `n_tokens` is the
            sequence's length), model_name, dequantized_from: the trace's.
        layers, heads: the model's indices of the L and H axes (None: all of them).
    """

    raw: Tensor
    effective: Tensor
    variant: str
    rows: Tensor
    first_token: str = ""
    tokens: list[str] | None = None
    model_name: str = ""
    dequantized_from: str = ""
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None

    def per_layer(self) -> Any:
        """A DataFrame, one row per layer: the means over heads of `raw` and `effective`,
        their difference `null` (the first token's mass in the null space), and the heads'
        largest raw mass `raw_max`."""
        import pandas as pd

        raw, eff = self.raw.double().cpu(), self.effective.double().cpu()
        layers = self.layers if self.layers is not None else range(raw.shape[0])
        return pd.DataFrame(
            {
                "layer": list(layers),
                "raw": raw.mean(1).numpy(),
                "effective": eff.mean(1).numpy(),
                "null": (raw - eff).mean(1).numpy(),
                "raw_max": raw.max(1).values.numpy(),
            }
        )


def key_mass(raw: Tensor, eff: Tensor, key: int, seen: Tensor) -> tuple[Tensor, Tensor]:
    """The mean over the rows that see `key` of A[h, i, key] and of A_eff[h, i, key]: the
    one reduction behind `sink_mass` and the scan's sink columns (`attention.scan`).

    Args:
        raw, eff: `[H, n, n_k]` A and A_eff on one device; seen: `[n]` bool there, the rows
            that see `key`.
    Returns: two `[H]` tensors on that device, float64 where it has it (else float32).
    """
    acc = torch.float64 if has_float64(raw.device) else torch.float32
    w = seen.to(acc)
    count = w.sum().clamp_min(1)
    return (
        (raw[:, :, key].to(acc) * w).sum(-1) / count,
        (eff[:, :, key].to(acc) * w).sum(-1) / count,
    )


def sink_mass(
    trace: Trace,
    variant: Variant = "paper",
    *,
    factors: HeadFactors | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> SinkMass:
    """Raw and effective attention on the first token of `trace`, per layer and head.

    Args:
        trace: any `Trace` (decoders: every row sees the first token; windows and masks
            are read from `keys_seen`); attentions `[L, H, n, n_k]`.
        variant: "paper" or "row-stochastic", as for `effective_attention`.
        factors: the trace's `HeadFactors`, when already computed.
        layers: the layers (default all); heads: the query heads (default all). Effective
            attention is streamed one layer at a time (`iter_effective_attention`): one
            layer's `[H, n, n_k]` maps are alive at once.
    Returns:
        `SinkMass` with `raw` and `effective` `[L, H]` float64 on the trace's device (L, H:
        the layers and heads asked for): the means over the query rows that see key 0 of
        A[l, h, :, 0] and A_eff[l, h, :, 0].
    """
    chosen, head_list = check_selection(trace, layers, heads)
    raw, eff, rows = [], [], []
    for le in iter_effective_attention(trace, variant, factors=factors, layers=chosen, heads=heads):
        seen = trace.keys_seen(le.layer)[:, 0].to(le.raw.device)  # [n] rows that see key 0
        r, e = key_mass(le.raw, le.effective, 0, seen)
        raw.append(r.double())
        eff.append(e.double())
        rows.append(int(seen.sum()))
    return SinkMass(
        raw=torch.stack(raw),
        effective=torch.stack(eff),
        variant=variant,
        tokens=list(trace.tokens),
        rows=torch.tensor(rows, dtype=torch.int64),
        first_token=(trace.key_tokens or trace.tokens)[0] if trace.n_keys else "",
        model_name=trace.model_name,
        dequantized_from=trace.dequantized_from,
        **_labels(trace, layers, head_list),
    )
