"""Automatic discovery on families deliberately left out of the spec table."""

from __future__ import annotations

import pytest
import torch

from helpers.families import build_tiny_hf_model
from identifiable.errors import IdentifiableError
from identifiable.models import Model, find_spec

LEFT_OUT = {
    # family: (config, expected value module, expected output module, fused, causal)
    "gptj": (
        {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "n_positions": 128},
        "attn.v_proj",
        "attn.out_proj",
        None,
        True,
    ),
    "starcoder2": (
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "sliding_window": 4,
        },
        "self_attn.v_proj",
        "self_attn.o_proj",
        None,
        True,
    ),
    "phi": (
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
        },
        "self_attn.v_proj",
        "self_attn.dense",
        None,
        True,
    ),
    "mpt": (
        {"d_model": 64, "n_layers": 2, "n_heads": 4},
        "attn.Wqkv",
        "attn.out_proj",
        "qkv_blocks",
        True,
    ),
}


def _tiny(model_type: str, config: dict):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        model_type, vocab_size=30522, pad_token_id=0, bos_token_id=101, eos_token_id=102, **config
    )
    hf = AutoModel.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf.eval()


@pytest.mark.parametrize("family", sorted(LEFT_OUT))
def test_discovered_spec_is_verified(family, bert_tokenizer):
    config, value, out, fused, causal = LEFT_OUT[family]
    assert find_spec(family) is None  # really not in the table
    m = Model.from_hf(_tiny(family, config), bert_tokenizer)
    d = m.discovery
    assert d is not None and d.spec.source == "discovered"
    assert (d.spec.value, d.spec.out_proj, d.spec.fused, d.spec.causal) == (
        value,
        out,
        fused,
        causal,
    )
    assert d.errors.max() < 1e-5 and d.tried[-1].endswith("verified")
    tr = m.trace("The cat sat on the mat, and the dog sat on the log.")
    assert tr.verify().max() < 1e-5
    assert torch.equal(tr.attentions.ne(0).any(1), tr.key_mask)


def test_discovery_under_medium_precision_says_what_to_do(bert_tokenizer, medium_matmul_precision):
    """Where "medium" makes float32 products bfloat16, no spec verifies to 1e-4; the error
    quotes the right candidate's advice to restore full precision, not a bad spec."""
    if not medium_matmul_precision:
        pytest.skip("this CPU multiplies float32 at full precision under 'medium'")
    config = LEFT_OUT["gptj"][0]
    with pytest.raises(IdentifiableError) as info:
        Model.from_hf(_tiny("gptj", config), bert_tokenizer)
    assert "attn.v_proj → attn.out_proj: float32 matmuls run at reduced precision" in str(
        info.value
    )
    assert "set_float32_matmul_precision('highest')" in str(info.value)


def test_discovered_window_comes_from_the_config(bert_tokenizer):
    config = LEFT_OUT["starcoder2"][0]
    m = Model.from_hf(_tiny("starcoder2", config), bert_tokenizer)
    assert m.windows == [4, 4]


def test_discovery_rejects_a_spec_that_does_not_verify(bert_tokenizer):
    """Deberta-v2's first candidate pairs value_proj with query_proj: verify must refuse it."""
    from identifiable.models.discover import discover_spec
    from identifiable.models.model import base_model_of

    hf = _tiny(
        "deberta-v2",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
        },
    )
    d = discover_spec(base_model_of(hf), bert_tokenizer)
    assert d.spec.out_proj == "attention.output.dense"
    assert find_spec("deberta-v2").out_proj == d.spec.out_proj  # agrees with the table


# SqueezeBERT projects with grouped 1×1 convolutions (nn.Conv1d, 3-D weights), which
# discovery does not read as linear projections (XLNet, the earlier example, is in the table).
UNDISCOVERABLE = (
    "squeezebert",
    {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "embedding_size": 64,
    },
)


def test_undiscoverable_family_is_one_line(bert_tokenizer):
    assert find_spec(UNDISCOVERABLE[0]) is None
    hf = _tiny(*UNDISCOVERABLE)
    with pytest.raises(IdentifiableError) as info:
        Model.from_hf(hf, bert_tokenizer)
    msg = str(info.value)
    assert "\n" not in msg and "'squeezebert' is not in the table" in msg
    assert "tried" in msg or "found no" in msg
    assert "ArchSpec" in msg and "spec=" in msg


