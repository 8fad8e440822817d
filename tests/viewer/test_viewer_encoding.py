"""Quantised, size-bounded encoding of attention matrices for the viewer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from identifiable.viewer import encoding as vd


@given(arrays(np.float64, st.integers(1, 40), elements=st.floats(-3, 3)))
def test_quantise_error_is_at_most_half_a_step(x: np.ndarray) -> None:
    codes, off, step = vd.quantise(x)
    back = vd.dequantise(codes, off, step)
    assert np.all(np.abs(back - x) <= step / 2 + 1e-12 * (1 + np.abs(x).max()))


def test_encode_decode_head_round_trip() -> None:
    torch.manual_seed(0)
    raw = torch.softmax(torch.randn(9, 9), -1)
    eff = raw + 0.3 * torch.randn(9, 9)  # effective attention can be negative
    entry = vd.encode_head(raw, eff)
    r, e = vd.decode_head(entry, 9)
    assert np.abs(r - raw.numpy()).max() <= entry["raw"][1] / 2 + 1e-12
    assert np.abs(e - eff.numpy()).max() <= entry["eff"][1] / 2 + 1e-12
    assert e.min() < 0


def test_head_order_starts_with_chosen_head_and_covers_all() -> None:
    order = vd.head_order(4, 3, layer=2, head=1)
    assert order[:3] == [(2, 1), (2, 0), (2, 2)]
    assert order[3][0] == 1 and order[6][0] == 3
    assert sorted(order) == [(a, b) for a in range(4) for b in range(3)]


@settings(deadline=None, max_examples=5)
@given(st.integers(1_000_000, 4_000_000))
def test_encoded_heads_respect_the_byte_budget(max_bytes: int) -> None:
    gen = torch.Generator().manual_seed(1)
    raw = torch.rand(3, 4, 300, 300, generator=gen)  # incompressible worst case
    heads, reduced = vd.encode_heads(raw, raw - 0.5, layer=1, head=2, max_bytes=max_bytes)
    assert set(heads) == {
        f"{a},{b}" for a in range(3) for b in range(4)
    }  # every head, full or preview
    assert heads["1,2"]["f"] == 1  # the chosen head is always at full resolution
    assert {k for k, e in heads.items() if e["f"] > 1} == {f"{a},{b}" for a, b in reduced}
    used = sum(len(e["blob"]) + 120 for e in heads.values())
    assert used <= max_bytes - vd._OVERHEAD_RESERVE or len(heads) - len(reduced) == 1


def test_preview_is_the_block_means() -> None:
    x = torch.arange(25.0).reshape(5, 5)
    means = vd.block_means(x.numpy(), 2, causal=False)
    assert means.shape == (3, 3)
    assert (
        means[0, 0] == np.mean([0, 1, 5, 6])
        and means[2, 2] == 24
        and means[0, 2] == np.mean([4, 9])
    )
    causal = vd.block_means(x.numpy(), 2, causal=True)
    assert causal[0, 1] == 0 and causal[0, 0] == np.mean([0, 5, 6])  # masked keys left out
    entry = vd.encode_head(x, -x, block=2)
    raw, eff = vd.decode_head(entry, 5)
    assert np.abs(raw - means).max() <= entry["raw"][1] / 2 + 1e-12
    assert np.abs(eff + means).max() <= entry["eff"][1] / 2 + 1e-12


def test_choose_rows() -> None:
    assert vd.choose_rows(5, None, 8) == [0, 1, 2, 3, 4]
    rows = vd.choose_rows(100, None, 8)
    assert len(rows) == 8 and rows[0] == 0 and rows[-1] == 99
    assert vd.choose_rows(100, [7, 3, 7], 8) == [3, 7]


def test_interval_json_rounds() -> None:
    row = vd.IntervalRow(
        0,
        0,
        1,
        np.array([0.5, 0.5]),
        np.array([0.0, 0.1]),
        np.array([0.9, 1.0]),
        np.array([0.123456, 0.876544]),
    )
    js = vd.interval_json(row)
    assert js["witness"] == [0.1235, 0.8765] and js["lo"] == [0.0, 0.1]
    with pytest.raises(TypeError):
        vd.IntervalRow(0, 0, 1)  # type: ignore[call-arg]


@given(st.lists(st.integers(0, 10_000), unique=True, max_size=60).map(sorted))
def test_spread_order_is_a_permutation_starting_with_the_ends(rows: list[int]) -> None:
    order = vd.spread_order(rows)
    assert sorted(order) == rows
    if len(rows) >= 3:
        assert order[:3] == [rows[0], rows[-1], rows[(len(rows) - 1) // 2]]
