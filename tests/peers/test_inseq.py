"""inseq round trip: identifiable's methods in inseq's own registry.

inseq 0.7.1 pins typeguard<=2.13.3 while the 'lens' extra's transformer-lens 4.3.0 needs
typeguard 4.6.1 (constraints.txt), so CI cannot hold both: the round trip skips with that
reason where inseq is absent, and the adapter's error message is checked instead.
"""

from __future__ import annotations

import pytest
import torch

from identifiable.errors import IdentifiableError
from identifiable.peers import INSEQ_METHODS, register_inseq

CONFLICT = (
    "inseq 0.7.1 is not installable here: it pins typeguard<=2.13.3, and the pinned "
    "transformer-lens 4.3.0 ('lens' extra) needs typeguard==4.6.1"
)


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
    config = AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=30522)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model = inseq.load_model(hf, "effective_attention", tokenizer=bert_tokenizer)
    text = "the miller sells bread to every traveller who stops by the bridge"
    out = model.attribute(text, generation_args={"max_new_tokens": 1})
    scores = out.sequence_attributions[0].target_attributions  # [k, q, L, H]
    ids = bert_tokenizer(text, return_tensors="pt").input_ids[0]
    eff = idf.effective_attention(Model.from_hf(hf, bert_tokenizer).trace(ids))
    n = len(ids)
    torch.testing.assert_close(
        scores[:n, :n].permute(2, 3, 1, 0).double(), eff.effective, atol=1e-5, rtol=0
    )