def test_cli_models_check(tmp_path, bert_tokenizer, capsys):
    from identifiable.cli import main

    config = LEFT_OUT["gptj"][0]
    _tiny("gptj", config).save_pretrained(tmp_path / "gptj")
    bert_tokenizer.save_pretrained(tmp_path / "gptj")
    main(["models", "--check", str(tmp_path / "gptj")])  # returns normally on success
    out = capsys.readouterr().out
    assert "spec: gptj (discovered)" in out and "attn.v_proj" in out
    assert "verified: max relative error" in out


def test_cli_models_check_undiscoverable(tmp_path, capsys):
    from identifiable.cli import main

    _tiny(*UNDISCOVERABLE).save_pretrained(tmp_path / "sq")
    with pytest.raises(SystemExit) as info:
        main(["models", "--check", str(tmp_path / "sq")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not in the table" in err and "Traceback" not in err


DISCOVERED_NORMS = {
    # family: (first, second, kind) as its modelling file wires the block
    "gptj": ("ln_1", "ln_1", "parallel"),  # one norm feeds attention and MLP
    "starcoder2": ("input_layernorm", "post_attention_layernorm", "pre"),
    "phi": ("input_layernorm", "input_layernorm", "parallel"),
    "mpt": ("norm_1", "norm_2", "pre"),
}


@pytest.mark.parametrize("family", sorted(DISCOVERED_NORMS))
def test_discovered_family_gets_a_proved_norm_layout_and_mixing_runs(family, bert_tokenizer):
    """A family with no table entry no longer stops at the context-mixing stage: discovery
    proves its block layout on the probe, and the norm-based methods run on it."""
    from identifiable.mixing import context_mixing
    from identifiable.models.blocks import norm_layout

    config = LEFT_OUT[family][0]
    m = Model.from_hf(_tiny(family, config), bert_tokenizer)
    layout = norm_layout(m)
    assert (layout.first, layout.second, layout.kind) == DISCOVERED_NORMS[family]
    assert m.discovery.norms.endswith("verified")
    n = len(m.encode(TEXT_MIX))
    for method in ("globenc", "alti"):
        res = context_mixing(m, TEXT_MIX, method)
        assert res.layerwise.shape == (2, n, n) and torch.isfinite(res.layerwise).all()
        ones = torch.ones(2, n, dtype=res.layerwise.dtype)
        torch.testing.assert_close(res.layerwise.sum(-1), ones, rtol=1e-5, atol=1e-6)


TEXT_MIX = "the cat sat on the mat near the river"


def test_discovery_without_a_provable_norm_layout_refuses_mixing_in_one_line(bert_tokenizer):
    """Gemma-2's sandwich norms fit no layout: discovery keeps the verified attention spec,
    and GlobEnc says why it cannot run (no "edit the package" advice)."""
    from identifiable.mixing import context_mixing
    from identifiable.models.discover import discover_spec
    from identifiable.models.model import base_model_of

    hf = build_tiny_hf_model("gemma2")
    d = discover_spec(base_model_of(hf), bert_tokenizer)
    assert d.spec.norms is None and "could prove" in d.norms
    m = Model.from_hf(hf, bert_tokenizer, spec=d.spec)
    m.trace(TEXT_MIX).verify()
    with pytest.raises(IdentifiableError) as exc:
        context_mixing(m, TEXT_MIX, "globenc")
    msg = str(exc.value)
    assert "\n" not in msg and "undefined for 'gemma2'" in msg and "could prove" in msg
    assert "NORM_LAYOUTS" not in msg and "blocks.py" not in msg
    assert context_mixing(m, TEXT_MIX, "rollout").layerwise.shape[0] == 2  # the rest runs


def test_discovered_norms_agree_with_the_table(bert_tokenizer):
    """Discovery, run on families the table describes, finds the table's own layouts."""
    from identifiable.models.blocks import norm_layout
    from identifiable.models.discover import discover_spec
    from identifiable.models.model import base_model_of

    for family in ("bert", "gpt2", "llama", "gpt_neox", "falcon", "gemma", "modernbert"):
        hf = build_tiny_hf_model(family)
        table = norm_layout(Model.from_hf(hf, bert_tokenizer))
        assert discover_spec(base_model_of(hf), bert_tokenizer).spec.norms == table, family
