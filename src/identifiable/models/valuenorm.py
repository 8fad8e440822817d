"""Normalised values: Gemma 4 (and EmbeddingGemma 2) applies an RMS norm over the head
width to each head's E·W_V + b_V (`self_attn.v_norm`, without a scale) before the attention
reads them.

T is then built on the normalised values: `ArchSpec.value_norm` names the module, and the
stack applies it (`AttentionStack.values`), with b_V inside it.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from identifiable.models.specs import ArchSpec


def find_value_norm(layers: Sequence[nn.Module], spec: ArchSpec) -> str | None:
    """The path of the `v_norm` module beside the spec's value projection, if a layer has one
    (latent attention keeps its own norm of the latent: None there)."""
    if spec.latent is not None:
        return None
    attention = spec.value.rsplit(".", 1)[0] if "." in spec.value else ""
    path = f"{attention}.v_norm" if attention else "v_norm"
    for layer in layers:
        try:
            layer.get_submodule(path)
        except AttributeError:
            continue
        return path
    return None
