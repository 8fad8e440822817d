"""`layers=` and `heads=` on `trace` and `iter_layers` (issue 22, item 2): the chosen maps
equal the full trace's, nothing else is computed, each selection verifies, and bad
selections get one line naming the Python argument (CLI: the flag)."""

from __future__ import annotations

import pytest
import torch

from helpers.cli import run_main as run
from helpers.families import _recompute_supported, build_tiny_hf_model, needs_recompute
from identifiable import IdentifiableError
from identifiable.models import Model, recompute

TEXT = "the cat sat on the mat and the dog sat on the log"


@pytest.fixture(scope="module")
def models(bert_tokenizer):
    sdpa = Model.from_hf(build_tiny_hf_model("llama", attn_implementation="sdpa"), bert_tokenizer)
    eager = Model.from_hf(build_tiny_hf_model("gpt2"), bert_tokenizer)
    # transformers 4.x has no attention interface: the sdpa model traces eager there
    assert sdpa.attention == ("sdpa" if _recompute_supported() else "eager")
    assert eager.attention == "eager"
    return {"sdpa": sdpa, "eager": eager}


@pytest.mark.parametrize("kind", ["sdpa", "eager"])
def test_chosen_heads_and_layers_equal_the_full_trace(models, kind):
    m = models[kind]
    full = m.trace(TEXT)
    part = m.trace(TEXT, layers=[1], heads=[3, 0])
    assert part.layers == [1] and part.heads == [3, 0]
    assert tuple(part.attentions.shape) == (1, 2, full.n_tokens, full.n_tokens)
    torch.testing.assert_close(part.attentions[0], full.attentions[1, [3, 0]])
    torch.testing.assert_close(part.values[0], full.values[1, [3, 0]])
    torch.testing.assert_close(part.out_proj[0], full.out_proj[1, [3, 0]])
    torch.testing.assert_close(part.hidden_states, full.hidden_states[1:3])
    assert part.kv_head_of.tolist() == full.kv_head_of[[3, 0]].tolist()
    assert float(part.verify().max()) < 1e-5  # the chosen heads' share of the block output
    streamed = list(m.iter_layers(TEXT, layers=[1], heads=[3, 0]))
    assert [i for i, _ in streamed] == [1]
    torch.testing.assert_close(streamed[0][1].attentions, part.attentions)


def test_analyses_of_chosen_heads_equal_the_full_trace(models):
    from identifiable.attention import effective_attention

    m = models["sdpa"]  # grouped-query: heads 3 and 1 read key/value heads 1 and 0
    full, part = (
        effective_attention(m.trace(TEXT)),
        effective_attention(m.trace(TEXT, heads=[3, 1])),
    )
    torch.testing.assert_close(part.effective, full.effective[:, [3, 1]])


def test_a_wrong_head_share_fails_verify(models):
    """verify() of a head selection can fail: the share of other heads does not reproduce."""
    m = models["sdpa"]
    part = m.trace(TEXT, heads=[1])
    other = m.trace(TEXT, heads=[2])
    part.attentions.copy_(other.attentions)
    with pytest.raises(IdentifiableError, match="does not reproduce"):
        part.verify()


@needs_recompute
def test_nothing_outside_the_selection_is_computed(models, monkeypatch):
    """Under sdpa only the chosen heads of the chosen layers are recomputed, and the
    forward pass stops after the last chosen layer."""
    m = models["sdpa"]
    filled: list[tuple[int, ...]] = []
    fill = recompute.AttentionCall.fill

    def spy(self, b, heads, n, n_k, out, *chunk):
        filled.append(tuple(heads) if heads is not None else ("all",))
        return fill(self, b, heads, n, n_k, out, *chunk)

    monkeypatch.setattr(recompute.AttentionCall, "fill", spy)
    runs: list[int] = []
    hook = m.layers[1].register_forward_hook(lambda mod, a, o: runs.append(1))
    try:
        m.trace(TEXT, layers=[0], heads=[2])
        assert filled == [(2,)] and runs == []  # layer 1 never ran
        filled.clear()
        got = [i for i, _ in m.iter_layers(TEXT, layers=[1], heads=[0, 1])]
        assert got == [1] and filled == [(0, 1)]
    finally:
        hook.remove()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"heads": []}, "heads= is empty"),
        ({"heads": [0, 0]}, "heads= repeats an index"),
        ({"heads": [4]}, r"heads= holds 4, out of range: valid heads are 0\.\.3"),
        ({"layers": [2]}, r"layers= holds 2, out of range: valid layers are 0\.\.1"),
        ({"layers": [-1]}, "layers= holds -1, out of range"),
        ({"heads": 0}, "heads= takes a list of integers"),
        ({"heads": [True]}, "heads= holds integers"),
    ],
)
def test_bad_selections_get_one_line(models, kwargs, message):
    m = models["sdpa"]
    for call in (lambda: m.trace(TEXT, **kwargs), lambda: list(m.iter_layers(TEXT, **kwargs))):
        with pytest.raises(IdentifiableError, match=message) as exc:
            call()
        assert "\n" not in str(exc.value)


def test_trace_takes_consecutive_layers_only(bert_tokenizer):
    from helpers.families import TINY_CONFIGS

    assert TINY_CONFIGS["albert"].config["num_hidden_layers"] == 3
    m = Model.from_hf(build_tiny_hf_model("albert"), bert_tokenizer)
    with pytest.raises(IdentifiableError, match=r"consecutive layers.*iter_layers streams any"):
        m.trace(TEXT, layers=[0, 2])
    assert [i for i, _ in m.iter_layers(TEXT, layers=[2, 0])] == [0, 2]
    assert m.trace(TEXT, layers=[1, 2]).layers == [1, 2]


def test_cli_trace_layers_and_heads(models, tmp_path, capsys, bert_tokenizer):
    folder = tmp_path / "llama"
    models["sdpa"].hf_model.save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    rc, out, err = run(
        ["trace", TEXT, "--model", str(folder), "--layers", "1", "--heads", "1,3"], capsys
    )
    assert rc == 0, err
    assert "1,3" in out and "passed" in out
    rc, out, err = run(["trace", TEXT, "--model", str(folder), "--heads", "7"], capsys)
    assert (
        rc == 2 and "--heads 7 is out of range: valid heads are 0..3" in err and "heads=" not in err
    )


@needs_recompute  # eager's plan for this tiny model fits in 1 MiB; sdpa's chunk buffer does not
def test_cli_trace_memory_budget_is_one_line(models, tmp_path, capsys, bert_tokenizer):
    folder = tmp_path / "llama"
    models["sdpa"].hf_model.save_pretrained(folder)
    bert_tokenizer.save_pretrained(folder)
    rc, _, err = run(["trace", TEXT, "--model", str(folder), "--memory-budget", "1"], capsys)
    assert rc == 2 and "--memory-budget" in err and "memory_budget=" not in err
    assert len(err.strip().splitlines()) == 1
