"""Every family in the spec tables, from its tiny config: traced, verified, its attention maps
equal to the model's own, its norm layout proved as discovery proves one; and register_spec.

The model types come from the tables themselves (`SPECS`, `SEQ2SEQ_SPECS`), so a new entry
without a tiny config in tests/helpers/families.py `TINY_CONFIGS` fails here.
"""

from __future__ import annotations

import pytest
import torch

from helpers.families import IMAGE_TYPES, TINY_CONFIGS, build_tiny_hf_model
from identifiable.errors import IdentifiableError
from identifiable.models import (
    ArchSpec,
    Model,
    NormLayout,
    Seq2SeqModel,
    find_spec,
    register_spec,
    specs,
)
from identifiable.models.blocks import norm_layout
from identifiable.models.discover import discover_norms, probe_ids, probe_norms, prove_norm_layout

TEXT = "The cat sat on the mat. It was happy, and so was I."
TYPES = sorted({t for s in specs.SPECS for t in s.model_types})
SEQ2SEQ_TYPES = sorted({t for s in specs.SEQ2SEQ_SPECS for t in s.model_types})


def untested(types: list[str], configs: dict[str, object]) -> list[str]:
    return [t for t in types if t not in configs]


def test_every_model_type_of_every_spec_has_a_tiny_config():
    missing = untested(TYPES + SEQ2SEQ_TYPES, TINY_CONFIGS)
    assert not missing, (
        f"add a tiny config to TINY_CONFIGS (tests/helpers/families.py) for {missing}"
    )
    # the one family list holds nothing the tables do not cover (a misspelt type would
    # silently test nothing)
    assert set(TINY_CONFIGS) == set(TYPES + SEQ2SEQ_TYPES)


def test_the_coverage_check_can_fail():
    """A spec whose model type has no tiny config is reported, by name."""
    assert untested([*TYPES, "made-up-type"], TINY_CONFIGS) == ["made-up-type"]


def _image(m: Model) -> torch.Tensor:
    cfg = m.hf_model.config
    g = torch.Generator().manual_seed(1)
    return torch.randn(int(cfg.num_channels), cfg.image_size, cfg.image_size, generator=g)


@pytest.mark.parametrize("model_type", TYPES)
def test_spec_traces_verifies_and_proves_its_norm_layout(model_type, tiny_model):
    m = tiny_model(model_type)
    assert isinstance(m, Model) and m.discovery is None  # the table's spec, not discovery
    assert m.spec.name == find_spec(model_type).name and m.spec.source == "table"
    x = _image(m) if model_type in IMAGE_TYPES else TEXT
    tr = m.trace(x)
    assert tr.verify().max() < 1e-5
    assert tr.is_causal == TINY_CONFIGS[model_type].causal
    # The per-layer capture equals the model's own attention probabilities, bit for bit.
    enc = m.encode(x)
    with torch.no_grad():
        own = m.hf_model(**m.batch_inputs([enc]), output_attentions=True).attentions
    assert torch.equal(torch.stack([a[0] for a in own]), tr.attentions)
    # The block's norm layout: proved by the check discovery uses, or refused in one line,
    # and then really not provable (discovery finds no layout either).
    try:
        layout = norm_layout(m)
    except IdentifiableError as exc:
        assert "\n" not in str(exc) and "undefined for" in str(exc)
        probe = probe_norms(m.hf_model, m.stack, m.inputs, probe_ids(m.hf_model), None)
        assert discover_norms(probe, tr.tolerance)[0] is None
        return
    assert prove_norm_layout(m.hf_model, m.stack, m.inputs, layout, tr.tolerance) is None


@pytest.mark.parametrize("model_type", SEQ2SEQ_TYPES)
def test_seq2seq_spec_traces_and_verifies(model_type, bert_tokenizer):
    m = Model.from_hf(build_tiny_hf_model(model_type), bert_tokenizer)
    assert isinstance(m, Seq2SeqModel)
    assert m.spec is specs.find_seq2seq_spec(model_type)
    tr = m.trace("The cat sat on the mat, and the dog sat on the log.", "Le chat.")
    assert all(float(e.max()) < 1e-5 for e in tr.verify().values())


