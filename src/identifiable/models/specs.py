"""Per-architecture knowledge, as data.

This is the only place that names Hugging Face modules. A spec says, relative to
the base model (`AutoModel`), where the list of layers is, which module inside a
layer is the value projection (its *input* is E), which is the output projection
W_O (its *output* is the attention block's output before dropout and residual),
and how to slice W_V out of a fused QKV weight.

Adding an architecture = one `ArchSpec` entry below plus a tiny-config test in
tests/models/test_architectures.py; `Trace.verify()` proves the entry right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from identifiable.errors import IdentifiableError


@dataclass(frozen=True)
class ArchSpec:
    """Where the pieces of SPEC.md §1 live in one family of models.

    Attributes:
        name: short family name shown to users.
        model_types: `config.model_type` values this spec covers.
        layers: dotted path (from the base model) of the `ModuleList` of layers.
        value: dotted path (inside a layer) of the module whose input is E and
            whose weight holds W_V.
        out_proj: dotted path (inside a layer) of W_O.
        weight_layout: "linear" (nn.Linear, weight is [out, in]) or
            "conv1d" (GPT-2's Conv1D, weight is [in, out]).
        fused_qkv: for fused projections, (number of chunks, index of V) along
            the output dimension; None when `value` is a separate V projection.
        causal: decoder-style (row i attends to keys ≤ i).
        norm: "post" (LayerNorm after the residual, BERT) or "pre" (GPT-2, Llama):
            documents what E is; E is always read at the value projection's input.
        position_offset: positions the model reserves before the first token
            (RoBERTa counts from padding_idx + 1), subtracted from the maximum length.
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    value: str
    out_proj: str
    weight_layout: Literal["linear", "conv1d"] = "linear"
    fused_qkv: tuple[int, int] | None = None
    causal: bool = False
    norm: Literal["pre", "post"] = "post"
    position_offset: int = 0


SPECS: tuple[ArchSpec, ...] = (
    ArchSpec(
        name="bert",
        model_types=("bert",),
        layers="encoder.layer",
        value="attention.self.value",
        out_proj="attention.output.dense",
    ),
    ArchSpec(
        name="roberta",
        model_types=("roberta", "xlm-roberta", "camembert"),
        layers="encoder.layer",
        value="attention.self.value",
        out_proj="attention.output.dense",
        position_offset=2,
    ),
    ArchSpec(
        name="electra",
        model_types=("electra",),
        layers="encoder.layer",
        value="attention.self.value",
        out_proj="attention.output.dense",
    ),
    ArchSpec(
        name="distilbert",
        model_types=("distilbert",),
        layers="transformer.layer",
        value="attention.v_lin",
        out_proj="attention.out_lin",
    ),
    ArchSpec(
        name="gpt2",
        model_types=("gpt2",),
        layers="h",
        value="attn.c_attn",
        out_proj="attn.c_proj",
        weight_layout="conv1d",
        fused_qkv=(3, 2),
        causal=True,
        norm="pre",
    ),
    ArchSpec(
        name="llama",
        model_types=("llama", "mistral", "qwen2"),
        layers="layers",
        value="self_attn.v_proj",
        out_proj="self_attn.o_proj",
        causal=True,
        norm="pre",
    ),
)


def supported_model_types() -> list[str]:
    return sorted(t for s in SPECS for t in s.model_types)


def spec_for(model_type: str) -> ArchSpec:
    """The spec covering `config.model_type`, or an error naming the supported ones."""
    for spec in SPECS:
        if model_type in spec.model_types:
            return spec
    raise IdentifiableError(
        f"architecture '{model_type}' is not supported; supported model types: "
        f"{', '.join(supported_model_types())}. To add one, write an ArchSpec entry in "
        "identifiable/models/specs.py (see README 'Adding an architecture')."
    )
