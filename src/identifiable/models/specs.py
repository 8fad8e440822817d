"""Per-architecture knowledge, as data: one entry per family, and nothing about a family elsewhere.

This is the only place that names Hugging Face modules. A spec says, relative to
the base model (`AutoModel`), where the list of layers is, which module inside a
layer is the value projection (its *input* is E), which is the output projection
W_O (its *output* is the attention block's output before dropout and residual),
and how to slice W_V out of a fused QKV weight (or, for XLNet, which raw
parameters hold W_V and W_O and which module receives the block output). It also
carries the family's residual-block layout (`NormLayout`, read by the context-mixing
decompositions, and the config switches that rewire it, `NormRule`), the module paths
of transformers 4.x where they differ, and the few config names and token names that
differ between families.

Adding an architecture = one `ArchSpec` entry below (or `register_spec(ArchSpec(...))`
at run time) plus a tiny config in `TINY_CONFIGS` of tests/helpers/families.py: the test in
tests/models/test_specs.py enumerates every spec, so an entry without a tiny config fails;
`Trace.verify()` proves the entry right and the block layout is proved as discovery
proves it (`identifiable.models.discover.prove_norm_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from identifiable.errors import IdentifiableError
from identifiable.models.latent import MLA, LatentValues

FusedLayout = Literal["qkv_blocks", "per_kv_group"]
"""Where W_V sits inside a fused QKV weight (output dimension, d_v = head width):

- "qkv_blocks": [Q (H·d_v) | K (H_kv·d_v) | V (H_kv·d_v)] (GPT-2, Phi-3).
- "per_kv_group": for each key/value head, its H/H_kv query heads, then its key,
  then its value, d_v columns each (GPT-NeoX, BLOOM: H_kv = H, i.e. [q, k, v] per
  head; Falcon: any H_kv, multi-query included).