@pytest.mark.parametrize("model_type", ["llama", "opt", "gpt_neox"])
def test_a_wrong_norm_layout_is_disproved(model_type, tiny_model):
    """The proof can fail: the right modules in the wrong wiring, or in the wrong order."""
    m = tiny_model(model_type)
    right = norm_layout(m)
    tol = m.trace(TEXT).tolerance
    for kind in {"post", "pre", "parallel"} - {right.kind}:
        wrong = NormLayout(right.first, right.second, kind)  # type: ignore[arg-type]
        assert prove_norm_layout(m.hf_model, m.stack, m.inputs, wrong, tol) is not None
    swapped = NormLayout(right.second, right.first, right.kind)
    assert prove_norm_layout(m.hf_model, m.stack, m.inputs, swapped, tol) is not None


_GPTJ = {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "n_positions": 128}


def _gptj():
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("gptj", vocab_size=30522, pad_token_id=0, **_GPTJ)
    return AutoModel.from_config(cfg, attn_implementation="eager").eval()


GPTJ_SPEC = ArchSpec(
    name="gpt-j",
    model_types=("gptj",),
    layers="h",
    value="attn.v_proj",
    out_proj="attn.out_proj",
    causal=True,
    norms=NormLayout("ln_1", "ln_1", "parallel"),
    mlp_width="n_inner",
)


@pytest.fixture
def registry(monkeypatch):
    """An empty run-time registry for one test."""
    monkeypatch.setattr(specs, "_REGISTERED", [])


def test_register_spec_traces_a_family_without_discovery(registry, bert_tokenizer):
    assert find_spec("gptj") is None
    register_spec(GPTJ_SPEC)
    assert find_spec("gptj").source == "registered" and "gptj" in specs.supported_model_types()
    m = Model.from_hf(_gptj(), bert_tokenizer)
    assert m.discovery is None and m.spec.name == "gpt-j"
    assert m.trace(TEXT).verify().max() < 1e-5
    assert norm_layout(m) == GPTJ_SPEC.norms


def test_register_spec_replaces_a_table_entry_only_when_asked(registry, bert_tokenizer):
    from dataclasses import replace

    mine = replace(find_spec("bert"), name="my-bert")
    with pytest.raises(IdentifiableError, match=r"'bert' is already in the table \(spec 'bert'\)"):
        register_spec(mine)
    assert find_spec("bert").name == "bert"
    register_spec(mine, replace_table=True)
    assert find_spec("bert").name == "my-bert"
    assert Model.from_hf(build_tiny_hf_model("bert"), bert_tokenizer).spec.name == "my-bert"


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: "bert", "register_spec takes an ArchSpec"),
        (lambda: ArchSpec("x", (), "h", "v", "o"), "model_types must be a non-empty tuple"),
        (lambda: ArchSpec("x", "gptj", "h", "v", "o"), "model_types must be a non-empty tuple"),
        (lambda: ArchSpec("", ("x",), "h", "v", "o"), "name must be"),
        (lambda: ArchSpec("x", ("x",), None, "v", "o"), "layers must be"),
        (lambda: ArchSpec("x", ("x",), "h", "v", "o", layer_groups="g"), "must be a LayerGroups"),
        (lambda: ArchSpec("x", ("x",), "h", "v", "o", axes=True), "axes must be an? Axes"),
    ],
)
def test_register_spec_refuses_bad_input_in_one_line(registry, bad, match):
    """A spec of the wrong kind is refused when it is made (ArchSpec) or registered."""
    with pytest.raises(IdentifiableError, match=match) as exc:
        register_spec(bad())
    assert "\n" not in str(exc.value) and specs._REGISTERED == []
