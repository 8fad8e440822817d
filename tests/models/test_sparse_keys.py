"""Sparse key selection (DeepSeek-V3.2 and GLM-5's sparse attention, models/keyselect.py):
the keys an indexer keeps for each query row are the trace's key mask, so that every
analysis sees the keys the model really read. Tiny configs keep 14 keys per row
(tests/helpers/families.py) at value width 12, so rows past the 14th token have a null
space of dimension 2 over their selection, and a larger one over the causal prefix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from helpers.families import build_tiny_hf_model
from identifiable import scan
from identifiable.attention import effective_attention
from identifiable.errors import IdentifiableError
from identifiable.models import Model, keyselect
from identifiable.models.hooks import HookSet
from identifiable.models.trace import Trace

TEXT = (
    "the cat sat on the mat and the dog sat on the log while the bird flew over the old "
    "tree and the fish swam round the bowl"
)
TOPK = 14


@pytest.fixture(scope="module")
def models(bert_tokenizer):
    made = {}
    for arch in ("deepseek_v32", "glm_moe_dsa"):
        for impl in ("eager", "sdpa"):
            hf = build_tiny_hf_model(arch, attn_implementation=impl)
            made[arch, impl] = Model.from_hf(hf, bert_tokenizer, attention=impl)
    return made


@pytest.fixture(scope="module")
def traces(models):
    return {key: m.trace(TEXT) for key, m in models.items()}


@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_the_key_mask_is_the_keys_the_model_read(traces, arch):
    tr = traces[arch, "eager"]
    n = tr.n_tokens
    assert n > TOPK + 5 and tr.verify().max() < 1e-5
    sizes = torch.tensor([min(i + 1, TOPK) for i in range(n)])
    for layer in range(tr.n_layers):
        mask = tr.key_mask[layer]
        assert torch.equal(mask.sum(-1), sizes)
        assert not mask.triu(1).any()  # inside the causal prefix
        # the model's own softmax is > 0 exactly on the selection, in every head
        assert torch.equal(tr.attentions[layer] > 0, mask.expand_as(tr.attentions[layer]))
    if arch == "glm_moe_dsa":  # layer 1 runs no indexer: it reuses layer 0's selection
        assert torch.equal(tr.key_mask[1], tr.key_mask[0])
    else:  # each layer's own indexer picks its own keys
        assert not torch.equal(tr.key_mask[1], tr.key_mask[0])


@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_sdpa_records_the_same_selection(traces, arch):
    eager, sdpa = traces[arch, "eager"], traces[arch, "sdpa"]
    assert torch.equal(eager.key_mask, sdpa.key_mask)
    assert sdpa.verify().max() < 1e-5
    torch.testing.assert_close(sdpa.attentions, eager.attentions, atol=1e-6, rtol=1e-5)


def _wide(tr: Trace) -> Trace:
    """The same capture with every causal key marked as seen (what a trace recorded
    before the selection was read)."""
    causal = torch.ones(tr.n_tokens, tr.n_tokens, dtype=torch.bool).tril()
    return Trace.from_tensors(
        tr.attentions, tr.values, tr.out_proj, causal=True, key_mask=causal.expand_as(tr.key_mask)
    )


def test_effective_attention_lives_on_the_selected_keys(traces):
    tr = traces["deepseek_v32", "eager"]
    ea = effective_attention(tr)
    wide = effective_attention(_wide(tr))
    outside_wide = 0.0
    for layer in range(tr.n_layers):
        mask = tr.key_mask[layer]
        seen = mask.sum(-1)
        for h in range(tr.n_heads):
            t = tr.values[layer, h].double() @ tr.out_proj[layer, h].double()  # T = E W_V W_O
            a, eff = tr.attentions[layer, h].double(), ea.effective[layer, h].double()
            err = torch.linalg.norm(eff @ t - a @ t) / torch.linalg.norm(a @ t)
            assert err < 1e-5
            assert not eff.masked_fill(mask, 0).any()  # no weight on keys never read
            # per row over its own keys: dim LN = |S_i| − rank T[S_i] (numpy's rank)
            ranks = [np.linalg.matrix_rank(t[mask[i]].numpy()) for i in range(tr.n_tokens)]
            assert torch.equal(ea.null_space.dim[layer, h], seen - torch.tensor(ranks))
            outside_wide = max(
                outside_wide, float(wide.effective[layer, h].masked_fill(mask, 0).abs().max())
            )
        # over the whole prefix the null space is larger: the causal mask is the wrong one
        assert (wide.null_space.dim[layer] > ea.null_space.dim[layer]).any()
    assert outside_wide > 1e-3  # the wide mask moves weight onto keys the model never read


def test_a_selection_that_is_not_the_models_is_refused(models, monkeypatch):
    """The capture checks the attention against the recorded selection: keys shifted by one
    leave the model's weight outside the mask, and the capture says so in one line."""
    real = keyselect._indices
    monkeypatch.setattr(keyselect, "_indices", lambda out, layer: real(out, layer) + 1)
    with pytest.raises(IdentifiableError, match="outside the mask") as err:
        models["deepseek_v32", "eager"].trace(TEXT)
    assert "\n" not in str(err.value)