In both, the fused width is (H + 2·H_kv)·d_v, which gives H_kv.
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
            `identifiable.models.discover` and proved by `verify()` on a probe,
            "registered" for specs added with `register_spec`.
        modality: "text" (token ids in) or "image" (`pixel_values` in; the tokens
            are `prefix_tokens` then the patches row by row).
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
        norms: the residual block's normalisation layout (`NormLayout`), None where it
            is not described (the norm-based methods then refuse in one line).
        norm_rules: config switches that change `norms` or make it undefined (`NormRule`).
        mlp_width: config attribute with the MLP width (memory estimates; 4·d if unset).
        prefix_tokens: image models: the tokens before the patches ([CLS], DeiT's [DIST]).
        tower: attribute of the base model holding the traced tower, where the base model
            is more than it (a full CLIP model: its `vision_model`); used where present.
        tf4_paths: (layers, value, out_proj) as transformers 4.x names them, where they
            differ (4.x ViT); used only when the model lacks `layers` and has these.
        tf4_windows: config attributes (local window width, period of global layers) that
            name windowed layers in transformers 4.x instead of `window_attr` and
            `layer_types_attr` (4.x ModernBERT: layer i is global when i is a multiple of
            the period, otherwise it sees |i − j| ≤ width / 2).
        latent: multi-head latent attention: how the value module (the latent expansion)
            holds each head's values (`identifiable.models.latent.LatentValues`); None: the
            value module reads the hidden states.
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
    source: Literal["table", "discovered", "registered"] = "table"
    modality: Literal["text", "image"] = "text"
    forward_ad: tuple[tuple[str, str], ...] = ()
    block_output_at: str | None = None
    sequence_first: bool = False
    relative_segments: bool = False
    norms: NormLayout | None = None
    norm_rules: tuple[NormRule, ...] = ()
    mlp_width: str = "intermediate_size"
    prefix_tokens: tuple[str, ...] = ("[CLS]",)
    tower: str | None = None
    tf4_paths: tuple[str, str, str] | None = None
    tf4_windows: tuple[str, str] | None = None
    latent: LatentValues | None = None

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


_BERT_LN = NormLayout("attention.output.LayerNorm", "output.LayerNorm", "post")
_PRE_RMS = NormLayout("input_layernorm", "post_attention_layernorm", "pre")
_SANDWICH = (
    "normalises the attention output before adding it to the residual stream (sandwich "
    "norm), a wiring the norm-based decompositions here do not describe"
)


_BERT = ArchSpec(
    name="bert",
    model_types=("bert",),
    layers="encoder.layer",
    value="attention.self.value",
    out_proj="attention.output.dense",
    norms=_BERT_LN,
)
_LLAMA = ArchSpec(
    name="llama",
    model_types=("llama", "mistral", "qwen2"),
    layers="layers",
    value="self_attn.v_proj",
    out_proj="self_attn.o_proj",
    causal=True,
    norm="pre",
    norms=_PRE_RMS,
)
_VIT = ArchSpec(
    name="vit",
    model_types=("vit",),
    layers="layers",
    value="attention.v_proj",
    out_proj="attention.o_proj",
    norm="pre",
    modality="image",
    norms=NormLayout("layernorm_before", "layernorm_after", "pre"),
    tf4_paths=("encoder.layer", "attention.attention.value", "attention.output.dense"),
)

SPECS: tuple[ArchSpec, ...] = (
    _BERT,
    replace(
        _BERT,
        name="roberta",
        model_types=("roberta", "xlm-roberta", "camembert"),
        position_offset=2,
    ),
    replace(_BERT, name="electra", model_types=("electra",)),
    ArchSpec(
        name="distilbert",
        model_types=("distilbert",),
        layers="transformer.layer",
        value="attention.v_lin",
        out_proj="attention.out_lin",
        norms=NormLayout("sa_layer_norm", "output_layer_norm", "post"),
        mlp_width="hidden_dim",
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
        norms=NormLayout("ln_1", "ln_2", "pre"),
        mlp_width="n_inner",
    ),
    _LLAMA,
    ArchSpec(
        name="albert",
        model_types=("albert",),
        layers="encoder.albert_layer_groups",
        layer_groups="albert_layers",
        value="attention.value",
        out_proj="attention.dense",
        # the layer is shared across depths: one hook per module, calls taken in order
        norms=NormLayout("attention.LayerNorm", "full_layer_layer_norm", "post"),
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
        norms=NormLayout("input_layernorm", "post_attention_layernorm", "parallel"),
        norm_rules=(NormRule("use_parallel_residual", False, _PRE_RMS),),
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
        norms=NormLayout("self_attn_layer_norm", "final_layer_norm", "pre"),
        # opt-350m: LayerNorm after the residual
        norm_rules=(
            NormRule(
                "do_layer_norm_before",
                False,
                NormLayout("self_attn_layer_norm", "final_layer_norm", "post"),
            ),
        ),
        mlp_width="ffn_dim",
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
        norms=NormLayout("ln_1", "ln_2", "pre"),
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
        norms=_PRE_RMS,
        norm_rules=(
            NormRule(
                "apply_residual_connection_post_layernorm",
                True,
                reason="takes its residual after the norm "
                "(apply_residual_connection_post_layernorm), which no layout here describes",
            ),
        ),
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
        norms=NormLayout("input_layernorm", "input_layernorm", "parallel"),
        norm_rules=(
            NormRule("new_decoder_architecture", True, NormLayout("ln_attn", "ln_mlp", "parallel")),
            NormRule("parallel_attn", False, _PRE_RMS),
        ),
        mlp_width="ffn_hidden_size",
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
        norms=_PRE_RMS,
    ),
    replace(
        _BERT, name="deberta-v2", model_types=("deberta-v2",), value="attention.self.value_proj"
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
        mlp_width="d_inner",
        # post-LN: the attention's own layer norm reads x + Attn, the FFN's ends the layer
        norms=NormLayout("rel_attn.layer_norm", "ff.layer_norm", "post"),
    ),
    ArchSpec(
        name="modernbert",
        model_types=("modernbert",),
        layers="layers",
        value="attn.Wqkv",
        out_proj="attn.Wo",
        fused="qkv_blocks",
        norm="pre",
        norms=NormLayout("attn_norm", "mlp_norm", "pre"),  # layer 0's attn_norm: Identity
        tf4_windows=("local_attention", "global_attn_every_n_layers"),
    ),
    _VIT,
    replace(_VIT, name="deit", model_types=("deit",), prefix_tokens=("[CLS]", "[DIST]")),
    ArchSpec(
        name="clip-vision",
        # a full CLIP model is traced through its vision tower
        model_types=("clip_vision_model", "clip"),
        layers="encoder.layers",
        value="self_attn.v_proj",
        out_proj="self_attn.out_proj",
        norm="pre",
        modality="image",
        norms=NormLayout("layer_norm1", "layer_norm2", "pre"),
        tower="vision_model",
    ),
    replace(
        _LLAMA,
        name="gemma",
        model_types=("gemma", "gemma2", "gemma3_text"),
        norms=replace(_PRE_RMS, unit_offset=True),
        norm_rules=(
            NormRule("model_type", "gemma2", reason=_SANDWICH),
            NormRule("model_type", "gemma3_text", reason=_SANDWICH),
        ),
    ),
    # q/k norms sit inside the attention scores, not on the residual path
    replace(_LLAMA, name="qwen3", model_types=("qwen3",)),
    replace(
        _LLAMA,
        name="olmo2",
        model_types=("olmo2",),
        norm_rules=(NormRule("model_type", "olmo2", reason=_SANDWICH),),
    ),
    replace(_LLAMA, name="mixtral", model_types=("mixtral",)),
    # multi-head latent attention: values from the normalised latent (models/latent.py)
    replace(
        _LLAMA,
        name="deepseek",
        model_types=("deepseek_v2", "deepseek_v3"),
        value="self_attn.kv_b_proj",
        latent=MLA,
    ),
)


def _t5(part: str, value: str, out: str, causal: bool) -> ArchSpec:
    return ArchSpec(
        name=f"t5-{part}",
        model_types=("t5", "mt5"),
        layers="block",
        value=value,
        out_proj=out,
        causal=causal,
        norm="pre",
        mlp_width="d_ff",
    )


def _bart(part: str, attn: str, causal: bool) -> ArchSpec:
    return ArchSpec(
        name=f"bart-{part}",
        model_types=("bart", "mbart", "marian"),
        layers="layers",
        value=f"{attn}.v_proj",
        out_proj=f"{attn}.out_proj",
        causal=causal,
        mlp_width="decoder_ffn_dim" if causal else "encoder_ffn_dim",
    )


SEQ2SEQ_SPECS: tuple[Seq2SeqSpec, ...] = (
    Seq2SeqSpec(
        name="t5",
        model_types=("t5", "mt5"),
        encoder=_t5("encoder", "layer.0.SelfAttention.v", "layer.0.SelfAttention.o", False),
        decoder=_t5("decoder", "layer.0.SelfAttention.v", "layer.0.SelfAttention.o", True),
        cross=_t5("cross", "layer.1.EncDecAttention.v", "layer.1.EncDecAttention.o", False),
    ),
    Seq2SeqSpec(
        name="bart",
        model_types=("bart", "mbart", "marian"),
        encoder=_bart("encoder", "self_attn", False),
        decoder=_bart("decoder", "self_attn", True),
        cross=_bart("cross", "encoder_attn", False),
        decoder_heads_attr="decoder_attention_heads",
    ),
)

_REGISTERED: list[ArchSpec | Seq2SeqSpec] = []
"""Specs added at run time by `register_spec`, newest first; consulted before the table."""


def register_spec(spec: ArchSpec | Seq2SeqSpec, *, replace_table: bool = False) -> None:
    """Add a family for this process: `load_model` and `Model.from_hf` then trace its
    model types with `spec`, as they do the table's entries.

    A registered spec is consulted before the table (newest registration first). A model
    type the table already covers is refused unless `replace_table=True`. Bad input is one
    `IdentifiableError` naming what to fix. `verify()` still proves every trace, so a wrong
    spec is caught on its first trace.
    """
    if not isinstance(spec, ArchSpec | Seq2SeqSpec):
        raise IdentifiableError(
            f"register_spec takes an ArchSpec (or a Seq2SeqSpec), got {type(spec).__name__}"
        )
    types = spec.model_types
    if not isinstance(types, tuple) or not types or not all(isinstance(t, str) for t in types):
        raise IdentifiableError(
            f"spec '{spec.name}': model_types must be a non-empty tuple of config.model_type "
            f"strings, got {types!r}"
        )
    known: tuple[ArchSpec | Seq2SeqSpec, ...] = (*SPECS, *SEQ2SEQ_SPECS)
    table = {t: s.name for s in known for t in s.model_types}
    covered = [t for t in types if t in table]
    if covered and not replace_table:
        raise IdentifiableError(
            f"model type '{covered[0]}' is already in the table (spec '{table[covered[0]]}'); "
            f"pass replace_table=True to trace it with '{spec.name}' instead"
        )
    _REGISTERED.insert(
        0, replace(spec, source="registered") if isinstance(spec, ArchSpec) else spec
    )


def all_specs() -> tuple[ArchSpec, ...]:
    """Every single-stack spec in force: the registered ones, then the table."""
    return (*(s for s in _REGISTERED if isinstance(s, ArchSpec)), *SPECS)


def all_seq2seq_specs() -> tuple[Seq2SeqSpec, ...]:
    """Every encoder–decoder spec in force: the registered ones, then the table."""
    return (*(s for s in _REGISTERED if isinstance(s, Seq2SeqSpec)), *SEQ2SEQ_SPECS)


def supported_model_types() -> list[str]:
    return sorted({t for s in all_specs() for t in s.model_types})


def find_spec(model_type: str) -> ArchSpec | None:
    """The spec covering `config.model_type` (registered first, then the table), or None."""
    for spec in all_specs():
        if model_type in spec.model_types:
            return spec
    return None


def find_seq2seq_spec(model_type: str) -> Seq2SeqSpec | None:
    """The encoder–decoder spec covering `config.model_type`, or None."""
    for spec in all_seq2seq_specs():
        if model_type in spec.model_types:
            return spec
    return None


def spec_for(model_type: str) -> ArchSpec:
    """The spec covering `config.model_type`, or an error naming the supported ones."""
    spec = find_spec(model_type)
    if spec is not None:
        return spec
    raise IdentifiableError(
        f"architecture '{model_type}' is not supported; supported model types: "
        f"{', '.join(supported_model_types())}. To add one, describe it with an ArchSpec and "
        "register_spec(spec) (identifiable.models; see docs/families.md, 'Adding an architecture')."
    )
