"""Sparse key selection: the keys an indexer picks for each query row, recorded as the
trace's key mask.

DeepSeek-V3.2's sparse attention (and GLM-5's, which shares it) scores every key for each
query with a small "lightning indexer" and keeps the top k; the attention module then masks
every other key before its softmax, so the row's probabilities are exactly 0 there. The
softmax is an ordinary one over a subset of the ordinary keys, so the decomposition
A·(E W_V)·W_O holds, but the row's key set is the selection, not the causal prefix: a null
space over keys the model never read is not the model's. A spec names the indexer
(`ArchSpec.key_selector`, a path inside a layer); its output is `[B, n, k]` key indices
(−1 or out of range: no key), and the capture narrows the layer's key mask (causal,
windows) to them before checking that the attention is 0 outside it. A layer without its
own indexer (GLM-5's "shared" layers) reuses the selection of the last layer that ran one,
as the model does.

A selector whose output is not one key set per query row (per-head block selection) is
refused in one line: the trace's key mask is per layer and row, `[L, n, n_k]`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.hooks import HookSet, first_tensor

# child names of an attention module that pick its keys (discovery looks for them)
SELECTOR_NAMES = ("indexer",)
# the refusal of a selection that is not one key set per row (discovery passes it on)
NOT_PER_ROW = "not one key set per query row"


def selector_modules(layers: Sequence[nn.Module], path: str) -> list[nn.Module | None]:
    """Per layer, the module at `path` (None where the layer has none: a shared layer)."""
    found: list[nn.Module | None] = []
    for layer in layers:
        mod: Any = layer
        for part in path.split("."):
            mod = getattr(mod, part, None)
        found.append(mod if isinstance(mod, nn.Module) else None)
    if not any(m is not None for m in found):
        raise IdentifiableError(
            f"no layer holds the key selector '{path}' the spec names; the spec does not "
            "match this model (see docs/families.md, 'Adding an architecture')"
        )
    return found


def find_selector(layers: Sequence[nn.Module], attention: str) -> str | None:
    """The path of the key selector beside the attention module at `attention` (a path
    inside a layer, "" for the layer itself) in any of `layers`, or None."""
    for name in SELECTOR_NAMES:
        path = f"{attention}.{name}" if attention else name
        for layer in layers:
            mod: Any = layer
            for part in path.split("."):
                mod = getattr(mod, part, None)
            if isinstance(mod, nn.Module):
                return path
    return None


def tap(
    hooks: HookSet, layers: Sequence[nn.Module], path: str, emit: Callable[[int, Any], None]
) -> None:
    """Hand `emit(layer, indices)` each selector's output `[B, n, k]` as the model makes it
    (the layer index is the stack's; shared layers emit nothing)."""
    for i, mod in enumerate(selector_modules(layers, path)):
        if mod is not None:
            hooks.post(mod, lambda m, a, out, i=i: emit(i, _indices(first_tensor(out), i)))


def _indices(out: torch.Tensor, layer: int) -> torch.Tensor:
    if out.dim() != 3 or out.dtype.is_floating_point or out.dtype == torch.bool:
        raise IdentifiableError(
            f"layer {layer}'s key selector returned a {out.dtype} tensor of shape "
            f"{tuple(out.shape)}, {NOT_PER_ROW} ([batch, query, k] key indices) but a "
            "per-head or block selection, which a per-row key mask cannot hold: not analysed"
        )
    return out


def picked(indices: torch.Tensor | None, b: int, n: int, n_k: int, layer: int) -> torch.Tensor:
    """`[n, n_k]` bool: the keys sequence `b`'s first n rows kept (`indices` `[B, ≥n, k]`),
    or one line when a layer that reuses a selection runs before any selector did."""
    if indices is None:
        raise IdentifiableError(
            f"layer {layer} reuses the key selection of an earlier layer, but no key selector "
            "ran before it; the spec's key_selector does not match this model"
        )
    idx = indices[b, :n].long().cpu()
    keep = (idx >= 0) & (idx < n_k)
    out = torch.zeros(n, n_k + 1, dtype=torch.bool)
    out.scatter_(1, torch.where(keep, idx, n_k), True)
    return out[:, :n_k]
