"""TransformerLens (extra `lens`): a TransformerBridge's run_with_cache becomes a verified Trace.

The bridge is booted offline from a tiny random GPT-2 (config saved to a temporary
directory, weights passed as `hf_model`), so nothing downloads.
"""

from __future__ import annotations

import pytest
import torch

from helpers.families import build_tiny_hf_model
from identifiable.attention import effective_attention
from identifiable.errors import IdentifiableError
from identifiable.integrations.lens import trace_from_lens
from identifiable.models import Model

pytest.importorskip(
    "transformer_lens",
    reason="TransformerLens is the optional extra `lens` (not installed; TransformerLens 4 "
    "needs transformers >= 5.9, so .venv-tf4 has none)",
)


@pytest.fixture(scope="module")
def bridge_and_model(tmp_path_factory, bert_tokenizer):
    from transformer_lens import TransformerBridge
    from transformers import GPT2LMHeadModel

    hf = build_tiny_hf_model("gpt2")
    folder = tmp_path_factory.mktemp("tiny-gpt2")
    hf.config.save_pretrained(folder)
    lm = GPT2LMHeadModel(hf.config)
    lm.transformer = hf
    bridge = TransformerBridge.boot_transformers(
        str(folder), hf_model=lm.eval(), tokenizer=bert_tokenizer
    )
    # the bridge rewires the modules it wraps: compare with a fresh copy (same seed)
    return bridge, Model.from_hf(build_tiny_hf_model("gpt2"), bert_tokenizer)


def test_lens_trace_verifies_and_equals_the_hf_trace(bridge_and_model):
    bridge, model = bridge_and_model
    ids = model.encode("The cat sat on the mat, it was happy.").input_ids
    tr = trace_from_lens(bridge, ids)
    errs = tr.verify()
    assert errs.max() < 1e-5, errs
    assert tr.is_causal and tr.n_tokens == len(ids)
    hf = model.trace(ids)
    torch.testing.assert_close(tr.attentions, hf.attentions, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(tr.values, hf.values, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(tr.out_proj, hf.out_proj)
    ea = effective_attention(tr, dtype=torch.float64)
    t = torch.einsum("lhnv,lhvd->lhnd", tr.values.double(), tr.out_proj.double())
    lhs, rhs = ea.effective @ t, tr.attentions.double() @ t
    assert ((lhs - rhs).abs() / rhs.abs().amax(dim=(-2, -1), keepdim=True)).max() < 1e-9


def test_lens_errors_are_one_line(bridge_and_model):
    bridge, _ = bridge_and_model
    with pytest.raises(IdentifiableError, match="takes a TransformerLens TransformerBridge"):
        trace_from_lens(object(), [1, 2, 3])
    _, cache = bridge.run_with_cache(
        torch.tensor([[101, 2000, 102]]), names_filter=lambda n: "pattern" in n
    )
    with pytest.raises(IdentifiableError, match=r"has no 'blocks\.0\.hook_resid_pre'"):
        trace_from_lens(bridge, [101, 2000, 102], cache=cache)
    with pytest.raises(IdentifiableError, match="trace_from_lens"):
        Model.from_hf(bridge)
