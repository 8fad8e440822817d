"""The embedded decoder SmolLM2-135M-Instruct: trained weights, dequantized from its Q4_1 GGUF
file. Claims that need trained attention (sinks) are checked here, on the packaged Wikipedia
sample at n = 512, against an independent per-row float64 projection."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import run_main
from identifiable.attention import sink_mass
from identifiable.experiments.sinks import corpus_prefix

N = 512
CHECKED = (3, 20)  # an early layer with a small sink, a late one with a large one


@pytest.fixture(scope="module")
def long_trace(smollm2):
    """The trace of the first 512 tokens of the packaged Wikipedia sample."""
    return smollm2.trace(corpus_prefix(smollm2, N))


@pytest.fixture(scope="module")
def sinks(long_trace):
    """The sink table of every layer of `long_trace`."""
    return sink_mass(long_trace)


def test_the_embedded_decoder(smollm2) -> None:
    info = smollm2.info
    assert (info.architecture, info.n_layers, info.n_heads, info.n_kv_heads) == ("llama", 30, 9, 3)
    assert (info.head_dim, info.hidden_size) == (64, 576)
    assert info.dequantized_from == "GGUF Q4_1"
    tr = smollm2.trace("The capital of France is Paris, a city on the Seine.")
    assert tr.dequantized_from == "GGUF Q4_1"
    assert float(tr.verify().max()) < tr.tolerance


def test_the_dequantized_weights_are_a_working_language_model(smollm2) -> None:
    """Greedy decoding from the cached weights (the causal LM with its tied head)."""
    from transformers import AutoModelForCausalLM

    folder = Path(str(smollm2.hf_model.config._name_or_path))
    lm = AutoModelForCausalLM.from_pretrained(folder)
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt")
    out = lm.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in smollm2.tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


def _first_key_effective(v: np.ndarray, a: np.ndarray) -> np.ndarray:
    """`[k, n]` A_eff[i, 0] of the k query heads that read the values `v` `[n, d_v]`
    (attentions `a` `[k, n, n]`), row by row in float64: row i of A projected onto the
    column space of V[:i+1], which is col(T[:i+1]) when each head's W_O slice has full row
    rank. Every row solves afresh: an SVD with the rank tolerance of docs/definitions.md
    while i + 1 ≤ d_v, then the normal equations of the whole prefix."""
    n, d_v = v.shape
    eps = np.finfo(np.float64).eps
    out = np.empty((a.shape[0], n))
    for i in range(n):
        vi, rows = v[: i + 1], a[:, i, : i + 1]  # [i+1, d_v], [k, i+1]
        if i + 1 <= d_v:
            u, s, _ = np.linalg.svd(vi, full_matrices=False)
            q = u[:, : int((s > s[0] * d_v * eps).sum())]
            out[:, i] = rows @ q @ q[0]
            continue
        gram = vi.T @ vi
        assert np.linalg.cond(gram) < 1e12  # V[:i+1] has full column rank d_v
        out[:, i] = vi[0] @ np.linalg.solve(gram, vi.T @ rows.T)
    return out


def test_sink_mass_against_a_per_row_float64_projection(long_trace, sinks) -> None:
    from threadpoolctl import threadpool_limits

    tr = long_trace
    assert tr.n_tokens == N and tr.is_causal
    for layer in CHECKED:
        for g in sorted(set(tr.kv_head_of.tolist())):
            heads = [h for h in range(tr.n_heads) if int(tr.kv_head_of[h]) == g]
            for h in heads:  # so that col(T[:i+1]) = col(V[:i+1])
                assert np.linalg.matrix_rank(tr.out_proj[layer, h].double().numpy()) == tr.head_dim
            a = tr.attentions[layer, heads].double().numpy()
            with threadpool_limits(1):  # thousands of small products: no thread hand-offs
                eff = _first_key_effective(tr.values[layer, heads[0]].double().numpy(), a)
            raw_expected = a[:, :, 0].mean(-1)
            got_raw = sinks.raw[layer, heads].numpy()
            got_eff = sinks.effective[layer, heads].numpy()
            assert np.allclose(got_raw, raw_expected, rtol=0, atol=1e-12)
            assert np.allclose(got_eff, eff.mean(-1), rtol=0, atol=2e-6), (layer, g)
    assert sinks.per_layer()["layer"].tolist() == list(range(30))


def test_trained_attention_has_a_sink_that_is_mostly_null(sinks) -> None:
    """What random weights cannot show: layers 12-29 put a third or more of each query's
    attention on the first token, and most of it changes nothing in the heads' outputs."""
    table = sinks.per_layer().set_index("layer")
    late = table.loc[12:29]
    assert late["raw"].min() > 0.25 and late["raw"].mean() > 0.45
    assert late["effective"].max() < 0.2
    assert (late["null"] > 0.15).all()
    assert table.loc[0:1, "raw"].max() < 0.05  # the first layers have none


