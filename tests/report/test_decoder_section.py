"""The decoder section of the report (`report.decoder_section`, tables from
`experiments.attention.CausalRows`): the tables against an independent per-row float64
projection (scipy's null space), the verdict on fabricated tables, and a smoke run of a tiny
decoder whose report carries the section while an encoder's does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import scipy.linalg

from helpers.corpora import small_corpus
from identifiable.experiments.attention import attention_tables
from identifiable.report.decoder_section import claim_sink_is_null, sink_table


@pytest.fixture(scope="module")
def tiny_llama(tiny_model: Any) -> Any:
    return tiny_model("llama")


TEXT = (
    "The river rises in the hills and runs west past three old mills, then turns north "
    "through the marshes, where herons wait in the reeds for the evening tide to come in."
)


def test_tables_match_a_per_row_float64_projection(tiny_llama: Any) -> None:
    tables = attention_tables(tiny_llama, [TEXT], 0, lambda k: None)
    tr = tiny_llama.trace(TEXT)
    n, d_v = tr.n_tokens, tr.values[0].shape[-1]
    assert n > 2 * d_v  # rows with and without a null space
    dims, fractions, expect = np.zeros(n), np.zeros(n), []
    for layer in range(tr.n_layers):
        for h in range(tr.n_heads):
            a = tr.attentions[layer, h].double().numpy()
            t = (tr.values[layer][h].double() @ tr.out_proj[layer][h].double()).numpy()
            raw_live, eff_live = [], []
            for i in range(n):
                null = scipy.linalg.null_space(t[: i + 1].T)  # x with x T≤i = 0
                row = a[i, : i + 1]
                eff = row - (row @ null) @ null.T
                dims[i] += null.shape[1]
                fractions[i] += np.linalg.norm(row - eff) / np.linalg.norm(row)
                if null.shape[1]:
                    raw_live.append(row[0])
                    eff_live.append(eff[0])
            expect.append((layer, h, np.mean(raw_live), np.mean(eff_live), len(raw_live)))
    sinks = tables["sinks"].set_index(["layer", "head"])
    for layer, h, raw, eff, rows in expect:
        got = sinks.loc[(layer, h)]
        assert got["null_rows"] == rows
        assert got["raw_null_rows"] == pytest.approx(raw, abs=1e-12)
        assert got["effective_null_rows"] == pytest.approx(eff, abs=1e-6)
        assert got["raw"] == pytest.approx(tr.attentions[layer, h, :, 0].double().mean().item())
    prefix = tables["by_prefix"]
    count = tr.n_layers * tr.n_heads
    assert prefix["prefix"].tolist() == list(range(1, n + 1))
    np.testing.assert_allclose(prefix["null_dim"], dims / count, atol=1e-12)
    np.testing.assert_allclose(prefix["null_fraction"], fractions / count, atol=1e-5)
    # RoPE leaves the values alone: a repeated token repeats a row of T, so short prefixes
    # can have a null space too; where no head has one, A_eff = A
    trivial = prefix["null_dim"] == 0
    assert trivial.iloc[:2].all() and prefix["null_fraction"][trivial].max() < 1e-6
    assert prefix["null_fraction"].iloc[-1] > 0.05


def _fabricated(effective_share: list[float], *, raw: float = 0.6) -> pd.DataFrame:
    """Two sink heads per sequence; effective = share · raw in the rows with a null space."""
    rows = []
    for seq, share in enumerate(effective_share):
        for head in (0, 1):
            rows.append((seq, 100, 3, head, raw, raw, 40, raw, share * raw))
    cols = "seq length layer head raw effective null_rows raw_null_rows effective_null_rows"
    return pd.DataFrame(rows, columns=cols.split())


@pytest.mark.parametrize(
    ("shares", "status"),
    [
        ([0.1, 0.15, 0.12, 0.2, 0.1, 0.18, 0.14, 0.11], "supported"),  # 80-90 % in the null space
        ([1.0] * 8, "not supported"),  # effective = raw: nothing in the null space
        ([0.9, 0.7, 0.6, 0.55, 0.62, 0.75, 0.8, 0.58], "not supported"),
        ([0.1, 0.9, 0.3, 0.7, 0.45, 0.55, 0.2, 0.8], "not settled"),
        ([0.1, 0.1, 0.1], "not settled"),  # three sequences: no 95 % interval of a median
    ],
)
def test_the_sink_verdict_follows_the_data(shares: list[float], status: str) -> None:
    v = claim_sink_is_null(_fabricated(shares))
    assert v.status == status, v.sentence
    assert v.numbers["null_share_lo"] <= v.numbers["null_share"] <= v.numbers["null_share_hi"]


def test_the_sink_verdict_is_not_tested_without_null_rows_or_sinks() -> None:
    short = _fabricated([0.1] * 8).assign(null_rows=0)
    assert claim_sink_is_null(short).status == "not tested"
    weak = _fabricated([0.1] * 8, raw=0.05)
    v = claim_sink_is_null(weak)
    assert v.status == "not tested" and "no head puts 0.2" in v.sentence


def test_sink_table_pools_heads_then_layers() -> None:
    df = _fabricated([0.5, 0.5]).assign(raw=[0.2, 0.6, 0.4, 0.8])
    table = sink_table(df)
    assert table["raw"].item() == pytest.approx(0.5)  # heads 0.3 and 0.7
    assert table["raw_max"].item() == pytest.approx(0.7)
    assert table["null"].item() == pytest.approx(table["raw"].item() - table["effective"].item())


@pytest.fixture(scope="module")
def decoder_run(tiny_llama: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A smoke reproduction of the tiny decoder: its folder, and the results as reproduce
    handed them to `write_report`."""
    import identifiable.runs.reproduce as reproduction

    seen: dict[str, Any] = {}
    real = reproduction.write_report

    def spy(out: Path, model: Any, results: Any, settings: Any) -> Any:
        seen.update(model=model, results=results, settings=settings)
        return real(out, model, results, settings)

    out = tmp_path_factory.mktemp("decoder") / "report"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reproduction, "write_report", spy)
        reproduction.reproduce(tiny_llama, small_corpus(), out, budget="smoke", progress=False)
    return seen | {"out": out}