def test_streamed_layers_and_the_scan_see_the_selection(models, traces):
    m, full = models["glm_moe_dsa", "eager"], traces["glm_moe_dsa", "eager"]
    # layer 1 alone: its selection comes from layer 0's indexer, which the stream passes
    ((layer, one),) = list(m.iter_layers(TEXT, layers=[1]))
    assert layer == 1 and torch.equal(one.key_mask[0], full.key_mask[1])
    assert one.verify().max() < 1e-5
    result = scan(m, [TEXT], sink=0, progress=False)
    ea = effective_attention(full)
    for layer in range(full.n_layers):
        rows = full.key_mask[layer][:, 0]  # rows whose selection holds key 0
        assert not rows.all()  # the selection drops the first token for some rows
        for h in range(full.n_heads):
            a, e = ea.raw[layer, h].double(), ea.effective[layer, h].double()
            frac = torch.linalg.norm(a - e) / torch.linalg.norm(a)
            assert float(result.null_fraction[0, layer, h]) == pytest.approx(float(frac), abs=1e-5)
            assert float(result.sink_raw[0, layer, h]) == pytest.approx(
                float(a[rows, 0].mean()), abs=1e-6
            )


def test_a_selector_that_picks_per_head_is_refused_in_one_line():
    class PerHead(nn.Module):
        def forward(self, x):
            return torch.zeros(1, 2, 3, 4, dtype=torch.long)  # [B, heads, n, k]

    layer = nn.Module()
    layer.indexer = PerHead()
    seen: list[torch.Tensor] = []
    with HookSet() as hooks:
        keyselect.tap(hooks, [layer], "indexer", lambda i, x: seen.append(x))
        with pytest.raises(IdentifiableError, match="not one key set per query row") as err:
            layer.indexer(torch.zeros(1))
    assert "\n" not in str(err.value) and not seen
    # -1 and out-of-range indices keep no key
    keep = keyselect.picked(torch.tensor([[[0, -1], [1, 7]]]), 0, 2, 3, 0)
    assert keep.tolist() == [[True, False, False], [False, True, False]]


def test_a_family_selecting_key_blocks_per_head_is_refused_by_discovery():
    """MiniMax-M3's sparse layers pick blocks of keys per key/value head: one line naming
    the family, not a list of failed candidates."""
    from transformers import AutoModel
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    import helpers.family_table as table

    if "minimax_m3_vl_text" not in CONFIG_MAPPING_NAMES:
        pytest.skip("transformers 4.x has no MiniMax-M3 (the family table's version has)")
    cfg = table.tiny_config("minimax_m3_vl_text")
    cfg.layer_types = ["minimax_m3_sparse"] * 2
    cfg.index_block_size, cfg.index_topk_blocks = 2, 3
    torch.manual_seed(0)
    hf = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    with pytest.raises(IdentifiableError, match="not one key set per query row") as err:
        Model.from_hf(hf)
    line = str(err.value)
    assert "\n" not in line and "'minimax_m3_vl_text'" in line and line.endswith("not analysed")


def test_the_training_penalty_refuses_a_selection_in_one_line(models):
    """The penalty's key sets come from the config; a text-dependent selection is refused."""
    from identifiable.training import null_attention_penalty

    with pytest.raises(IdentifiableError, match="picks each row's keys with an indexer") as err:
        null_attention_penalty(models["deepseek_v32", "eager"], [TEXT])
    assert "\n" not in str(err.value)


def test_intervals_range_over_the_selected_keys_only(traces):
    """A row past the 14th token sees 14 keys and has a null space of dimension 2 there:
    its interval map moves weight among its own keys, never onto one it did not read."""
    from identifiable.attention import interval_map

    tr = traces["deepseek_v32", "eager"]
    row = tr.n_tokens - 1
    im = interval_map(tr, layers=[1], heads=[0], rows=[row], progress=False)
    mask = tr.key_mask[1, row]
    lower, upper = im.lower[0, 0, 0], im.upper[0, 0, 0]
    assert not lower[~mask].any() and not upper[~mask].any()
    assert ((upper - lower)[mask] > 1e-6).any()  # the row's own keys have room to move
    a = tr.attentions[1, 0, row].double()
    assert bool(((lower <= a + 1e-9) & (a <= upper + 1e-9)).all())
