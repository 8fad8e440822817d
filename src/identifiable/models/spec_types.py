"""The data types of the family table (models/specs.py): `ArchSpec` (where the pieces of
docs/definitions.md#notation live in one family), `Seq2SeqSpec` (the three attention kinds of an
encoder–decoder family), the residual-block layout `NormLayout` and the config switches that
rewire it (`NormRule`); a family's quirks are objects of models/quirks.py. They name no family;
the entries live in models/specs.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from identifiable.errors import IdentifiableError
from identifiable.models.latent import LatentValues
from identifiable.models.quirks import (
    AT_OUT_PROJ,
    BATCH_FIRST,
    EMBEDDED_SEGMENTS,
    NO_TOWER,
    ONE_RUN_EACH,
    QUIRKS,
    Axes,
    BlockOutput,
    LayerGroups,
    Segments,
    Tower,
)

FusedLayout = Literal["qkv_blocks", "per_kv_group", "qvk_mp4"]
"""Where W_V sits inside a fused QKV weight (output dimension, d_v = head width):

- "qkv_blocks": [Q (H·d_v) | K (H_kv·d_v) | V (H_kv·d_v)] (GPT-2, Phi-3).
- "per_kv_group": for each key/value head, its H/H_kv query heads, then its key,
  then its value, d_v columns each (GPT-NeoX, BLOOM: H_kv = H, i.e. [q, k, v] per
  head; Falcon: any H_kv, multi-query included).
- "qvk_mp4": four model-parallel blocks, each [Q | V | K] of a quarter of the heads
  (CodeGen; H_kv = H).
In all, the fused width is (H + 2·H_kv)·d_v, which gives H_kv.
"""

BlockKind = Literal["post", "pre", "parallel"]
"""How a layer's residual block is wired (N1, N2 its two normalisation modules):

- "post" (BERT family): x → N1(x + Attn(x)) = y → N2(y + FFN(y)).
- "pre" (GPT-2, Llama): x → x + Attn(N1(x)) = y → y + MLP(N2(y)).
- "parallel" (GPT-NeoX, GPT-J-style Falcon): x → x + Attn(N1(x)) + MLP(N2(x)); the MLP
  reads x, not x + Attn, so y = x + Attn(N1(x)) is never formed by the model.
