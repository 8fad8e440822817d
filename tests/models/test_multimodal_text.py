"""Multimodal models on token ids (issue 54): Llava, Gemma 3 and Qwen2.5-VL run their
language model alone when given no image, so that tower is what a Model traces; a
composite without such a tower is refused in one line that names its towers."""

from __future__ import annotations

import pytest
import torch

from helpers.families import _skip_if_missing_in_tf4
from helpers.family_table import PROBE, _build
from identifiable import effective_attention
from identifiable.errors import IdentifiableError
from identifiable.models import Model


def _composite(model_type: str):
    _skip_if_missing_in_tf4(model_type)
    return _build(model_type)  # the family table's tiny model, perturbed weights


@pytest.mark.parametrize(
    ("model_type", "family"),
    [("llava", "llama"), ("gemma3", "gemma"), ("qwen2_5_vl", "discovered")],
)
def test_a_multimodal_model_traces_its_language_model(model_type, family):
    hf = _composite(model_type)
    m = Model.from_hf(hf)
    assert m.hf_model is hf.language_model
    assert (m.spec.source if family == "discovered" else m.spec.name) == family
    ids = torch.tensor(PROBE)
    tr = m.trace(ids)
    assert float(tr.verify().max()) < 1e-5
    # independent: the whole model's own forward on the same ids, no image
    with torch.no_grad():
        out = hf(input_ids=ids[None], output_hidden_states=True)
    for layer in range(1, len(out.hidden_states) - 1):  # the last one is after the final norm
        assert torch.allclose(tr.hidden_states[layer], out.hidden_states[layer][0], atol=1e-5)
    eff = effective_attention(tr).effective.double()
    t = tr.values.double() @ tr.out_proj.double()
    assert torch.allclose(eff @ t, tr.attentions.double() @ t, atol=1e-6)


def test_a_composite_without_a_language_model_is_refused_in_one_line():
    """BLIP pairs a text and an image tower without a language model over both."""
    with pytest.raises(IdentifiableError) as info:
        Model.from_hf(_composite("blip"))
    msg = str(info.value)
    assert "\n" not in msg and "composite of towers (text_model, vision_model)" in msg
    assert "Model.from_hf(model.text_model)" in msg
