"""The one family list of the tests and the tiny random models built from it.

Everything is built offline. Tiny models share the embedded model's BERT tokenizer
(vocabulary 30522), so any text works with any architecture. `tests/conftest.py` re-exports
these names, so `from conftest import build_tiny_hf_model` keeps working; new tests import
them from here (`from helpers.families import build_tiny_hf_model`).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch


class Tiny(NamedTuple):
    """A tiny random config of one model type: `AutoConfig.for_model(type, **config)`
    (text models also get the BERT vocabulary), the family-wide tests it joins (`suite`),
    and whether its attention is causal (test knowledge, independent of the spec table)."""

    suite: str
    config: dict
    causal: bool = False


_LLAMA_LIKE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
    "head_dim": 16,
}
_GPTJ_LIKE = {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "n_positions": 128}
_IDS = {"pad_token_id": 0, "bos_token_id": 101, "eos_token_id": 102}
_BERT_LIKE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 128,
}
_ROBERTA_LIKE = {
    **_BERT_LIKE,
    "max_position_embeddings": 130,
    "pad_token_id": 0,
    "type_vocab_size": 1,
}
# Encoder–decoder families (tests/models/test_seq2seq.py), traced by `Seq2SeqModel`.
_BART_LIKE = {
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 101,
    "eos_token_id": 102,
    "decoder_start_token_id": 102,
}
_T5_LIKE = {
    "d_model": 64,
    "d_kv": 16,
    "num_heads": 4,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "d_ff": 128,
    "relative_attention_num_buckets": 8,
    "pad_token_id": 0,
    "eos_token_id": 102,
    "decoder_start_token_id": 0,
}
# Vision families (tests/models/test_vision.py): 32×32 images in 8×8 patches, so a
# 4×4 grid plus [CLS] (and DeiT's [DIST]): n = 17 or 18 > head width 16.
_VISION = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "image_size": 32,
    "patch_size": 8,
}

_MLA = {
    **{k: v for k, v in _LLAMA_LIKE.items() if k != "head_dim"},  # head_dim: the RoPE width
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 12,
    "first_k_dense_replace": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_group": 1,
    "topk_group": 1,
    **_IDS,
}
_DSA = {**_MLA, "q_lora_rank": 24, "index_topk": 14, "index_n_heads": 2, "index_head_dim": 16}

TINY_CONFIGS: dict[str, Tiny] = {
    # "core": every test of tests/models, attention, attribution and mixing runs on these.
    "bert": Tiny("core", _BERT_LIKE),
    "roberta": Tiny("core", _ROBERTA_LIKE),
    "distilbert": Tiny(
        "core",
        {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128, "max_position_embeddings": 128},
    ),
    "electra": Tiny("core", {"embedding_size": 32, **_BERT_LIKE}),
    "gpt2": Tiny(
        "core", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128}, causal=True
    ),
    "llama": Tiny(
        "core",
        {k: v for k, v in _LLAMA_LIKE.items() if k != "head_dim"} | {"pad_token_id": 0},
        causal=True,
    ),
    # "family": the families added by issue 9 (tests/models/test_families.py and
    # tests/mixing/test_families.py), with valid pad/bos/eos ids. Windows are small
    # (4 keys) so that short texts exercise key sets.
    "albert": Tiny(
        "family", {"embedding_size": 32, **_BERT_LIKE, "num_hidden_layers": 3, **_IDS}
    ),  # one shared layer, run three times
    "gpt_neox": Tiny("family", {**_BERT_LIKE, **_IDS}, causal=True),
    "opt": Tiny(
        "family",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "ffn_dim": 128,
            "word_embed_proj_dim": 64,
            "max_position_embeddings": 128,
            **_IDS,
        },
        causal=True,
    ),
    "gpt_neo": Tiny(
        "family",
        {
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 4,
            "intermediate_size": 128,
            "attention_types": [[["global", "local"], 1]],
            "window_size": 4,
            "max_position_embeddings": 128,
            **_IDS,
        },
        causal=True,
    ),
    "bloom": Tiny("family", {"hidden_size": 64, "n_layer": 2, "n_head": 4, **_IDS}, causal=True),
    "falcon": Tiny(
        "family",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "multi_query": True,
            "new_decoder_architecture": False,
            "max_position_embeddings": 128,
            **_IDS,
        },
        causal=True,
    ),
    "phi3": Tiny("family", {**_LLAMA_LIKE, **_IDS}, causal=True),
    "gemma": Tiny("family", {**_LLAMA_LIKE, **_IDS}, causal=True),
    "gemma2": Tiny(
        "family", {**_LLAMA_LIKE, "sliding_window": 4, **_IDS}, causal=True
    ),  # layers: sliding, full
    "gemma3_text": Tiny(
        "family",
        {
            **_LLAMA_LIKE,
            "sliding_window": 4,
            "layer_types": ["sliding_attention", "full_attention"],
            **_IDS,
        },
        causal=True,
    ),
    "qwen3": Tiny("family", {**_LLAMA_LIKE, **_IDS}, causal=True),
    "olmo2": Tiny("family", {**_LLAMA_LIKE, **_IDS}, causal=True),
    "mixtral": Tiny(
        "family", {**_LLAMA_LIKE, "num_local_experts": 4, "sliding_window": 4, **_IDS}, causal=True
    ),
    "deberta-v2": Tiny(
        "family",
        {
            **_BERT_LIKE,
            "relative_attention": True,
            "pos_att_type": ["p2c", "c2p"],
            "pad_token_id": 0,
        },
    ),
    "modernbert": Tiny(
        "family",
        {
            **_BERT_LIKE,
            "num_hidden_layers": 3,
            "local_attention": 4,  # layers: global, local (|i − j| ≤ 2), local
            "global_attn_every_n_layers": 3,
            **_IDS,
            "cls_token_id": 101,
            "sep_token_id": 102,
        },
    ),
    # "xlnet" (tests/models/test_xlnet.py): kept out of the family-wide tests because its
    # values are formed inside the attention module's forward (raw parameters, no value
    # module), so the value-zeroing re-runs of the mixing family tests have no output to zero.
    "xlnet": Tiny("xlnet", {"d_model": 64, "n_layer": 2, "n_head": 4, "d_inner": 128, **_IDS}),
    "t5": Tiny("seq2seq", _T5_LIKE),
    "mt5": Tiny("seq2seq", {**_T5_LIKE, "feed_forward_proj": "gated-gelu"}),
    "bart": Tiny("seq2seq", _BART_LIKE),
    "mbart": Tiny("seq2seq", _BART_LIKE),
    "marian": Tiny(
        "seq2seq",
        {**_BART_LIKE, "decoder_vocab_size": 30522, "share_encoder_decoder_embeddings": True},
    ),
    # fairseq's layout: sequence-first hidden states, an encoder stack without a config
    "fsmt": Tiny("seq2seq", {**_BART_LIKE, "src_vocab_size": 30522}),
    # the BART and T5 layouts' other families (issue 54's family table), and NLLB-MoE's
    # experts and BigBird-Pegasus's full attention (block-sparse is refused by name)
    **{t: Tiny("spec", _BART_LIKE) for t in ("blenderbot", "blenderbot-small", "pegasus")},
    **{t: Tiny("spec", _BART_LIKE) for t in ("m2m_100", "plbart", "mvp")},
    "nllb-moe": Tiny("spec", {**_BART_LIKE, "num_experts": 4}),
    "bigbird_pegasus": Tiny("spec", {**_BART_LIKE, "attention_type": "original_full"}),
    "umt5": Tiny("spec", _T5_LIKE),
    "switch_transformers": Tiny("spec", {**_T5_LIKE, "num_experts": 4}),
    "vit": Tiny("vision", _VISION),
    "deit": Tiny("vision", _VISION),
    "clip_vision_model": Tiny("vision", _VISION),
    # "spec": the other model types of a spec, traced only by tests/models/test_specs.py.
    "mistral": Tiny("spec", {**_LLAMA_LIKE, **_IDS}, causal=True),
    "qwen2": Tiny("spec", {**_LLAMA_LIKE, **_IDS}, causal=True),
    "xlm-roberta": Tiny("spec", _ROBERTA_LIKE),
    "camembert": Tiny("spec", _ROBERTA_LIKE),
    # multi-head latent attention: value width 12 ≠ query/key width 16 + 8; v3 with a query
    # low-rank path, a dense first layer and mixture-of-experts after it; v2 without
    "deepseek_v3": Tiny("spec", {**_MLA, "q_lora_rank": 24}, causal=True),
    "deepseek_v2": Tiny("spec", {**_MLA, "q_lora_rank": None}, causal=True),
    # DeBERTa v1: [q | k | v] per head in one bias-free in_proj, b_V a parameter of its own
    "deberta": Tiny(
        "spec",
        {
            **_BERT_LIKE,
            "relative_attention": True,
            "pos_att_type": ["c2p", "p2c"],
            "position_biased_input": False,
            "pad_token_id": 0,
        },
    ),
    # sparse attention: an indexer keeps 14 keys per row (d_v = 12); GLM-5: layer 1 reuses it
    "deepseek_v32": Tiny("spec", _DSA, causal=True),
    "glm_moe_dsa": Tiny("spec", {**_DSA, "indexer_types": ["full", "shared"]}, causal=True),
    # four model-parallel [q | v | k] blocks in one fused projection
    "codegen": Tiny("spec", {**_GPTJ_LIKE, **_IDS}, causal=True),
    "clip": Tiny(
        "spec",
        {
            "vision_config": _VISION,
            "text_config": {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4},
        },
    ),
}
"""The one family list of the tests: model_type → `Tiny`. The names below are views of it."""

IMAGE_TYPES = {"vit", "deit", "clip_vision_model", "clip"}


def _suite(name: str) -> dict[str, dict]:
    return {t: entry.config for t, entry in TINY_CONFIGS.items() if entry.suite == name}


ARCHITECTURES = list(_suite("core"))
CAUSAL = {t for t in ARCHITECTURES if TINY_CONFIGS[t].causal}
FAMILY_CONFIGS = _suite("family")
FAMILIES = list(FAMILY_CONFIGS)
XLNET_CONFIG = TINY_CONFIGS["xlnet"].config
SEQ2SEQ_CONFIGS = _suite("seq2seq")
SEQ2SEQ_FAMILIES = list(SEQ2SEQ_CONFIGS)
VISION_CONFIGS = _suite("vision")
VISION_FAMILIES = list(VISION_CONFIGS)


def _skip_if_missing_in_tf4(model_type: str) -> None:
    """Under transformers 4.x (.venv-tf4, the low end of the supported range) a family that
    4.x does not have is skipped, naming it; under 5.x a missing family is an error."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if transformers.__version__.startswith("4.") and model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(
            f"model type '{model_type}' does not exist in transformers {transformers.__version__}"
        )