def test_a_decoder_report_has_the_section_and_an_encoder_report_not(
    decoder_run: dict[str, Any], finished_run: Path
) -> None:
    out = decoder_run["out"]
    summary = json.loads((out / "summary.json").read_text())
    assert {"decoder_sinks", "decoder_by_prefix"} <= set(summary["tables"])
    assert "decoder_sink" in summary["claims"]
    page = (out / "index.html").read_text()
    assert 'id="decoder"' in page and "Decoders (causal rows)" in page
    for stem in ("decoder_rows", "decoder_sinks"):
        assert (out / "figures" / f"{stem}.svg").exists()
    encoder = json.loads((finished_run / "summary.json").read_text())
    assert "decoder_sinks" not in encoder["tables"] and "decoder_sink" not in encoder["claims"]
    assert 'id="decoder"' not in (finished_run / "index.html").read_text()


@pytest.mark.parametrize("table", ["sinks", "by_prefix"])
def test_a_decoder_run_without_its_tables_is_refused(
    decoder_run: dict[str, Any], tmp_path: Path, table: str
) -> None:
    from identifiable.errors import IdentifiableError
    from identifiable.report.document import write_report

    results = dict(decoder_run["results"])
    results["attention"] = {k: v for k, v in results["attention"].items() if k != table}
    with pytest.raises(IdentifiableError, match=f"stage 'attention' gave no table '{table}'"):
        write_report(tmp_path, decoder_run["model"], results, decoder_run["settings"])
    assert not any(tmp_path.iterdir()), "a refused report wrote files"
