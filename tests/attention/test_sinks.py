"""`sink_mass`: raw and effective attention on the first token, against effective attention
itself, on encoder and causal traces; selections, windows and the result's manners."""

from __future__ import annotations

import pytest
import torch

from helpers.traces import synthetic_trace
from identifiable.attention import SinkMass, effective_attention, sink_mass
from identifiable.results import load as load_result


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
def test_the_means_of_the_first_column(causal: bool, variant: str) -> None:
    tr = synthetic_trace(n=14, layers=3, heads=2, d_v=4, causal=causal, seed=3)
    eff = effective_attention(tr, variant).effective.double()  # type: ignore[arg-type]
    sm = sink_mass(tr, variant)  # type: ignore[arg-type]
    assert torch.allclose(sm.raw, tr.attentions[..., 0].double().mean(-1), atol=1e-12)
    assert torch.allclose(sm.effective, eff[..., 0].mean(-1), atol=1e-12)
    assert sm.rows.tolist() == [14, 14, 14]
    # n = 14 > d_v = 4: the first column is not identifiable, so the two differ
    assert float((sm.raw - sm.effective).abs().max()) > 1e-3


def test_a_sink_in_the_null_space() -> None:
    """Every row puts 0.9 on the first key, whose value row is 0: that mass reaches nothing,
    and effective attention moves it off (it keeps the first key's share of col(T))."""
    tr = synthetic_trace(n=10, layers=1, heads=1, d_v=3, seed=1)
    a = torch.full((1, 1, 10, 10), 0.1 / 9)
    a[..., 0] = 0.9
    values = tr.values.clone()
    values[..., 0, :] = 0.0
    from dataclasses import replace

    sunk = replace(tr, attentions=a, values=values)
    sm = sink_mass(sunk)
    assert float(sm.raw[0, 0]) == pytest.approx(0.9)
    assert abs(float(sm.effective[0, 0])) < 1e-6  # e_0 is orthogonal to col(T)


def test_rows_that_do_not_see_the_first_key_are_left_out() -> None:
    tr = synthetic_trace(n=12, layers=1, heads=2, d_v=4, causal=True, seed=2)
    window = torch.ones(12, 12, dtype=torch.bool).tril() & ~torch.ones(12, 12).tril(-5).bool()
    a = tr.attentions.masked_fill(~window, 0.0)
    a = a / a.sum(-1, keepdim=True)
    from dataclasses import replace

    windowed = replace(tr, attentions=a, key_mask=window[None])
    sm = sink_mass(windowed)
    assert sm.rows.tolist() == [5]  # rows 0..4 see key 0
    assert torch.allclose(sm.raw, a[0, :, :5, 0].double().mean(-1)[None], atol=1e-12)


def test_selections_and_the_result(tmp_path) -> None:
    tr = synthetic_trace(n=12, layers=3, heads=3, d_v=4, seed=4)
    full = sink_mass(tr)
    part = sink_mass(tr, layers=[2], heads=[0, 2])
    assert torch.allclose(part.raw, full.raw[2:3, [0, 2]])
    assert torch.allclose(part.effective, full.effective[2:3, [0, 2]])
    assert part.layers == (2,) and part.heads == (0, 2)
    table = full.per_layer()
    assert list(table.columns) == ["layer", "raw", "effective", "null", "raw_max"]
    assert table["null"].to_numpy() == pytest.approx((table["raw"] - table["effective"]).to_numpy())
    assert len(full.to_pandas()) == 9  # one row per layer and head
    path = full.save(tmp_path / "sinks.idf")
    back = load_result(path)
    assert isinstance(back, SinkMass) and torch.equal(back.effective, full.effective)
    assert "SinkMass" in repr(full) and full.first_token == "t0" and full.n_tokens == 12
