"""Capture without eager attention (issue 22, item 1): maps recomputed from the query and
key that each attention function receives equal the eager maps, family by family.

Every tiny family (tests/helpers/families.py TINY_CONFIGS, core and family suites) is loaded with
sdpa where its class has it; families whose attention goes through transformers'
attention interface must trace under sdpa with maps equal to an eager model's of the same
weights, the rest must run eager (with a warning when they were loaded on sdpa).
Gemma-2 (soft-capping, sliding windows) has no sdpa in transformers 5.x: its recomputation
is checked inside eager forwards against the probabilities eager itself returns.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers.families import (
    ARCHITECTURES,
    FAMILIES,
    TINY_CONFIGS,
    build_tiny_hf_model,
    needs_recompute,
    tiny_config,
)
from identifiable import IdentifiableError
from identifiable.models import Model, backends, recompute

pytestmark = needs_recompute

TEXT = "the cat sat on the mat and the dog sat on the log, the cat sat again"
RECOMPUTED = {
    "gpt2", "llama", "gpt_neox", "opt", "phi3", "gemma", "gemma3_text", "qwen3", "olmo2",
    "mixtral", "bert", "roberta", "distilbert", "electra", "albert", "modernbert",
}  # fmt: skip
EAGER_ONLY = {"gpt_neo", "bloom", "falcon", "gemma2", "deberta-v2"}


def _sdpa_or_eager(arch: str) -> str:
    from transformers import AutoModel

    cls = AutoModel._model_mapping[type(tiny_config(arch))]
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def test_every_family_is_classified():
    assert set(ARCHITECTURES) | set(FAMILIES) == RECOMPUTED | EAGER_ONLY


@pytest.mark.parametrize("arch", sorted(RECOMPUTED | EAGER_ONLY))
def test_recomputed_maps_equal_eager_maps(arch, bert_tokenizer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = Model.from_hf(
            build_tiny_hf_model(arch, attn_implementation=_sdpa_or_eager(arch)), bert_tokenizer
        )
    eager = Model.from_hf(build_tiny_hf_model(arch), bert_tokenizer, attention="eager")
    assert eager.attention == "eager"
    tr, ref = m.trace(TEXT), eager.trace(TEXT)
    if arch in RECOMPUTED:
        assert m.attention == "sdpa", arch
        assert m.recompute_error is not None and m.recompute_error < 1e-6
        assert not [w for w in caught if "eager" in str(w.message)]
    else:
        assert m.attention == "eager"
        if _sdpa_or_eager(arch) == "sdpa":  # Falcon: loaded on sdpa, switched
            assert any("cannot be recomputed" in str(w.message) for w in caught)
    torch.testing.assert_close(tr.attentions, ref.attentions, atol=1e-6, rtol=0)
    assert float(tr.verify().max()) < 1e-5
    assert bool((tr.attentions.masked_fill(tr.key_mask[:, None], 0) == 0).all())


def test_attention_sdpa_switches_an_eager_model_and_falls_back_with_a_warning(bert_tokenizer):
    m = Model.from_hf(build_tiny_hf_model("llama"), bert_tokenizer, attention="sdpa")
    assert m.attention == "sdpa"
    assert m.hf_model.config._attn_implementation == "eager"  # the user's own, kept
    with pytest.warns(
        UserWarning, match="cannot be recomputed under sdpa.*switched the model to eager"
    ):
        g = Model.from_hf(build_tiny_hf_model("gemma2"), bert_tokenizer, attention="sdpa")
    assert g.attention == "eager"
    with pytest.raises(IdentifiableError, match="attention= must be one of"):
        Model.from_hf(build_tiny_hf_model("llama"), bert_tokenizer, attention="flash")


def test_a_wrong_recomputation_is_caught_by_the_probe(bert_tokenizer, monkeypatch):
    """The probe proof can fail: a recomputation that forgets the scaling differs from
    eager and the model falls back to eager with a warning."""
    real = recompute.AttentionCall.from_arguments

    def unscaled(*args):
        return recompute.AttentionCall(**{**real(*args).__dict__, "scaling": 1.0})

    monkeypatch.setattr(recompute.AttentionCall, "from_arguments", unscaled)
    with pytest.warns(UserWarning, match="differ from eager's"):
        m = Model.from_hf(build_tiny_hf_model("llama", attn_implementation="sdpa"), bert_tokenizer)
    assert m.attention == "eager"


def test_batches_with_padding_recompute_the_padding_mask(bert_tokenizer):
    m = Model.from_hf(build_tiny_hf_model("mixtral", attn_implementation="sdpa"), bert_tokenizer)
    eager = Model.from_hf(build_tiny_hf_model("mixtral"), bert_tokenizer, attention="eager")
    texts = ["a short one", TEXT, "a text of middling length here"]
    for tr, ref in zip(m.trace_many(texts, batch_size=3), eager.trace_many(texts), strict=True):
        torch.testing.assert_close(tr.attentions, ref.attentions, atol=1e-6, rtol=0)
        assert float(tr.verify().max()) < 1e-5


def _gemma2(softcap: float):
    config = tiny_config("gemma2")
    config.attn_logit_softcapping = softcap
    config.query_pre_attn_scalar = 24  # scaling 24^-0.5, not head_dim^-0.5
    from transformers import AutoModel

    torch.manual_seed(0)
    hf = AutoModel.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.5)  # large scores, so that soft-capping bites
    return hf


def test_gemma2_softcap_and_window_recomputed_inside_eager(bert_tokenizer):
    """Gemma-2 layer 0 slides (window 4), layer 1 is global; soft-capping at 50 (the
    real value) and at 1 (where it changes every map); eager's own probabilities are
    the reference, the recomputation reads the same calls' arguments."""
    ids = torch.randint(5, 1000, (24,), generator=torch.Generator().manual_seed(1))
    for softcap in (50.0, 1.0):
        m = Model.from_hf(_gemma2(softcap), bert_tokenizer)
        assert m.windows == [TINY_CONFIGS["gemma2"].config["sliding_window"], None]
        err = backends.recompute_error(m.hf_model, m.stack, m.inputs, ids)
        assert err < 1e-6, (softcap, err)
    # the soft-capping matters: dropped, the recomputation differs
    m = Model.from_hf(_gemma2(1.0), bert_tokenizer)
    real = recompute.AttentionCall.from_arguments
    try:
        recompute.AttentionCall.from_arguments = classmethod(  # type: ignore[method-assign]
            lambda cls, *a: recompute.AttentionCall(**{**real(*a).__dict__, "softcap": None})
        )
        assert backends.recompute_error(m.hf_model, m.stack, m.inputs, ids) > 1e-2
    finally:
        recompute.AttentionCall.from_arguments = real  # type: ignore[method-assign]


