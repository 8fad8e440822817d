"""Per-architecture knowledge, as data.

This is the only place that names Hugging Face modules. A spec says, relative to
the base model (`AutoModel`), where the list of layers is, which module inside a
layer is the value projection (its *input* is E), which is the output projection
W_O (its *output* is the attention block's output before dropout and residual),
and how to slice W_V out of a fused QKV weight (or, for XLNet, which raw
parameters hold W_V and W_O and which module receives the block output).

Adding an architecture = one `ArchSpec` entry below plus a tiny-config test in
tests/models/test_architectures.py; `Trace.verify()` proves the entry right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from identifiable.errors import IdentifiableError

FusedLayout = Literal["qkv_blocks", "per_kv_group"]
"""Where W_V sits inside a fused QKV weight (output dimension, d_v = head width):

- "qkv_blocks": [Q (H·d_v) | K (H_kv·d_v) | V (H_kv·d_v)] (GPT-2, Phi-3).
- "per_kv_group": for each key/value head, its H/H_kv query heads, then its key,
  then its value, d_v columns each (GPT-NeoX, BLOOM: H_kv = H, i.e. [q, k, v] per
  head; Falcon: any H_kv, multi-query included).
In both, the fused width is (H + 2·H_kv)·d_v, which gives H_kv.
"""


@dataclass(frozen=True)
class ArchSpec:
    """Where the pieces of docs/definitions.md#notation live in one family of models.

    Attributes:
        name: short family name shown to users.
        model_types: `config.model_type` values this spec covers.
        layers: dotted path (from the base model) of the `ModuleList` of layers.
        value: dotted path (inside a layer) of the module whose input is E and
            whose weight holds W_V (of the raw W_V parameter for layout "heads").
        out_proj: dotted path (inside a layer) of W_O (module or raw parameter).
        weight_layout: "linear" (nn.Linear, weight is [out, in]),
            "conv1d" (GPT-2's Conv1D, weight is [in, out]) or "heads": `value` and
            `out_proj` name raw parameters of shape [d, H, d_v] (XLNet's `v` and `o`),
            W_V = value reshaped to [d, H·d_v] and head h's rows of W_O = out_proj[:, h, :]ᵀ,
            without biases; E is then the input of the module holding `value`.
        fused_qkv: for fused projections, (number of chunks, index of V) along
            the output dimension; None when `value` is a separate V projection.
        causal: decoder-style (row i attends to keys ≤ i).
        norm: "post" (LayerNorm after the residual, BERT) or "pre" (GPT-2, Llama):
            documents what E is; E is always read at the value projection's input.
        position_offset: positions the model reserves before the first token
            (RoBERTa counts from padding_idx + 1), subtracted from the maximum length.
        fused: layout of a fused QKV projection whose blocks differ in size
            (see `FusedLayout`); `fused_qkv` covers the equal-chunk case.
        layer_groups: for models that reuse layers (ALBERT), the path inside each
            entry of `layers` of the list of layers it runs; the logical layer i
            runs group ⌊i·G/L⌋ (G groups, L = `config.num_hidden_layers`).
        window_attr: config attribute with the sliding/local window size.
        layer_types_attr: config attribute naming each layer's attention type
            ("sliding_attention"/"local" layers use the window, others see all keys).
        source: "table" for the entries below, "discovered" for specs found by
            `identifiable.models.discover` and proved by `verify()` on a probe.
        modality: "text" (token ids in) or "image" (`pixel_values` in; the tokens
            are [CLS] (and DeiT's distillation token) then the patches row by row).
        forward_ad: modules (dotted path inside a layer, name of a plain function
            in the module's own modelling file) whose forward is a custom
            `autograd.Function` without forward-mode AD, and the function that
            computes the same numbers with plain torch ops. Hidden Token
            Attribution runs the function in their place (BLOOM's GELU).
        block_output_at: for models whose attention block output is the output of no
            module (XLNet multiplies by W_O inside the attention module's forward):
            dotted path (inside a layer) of a module that is called on that output
            (XLNet's attention dropout, before the residual); its calls on other
            tensors (attention maps, 4-D) are skipped. None: the block output is
            `out_proj`'s output.
        sequence_first: the layers pass hidden states as [n, B, d] and their attention
            maps as [n, n, B, H] (XLNet); every capture turns them to [B, n, d] and
            [B, H, n, n].
        relative_segments: the model compares token types (same or different segment)
            instead of embedding them (XLNet), so a pair's token_type_ids are passed
            although the config has no `type_vocab_size`.
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    value: str
    out_proj: str
    weight_layout: Literal["linear", "conv1d", "heads"] = "linear"
    fused_qkv: tuple[int, int] | None = None
    causal: bool = False
    norm: Literal["pre", "post"] = "post"
    position_offset: int = 0
    fused: FusedLayout | None = None
    layer_groups: str | None = None
    window_attr: str = "sliding_window"
    layer_types_attr: str = "layer_types"
    source: Literal["table", "discovered"] = "table"
    modality: Literal["text", "image"] = "text"
    forward_ad: tuple[tuple[str, str], ...] = ()
    block_output_at: str | None = None
    sequence_first: bool = False
    relative_segments: bool = False


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
    ArchSpec(
        name="albert",
        model_types=("albert",),
        layers="encoder.albert_layer_groups",
        layer_groups="albert_layers",
        value="attention.value",
        out_proj="attention.dense",
    ),
    ArchSpec(
        name="gpt-neox",
        model_types=("gpt_neox",),
        layers="layers",
        value="attention.query_key_value",
        out_proj="attention.dense",
        fused="per_kv_group",
        causal=True,
        norm="pre",
    ),
    ArchSpec(
        name="opt",
        model_types=("opt",),
        layers="decoder.layers",
        value="self_attn.v_proj",
        out_proj="self_attn.out_proj",
        causal=True,
        norm="pre",
        position_offset=2,
    ),
    ArchSpec(
        name="gpt-neo",
        model_types=("gpt_neo",),
        layers="h",
        value="attn.attention.v_proj",
        out_proj="attn.attention.out_proj",
        causal=True,
        norm="pre",
        window_attr="window_size",
        layer_types_attr="attention_layers",
    ),
    ArchSpec(
        name="bloom",
        model_types=("bloom",),
        layers="h",
        value="self_attention.query_key_value",
        out_proj="self_attention.dense",
        fused="per_kv_group",
        causal=True,
        norm="pre",
        # transformers 5.x runs GeLUFunction (backward only) in eval mode too.
        forward_ad=(("mlp.gelu_impl", "bloom_gelu_forward"),),
    ),
    ArchSpec(
        name="falcon",
        model_types=("falcon",),
        layers="h",
        value="self_attention.query_key_value",
        out_proj="self_attention.dense",
        fused="per_kv_group",
        causal=True,
        norm="pre",
    ),
    ArchSpec(
        name="phi3",
        model_types=("phi3",),
        layers="layers",
        value="self_attn.qkv_proj",
        out_proj="self_attn.o_proj",
        fused="qkv_blocks",
        causal=True,
        norm="pre",
    ),
    ArchSpec(
        name="deberta-v2",
        model_types=("deberta-v2",),
        layers="encoder.layer",
        value="attention.self.value_proj",
        out_proj="attention.output.dense",
    ),
    ArchSpec(
        # Relative attention with raw [d, H, d_v] projections. Without a target mapping
        # (pretraining only) just the content stream runs, and that is what is traced;
        # the query stream of two-stream attention is not.
        name="xlnet",
        model_types=("xlnet",),
        layers="layer",
        value="rel_attn.v",
        out_proj="rel_attn.o",
        weight_layout="heads",
        # `rel_attn.dropout` runs on A, then on the block output (both eval identities);
        # reading it there is exact, whereas the layer norm's input minus E would add
        # the rounding of the residual sum (beyond the half-precision tolerance).
        block_output_at="rel_attn.dropout",
        sequence_first=True,
        relative_segments=True,
    ),
    ArchSpec(
        name="modernbert",
        model_types=("modernbert",),
        layers="layers",
        value="attn.Wqkv",
        out_proj="attn.Wo",
        fused="qkv_blocks",
        norm="pre",
    ),
    ArchSpec(
        name="vit",
        model_types=("vit", "deit"),
        layers="layers",
        value="attention.v_proj",
        out_proj="attention.o_proj",
        norm="pre",
        modality="image",
    ),
    ArchSpec(
        name="clip-vision",
        model_types=("clip_vision_model",),
        layers="encoder.layers",
        value="self_attn.v_proj",
        out_proj="self_attn.out_proj",
        norm="pre",
        modality="image",
    ),
    *(
        ArchSpec(
            name=name,
            model_types=types,
            layers="layers",
            value="self_attn.v_proj",
            out_proj="self_attn.o_proj",
            causal=True,
            norm="pre",
        )
        for name, types in (
            ("gemma", ("gemma", "gemma2", "gemma3_text")),
            ("qwen3", ("qwen3",)),
            ("olmo2", ("olmo2",)),
            ("mixtral", ("mixtral",)),
        )
    ),
)


def supported_model_types() -> list[str]:
    return sorted(t for s in SPECS for t in s.model_types)


def find_spec(model_type: str) -> ArchSpec | None:
    """The table's spec covering `config.model_type`, or None."""
    for spec in SPECS:
        if model_type in spec.model_types:
            return spec
    return None


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
