"""Intervals and witnesses over each row's own key set: cross-attention (the encoder's
n_s keys, n_s ≠ n) and windowed layers, against a plain per-key `scipy.optimize.linprog`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from helpers.families import build_tiny_hf_model
from identifiable.attention import attention_intervals, interval_map, witness
from identifiable.models import Model

SOURCE = "The cat sat on the mat, and the dog sat on the log by the door near the old mill."
TARGET = "Le chat est assis."


def _reference(trace, layer: int, head: int, row: int) -> tuple[np.ndarray, np.ndarray]:
    """min and max of ã_j over {ã ≥ 0 on the row's keys, Σã = 1, ã·T = a·T}, per key."""
    keys = trace.keys_seen(layer)[row].nonzero().flatten()
    a = trace.attentions[layer, head, row, keys].double().numpy()
    t = (trace.values[layer, head, keys].double() @ trace.out_proj[layer, head].double()).numpy()
    a_eq = np.vstack([t.T, np.ones((1, len(keys)))])
    b_eq = a_eq @ a
    lo, hi = np.zeros(trace.n_keys), np.zeros(trace.n_keys)
    for k, j in enumerate(keys.tolist()):
        c = np.zeros(len(keys))
        c[k] = 1.0
        opts = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
        lo[j] = linprog(c, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs", options=opts).fun
        hi[j] = -linprog(
            -c, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs", options=opts
        ).fun
    return lo, hi


@pytest.fixture(scope="module")
def cross(bert_tokenizer):
    model = Model.from_hf(build_tiny_hf_model("bart"), bert_tokenizer)
    tr = model.trace(SOURCE, TARGET).cross
    assert tr.n_keys > tr.n_tokens and tr.n_keys > tr.head_dim  # a null space over keys
    return tr


def test_cross_attention_intervals_cover_every_encoder_key(cross) -> None:
    for row in (0, cross.n_tokens - 1):
        iv = attention_intervals(cross, 0, 1, row)
        assert iv.lower.shape == (cross.n_keys,)
        lo, hi = _reference(cross, 0, 1, row)
        np.testing.assert_allclose(iv.lower.numpy(), lo, atol=1e-7)
        np.testing.assert_allclose(iv.upper.numpy(), hi, atol=1e-7)
        assert iv.null_dim == cross.n_keys - torch.linalg.matrix_rank(
            torch.cat(
                [cross.values[0, 1].double() @ cross.out_proj[0, 1].double(),
                 torch.ones(cross.n_keys, 1, dtype=torch.float64)], 1
            )
        )  # fmt: skip


def test_cross_attention_witness_is_valid_over_the_encoder_keys(cross) -> None:
    w = witness(cross, 1, 0, 2)
    assert w.exists and w.weights is not None and w.weights.shape == (cross.n_keys,)
    t = cross.values[1, 0].double() @ cross.out_proj[1, 0].double()
    a = cross.attentions[1, 0, 2].double()
    # the same mass as the (float32) raw row, on the encoder's keys
    assert float(w.weights.min()) >= 0 and abs(float(w.weights.sum() - a.sum())) < 1e-9
    assert float((w.weights @ t - a @ t).norm() / (a @ t).norm()) < 1e-9
    assert 0 <= w.key < cross.n_keys and float(cross.attentions[1, 0, 2, w.key]) > 0


def test_cross_attention_interval_map_has_the_encoder_width(cross) -> None:
    imap = interval_map(cross, layers=[0], heads=[1], rows=[0, 1])
    assert imap.lower.shape[-1] == cross.n_keys
    lo, hi = _reference(cross, 0, 1, 1)
    np.testing.assert_allclose(imap.lower[0, 0, 1].numpy(), lo, atol=1e-7)
    np.testing.assert_allclose(imap.upper[0, 0, 1].numpy(), hi, atol=1e-7)


def test_windowed_rows_use_their_window_not_a_prefix(tiny_model) -> None:
    tr = tiny_model("gpt_neo").trace(SOURCE + " " + SOURCE)  # local layers: a window
    layer = next(
        lyr for lyr in range(tr.n_layers)
        if not bool(tr.keys_seen(lyr).equal(torch.ones_like(tr.keys_seen(lyr)).tril()))
    )  # fmt: skip
    row = tr.n_tokens - 1
    keys = tr.keys_seen(layer)[row]
    assert not bool(keys[0])  # the window does not reach the first token
    iv = attention_intervals(tr, layer, 0, row)
    assert float(iv.upper[~keys].abs().max()) == 0.0
    lo, hi = _reference(tr, layer, 0, row)
    np.testing.assert_allclose(iv.lower.numpy(), lo, atol=1e-7)
    np.testing.assert_allclose(iv.upper.numpy(), hi, atol=1e-7)
