"""nnsight (extra `nnsight`): the model inside an nnsight wrapper traces exactly as
`load_model(hf_model)` does, agrees with what nnsight itself saves, and its effective
attention keeps A_eff·T = A·T. Tiny random GPT-2 and Llama, offline (no remote=True)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import identifiable as idf
from helpers.families import tiny_config
from identifiable.attention import effective_attention
from identifiable.errors import IdentifiableError
from identifiable.integrations.nnsight import model_from_nnsight, trace_from_nnsight

nnsight = pytest.importorskip(
    "nnsight", reason="nnsight is the optional extra `nnsight` (pip install identifiable[nnsight])"
)

TEXT = "The cat sat on the mat, and then it was happy."
LAST_BLOCK = {"gpt2": "transformer.h", "llama": "model.layers"}


def _lm(arch: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(tiny_config(arch))
    with torch.no_grad():  # move biases and norms off their 0/1 start, as conftest does
        for p in lm.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return lm.eval()


def _wrap(lm, tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nnsight's own deprecation notes
        return nnsight.TransformersModel(lm, tokenizer=tokenizer)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_an_nnsight_model_traces_as_load_model_does(bert_tokenizer, arch) -> None:
    tok = copy.deepcopy(bert_tokenizer)  # nnsight sets the tokenizer's padding side
    nn_model = _wrap(_lm(arch), tok)
    reference = idf.load_model(_lm(arch), tokenizer=copy.deepcopy(bert_tokenizer))
    tr = trace_from_nnsight(nn_model, TEXT)
    ref = reference.trace(TEXT)
    assert tr.tokens == ref.tokens and torch.equal(tr.input_ids, ref.input_ids)
    assert tr.is_causal and tr.n_layers == 2
    for field in ("attentions", "values", "hidden_states", "attn_outputs", "out_proj"):
        torch.testing.assert_close(getattr(tr, field), getattr(ref, field), atol=1e-6, rtol=1e-5)
    assert float(tr.verify().max()) < 1e-5
    # what nnsight itself saves at the last block equals the trace's last hidden state
    blocks = nn_model
    for part in LAST_BLOCK[arch].split("."):
        blocks = getattr(blocks, part)
    with nn_model.trace(tr.input_ids[None]):
        saved = blocks[-1].output.save()
    saved = saved[0] if isinstance(saved, tuple) else saved
    torch.testing.assert_close(saved[0].float(), tr.hidden_states[-1], atol=1e-5, rtol=1e-4)
    ea = effective_attention(tr, dtype=torch.float64)
    t = torch.einsum("lhnv,lhvd->lhnd", tr.values.double(), tr.out_proj.double())
    lhs, rhs = ea.effective @ t, tr.attentions.double() @ t
    assert ((lhs - rhs).abs() / rhs.abs().amax(dim=(-2, -1), keepdim=True)).max() < 1e-9


def test_load_model_takes_the_wrapper_and_the_model_is_built_once(bert_tokenizer) -> None:
    lm = _lm("gpt2")
    impl = lm.config._attn_implementation
    nn_model = _wrap(lm, copy.deepcopy(bert_tokenizer))
    model = idf.load_model(nn_model)
    assert model.tokenizer is nn_model.tokenizer  # the wrapper's tokenizer
    assert model.hf_model is lm.transformer
    assert model_from_nnsight(nn_model) is model_from_nnsight(nn_model)
    model.trace(TEXT)
    assert lm.config._attn_implementation == impl  # the user's model as it was
    generic = nnsight.NNsight(_lm("gpt2"))  # no tokenizer: token ids trace
    ids = bert_tokenizer(TEXT)["input_ids"]
    assert trace_from_nnsight(generic, ids).n_tokens == len(ids)


def test_what_is_not_an_nnsight_model_is_one_line(bert_tokenizer) -> None:
    with pytest.raises(IdentifiableError, match="takes an nnsight model"):
        trace_from_nnsight(object(), [1, 2, 3])
    with pytest.raises(IdentifiableError, match="takes an nnsight model"):
        trace_from_nnsight(_lm("gpt2"), [1, 2, 3])  # the bare transformers model
    plain = nnsight.NNsight(torch.nn.Linear(2, 2))
    with pytest.raises(IdentifiableError, match="not a transformers model"):
        trace_from_nnsight(plain, [1, 2, 3])