def tiny_config(arch: str):
    """A 2-layer, 4-head, width-64 (head width 16) config for `arch`."""
    from transformers import AutoConfig

    _skip_if_missing_in_tf4(arch)
    if arch not in TINY_CONFIGS:
        raise ValueError(
            f"no tiny config for '{arch}': add one to TINY_CONFIGS in tests/helpers/families.py"
        )
    common = {} if arch in IMAGE_TYPES else {"vocab_size": 30522}
    return AutoConfig.for_model(arch, **TINY_CONFIGS[arch].config, **common)


def build_tiny_hf_model(arch: str, seed: int = 0, attn_implementation: str = "eager"):
    from transformers import AutoModel

    torch.manual_seed(seed)
    hf = AutoModel.from_config(tiny_config(arch), attn_implementation=attn_implementation)
    # HF initialises biases to 0 and norms to 1; perturb everything so that a
    # wrong bias or norm placement cannot hide in the self-check.
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf.eval()


def _recompute_supported() -> bool:
    from identifiable.models.recompute import supported

    return supported()


needs_recompute = pytest.mark.skipif(
    not _recompute_supported(),
    reason="transformers 4.x dispatches no attention interface, so maps are not recomputed "
    "under sdpa there: models trace eager (docs/families.md, 'Attention implementation')",
)
