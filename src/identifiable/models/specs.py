"""Per-architecture knowledge, as data: one entry per family, and nothing about a family elsewhere.

This is the only place that names Hugging Face modules. A spec says, relative to
the base model (`AutoModel`), where the list of layers is, which module inside a
layer is the value projection (its *input* is E), which is the output projection
W_O (its *output* is the attention block's output before dropout and residual),
and how to slice W_V out of a fused QKV weight (or, for XLNet, which raw
parameters hold W_V and W_O). A family whose layers depart from the ordinary layout says so
with a quirk object (models/quirks.py: tensor axes, where the block output is read, layers
shared across depths, token types, the traced tower). It also carries the family's
residual-block layout (`NormLayout`, read by the context-mixing
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

from dataclasses import replace

from identifiable.errors import IdentifiableError
from identifiable.models.latent import MLA
from identifiable.models.quirks import (
    BATCH_FIRST,
    FAIRSEQ,
    SEQUENCE_FIRST,
    Axes,
    BlockOutput,
    LayerGroups,
    Segments,
    Tower,
)
from identifiable.models.spec_types import (
    ArchSpec,
    BlockKind,
    FusedLayout,
    NormLayout,
    NormRule,
    Seq2SeqSpec,
)

__all__ = [
    "BATCH_FIRST",
    "FAIRSEQ",
    "SEQ2SEQ_SPECS",
    "SEQUENCE_FIRST",
    "SPECS",
    "ArchSpec",
    "Axes",
    "BlockKind",
    "BlockOutput",
    "FusedLayout",
    "LayerGroups",
    "NormLayout",
    "NormRule",
    "Segments",
    "Seq2SeqSpec",
    "Tower",
    "all_seq2seq_specs",
    "all_specs",
    "find_seq2seq_spec",
    "find_spec",
    "register_spec",
    "spec_for",
    "supported_model_types",
]


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
    norms=_PRE_RMS,
)
_VIT = ArchSpec(
    name="vit",
    model_types=("vit",),
    layers="layers",
    value="attention.v_proj",
    out_proj="attention.o_proj",
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
        fused="qkv_blocks",
        causal=True,
        norms=NormLayout("ln_1", "ln_2", "pre"),
        mlp_width="n_inner",
    ),
    _LLAMA,
    ArchSpec(
        name="albert",
        model_types=("albert",),
        layers="encoder.albert_layer_groups",
        layer_groups=LayerGroups("albert_layers"),
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
        norms=NormLayout("input_layernorm", "input_layernorm", "parallel"),
        norm_rules=(
            NormRule("new_decoder_architecture", True, NormLayout("ln_attn", "ln_mlp", "parallel")),
            NormRule("parallel_attn", False, _PRE_RMS),
        ),
        mlp_width="ffn_hidden_size",
    ),
    ArchSpec(
        name="codegen",
        model_types=("codegen",),
        layers="h",
        value="attn.qkv_proj",
        out_proj="attn.out_proj",
        fused="qvk_mp4",
        causal=True,
        norms=NormLayout("ln_1", "ln_1", "parallel"),
        mlp_width="n_inner",
    ),
    ArchSpec(
        name="phi3",
        model_types=("phi3",),
        layers="layers",
        value="self_attn.qkv_proj",
        out_proj="self_attn.o_proj",
        fused="qkv_blocks",
        causal=True,
        norms=_PRE_RMS,
    ),
    replace(
        _BERT, name="deberta-v2", model_types=("deberta-v2",), value="attention.self.value_proj"
    ),
    # DeBERTa v1: [q | k | v] per head in one bias-free in_proj, b_V a parameter of its own
    replace(
        _BERT,
        name="deberta",
        model_types=("deberta",),
        value="attention.self.in_proj",
        fused="per_kv_group",
        value_bias="attention.self.v_bias",
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
        block_output=BlockOutput("rel_attn.dropout"),
        axes=SEQUENCE_FIRST,
        segments=Segments(compared=True),
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
        modality="image",
        norms=NormLayout("layer_norm1", "layer_norm2", "pre"),
        tower=Tower("vision_model"),
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
    # DeepSeek sparse attention: latent attention over the keys an indexer keeps per row
    # (models/keyselect.py); GLM-5's "shared" layers reuse the last layer's selection
    replace(
        _LLAMA,
        name="deepseek-sparse",
        model_types=("deepseek_v32", "glm_moe_dsa"),
        value="self_attn.kv_b_proj",
        latent=MLA,
        key_selector="self_attn.indexer",
    ),
)


_T5_TYPES = ("t5", "mt5", "umt5", "switch_transformers")  # switch: experts in the MLP only
# BART's module layout (self_attn, encoder_attn, v_proj, out_proj), pre- or post-LN
_BART_TYPES = (
    "bart",
    "mbart",
    "marian",
    "blenderbot",
    "blenderbot-small",
    "pegasus",
    "m2m_100",
    "plbart",
    "mvp",
)


def _t5(part: str, value: str, out: str, causal: bool) -> ArchSpec:
    return ArchSpec(
        name=f"t5-{part}",
        model_types=_T5_TYPES,
        layers="block",
        value=value,
        out_proj=out,
        causal=causal,
        mlp_width="d_ff",
    )


def _bart(part: str, attn: str, causal: bool, types: tuple[str, ...] = _BART_TYPES) -> ArchSpec:
    return ArchSpec(
        name=f"bart-{part}",
        model_types=types,
        layers="layers",
        value=f"{attn}.v_proj",
        out_proj=f"{attn}.out_proj",
        causal=causal,
        mlp_width="decoder_ffn_dim" if causal else "encoder_ffn_dim",
    )


def _fairseq(part: str, attn: str, causal: bool) -> ArchSpec:
    """FSMT: BART's module names in fairseq's layout (hidden states [n, B, d] between layers,
    attention maps [B, H, n, n_k]); the encoder's ids come from the source vocabulary."""
    return replace(
        _bart(part, attn, causal, ("fsmt",)),
        name=f"fsmt-{part}",
        axes=FAIRSEQ,
        vocab_attr="src_vocab_size" if part == "encoder" else "vocab_size",
    )


