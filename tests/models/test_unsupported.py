"""Families refused by name (models/unsupported.py) and the family-table fixes of issue 54:
a refusal is one line naming the family and why; the families fixed beside them trace and
verify; each fix can fail (the wrong layout, the refused attention switched back on)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from helpers.family_table import PROBE, _build, tiny_config
from identifiable.errors import IdentifiableError
from identifiable.models import Model, find_spec
from identifiable.models.stack import layer_windows
from identifiable.models.unsupported import REFUSED, refusal


def _refused(model_type: str, **config) -> str:
    hf = _with(model_type, **config)
    with pytest.raises(IdentifiableError) as info:
        Model.from_hf(hf)
    line = str(info.value)
    assert "\n" not in line and f"'{model_type}'" in line
    return line


def _needs(model_type: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"model type '{model_type}' is not in this transformers")


def _with(model_type: str, **config):
    """The family table's tiny model of `model_type`, with `config` set on its config."""
    from transformers import AutoModel

    _needs(model_type)
    if not config:
        return _build(model_type)
    cfg = tiny_config(model_type)
    for k, v in config.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    return AutoModel.from_config(cfg, attn_implementation="eager").eval()


@pytest.mark.parametrize(
    ("model_type", "why"),
    [
        ("wav2vec2", "takes audio input (input_values), not token ids"),
        ("longformer", "sliding-window plus global attention"),
        ("led", "sliding-window plus global attention"),  # encoder–decoder: seq2seq_spec
        ("big_bird", "block-sparse attention"),
        ("deepseek_v4", "keys are not the tokens"),  # compressed keys (models/keyselect.py)
        ("hy_v4", "hyper-connections"),  # its indexer alone would be a key mask
    ],
)
def test_a_refused_family_gets_one_line_naming_it_and_why(model_type, why):
    overrides = {"attention_type": "block_sparse"} if model_type == "big_bird" else {}
    assert why in _refused(model_type, **overrides)


def test_full_attention_of_a_refused_family_is_traced():
    """BigBird's switch: block-sparse is refused, full attention verifies through discovery."""
    hf = _with("big_bird", attention_type="original_full")
    assert refusal(hf) is None
    m = Model.from_hf(hf)
    assert m.discovery is not None
    assert float(m.trace(torch.tensor(PROBE)).verify().max()) < 1e-5


def test_every_refusal_names_a_reason_the_family_table_counts():
    from helpers.family_table import REFUSALS

    for entry in REFUSED:
        line = f"'{entry.model_types[0]}' {entry.reason}"
        assert "\n" not in line and any(w in line for w in REFUSALS), line


def test_codegen_model_parallel_layout_verifies_and_a_wrong_layout_fails():
    hf = _with("codegen")
    m = Model.from_hf(hf)
    assert m.spec.name == "codegen" and m.discovery is None
    assert float(m.trace(torch.tensor(PROBE)).verify().max()) < 1e-5
    wrong = Model.from_hf(hf, spec=replace(find_spec("codegen"), fused="qkv_blocks"))
    with pytest.raises(IdentifiableError, match="does not reproduce"):
        wrong.trace(torch.tensor(PROBE)).verify()


def test_deberta_value_bias_verifies_and_without_it_fails():
    """DeBERTa v1 adds b_V (`v_bias`) after its bias-free fused in_proj: read from the
    parameter, the layer verifies; from the projection (no bias), it does not."""
    hf = _with("deberta", relative_attention=True, pos_att_type=["c2p", "p2c"])
    with torch.no_grad():
        hf.encoder.layer[0].attention.self.v_bias.normal_()  # HF initialises it to 0
    m = Model.from_hf(hf)
    assert m.spec.name == "deberta" and m.discovery is None
    assert float(m.trace(torch.tensor(PROBE)).verify().max()) < 1e-5
    wrong = Model.from_hf(hf, spec=replace(find_spec("deberta"), value_bias=None))
    with pytest.raises(IdentifiableError, match="does not reproduce"):
        wrong.trace(torch.tensor(PROBE)).verify()


def test_multimodal_rope_text_decoder_verifies():
    """Qwen2-VL's text model (RoPE over three position axes) from token ids alone."""
    m = Model.from_hf(_with("qwen2_vl_text"))
    assert float(m.trace(torch.tensor(PROBE)).verify().max()) < 1e-5


def test_windows_of_a_heterogeneous_config_are_read_per_layer():
    """NeoMME's config refuses a global `sliding_window`; each layer's own is read."""
    _needs("neomme")
    cfg = tiny_config("neomme")
    cfg = type(cfg)(**{**cfg.to_dict(), "sliding_window": 4})
    kinds = list(cfg.layer_types)
    spec = find_spec("llama")
    assert layer_windows(cfg, spec, len(kinds)) == [
        4 if k == "sliding_attention" else None for k in kinds
    ]
