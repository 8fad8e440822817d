"""Every public name of `identifiable` called the wrong way: None, a wrong type, an empty
collection, an object of the wrong kind (a Model where a Trace belongs and back). Each call
must raise `IdentifiableError` with one line from our own checks, never a foreign exception
(AttributeError, torch's TypeError, …) from deep inside.

The table holds cheap bad calls only: each is refused before any real work, so the whole
file runs in seconds on the tiny models of tests/helpers/families.py."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import identifiable as idf
from identifiable.errors import IdentifiableError
from identifiable.results import Result

Case = Callable[[Any], Any]


def _trace_fields(**changes: Any) -> dict[str, Any]:
    """Keyword arguments of a valid 1-layer Trace, with `changes` made."""
    n, d = 3, 4
    fields = dict(
        tokens=["a", "b", "c"],
        input_ids=torch.arange(n),
        attentions=torch.full((1, 1, n, n), 1 / n),
        values=torch.ones(1, 1, n, 2),
        value_bias=torch.zeros(1, 1, 2),
        out_proj=torch.ones(1, 1, 2, d),
        out_bias=torch.zeros(1, d),
        hidden_states=torch.zeros(2, n, d),
        attn_outputs=torch.zeros(1, n, d),
        is_causal=False,
        kv_head_of=torch.arange(1),
    )
    return {**fields, **changes}


# name → bad calls; `c` holds the tiny model `c.m` (BERT), its trace `c.tr`, `c.dir` (the
# model's folder) and `c.tmp` (an empty folder, where outputs must never appear)
MISUSE: dict[str, list[Case]] = {
    "load_model": [
        lambda c: idf.load_model(None),
        lambda c: idf.load_model(42),
        lambda c: idf.load_model(""),
        lambda c: idf.load_model([]),
        lambda c: idf.load_model(c.m),
        lambda c: idf.load_model(str(c.dir), dtype="float13"),  # the case
        lambda c: idf.load_model(str(c.dir), dtype=42),
        lambda c: idf.load_model(str(c.dir), device=42),
    ],
    "Model": [
        lambda c: idf.Model(None),
        lambda c: idf.Model(42),
        lambda c: idf.Model(c.m),
        lambda c: idf.Model("bert"),
        lambda c: idf.Model(c.m.task_model, tokenizer=42),
    ],
    "Seq2SeqModel": [
        lambda c: idf.Seq2SeqModel(None),
        lambda c: idf.Seq2SeqModel(42),
        lambda c: idf.Seq2SeqModel(c.m.task_model),  # an encoder-only model
    ],
    "Trace": [
        lambda c: idf.Trace(**_trace_fields(attentions=None)),
        lambda c: idf.Trace(**_trace_fields(tokens=None)),
        lambda c: idf.Trace(**_trace_fields(tokens="abc")),
        lambda c: idf.Trace(**_trace_fields(values=[[1.0]])),
        lambda c: idf.Trace.from_tensors(None, None, None),
        lambda c: idf.Trace.from_tensors(torch.ones(2, 2), "x", torch.ones(1, 1)),
    ],
    "Seq2SeqTrace": [
        lambda c: idf.Seq2SeqTrace(None, None, None),
        lambda c: idf.Seq2SeqTrace(c.tr, c.tr, 42),
    ],
    "Encoding": [
        lambda c: idf.Encoding(None, ["a"], 0),
        lambda c: idf.Encoding(torch.arange(2), None, 0),
        lambda c: idf.Encoding(torch.arange(2), ["a", "b"], None),
    ],
    "ArchSpec": [
        lambda c: idf.ArchSpec(None, ("x",), "layers", "value", "out"),
        lambda c: idf.ArchSpec("x", "bert", "layers", "value", "out"),
        lambda c: idf.ArchSpec("x", (), "layers", "value", "out"),
        lambda c: idf.ArchSpec("x", ("x",), None, "value", "out"),
    ],
    "register_spec": [
        lambda c: idf.register_spec(None),
        lambda c: idf.register_spec(42),
        lambda c: idf.register_spec({}),
    ],
    "discover_spec": [
        lambda c: idf.discover_spec(None),
        lambda c: idf.discover_spec(42),
        lambda c: idf.discover_spec(c.m),
    ],
    "trace_from_lens": [
        lambda c: idf.trace_from_lens(None, None),
        lambda c: idf.trace_from_lens(c.m, "x"),
        lambda c: idf.trace_from_lens(42, []),
    ],
    "trace_from_nnsight": [
        lambda c: idf.trace_from_nnsight(None, None),
        lambda c: idf.trace_from_nnsight(c.m, "x"),
        lambda c: idf.trace_from_nnsight(42, ""),
    ],
    "null_space": [
        lambda c: idf.null_space(None),
        lambda c: idf.null_space(c.m),
        lambda c: idf.null_space(42),
        lambda c: idf.null_space(c.tr, layers=[]),
        lambda c: idf.null_space(c.tr, heads="0"),
        lambda c: idf.null_space(c.tr, factors=42),
    ],
    "effective_attention": [
        lambda c: idf.effective_attention(None),
        lambda c: idf.effective_attention(c.m),
        lambda c: idf.effective_attention({}),
        lambda c: idf.effective_attention(c.tr, variant=None),
        lambda c: idf.effective_attention(c.tr, dtype="float13"),
        lambda c: idf.effective_attention(c.tr, out=42),
        lambda c: idf.effective_attention(c.tr, layers=[]),
    ],
    "iter_effective_attention": [
        lambda c: list(idf.iter_effective_attention(None)),
        lambda c: list(idf.iter_effective_attention(c.m, [])),  # the case
        lambda c: list(idf.iter_effective_attention(c.tr, layers=[])),
        lambda c: list(idf.iter_effective_attention(c.tr, variant=42)),
    ],
    "sink_mass": [
        lambda c: idf.sink_mass(None),
        lambda c: idf.sink_mass(c.m),
        lambda c: idf.sink_mass(c.tr, variant=42),
        lambda c: idf.sink_mass(c.tr, layers=[]),
        lambda c: idf.sink_mass(c.tr, heads=[99]),
        lambda c: idf.sink_mass(c.tr, heads="0"),
        lambda c: idf.sink_mass(c.tr, factors=42),
    ],
    "constrained_attention": [
        lambda c: idf.constrained_attention(None, 0, 0),
        lambda c: idf.constrained_attention(c.m, 0, 0),
        lambda c: idf.constrained_attention(c.tr, None, 0),
        lambda c: idf.constrained_attention(c.tr, 0, "0"),
        lambda c: idf.constrained_attention(c.tr, 0, 0, rows=[]),
        lambda c: idf.constrained_attention(c.tr, 0, 0, rows="1"),
        lambda c: idf.constrained_attention(c.tr, 0, 0, reference=None),
        lambda c: idf.constrained_attention(c.tr, 0, 0, key_mask=42),
    ],
    "witness": [
        lambda c: idf.witness(None, 0, 0, 0),
        lambda c: idf.witness(c.m, 0, 0, 0),
        lambda c: idf.witness(c.tr, None, 0, 0),
        lambda c: idf.witness(c.tr, 0, 0, "1"),
        lambda c: idf.witness(c.tr, 0, 0, 1.5),
    ],
    "attention_intervals": [
        lambda c: idf.attention_intervals(None, 0, 0, 0),
        lambda c: idf.attention_intervals(c.m, 0, 0, 0),
        lambda c: idf.attention_intervals(c.tr, 0, None, 0),
        lambda c: idf.attention_intervals(c.tr, 0, 0, 0, threads=0),
        lambda c: idf.attention_intervals(c.tr, 0, 0, 0, threads="2"),
    ],
    "scan": [
        lambda c: idf.scan(None, ["a b c"]),
        lambda c: idf.scan(c.tr, ["a b c"]),
        lambda c: idf.scan(c.m, None),
        lambda c: idf.scan(c.m, []),
        lambda c: idf.scan(c.m, 42),
        lambda c: idf.scan(c.m, ["a b c"], layers=[]),
        lambda c: idf.scan(c.m, ["a b c"], heads=[99]),
        lambda c: idf.scan(c.m, ["a b c"], sink=-1),
        lambda c: idf.scan(c.m, ["a b c"], sink="0"),
        lambda c: idf.scan(c.m, ["a b c"], keep=[(99, 0)]),
        lambda c: idf.scan(c.m, ["a b c"], variant=42),
        lambda c: idf.scan(c.m, ["a b c"], max_tokens=0),
        lambda c: idf.scan(c.m, ["a b c"], memory_budget="1"),
        lambda c: idf.scan(c.m, ["a b c"], device="meta"),
    ],
    "attention_posterior": [
        lambda c: idf.attention_posterior(None, 0, 0),
        lambda c: idf.attention_posterior(c.m, 0, 0),
        lambda c: idf.attention_posterior(c.tr, None, 0),
        lambda c: idf.attention_posterior(c.tr, 0, "0"),
        lambda c: idf.attention_posterior(c.tr, 0, 0, rows=[]),
        lambda c: idf.attention_posterior(c.tr, 0, 0, rows="0"),
        lambda c: idf.attention_posterior(c.tr, 0, 0, prior=None),
        lambda c: idf.attention_posterior(c.tr, 0, 0, alpha="1"),
        lambda c: idf.attention_posterior(c.tr, 0, 0, samples=None),
        lambda c: idf.attention_posterior(c.tr, 0, 0, chains=1.5),
        lambda c: idf.attention_posterior(c.tr, 0, 0, seed="0"),
        lambda c: idf.attention_posterior(c.tr, 0, 0, level=2),
        lambda c: idf.attention_posterior(c.tr, 0, 0, time_budget="1"),
        lambda c: idf.attention_posterior(c.tr, 0, 0, walk="gibbs"),
    ],
    "interval_map": [
        lambda c: idf.interval_map(None),
        lambda c: idf.interval_map(c.m),
        lambda c: idf.interval_map(c.tr, workers=0),  # the case
        lambda c: idf.interval_map(c.tr, rows=[]),  # the case
        lambda c: idf.interval_map(c.tr, layers=[]),
        lambda c: idf.interval_map(c.tr, heads=[]),
        lambda c: idf.interval_map(c.tr, workers=None),
        lambda c: idf.interval_map(c.tr, workers="2"),
        lambda c: idf.interval_map(c.tr, workers=1.5),
        lambda c: idf.interval_map(c.tr, rows="0"),
        lambda c: idf.interval_map(c.tr, rows=[None]),
        lambda c: idf.interval_map(c.tr, rows=[0, 0]),
        lambda c: idf.interval_map(c.tr, threads=0),
        lambda c: idf.interval_map(c.tr, key_mask=42),
        lambda c: idf.interval_map(c.tr, chains_per_row=0),
        lambda c: idf.interval_map(c.tr, time_budget="1"),
        lambda c: idf.interval_map(c.tr, progress="yes"),
    ],
    "token_identifiability": [
        lambda c: idf.token_identifiability(None),
        lambda c: idf.token_identifiability(c.tr),  # the case
        lambda c: idf.token_identifiability(c.m, None),
        lambda c: idf.token_identifiability(c.m, []),
        lambda c: idf.token_identifiability(c.m, max_tokens=None),
        lambda c: idf.token_identifiability(c.m, probe_kinds=[]),
        lambda c: idf.token_identifiability(c.m, probe_kinds="linear"),
        lambda c: idf.token_identifiability(c.m, objectives=[]),
    ],
    "ProbeConfig": [
        lambda c: idf.ProbeConfig(ridge=None),
        lambda c: idf.ProbeConfig(ridge="x"),
        lambda c: idf.ProbeConfig(ridge_grid=()),
    ],
    "hidden_token_attribution": [
        lambda c: idf.hidden_token_attribution(None, "x"),
        lambda c: idf.hidden_token_attribution(c.tr, "x"),
        lambda c: idf.hidden_token_attribution(c.m, None),
        lambda c: idf.hidden_token_attribution(c.m, ""),
        lambda c: idf.hidden_token_attribution(c.m, []),
        lambda c: idf.hidden_token_attribution(c.m, "x", probes=0),
        lambda c: idf.hidden_token_attribution(c.m, "x", probes="2"),
        lambda c: idf.hidden_token_attribution(c.m, "x", seed=None),
        lambda c: idf.hidden_token_attribution(c.m, "x", memory_budget=None),
        lambda c: idf.hidden_token_attribution(c.m, "x", chunk_size="1"),
    ],
    "context_mixing": [
        lambda c: idf.context_mixing(None, "x"),
        lambda c: idf.context_mixing(c.tr, "x"),
        lambda c: idf.context_mixing(c.m, None),
        lambda c: idf.context_mixing(c.m, []),
        lambda c: idf.context_mixing(c.m, "x", method=None),
        lambda c: idf.context_mixing(c.m, "x", method="junk"),
        lambda c: idf.context_mixing(c.m, "x", "flow", workers=0),
        lambda c: idf.context_mixing(c.m, "x", "flow", workers=None),
    ],
    "load_corpus": [
        lambda c: idf.load_corpus(None),
        lambda c: idf.load_corpus(42),
        lambda c: idf.load_corpus([]),
        lambda c: idf.load_corpus([None]),
        lambda c: idf.load_corpus("wikipedia-sample", unit=42),
        lambda c: idf.load_corpus("wikipedia-sample", limit=0),
        lambda c: idf.load_corpus("wikipedia-sample", limit="3"),
        lambda c: idf.load_corpus("wikipedia-sample", seed=None),
    ],
    "Corpus": [
        lambda c: idf.Corpus(None, "text", (), ""),
        lambda c: idf.Corpus("x", "text", None, ""),
    ],
    "null_attention_penalty": [
        lambda c: idf.null_attention_penalty(None, "x"),
        lambda c: idf.null_attention_penalty(c.tr, "x"),
        lambda c: idf.null_attention_penalty(c.m, None),
        lambda c: idf.null_attention_penalty(c.m, []),
        lambda c: idf.null_attention_penalty(c.m, "x", layers=[]),
        lambda c: idf.null_attention_penalty(c.m, "x", variant=None),
        lambda c: idf.null_attention_penalty(c.m, {"input_ids": 42}),
    ],
    "finetune": [
        lambda c: idf.finetune(None, out=c.tmp / "f"),
        lambda c: idf.finetune(c.m, out=c.tmp / "f"),
        lambda c: idf.finetune(str(c.dir), None, out=c.tmp / "f"),
        lambda c: idf.finetune(str(c.dir), [], out=c.tmp / "f"),
        lambda c: idf.finetune(str(c.dir), "0.1", out=c.tmp / "f"),
        lambda c: idf.finetune(str(c.dir), 1e308, out=c.tmp / "f"),  # the case
        lambda c: idf.finetune(str(c.dir), float("nan"), out=c.tmp / "f"),
        lambda c: idf.finetune(str(c.dir), out=None),
        lambda c: idf.finetune(str(c.dir), out=c.tmp / "f", settings=42),
        lambda c: idf.finetune(str(c.dir), out=c.tmp / "f", corpus=None),
        lambda c: idf.finetune(str(c.dir), out=c.tmp / "f", held_out_pairs=0),
        lambda c: idf.finetune(str(c.dir), out=c.tmp / "f", time_budget=-1),
    ],
    "compare": [
        lambda c: idf.compare(None),
        lambda c: idf.compare([]),
        lambda c: idf.compare("minilm"),
        lambda c: idf.compare([str(c.dir), None], out=c.tmp / "c"),
        lambda c: idf.compare([str(c.dir), str(c.dir)], None, out=c.tmp / "c"),
        lambda c: idf.compare([str(c.dir), str(c.dir)], out=None),
        lambda c: idf.compare([str(c.dir), str(c.dir)], out=c.tmp / "c", budget=None),
        lambda c: idf.compare([str(c.dir), str(c.dir)], out=c.tmp / "c", seed=None),
    ],
    "reproduce": [
        lambda c: idf.reproduce(None, out=c.tmp / "r"),
        lambda c: idf.reproduce(c.tr, out=c.tmp / "r"),
        lambda c: idf.reproduce(c.m, None, out=c.tmp / "r"),
        lambda c: idf.reproduce(c.m, [], out=c.tmp / "r"),
        lambda c: idf.reproduce(c.m, out=None),
        lambda c: idf.reproduce(c.m, out=c.tmp / "r", budget=None),
        lambda c: idf.reproduce(c.m, out=c.tmp / "r", seed=None),
    ],
    "build_viewer": [
        lambda c: idf.build_viewer(None, "x"),
        lambda c: idf.build_viewer(c.tr, "x"),
        lambda c: idf.build_viewer(c.m, None),
        lambda c: idf.build_viewer(c.m, []),
        lambda c: idf.build_viewer(c.m, "x", options=42),
        lambda c: idf.build_viewer(c.m, "x", bogus=1),
    ],
    "viewer_html": [
        lambda c: idf.viewer_html(42),
        lambda c: idf.viewer_html(None, bogus=1),
    ],
    "viewer_iframe": [
        lambda c: idf.viewer_iframe(None),  # the case
        lambda c: idf.viewer_iframe(42),
        lambda c: idf.viewer_iframe(""),
        lambda c: idf.viewer_iframe("<html></html>", height=None),
        lambda c: idf.viewer_iframe("<html></html>", height=0),
        lambda c: idf.viewer_iframe("<html></html>", title=None),
    ],
    "viewer_fragment": [
        lambda c: idf.viewer_fragment(bogus=1),
        lambda c: idf.viewer_fragment(model=None, text=None),
    ],
    "viewer_widget": [
        lambda c: idf.viewer_widget(None, None),
        lambda c: idf.viewer_widget(c.tr, "x"),
        lambda c: idf.viewer_widget(page_html=42),
        lambda c: idf.viewer_widget(c.m, "x", height=None),
    ],
    "load_result": [
        lambda c: idf.load_result(None),
        lambda c: idf.load_result(42),
        lambda c: idf.load_result(""),
        lambda c: idf.load_result([]),
        lambda c: idf.load_result(c.tmp / "missing.json"),
    ],
}

# What the table leaves out, and why.
NOT_CALLED: dict[str, str] = {
    "__version__": "a string",
    "IdentifiableError": "the exception itself (any arguments make one)",
    "TruncationWarning": "a warning class, raised by the library",
    "RemoteCodeNotRun": "a warning class, raised by the library",
    "supported_model_types": "takes no arguments",
    "register_inseq": "takes no arguments",
    **{name: "a subpackage" for name in idf.SUBPACKAGES},
}
RESULTS = "a result: made by the functions above and read back by load_result (tested there)"


def _is_result(name: str) -> bool:
    obj = getattr(idf, name)
    runs = ("FinetuneResult", "Comparison", "Reproduction")  # plain records of a run
    return name in runs or (inspect.isclass(obj) and issubclass(obj, Result) and name not in MISUSE)


def test_every_public_name_is_in_the_table() -> None:
    """A new public name fails here until it has bad calls (or a reason to have none)."""
    covered = set(MISUSE) | set(NOT_CALLED) | {n for n in idf.__all__ if _is_result(n)}
    assert covered == set(idf.__all__), sorted(set(idf.__all__) ^ covered)
    assert all(len(cases) >= 1 for cases in MISUSE.values())


@pytest.fixture(scope="module")
def objects(tiny_model, model_dir) -> dict[str, Any]:
    m = tiny_model("bert")
    return {"m": m, "tr": m.trace("the cat sat on the mat"), "dir": model_dir}


@pytest.fixture
def ctx(objects, tmp_path) -> SimpleNamespace:
    return SimpleNamespace(**objects, tmp=tmp_path)


CASES = [(name, i) for name, calls in MISUSE.items() for i in range(len(calls))]


@pytest.mark.parametrize(("name", "i"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_misuse_raises_one_line_of_ours(ctx, name: str, i: int) -> None:
    with pytest.raises(IdentifiableError) as info:
        MISUSE[name][i](ctx)
    message = str(info.value)
    assert message and "\n" not in message and len(message) < 600, message
    assert "\n" not in info.value.for_cli()
    assert not any(Path(ctx.tmp).iterdir()), "a refused call wrote files"