def test_the_cli_prints_the_sink_table(smollm2, tmp_path: Path, capsys) -> None:
    """One command, the README's: here on 96 tokens of the sample (n > d_v = 64)."""
    out_file = tmp_path / "sink.json"
    args = ["attention", "--model", "smollm2", "--sink", "--tokens", "96"]
    rc, out, err = run_main([*args, "--json", str(out_file)], capsys)
    assert rc == 0, err
    assert "smollm2 (weights dequantized from GGUF Q4_1)" in out and "n = 96" in out
    payload = json.loads(out_file.read_text())
    assert payload["n_tokens"] == 96 and payload["dequantized_from"] == "GGUF Q4_1"
    expected = sink_mass(smollm2.trace(corpus_prefix(smollm2, 96))).per_layer()
    assert [row["layer"] for row in payload["layers"]] == list(range(30))
    got = np.array([[row["raw"], row["effective"]] for row in payload["layers"]])
    assert np.allclose(got, expected[["raw", "effective"]].to_numpy(), rtol=0, atol=1e-6)
    assert len(payload["layers"][20]["heads_raw"]) == 9


def test_the_report_sections_sink_verdict_on_trained_weights(smollm2, long_trace) -> None:
    """The decoder section's tables on six 128-token windows of the sample: the per-layer
    raw mass agrees with `sink_mass` (the scan's reduction) and, in the rows with a null
    space, most of the sink heads' first-token mass is null; the verdict says so."""
    from identifiable.experiments.attention import attention_tables
    from identifiable.report.decoder_section import claim_sink_is_null, sink_table

    ids = corpus_prefix(smollm2, 6 * 128)
    windows = [ids[k * 128 : (k + 1) * 128] for k in range(6)]
    tables = attention_tables(smollm2, windows, 0, lambda k: None)
    sinks = tables["sinks"]
    first = sink_mass(smollm2.trace(windows[0])).raw.numpy()
    got = sinks[sinks["seq"] == 0].pivot(index="layer", columns="head", values="raw").to_numpy()
    assert np.allclose(got, first, rtol=0, atol=1e-6)  # a batched forward against one
    late = sink_table(sinks).set_index("layer").loc[12:29]
    assert (late["effective_null_rows"] < late["raw_null_rows"]).all()
    verdict = claim_sink_is_null(sinks)
    assert verdict.numbers["sink_heads"] > 100
    assert verdict.status == "supported", verdict.sentence


def test_the_scans_sink_columns_on_trained_weights(smollm2, sinks) -> None:
    """`identifiable.scan` of the same 512 tokens gives `sink_mass`'s table head by head
    (one streams the layers on the model's device, the other reads the trace), and its late
    layers show the sink that random weights lack."""
    from identifiable import scan

    result = scan(smollm2, [corpus_prefix(smollm2, N)], progress=False)
    raw, eff = result.sink_raw[0].numpy(), result.sink_effective[0].numpy()
    assert np.allclose(raw, sinks.raw.numpy(), rtol=0, atol=1e-6)
    assert np.allclose(eff, sinks.effective.numpy(), rtol=0, atol=1e-6)
    assert raw[12:].mean() > 0.45 and eff[12:].mean() < 0.2