def test_sinks_match_gpt_oss_eager_attention():
    """gpt-oss adds one sink logit per head to the softmax's denominator."""
    from transformers.models.gpt_oss import modeling_gpt_oss as oss

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 9, 8, generator=g), torch.randn(1, 2, 9, 8, generator=g)
    v, sinks = torch.randn(1, 2, 9, 8, generator=g), torch.randn(4, generator=g)
    mask = torch.full((9, 9), float("-inf")).triu(1)[None, None]
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = 2, False
    module.sinks = torch.nn.Parameter(sinks)  # eager reads the module's, sdpa gets s_aux
    _, ref = oss.eager_attention_forward(
        module, q, k, v, mask, scaling=0.3, dropout=0.0, s_aux=sinks
    )
    call = recompute.AttentionCall(q, k, mask, 0.3, None, None, True, sinks)
    out = torch.empty(4, 9, 9)
    call.fill(0, None, 9, 9, out)
    torch.testing.assert_close(out, ref[0], atol=1e-6, rtol=0)
    assert float((out.sum(-1) - 1).abs().min()) > 1e-3  # the sinks take their share


def test_mask_free_calls_apply_causal_window_and_padding():
    """What flash attention receives: no 4-D mask; causal, window and 2-D padding from
    the call (brute force against an explicit mask)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 7, 4, generator=g), torch.randn(2, 2, 7, 4, generator=g)
    pad = torch.ones(2, 7, dtype=torch.long)
    pad[1, 5:] = 0
    call = recompute.AttentionCall(q, k, pad, 0.5, None, 3, True, None)
    i, j = torch.arange(7)[:, None], torch.arange(7)[None]
    for b in range(2):
        keep = (j <= i) & (i - j < 3) & pad[b].bool()[None]
        ref = torch.softmax(
            (q[b] @ k[b].transpose(-1, -2) * 0.5).masked_fill(~keep, -torch.inf), -1
        )
        out = torch.empty(2, 5, 7)
        call.fill(b, None, 5, 7, out)
        torch.testing.assert_close(out, ref[:, :5], atol=1e-6, rtol=0)


def test_a_score_bias_is_refused():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(recompute.CannotRecompute, match="position_bias"):
        recompute.AttentionCall.from_arguments(
            torch.nn.Module(), q, q, None, (), {"position_bias": torch.zeros(1, 2, 3, 3)}
        )
