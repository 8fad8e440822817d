"""Tensor-level entry points (identifiable.attention.tensors) equal the trace route."""

from __future__ import annotations

import pytest
import torch

from identifiable.attention import effective_attention, null_space, tensors, witness
from identifiable.errors import IdentifiableError

TEXT = "The cat sat on the mat. It was happy, and so was I."


@pytest.mark.parametrize("arch", ["bert", "gpt2", "gemma2"])
@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
def test_tensors_equal_the_trace_route(tiny_model, arch, variant):
    tr = tiny_model(arch).trace(TEXT)
    mask = tr.key_mask if arch == "gemma2" else None  # windows are not readable off A
    got = tensors.effective_attention(
        tr.attentions, tr.values, tr.out_proj, variant=variant, key_mask=mask
    )
    want = effective_attention(tr, variant)
    assert torch.equal(got.effective, want.effective)
    assert torch.equal(got.null_space.rank, want.null_space.rank)
    assert torch.equal(got.null_space.dim_stochastic, want.null_space.dim_stochastic)
    assert got.null_space.is_causal == (arch != "bert")  # read off the zeros above the diagonal
    ns = tensors.null_space(tr.values, tr.out_proj, causal=arch != "bert", key_mask=mask)
    assert torch.equal(ns.dim, null_space(tr).dim)


def test_single_head_shapes_and_brute_force():
    g = torch.Generator().manual_seed(0)
    n, d_v, d = 12, 4, 8
    a = torch.softmax(torch.randn(n, n, generator=g), -1)
    v = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    h = torch.randn(d_v, d, generator=g, dtype=torch.float64)
    ea = tensors.effective_attention(a, v, h, dtype=torch.float64)
    assert ea.effective.shape == (n, n) and ea.null_space.rank.shape == (n,)
    u, _, _ = torch.linalg.svd(v @ h, full_matrices=False)
    want = a.double() @ u[:, :d_v] @ u[:, :d_v].T
    torch.testing.assert_close(ea.effective, want, atol=1e-12, rtol=0)
    assert ea.null_space.dim.tolist() == [n - d_v] * n
    # one layer of heads: [H, n, n]
    eah = tensors.effective_attention(
        a[None].expand(3, n, n), v.expand(3, n, d_v), h.expand(3, d_v, d), dtype=torch.float64
    )
    assert eah.effective.shape == (3, n, n)
    torch.testing.assert_close(eah.effective[2], ea.effective)


def test_cross_attention_tensors():
    """Rows ≠ keys: 5 queries over 9 keys of width 3 leave a 6-dimensional null space."""
    g = torch.Generator().manual_seed(1)
    a = torch.softmax(torch.randn(2, 5, 9, generator=g), -1)
    v = torch.randn(2, 9, 3, generator=g)
    h = torch.randn(2, 3, 8, generator=g)
    ea = tensors.effective_attention(a, v, h, dtype=torch.float64)
    assert ea.effective.shape == (2, 5, 9) and ea.null_space.dim.unique().tolist() == [6]
    t = v.double() @ h.double()
    torch.testing.assert_close(ea.effective @ t, a.double() @ t, atol=1e-12, rtol=0)
    ns = tensors.null_space(v, h, key_mask=torch.ones(5, 9, dtype=torch.bool))
    assert ns.rank.shape == (2, 5) and ns.dim.unique().tolist() == [6]


def test_as_trace_feeds_trace_level_functions(tiny_model):
    tr = tiny_model("bert").trace(TEXT)
    bare = tensors.as_trace(tr.attentions, tr.values, tr.out_proj)
    w1, w2 = witness(tr, 1, 2, 3), witness(bare, 1, 2, 3)
    torch.testing.assert_close(torch.as_tensor(w1.weights), torch.as_tensor(w2.weights))
    with pytest.raises(IdentifiableError, match="no captured attention output"):
        bare.verify()


def test_bad_shapes_are_one_line_errors():
    a = torch.softmax(torch.randn(2, 6, 6), -1)
    with pytest.raises(IdentifiableError, match="shapes do not fit") as e:
        tensors.effective_attention(a, torch.randn(2, 5, 4), torch.randn(2, 4, 8))
    assert "\n" not in str(e.value)
    with pytest.raises(IdentifiableError, match="expected 4"):
        tensors.effective_attention(
            torch.zeros(1, 1, 1, 6, 6), torch.zeros(6, 4), torch.zeros(4, 8)
        )
    with pytest.raises(IdentifiableError, match="outside key_mask"):
        tensors.effective_attention(
            a, torch.randn(2, 6, 4), torch.randn(2, 4, 8), key_mask=torch.eye(6, dtype=torch.bool)
        )