SEQ2SEQ_SPECS: tuple[Seq2SeqSpec, ...] = (
    Seq2SeqSpec(
        name="t5",
        model_types=_T5_TYPES,
        encoder=_t5("encoder", "layer.0.SelfAttention.v", "layer.0.SelfAttention.o", False),
        decoder=_t5("decoder", "layer.0.SelfAttention.v", "layer.0.SelfAttention.o", True),
        cross=_t5("cross", "layer.1.EncDecAttention.v", "layer.1.EncDecAttention.o", False),
    ),
    Seq2SeqSpec(
        name="bart",
        model_types=_BART_TYPES,
        encoder=_bart("encoder", "self_attn", False),
        decoder=_bart("decoder", "self_attn", True),
        cross=_bart("cross", "encoder_attn", False),
        decoder_heads_attr="decoder_attention_heads",
    ),
    Seq2SeqSpec(  # BART's layout with experts in the MLP and its cross-attention renamed
        name="nllb-moe",
        model_types=("nllb-moe",),
        encoder=_bart("encoder", "self_attn", False, ("nllb-moe",)),
        decoder=_bart("decoder", "self_attn", True, ("nllb-moe",)),
        cross=_bart("cross", "cross_attention", False, ("nllb-moe",)),
        decoder_heads_attr="decoder_attention_heads",
    ),
    Seq2SeqSpec(  # BART's decoder; the encoder's full attention (block-sparse is refused)
        name="bigbird-pegasus",
        model_types=("bigbird_pegasus",),
        encoder=replace(
            _bart("encoder", "self_attn", False, ("bigbird_pegasus",)),
            value="self_attn.self.value",
            out_proj="self_attn.output",
        ),
        decoder=_bart("decoder", "self_attn", True, ("bigbird_pegasus",)),
        cross=_bart("cross", "encoder_attn", False, ("bigbird_pegasus",)),
        decoder_heads_attr="decoder_attention_heads",
    ),
    Seq2SeqSpec(  # fairseq machine translation (WMT19): its encoder stack has no config
        name="fsmt",
        model_types=("fsmt",),
        encoder=_fairseq("encoder", "self_attn", False),
        decoder=_fairseq("decoder", "self_attn", True),
        cross=_fairseq("cross", "encoder_attn", False),
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
