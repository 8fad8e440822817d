"""inseq round trip: identifiable's methods in inseq's own registry.

inseq 0.7.1 pins typeguard<=2.13.3 while the 'lens' extra's transformer-lens 4.3.0 needs
typeguard 4.6.1 (constraints.txt), so one environment cannot hold both. CI runs this file in
both: in .venv-tf4 (transformers 4.57.6, inseq 0.7.1 pinned in constraints-tf4.txt) the round
trip runs; in .venv (transformers 5.x with TransformerLens) it skips with that reason and the
adapter's error message is checked instead.
"""

from __future__ import annotations

import pytest
import torch

from identifiable.errors import IdentifiableError
from identifiable.integrations.inseq import INSEQ_METHODS, register_inseq

CONFLICT = (
    "inseq 0.7.1 is not installable here: it pins typeguard<=2.13.3, and the pinned "
    "transformer-lens 4.3.0 ('lens' extra) needs typeguard==4.6.1; the round trip runs "
    "in .venv-tf4 (make test-tf4)"
)


def _without_special_tokens(tokenizer):
    """The BERT tokenizer as a decoder-only model's: no [CLS]/[SEP] added, so that inseq's
    check that a generation starts with its prompt holds (a GPT-2 config over BERT's vocabulary)."""
    import copy

    from tokenizers.processors import TemplateProcessing

    tok = copy.deepcopy(tokenizer)
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="$A", pair="$A $B")
    return tok


def _has_inseq() -> bool:
    try:
        import inseq  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(_has_inseq(), reason="inseq is installed: the round trip below runs")
def test_without_inseq_the_adapter_says_how_to_install_it() -> None:
    with pytest.raises(IdentifiableError, match=r"pip install 'identifiable\[inseq\]'"):
        register_inseq()


@pytest.mark.skipif(not _has_inseq(), reason=CONFLICT)
def test_effective_attention_through_inseq(bert_tokenizer) -> None:
    import inseq
    from transformers import AutoConfig, AutoModelForCausalLM

    import identifiable as idf
    from identifiable.models import Model

    assert set(register_inseq()) == set(INSEQ_METHODS)
    assert "effective_attention" in inseq.list_feature_attribution_methods()
    torch.manual_seed(0)
    # d_v = 64 / 8 = 8 < n: the last prompt row is not identifiable, so effective ≠ raw.
    config = AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=8, vocab_size=30522)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    tokenizer = _without_special_tokens(bert_tokenizer)
    model = inseq.load_model(hf, "effective_attention", tokenizer=tokenizer)
    text = "the miller sells bread to every traveller who stops by the bridge"
    out = model.attribute(text, generation_args={"max_new_tokens": 1})
    seq = out.sequence_attributions[0]
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    n = len(ids)
    assert seq.target_attributions.shape == (n + 1, 1, 2, 8)  # [key, step, layer, head]
    # The one generated step is predicted from query row n − 1 (the prompt's last token),
    # over keys 0..n−1; inseq marks the generated token's own key NaN.
    got = seq.target_attributions[:, 0].permute(1, 2, 0).double()  # [L, H, n + 1]
    assert torch.isnan(got[..., n]).all()
    eff = idf.effective_attention(Model.from_hf(hf, tokenizer).trace(ids))
    torch.testing.assert_close(got[..., :n], eff.effective[:, :, n - 1].double(), atol=1e-5, rtol=0)
    # effective attention, not the raw attention inseq's own method would give
    assert (got[..., :n] - eff.raw[:, :, n - 1].double()).abs().max() > 1e-3


@pytest.mark.skipif(not _has_inseq(), reason=CONFLICT)
def test_hidden_token_attribution_through_inseq(bert_tokenizer) -> None:
    """The HTA method hands inseq's token ids to `hidden_token_attribution` (ids, not text)."""
    import inseq
    from transformers import AutoConfig, AutoModelForCausalLM

    from identifiable.attribution import hidden_token_attribution
    from identifiable.models import Model

    register_inseq()
    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=8, vocab_size=30522)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    tokenizer = _without_special_tokens(bert_tokenizer)
    model = inseq.load_model(hf, "hidden_token_attribution", tokenizer=tokenizer, probes=16)
    text = "the miller sells bread to every traveller who stops by the bridge"
    seq = model.attribute(text, generation_args={"max_new_tokens": 1}).sequence_attributions[0]
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    n = len(ids)
    got = seq.target_attributions[:, 0].T.double()  # [L, n + 1]: row n − 1 over keys
    assert torch.isnan(got[:, n]).all()
    ref = hidden_token_attribution(Model.from_hf(hf, tokenizer), ids, probes=16, progress=False)
    torch.testing.assert_close(got[:, :n], ref.contributions[:, n - 1], atol=1e-6, rtol=0)
    torch.testing.assert_close(got[:, :n].sum(-1), torch.ones(2, dtype=torch.float64))