"""


@dataclass(frozen=True)
class NormLayout:
    """Where a family's two normalisation modules sit inside one layer, and the wiring.

    Attributes:
        first: dotted path (inside a layer) of N1 (LN1 of a post-LN block).
        second: dotted path of N2 (Falcon's parallel block has one norm feeding both
            branches: then `second` is the same module as `first`).
        kind: "post", "pre" or "parallel" (`BlockKind`).
        unit_offset: the RMSNorm scales by (1 + weight) rather than weight (Gemma).
    """

    first: str
    second: str
    kind: BlockKind
    unit_offset: bool = False


@dataclass(frozen=True)
class NormRule:
    """A config switch that rewires a family's block: when `config.<attr> == value`, the
    layout is `layout`, or, when `layout` is None, the norm-based methods are undefined
    because the model `reason` (a phrase that follows "it", e.g. "normalises …").
    Rules are tried in order; the first that matches wins."""

    attr: str
    value: object
    layout: NormLayout | None = None
    reason: str = ""


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
        causal: decoder-style (row i attends to keys ≤ i).
        position_offset: positions the model reserves before the first token
            (RoBERTa counts from padding_idx + 1), subtracted from the maximum length.
        fused: where W_V sits in a fused QKV projection (`FusedLayout`: equal [Q | K | V]
            thirds are "qkv_blocks" with H_kv = H); None when `value` is a separate V
            projection.
        layer_groups: how the entries of `layers` run across depths (`LayerGroups`; ALBERT
            reuses them: `LayerGroups("albert_layers")`).
        window_attr: config attribute with the sliding/local window size.
        layer_types_attr: config attribute naming each layer's attention type
            ("sliding_attention"/"local" layers use the window, others see all keys).
        source: "table" for the entries below, "discovered" for specs found by
            `identifiable.models.discover` and proved by `verify()` on a probe,
            "registered" for specs added with `register_spec`.
        modality: "text" (token ids in) or "image" (`pixel_values` in; the tokens
            are `prefix_tokens` then the patches row by row).
        forward_ad: modules (dotted path inside a layer, name of a plain function
            in the module's own modelling file) whose forward is a custom
            `autograd.Function` without forward-mode AD, and the function that
            computes the same numbers with plain torch ops. Hidden Token
            Attribution runs the function in their place (BLOOM's GELU).
        block_output: where the attention block's output is read (`BlockOutput`: `out_proj`'s
            output, or XLNet's `BlockOutput("rel_attn.dropout")`, a module's input).
        axes: the order of the layers' tensors (`Axes`: `BATCH_FIRST`, XLNet's
            `SEQUENCE_FIRST`, FSMT's `FAIRSEQ`); every capture turns them to `[B, n, d]` and
            `[B, H, n, n_k]`.
        segments: whether a pair's token types are passed (`Segments`; XLNet compares them
            without embedding them: `Segments(compared=True)`).
        norms: the residual block's normalisation layout (`NormLayout`), whose `kind` says
            how the block is wired (post-LN, pre-LN or parallel, and so what E is; E is always
            read at the value projection's input); None where it is not described (the
            norm-based methods then refuse in one line).
        norm_rules: config switches that change `norms` or make it undefined (`NormRule`).
        mlp_width: config attribute with the MLP width (memory estimates; 4·d if unset).
        prefix_tokens: image models: the tokens before the patches ([CLS], DeiT's [DIST]).
        tower: the tower traced where the base model holds several (`Tower`; a full CLIP
            model: `Tower("vision_model")`); used where present.
        tf4_paths: (layers, value, out_proj) as transformers 4.x names them, where they
            differ (4.x ViT); used only when the model lacks `layers` and has these.
        tf4_windows: config attributes (local window width, period of global layers) that
            name windowed layers in transformers 4.x instead of `window_attr` and
            `layer_types_attr` (4.x ModernBERT: layer i is global when i is a multiple of
            the period, otherwise it sees |i − j| ≤ width / 2).
        latent: multi-head latent attention: how the value module (the latent expansion)
            holds each head's values (`identifiable.models.latent.LatentValues`); None: the
            value module reads the hidden states.
        key_selector: sparse attention: dotted path (inside a layer) of the module that picks
            the keys each query row attends to (DeepSeek-V3.2's indexer), whose output is
            `[B, n, k]` key indices; layers without it reuse the last selection
            (models/keyselect.py). None: every key the mask and windows allow.
        value_bias: dotted path (inside a layer) of a raw parameter holding b_V (H_kv·d_v,
            head by head) that the model adds after a bias-free value projection (DeBERTa's
            `v_bias` after its fused `in_proj`); None: the value module's own bias.
        value_norm: dotted path (inside a layer) of a module the model applies to each head's
            values before attention (Gemma 4: an RMS norm over the head width,
            `self_attn.v_norm`); E·W_V is then read as that module's output, with b_V inside
            it. None: the values are E·W_V + b_V.
        vocab_attr: config attribute with the size of the vocabulary the stack's token ids
            come from (FSMT's encoder reads `src_vocab_size`; its `vocab_size` is the target's).
    """

    name: str
    model_types: tuple[str, ...]
    layers: str
    value: str
    out_proj: str
    weight_layout: Literal["linear", "conv1d", "heads"] = "linear"
    causal: bool = False
    position_offset: int = 0
    fused: FusedLayout | None = None
    layer_groups: LayerGroups = ONE_RUN_EACH
    window_attr: str = "sliding_window"
    layer_types_attr: str = "layer_types"
    source: Literal["table", "discovered", "registered"] = "table"
    modality: Literal["text", "image"] = "text"
    forward_ad: tuple[tuple[str, str], ...] = ()
    block_output: BlockOutput = AT_OUT_PROJ
    axes: Axes = BATCH_FIRST
    segments: Segments = EMBEDDED_SEGMENTS
    norms: NormLayout | None = None
    norm_rules: tuple[NormRule, ...] = ()
    mlp_width: str = "intermediate_size"
    prefix_tokens: tuple[str, ...] = ("[CLS]",)
    tower: Tower = NO_TOWER
    tf4_paths: tuple[str, str, str] | None = None
    tf4_windows: tuple[str, str] | None = None
    latent: LatentValues | None = None
    key_selector: str | None = None
    value_bias: str | None = None
    value_norm: str | None = None
    vocab_attr: str = "vocab_size"

    def __post_init__(self) -> None:
        """One line for a spec of the wrong kind, when it is made (not at its first trace)."""
        types = self.model_types
        if not isinstance(types, tuple) or not types or not all(isinstance(t, str) for t in types):
            raise IdentifiableError(
                f"spec '{self.name}': model_types must be a non-empty tuple of config.model_type "
                f"strings, got {types!r:.80}"
            )
        for field in ("name", "layers", "value", "out_proj"):
            value = getattr(self, field)
            if not isinstance(value, str) or (field == "name" and not value):
                raise IdentifiableError(
                    f"ArchSpec {field} must be a non-empty string (a module path such as "
                    f"'encoder.layer' for layers), got {value!r:.60}"
                )
        for field, kind in QUIRKS.items():
            value = getattr(self, field)
            if not isinstance(value, kind):
                raise IdentifiableError(
                    f"ArchSpec {field} must be a {kind.__name__} (identifiable.models.quirks; "
                    f"docs/families.md, 'Adding an architecture'), got {value!r:.60}"
                )


@dataclass(frozen=True)
class Seq2SeqSpec:
    """Where the three attention kinds live in one encoder–decoder family.

    Attributes:
        name: short family name.
        model_types: `config.model_type` values covered.
        encoder: spec of the encoder's self-attention, paths relative to the encoder stack.
        decoder: spec of the decoder's causal self-attention, relative to the decoder stack.
        cross: spec of the decoder's cross-attention (its value projection's input is E_enc).
        encoder_stack, decoder_stack: paths of the two stacks in the base model.
        decoder_heads_attr: config attribute with the decoder's number of heads.
    """

    name: str
    model_types: tuple[str, ...]
    encoder: ArchSpec
    decoder: ArchSpec
    cross: ArchSpec
    encoder_stack: str = "encoder"
    decoder_stack: str = "decoder"
    decoder_heads_attr: str = "num_attention_heads"
