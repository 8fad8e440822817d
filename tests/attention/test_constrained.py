"""Constrained effective attention against independent solvers (scipy SLSQP, brute force)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from helpers.traces import synthetic_trace
from identifiable.attention import constrained_attention, effective_attention
from identifiable.attention.constrained import max_entropy_row, project_onto_rows
from identifiable.attention.linalg import add_ones, column_basis
from identifiable.errors import IdentifiableError


def _problem(n: int, d_v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    a = torch.softmax(torch.randn(n, generator=g, dtype=torch.float64) * 2, 0).numpy()
    q, r, _ = column_basis(v)
    qa, _ = add_ones(q, r)
    aq = qa[:, torch.linalg.vector_norm(qa, dim=0) > 0].numpy().T
    return a, aq


def _brute_projection(aq: np.ndarray, b: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Best of all active sets: for each support S, the equality-constrained projection."""
    n = r.size
    best, best_d = None, np.inf
    for k in range(1, n + 1):
        for s in itertools.combinations(range(n), k):
            s = list(s)
            sub = aq[:, s]
            y = np.linalg.lstsq(sub @ sub.T, b - sub @ r[s], rcond=None)[0]
            x = np.zeros(n)
            x[s] = r[s] + sub.T @ y
            if (x >= -1e-12).all() and np.linalg.norm(aq @ x - b) < 1e-9:
                d = np.linalg.norm(x - r)
                if d < best_d:
                    best, best_d = x, d
    return best


@settings(max_examples=20, deadline=None)
@given(n=st.integers(3, 8), d_v=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_projection_is_the_brute_force_optimum(n, d_v, seed):
    a, aq = _problem(n, d_v, seed)
    if aq.shape[0] >= n:
        return
    r = np.full(n, 1 / n)
    x = project_onto_rows(aq, aq @ a, r, a)
    assert (x >= 0).all() and np.linalg.norm(aq @ (x - a)) < 1e-10
    np.testing.assert_allclose(x, _brute_projection(aq, aq @ a, r), atol=1e-9)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(6, 30), d_v=st.integers(1, 5), seed=st.integers(0, 10_000))
@example(n=30, d_v=5, seed=54)  # the dual objective's decrease fell below round-off here
def test_entropy_and_projection_match_slsqp(n, d_v, seed):
    a, aq = _problem(n, d_v, seed)
    if aq.shape[0] >= n:
        return
    b = aq @ a
    cons = [{"type": "eq", "fun": lambda x: aq @ x - b, "jac": lambda x: aq}]
    x = project_onto_rows(aq, b, np.full(n, 1 / n), a)
    ref = minimize(lambda z: ((z - 1 / n) ** 2).sum(), a, jac=lambda z: 2 * (z - 1 / n),
                   bounds=[(0, None)] * n, constraints=cons, method="SLSQP",
                   options={"ftol": 1e-14, "maxiter": 500})  # fmt: skip
    assert ((x - 1 / n) ** 2).sum() <= ref.fun + 1e-10
    np.testing.assert_allclose(x, ref.x, atol=1e-5)
    e = max_entropy_row(aq, b)
    ent = lambda z: float(np.sum(z * np.log(np.maximum(z, 1e-300))))  # noqa: E731
    ref_e = minimize(ent, a, jac=lambda z: np.log(np.maximum(z, 1e-300)) + 1,
                     bounds=[(1e-15, None)] * n, constraints=cons, method="SLSQP",
                     options={"ftol": 1e-14, "maxiter": 500})  # fmt: skip
    assert (e > 0).all() and np.linalg.norm(aq @ e - b) < 1e-10
    assert ent(e) <= ref_e.fun + 1e-9  # at least as much entropy as SLSQP finds
    assert ent(e) <= ent(a) + 1e-12 and ent(e) <= ent(x) + 1e-12


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reference", ["uniform", "entropy"])
def test_trace_rows_are_distributions_with_the_same_output(causal, reference):
    trace = synthetic_trace(n=12, d_v=3, causal=causal, seed=7)
    c = constrained_attention(trace, 1, 2, reference=reference)
    a = trace.attentions[1, 2].double()
    t = trace.values[1, 2].double() @ trace.out_proj[1, 2].double()
    assert (c.weights >= 0).all()
    torch.testing.assert_close(c.weights.sum(-1), a.sum(-1), atol=1e-10, rtol=0)
    torch.testing.assert_close(c.weights @ t, a @ t, atol=1e-8, rtol=1e-9)
    # The paper variant agrees with the library's effective attention, and is no distribution.
    eff = effective_attention(trace, "paper", dtype=torch.float64).effective[1, 2]
    torch.testing.assert_close(c.effective, eff, atol=1e-10, rtol=0)
    assert float(c.effective.min()) < 0
    if causal:
        assert torch.count_nonzero(c.weights.triu(1)) == 0
    assert (c.l1_constrained > 1e-6).any()


def test_any_reference_in_col_t1_gives_the_uniform_answer():
    """Theorem in constrained.py: references in col([T, 1]) (a_eff, uniform) share a minimiser;
    a reference outside it (here a perturbed one) does not."""
    a, aq = _problem(12, 3, 4)
    b = aq @ a
    q = aq.T
    a_eff = q[:, :-1] @ (q[:, :-1].T @ a)  # basis of col(T) first, then the ones direction
    uni = project_onto_rows(aq, b, np.full(12, 1 / 12), a)
    np.testing.assert_allclose(project_onto_rows(aq, b, a_eff, a), uni, atol=1e-12)
    other = project_onto_rows(aq, b, np.linspace(0, 0.2, 12), a)
    assert np.abs(other - uni).max() > 1e-3


def test_unknown_reference():
    with pytest.raises(IdentifiableError, match=r"unknown reference 'raw'.*uniform, entropy"):
        constrained_attention(synthetic_trace(), 0, 0, reference="raw")


def test_a_time_budget_changes_nothing_it_can_fit(capsys):
    trace = synthetic_trace(n=40, d_v=3, causal=True, seed=5)
    plain = constrained_attention(trace, 1, 0)
    timed = constrained_attention(trace, 1, 0, time_budget=600.0, progress=True)
    assert torch.equal(timed.weights, plain.weights) and torch.equal(timed.raw, plain.raw)
    assert "constrained attention (rows): 40/40" in capsys.readouterr().err


def test_a_time_budget_out_of_reach_is_refused_in_one_line():
    """The whole head takes about 0.6 s alone on this machine (400 causal rows, null spaces
    up to 383 wide), over ten times the budget."""
    trace = synthetic_trace(n=400, d_v=16, d=32, layers=1, heads=1, causal=True, seed=3)
    start = time.monotonic()
    with pytest.raises(
        IdentifiableError,
        match=r"^constrained_attention of 400 rows needs (about|more than) .* solved in .*\), "
        r"more than the time budget of 0.05 s: raise time_budget= or ask for fewer rows",
    ):
        constrained_attention(trace, 0, 0, time_budget=0.05)
    assert time.monotonic() - start < 2.0
    with pytest.raises(IdentifiableError, match="time_budget"):
        constrained_attention(trace, 0, 0, time_budget=0)
