"""Exact and estimated Jacobian block norms on a pure-function toy Transformer (float64)."""

from __future__ import annotations

import pytest
import torch

from helpers.hta_toy import make_toy, toy_input
from identifiable.attribution import (
    contribution_stderr,
    contributions,
    jacobian_sq_norms,
    reverse_mode_sq_norms,
)
from identifiable.errors import IdentifiableError

N, D = 6, 16


@pytest.fixture(scope="module", params=[False, True], ids=["encoder", "causal"])
def toy(request):
    causal = request.param
    f = make_toy(2, D, 4, causal=causal)
    e0 = toy_input(N, D)
    return f, e0, causal, jacobian_sq_norms(f, e0)


def full_jacobian_sq(f, e0):
    jac = torch.autograd.functional.jacobian(f, e0)  # [L+1, n, d, n, d]
    return jac[1:].square().sum((2, 4))  # [L, n(i), n(j)]


def test_exact_matches_full_jacobian_and_reverse_mode(toy):
    f, e0, _, exact = toy
    assert exact.exact and exact.sq_var is None and exact.n_jvps == N * D
    torch.testing.assert_close(exact.sq, full_jacobian_sq(f, e0), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(exact.sq, reverse_mode_sq_norms(f, e0), rtol=1e-10, atol=1e-12)


def test_reverse_mode_rows_subset_leaves_others_nan(toy):
    f, e0, _, exact = toy
    ref = reverse_mode_sq_norms(f, e0, rows=[(1, 0), (2, 3)])
    torch.testing.assert_close(ref[0, 0], exact.sq[0, 0])
    torch.testing.assert_close(ref[1, 3], exact.sq[1, 3])
    assert ref[0, 1].isnan().all() and ref[1, 0].isnan().all()


def test_chunking_does_not_change_results(toy):
    f, e0, _, exact = toy
    for chunk in (1, 7, N * D):
        got = jacobian_sq_norms(f, e0, chunk_size=chunk)
        assert got.chunk_size == chunk
        torch.testing.assert_close(got.sq, exact.sq, rtol=1e-12, atol=1e-12)


def test_rows_sum_to_one_and_causal_zeros(toy):
    _, _, causal, exact = toy
    c = contributions(exact.sq)
    torch.testing.assert_close(c.sum(-1), torch.ones(c.shape[:-1], dtype=c.dtype))
    assert (c >= 0).all()
    upper = torch.ones(N, N, dtype=torch.bool).triu(1)
    if causal:
        assert (exact.sq[:, upper] == 0).all()  # exactly zero, not merely small
        assert (c[:, upper] == 0).all()
    else:
        assert (c[:, upper] > 0).all()


def test_probes_d_equals_exact(toy):
    f, e0, _, exact = toy
    est = jacobian_sq_norms(f, e0, probes=D, seed=5)
    assert not est.exact and est.probes == D
    torch.testing.assert_close(est.sq, exact.sq, rtol=1e-10, atol=1e-12)
    assert est.sq_var is not None and est.sq_var.abs().max() < 1e-9 * exact.sq.max() ** 2


def test_estimator_is_seeded_and_chunk_invariant(toy):
    f, e0, _, _ = toy
    a = jacobian_sq_norms(f, e0, probes=4, seed=3, chunk_size=5)
    b = jacobian_sq_norms(f, e0, probes=4, seed=3)
    c = jacobian_sq_norms(f, e0, probes=4, seed=4)
    torch.testing.assert_close(a.sq, b.sq, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(a.sq, c.sq)


def test_estimator_is_unbiased_and_its_variance_is_calibrated():
    f = make_toy(2, D, 4)
    e0 = toy_input(N, D)
    exact = jacobian_sq_norms(f, e0).sq
    k, seeds = 4, 300
    runs = [jacobian_sq_norms(f, e0, probes=k, seed=s) for s in range(seeds)]
    est = torch.stack([r.sq for r in runs])
    var = torch.stack([r.sq_var for r in runs])
    spread = est.std(0)
    assert (spread > 0).all()  # genuinely random, so the test below has power
    z = (est.mean(0) - exact) / (spread / seeds**0.5)
    # 72 entries: |z| < 4.5 for all, and the average z is near 0 (bias would shift it).
    assert z.abs().max() < 4.5
    assert abs(float(z.mean())) < 0.5
    # The variance estimate matches the empirical variance across seeds.
    ratio = var.mean(0) / spread.square()
    assert 0.8 < float(ratio.median()) < 1.25


def test_contribution_stderr_matches_spread_across_seeds():
    f = make_toy(2, D, 4)
    e0 = toy_input(N, D)
    runs = [jacobian_sq_norms(f, e0, probes=8, seed=s) for s in range(200)]
    cs = torch.stack([contributions(r.sq) for r in runs])
    ses = torch.stack([contribution_stderr(r.sq, r.sq_var) for r in runs])
    ratio = ses.mean(0) / cs.std(0)
    assert 0.7 < float(ratio.median()) < 1.4


def test_single_probe_has_no_variance_estimate():
    f = make_toy(1, D, 4)
    est = jacobian_sq_norms(f, toy_input(3, D), probes=1)
    assert est.sq_var is not None and est.sq_var.isnan().all()


@pytest.mark.parametrize("bad", [0, -1, D + 1, 2.5, True, "4"])
def test_bad_probe_counts_are_rejected_before_any_work(bad):
    calls = []

    def f(x):
        calls.append(1)
        return torch.stack([x, x])

    with pytest.raises(IdentifiableError, match="probes"):
        jacobian_sq_norms(f, toy_input(3, D), probes=bad)
    assert not calls


@pytest.mark.parametrize(
    ("e0", "message"),
    [(torch.zeros(3), r"\[n, d\]"), (torch.zeros(3, 4, dtype=torch.long), "floating")],
)
def test_bad_inputs(e0, message):
    with pytest.raises(IdentifiableError, match=message):
        jacobian_sq_norms(lambda x: torch.stack([x, x]), e0)


def test_layer_function_with_wrong_output_shape():
    with pytest.raises(IdentifiableError, match=r"\[L\+1, n, d\]"):
        jacobian_sq_norms(lambda x: x, toy_input(3, D))


def test_layer_function_that_cannot_be_transformed_gets_a_clear_error():
    def f(x):  # leaves torch through numpy, which torch.func cannot follow
        return torch.stack([x, torch.from_numpy(x.numpy().copy())])

    with pytest.raises(IdentifiableError, match="forward mode"):
        jacobian_sq_norms(f, toy_input(3, D))


def test_non_finite_jacobian_is_reported():
    def f(x):
        return torch.stack([x, x * torch.tensor(float("inf"), dtype=x.dtype)])

    with pytest.raises(IdentifiableError, match="non-finite"):
        jacobian_sq_norms(f, toy_input(3, D))
