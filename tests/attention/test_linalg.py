"""Property tests of the encoder linear algebra on random matrices (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.traces import exact_rank
from identifiable.attention.linalg import add_ones, column_basis, head_factors, project_rows
from identifiable.attention.reference import effective_rows_reference

SETTINGS = settings(max_examples=40, deadline=None)


def _low_rank(g: torch.Generator, n: int, m: int, r: int) -> torch.Tensor:
    return torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(
        r, m, generator=g, dtype=torch.float64
    )


def _attention(g: torch.Generator, n: int) -> torch.Tensor:
    return torch.softmax(torch.randn(n, n, generator=g, dtype=torch.float64) * 2, -1)


@SETTINGS
@given(n=st.integers(1, 12), m=st.integers(1, 8), r=st.integers(0, 8), seed=st.integers(0, 999))
def test_column_basis_is_orthonormal_and_spans(n, m, r, seed):
    g = torch.Generator().manual_seed(seed)
    x = _low_rank(g, n, m, min(r, n, m))
    q, rank, _ = column_basis(x)
    assert int(rank) == exact_rank(x, m) == min(r, n, m)
    kept = q[:, : int(rank)]
    torch.testing.assert_close(kept.T @ kept, torch.eye(int(rank), dtype=torch.float64))
    assert torch.count_nonzero(q[:, int(rank) :]) == 0
    torch.testing.assert_close(q @ (q.T @ x), x, atol=1e-10, rtol=1e-10)


@SETTINGS
@given(
    n=st.integers(2, 14),
    d_v=st.integers(1, 6),
    d=st.integers(1, 12),
    h_rank=st.integers(0, 6),
    seed=st.integers(0, 999),
)
def test_head_factor_preserves_singular_values_and_column_space(n, d_v, d, h_rank, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    h = _low_rank(g, d_v, d, min(h_rank, d_v, d))
    f, full, _ = head_factors(h)
    t, vf = v @ h, v @ f
    assert bool(full) == (exact_rank(h, d) == d_v)
    k = min(n, d_v, d)
    torch.testing.assert_close(
        torch.linalg.svdvals(vf)[:k], torch.linalg.svdvals(t)[:k], atol=1e-9, rtol=1e-9
    )
    qt, _, _ = column_basis(t, width=d_v)
    qf, _, _ = column_basis(vf, width=d_v)
    torch.testing.assert_close(qt @ qt.T, qf @ qf.T, atol=1e-8, rtol=0)


@SETTINGS
@given(n=st.integers(1, 14), d_v=st.integers(1, 8), d=st.integers(1, 10), seed=st.integers(0, 999))
def test_projection_invariants(n, d_v, d, seed):
    g = torch.Generator().manual_seed(seed)
    a = _attention(g, n)
    v = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    b_v = torch.randn(d_v, generator=g, dtype=torch.float64)
    h = torch.randn(d_v, d, generator=g, dtype=torch.float64)
    t = v @ h
    f, _, _ = head_factors(h)
    q, rank, _ = column_basis(v @ f)
    qa, rank_a = add_ones(q, rank)
    for basis, r in ((q, rank), (qa, rank_a)):
        eff = project_rows(a, basis)
        scale = (a @ t).norm()
        assert (eff @ t - a @ t).norm() <= 1e-10 * scale  # A_eff T = A T
        assert ((a - eff) @ t).norm() <= 1e-10 * scale  # null rows lie in LN(T)
        torch.testing.assert_close(project_rows(eff, basis), eff)  # a projection
        if int(r) == n:
            torch.testing.assert_close(eff, a, atol=1e-10, rtol=0)
    eff_s = project_rows(a, qa)
    # float64 round-off of a projection of n ≤ 40 terms: 1e-10, not 1e-12 (hypothesis found 1.4e-12)
    torch.testing.assert_close(eff_s.sum(-1), a.sum(-1), atol=1e-10, rtol=0)
    biased = (v + b_v) @ h
    torch.testing.assert_close(eff_s @ biased, a @ biased, atol=1e-10, rtol=1e-10)
    assert int(rank_a) in (int(rank), int(rank) + 1) and int(rank_a) <= n


@SETTINGS
@given(n=st.integers(2, 14), d_v=st.integers(1, 6), seed=st.integers(0, 999))
def test_ones_direction_is_detected(n, d_v, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    q, rank, _ = column_basis(v)
    _, rank_a = add_ones(q, rank)
    assert int(rank_a) == exact_rank(torch.cat([v, torch.ones(n, 1, dtype=v.dtype)], 1), d_v + 1)
    # 1 already in col(V): no new direction.
    v_with_ones = torch.cat([v[:, :-1], torch.ones(n, 1, dtype=v.dtype) * 3.0], 1)
    q, rank, _ = column_basis(v_with_ones)
    _, rank_a = add_ones(q, rank)
    assert int(rank_a) == int(rank)


@SETTINGS
@given(
    n=st.integers(1, 12),
    d_v=st.integers(1, 6),
    d=st.integers(1, 10),
    h_rank=st.integers(0, 6),
    stochastic=st.booleans(),
    seed=st.integers(0, 999),
)
def test_fast_route_matches_svd_of_full_t(n, d_v, d, h_rank, stochastic, seed):
    """The n×d_v route equals the SVD of the n×d matrix T, also when H is rank deficient."""
    g = torch.Generator().manual_seed(seed)
    a = _attention(g, n)
    v = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    h = _low_rank(g, d_v, d, min(h_rank, d_v, d))
    f, _, _ = head_factors(h)
    q, rank, _ = column_basis(v @ f)
    if stochastic:
        q, rank = add_ones(q, rank)
    fast = a.clone() if int(rank) == n else project_rows(a, q)
    ref = effective_rows_reference(a, v @ h, stochastic=stochastic, causal=False, d_v=d_v)
    torch.testing.assert_close(fast, ref, atol=1e-9, rtol=0)


@SETTINGS
@given(
    n=st.integers(1, 14),
    m=st.integers(1, 8),
    log_kappa=st.sampled_from([0, 2, 3, 7, 11]),
    seed=st.integers(0, 999),
)
def test_fast_and_svd_bases_agree(n, m, log_kappa, seed):
    """Well-conditioned matrices take Cholesky QR (or the identity), others the SVD; both
    give the same rank and projector, including full-rank matrices with κ up to 1e11
    (where rounding x alone moves its column space by ~eps·κ)."""
    g = torch.Generator().manual_seed(seed)
    k = min(n, m)
    u, _ = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))
    w, _ = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))
    s = torch.logspace(0, -log_kappa, k, dtype=torch.float64)
    x = (u * s) @ w.T
    q, rank, smax = column_basis(x)
    assert int(rank) == k == exact_rank(x, m)
    assert float(smax) == pytest.approx(1.0, rel=1e-12)
    # Cholesky QR (κ ≤ 1e3): error ~eps·κ²; SVD: ~eps·κ.
    tol = 1e-14 * 10 ** (2 * log_kappa) if log_kappa <= 3 else 1e-13 * 10**log_kappa
    torch.testing.assert_close(q @ q.T, u @ u.T, atol=tol, rtol=0)


def test_the_eigensolver_free_test_never_admits_what_the_eigenvalue_test_rejects():
    """cholesky_if_well_conditioned is sufficient for _well_conditioned (κ < 1e3): over
    matrices of controlled condition number, ok ⇒ accepted, and far below 1e3 it accepts;
    where it accepts, L⁻¹ gives the same Q as the Cholesky QR of _column_basis, bit for bit."""
    from identifiable.attention.linalg import (
        _cholesky_qr,
        _well_conditioned,
        cholesky_if_well_conditioned,
    )

    g = torch.Generator().manual_seed(0)
    for kappa in (1.0, 3.0, 10.0, 100.0, 900.0, 1e3, 1.1e3, 1e5, 1e12):
        u, _ = torch.linalg.qr(torch.randn(8, 40, 6, generator=g, dtype=torch.float64))
        w, _ = torch.linalg.qr(torch.randn(8, 6, 6, generator=g, dtype=torch.float64))
        s = torch.logspace(0, -float(torch.log10(torch.tensor(kappa))), 6, dtype=torch.float64)
        x = u @ torch.diag_embed(s) @ w.transpose(-1, -2)
        gram = x.transpose(-1, -2) @ x
        ok, _, inverse = cholesky_if_well_conditioned(gram)
        accepted, _ = _well_conditioned(gram)
        assert not bool((ok & ~accepted).any()), kappa
        if kappa <= 10:
            assert bool(ok.all())  # ‖L‖_F‖L⁻¹‖_F ≤ k·κ = 60 here
        if kappa >= 1.1e3:
            assert not bool(ok.any())
        if bool(ok.any()):
            q = x[ok] @ inverse[ok].transpose(-1, -2)
            assert torch.equal(q, _cholesky_qr(x[ok], gram[ok]))
    # a singular Gram matrix (rank-deficient x): Cholesky fails or κ is huge, never ok
    x = torch.randn(3, 20, 4, generator=g, dtype=torch.float64)
    x[..., -1] = x[..., 0]
    ok, _, _ = cholesky_if_well_conditioned(x.transpose(-1, -2) @ x)
    assert not bool(ok.any())


def test_the_float32_certificate_never_admits_what_the_float64_test_rejects():
    """certified_well_conditioned proves κ(H) < 1e3 from a float32 Gram: over head slices of
    controlled κ (including ones just past 1e3, and spectra with one small singular value),
    certified ⇒ `head_factors` calls the head well-conditioned and of full row rank;
    heads of κ ≤ 30 are certified, so the shortcut is not vacuous, and so is κ = 5 at
    d = 4096, d_v = 128 (where a bound through ‖L⁻¹‖_F proved only κ ≤ 2); reduced-precision
    matmuls, float64 input, d < d_v and non-finite input certify nothing."""
    from identifiable.attention.linalg import certified_well_conditioned

    g = torch.Generator().manual_seed(1)
    d_v, d = 16, 96
    for kappa in (1.0, 3.0, 10.0, 30.0, 100.0, 999.0, 1.001e3, 1.1e3, 1e5):
        for shape in ("log", "one"):
            u, _ = torch.linalg.qr(torch.randn(8, d, d_v, generator=g, dtype=torch.float64))
            w, _ = torch.linalg.qr(torch.randn(8, d_v, d_v, generator=g, dtype=torch.float64))
            if shape == "log":
                s = torch.logspace(0, -float(torch.log10(torch.tensor(kappa))), d_v)
            else:
                s = torch.ones(d_v)
                s[-1] = 1 / kappa
            h = (w @ torch.diag_embed(s.double()) @ u.transpose(-1, -2)).float()  # [8, d_v, d]
            proved = certified_well_conditioned(h)
            _, full, well = head_factors(h.double())
            assert not bool((proved & ~well).any()), (kappa, shape)
            assert not bool((proved & ~full).any()), (kappa, shape)
            if kappa <= 30:
                assert bool(proved.all()), (kappa, shape)
            if kappa > 1e3:
                assert not bool(proved.any()), (kappa, shape)
    # Two nearly parallel rows of positive entries put κ near 1e3 where the float32
    # rounding of the Gram is as large as λ_min: without the rounding term δ the
    # certificate wrongly proves 17 of these 256 at d = 96 and 27 at d = 4096.
    for d_wide in (96, 4096):
        base = 1 + torch.rand(256, 1, d_wide, generator=g)
        h = torch.cat([base, base + 3e-3 * torch.randn(256, 1, d_wide, generator=g)], 1)
        _, _, well = head_factors(h.double())
        assert not bool((certified_well_conditioned(h) & ~well).any()), d_wide
    u, _ = torch.linalg.qr(torch.randn(2, 4096, 128, generator=g, dtype=torch.float64))
    s = torch.logspace(0, -float(torch.log10(torch.tensor(5.0))), 128, dtype=torch.float64)
    wide = (s[:, None] * u.transpose(-1, -2)).float()  # [2, 128, 4096], κ = 5
    assert bool(certified_well_conditioned(wide).all())
    h = torch.randn(4, d_v, d, generator=g)
    assert bool(certified_well_conditioned(h).all())
    assert not bool(certified_well_conditioned(h.double()).any())
    assert not bool(certified_well_conditioned(h[..., :8]).any())  # d < d_v
    bad = h.clone()
    bad[2, 3, 5] = float("nan")
    assert certified_well_conditioned(bad).tolist() == [True, True, False, True]
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert not bool(certified_well_conditioned(h).any())
    finally:
        torch.set_float32_matmul_precision(previous)
