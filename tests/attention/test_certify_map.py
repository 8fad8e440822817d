"""Whole-head interval maps (warm-started simplex) against per-key HiGHS LPs."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.traces import (
    TEXT_LONG,
    assert_certified,
    engine,
    plain_bounds,
    shared_rows,
    synthetic_trace,
)
from identifiable.attention import attention_intervals, interval_map
from identifiable.errors import IdentifiableError


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 24), d_v=st.integers(1, 6), rows=st.integers(1, 10),
       chains=st.integers(1, 4), order=st.sampled_from(["key", "row"]),
       block=st.sampled_from([None, 1, 3]), seed=st.integers(0, 10_000))  # fmt: skip
def test_simplex_matches_plain_linprog(n, d_v, rows, chains, order, block, seed):
    aq, a, movable, v = shared_rows(n, d_v, rows, seed)
    if aq.shape[1] >= n:
        return
    sol = engine(aq, a, np.ones((rows, n), bool), movable,
                           chains_per_row=chains, keep_vertices=True, order=order,
                           block=block)  # fmt: skip
    assert_certified(sol, a, v, resid=1e-9 * max(1.0, np.abs(v).max()))  # and every witness
    assert (sol.lp_solved + sol.fallbacks <= 2 * n).all()


def test_dual_warm_start_across_rows_saves_pivots():
    """Key order carries each objective's optimal basis down the rows (dual simplex);
    row order warm-starts across objectives (primal). Same bounds, fewer pivots: on
    these rows 5,665 against 6,564 (7.8k before row order took basic keys first,
    `kernel.pool_next`; on MiniLM heads the ratio is ~2.4)."""
    aq, a, movable, _ = shared_rows(40, 6, 30, seed=1)
    keys = np.ones(a.shape, bool)
    by_key = engine(aq, a, keys, movable, order="key")
    by_row = engine(aq, a, keys, movable, order="row")
    np.testing.assert_allclose(by_key.lower, by_row.lower, atol=1e-12, rtol=0)
    np.testing.assert_allclose(by_key.upper, by_row.upper, atol=1e-12, rtol=0)
    assert by_key.fallbacks.sum() == by_row.fallbacks.sum() == 0
    assert by_key.pivots.sum() < 0.9 * by_row.pivots.sum()
    with pytest.raises(ValueError, match="share A"):
        engine(np.repeat(aq, 30, 0), a, keys, movable, order="key")


@pytest.mark.parametrize("causal", [False, True])
def test_map_equals_per_row_intervals(causal):
    trace = synthetic_trace(n=13, d_v=4, causal=causal, seed=5)
    m = interval_map(trace)
    assert m.lower.shape == (2, 3, 13, 13) and m.lps_solved > 0
    for layer in range(2):
        for head in range(3):
            for row in range(13):
                iv = attention_intervals(trace, layer, head, row)
                torch.testing.assert_close(m.lower[layer, head, row], iv.lower, atol=1e-9, rtol=0)
                torch.testing.assert_close(m.upper[layer, head, row], iv.upper, atol=1e-9, rtol=0)
                assert int(m.null_dim[layer, head, row]) == iv.null_dim
    if causal:  # keys after the row never get weight
        assert torch.count_nonzero(m.upper.triu(1)) == 0
        assert torch.equal(m.keys[0], torch.ones(13, 13, dtype=torch.bool).tril())


def test_window_mask_is_respected():
    trace = synthetic_trace(n=14, d_v=3, seed=2)
    idx = torch.arange(14)
    window = (idx[:, None] - idx[None, :]).abs() <= 5
    att = trace.attentions.masked_fill(~window, 0.0)
    trace.attentions = att / att.sum(-1, keepdim=True)
    m = interval_map(trace, layers=[0], heads=[1], key_mask=window)
    assert torch.count_nonzero(m.upper[0, 0][~window]) == 0
    assert torch.equal(m.keys[0], window)
    for row in (0, 7, 13):  # independent check: LPs over the window's keys only
        keys = window[row]
        v = (trace.values[0, 1].double() @ trace.out_proj[0, 1].double())[keys].numpy()
        lo, hi = plain_bounds(trace.attentions[0, 1, row, keys].double().numpy(), v)
        np.testing.assert_allclose(m.lower[0, 0, row, keys].numpy(), lo, atol=1e-8)
        np.testing.assert_allclose(m.upper[0, 0, row, keys].numpy(), hi, atol=1e-8)
    with pytest.raises(IdentifiableError, match="not a distribution over its keys"):
        interval_map(
            trace, layers=[0], heads=[1], key_mask=~window | torch.eye(14, dtype=torch.bool)
        )


def test_corrupt_trace_and_ranges_name_layer_and_head():
    trace = synthetic_trace(n=8)
    trace.attentions[1, 2, 3, 0] = -0.5
    with pytest.raises(IdentifiableError, match=r"layer 1, head 2, row 3.*infeasible"):
        interval_map(trace)
    with pytest.raises(IdentifiableError, match=r"valid heads are 0\.\.2"):
        interval_map(trace, heads=[3])
    with pytest.raises(IdentifiableError, match=r"valid rows are 0\.\.7"):
        interval_map(trace, rows=[8])


def test_time_budget_too_small_says_what_it_needs(monkeypatch):
    """A budget the probe row alone outlasts is refused when it runs out; one the probe
    fits but the whole map does not is refused with the estimate, before the map runs."""
    import identifiable.attention.mapwork as certify

    trace = synthetic_trace(n=30, d_v=4, layers=2, heads=3)
    with pytest.raises(IdentifiableError, match=r"or more \(one row, 30 keys, took over .*1e-06 s"):
        interval_map(trace, time_budget=1e-6)
    real = certify._solve_head

    def slow(args):  # one row now takes 0.2 s: 180 rows cannot fit in 2 s
        time.sleep(0.2)
        return real(args)

    monkeypatch.setattr(certify, "_solve_head", slow)
    start = time.time()
    with pytest.raises(IdentifiableError, match=r"needs about [\d.e-]+ s .*time budget of 2 s"):
        interval_map(trace, time_budget=2)
    assert time.time() - start < 2.0
    monkeypatch.undo()
    assert interval_map(trace, layers=[0], heads=[0], time_budget=600).lps_solved > 0
    # NaN compares False with every estimate, so it would refuse nothing: refused itself.
    for bad in (float("nan"), 0.0, -5.0):
        with pytest.raises(
            IdentifiableError, match=r"time_budget=.* must be a finite number above 0"
        ):
            interval_map(trace, layers=[0], heads=[0], time_budget=bad)


def test_workers_beyond_heads_or_cores_neither_fail_nor_shrink_the_estimate(monkeypatch):
    import identifiable.attention.intervals as certify

    trace = synthetic_trace(n=8, d_v=3, layers=1, heads=2)
    seen = []
    real = certify.check_budget
    import identifiable.attention.mapwork as mapwork
    import identifiable.utils.pools as pools

    monkeypatch.setattr(pools, "available_cores", lambda: 2)
    monkeypatch.setattr(mapwork, "available_cores", lambda: 2)
    monkeypatch.setattr(certify, "check_budget", lambda *a: (seen.append(a[5]), real(*a)))
    # One head: one job, solved in this process however many workers are asked for (an
    # int too large for a C int used to reach ProcessPoolExecutor and raise OverflowError).
    one = interval_map(trace, layers=[0], heads=[0], workers=10**11, time_budget=600)
    assert torch.equal(one.lower, interval_map(trace, layers=[0], heads=[0]).lower)
    assert seen == [1]
    # Two heads on two cores: the estimate is shared by 2 processes, not by 10**6.
    with pytest.raises(IdentifiableError, match="time budget"):
        interval_map(trace, workers=10**6, time_budget=1e-9)
    assert seen[-1] == 2


def test_worker_processes_give_the_same_map():
    trace = synthetic_trace(n=10, d_v=3, layers=1, heads=2)
    one = interval_map(trace)
    two = interval_map(trace, workers=2)
    assert torch.equal(one.lower, two.lower) and torch.equal(one.upper, two.upper)


def test_tiny_model_map_every_row(tiny_model):
    trace = tiny_model("gpt2").trace(TEXT_LONG)
    m = interval_map(trace, layers=[1], heads=[0])
    w = m.width[0, 0]
    assert (w >= -1e-12).all() and (m.movable_mass >= -1e-12).all()
    early = trace.head_dim  # rows with ≤ d_v + 1 keys: nothing moves
    assert float(w[: early - 1].abs().max()) < 1e-12 and float(w[early + 4 :].max()) > 1e-3


def test_rank_deficient_prefixes_of_repeated_words(tiny_model):
    """Repeated words in a decoder's first layer: prefixes of equal rank([T, 1]) but
    different paper-basis widths (np.stack in head_rows used to raise numpy's ValueError).
    The map runs in row chunks and equals per-row intervals."""
    model = tiny_model("llama")
    text = " ".join(["the cat the dog the cat a bird the cat sat"] * 4)
    trace = model.trace(text)
    assert trace.n_tokens > 2 * trace.head_dim
    rows = [3, 9, 20, trace.n_tokens - 1]
    m = interval_map(trace, layers=[0], heads=[0], rows=rows, time_budget=600)
    for i, r in enumerate(rows):
        one = attention_intervals(trace, 0, 0, r)
        torch.testing.assert_close(m.lower[0, 0, i], one.lower, atol=1e-9, rtol=0)
        torch.testing.assert_close(m.upper[0, 0, i], one.upper, atol=1e-9, rtol=0)
    full = interval_map(trace, layers=[0], heads=[1])
    assert full.lower.shape == (1, 1, trace.n_tokens, trace.n_tokens)
    assert bool((full.lower <= full.raw + 1e-9).all() and (full.raw <= full.upper + 1e-9).all())


def test_single_row_intervals_run_in_the_simplex_and_match_highs():
    """`attention_intervals` now uses the warm-started simplex; its bounds equal HiGHS's
    per-key LPs (`interval_lp`) on a causal row."""
    from identifiable.attention.certificates import interval_lp
    from identifiable.attention.intervals import _row_problem

    trace = synthetic_trace(n=40, d_v=4, d=12, causal=True, seed=4)
    got = attention_intervals(trace, 1, 2, 39)
    a, seen, _, _, basis, _ = _row_problem(trace, 1, 2, 39, None)
    lo, hi, _ = interval_lp(a[seen].numpy(), basis)
    np.testing.assert_allclose(got.lower[seen].numpy(), lo, atol=1e-9, rtol=0)
    np.testing.assert_allclose(got.upper[seen].numpy(), hi, atol=1e-9, rtol=0)
    assert got.lp_solved > 0


def test_optima_certified_on_refined_values_match_fresh_factorisations():
    """Ending each LP on a refined x_B and tableau row instead of a fresh inverse changes
    the work, not the bounds: against certifying every optimum on a fresh factorisation
    (refine=False) the bounds agree to 1e-12, with no LP for HiGHS, in key and row order."""
    aq, a, movable, _ = shared_rows(60, 8, 12, seed=5)
    keys = np.ones(a.shape, bool)
    sols = {}
    for refine in (True, False):
        for order in ("key", "row"):
            sols[refine, order] = engine(aq, a, keys, movable, order=order, refine=refine)
    for order in ("key", "row"):
        new, old = sols[True, order], sols[False, order]
        np.testing.assert_allclose(new.lower, old.lower, atol=1e-12, rtol=0)
        np.testing.assert_allclose(new.upper, old.upper, atol=1e-12, rtol=0)
        assert new.fallbacks.sum() == old.fallbacks.sum() == 0


def test_budget_weights_rows_by_their_keys():
    """The time-budget estimate prices each row of k keys at k·(k − d_v − 1) of the probe
    row's k_max·(k_max − d_v − 1) (times `_OWN_KEYS_FACTOR` for rows that do not share one
    key set): rows without a null space (k ≤ d_v + 1) at 0, and rows that share one key
    set (bidirectional, key order) at 1/2.8 of a probe each."""
    from identifiable.attention.mapwork import _OWN_KEYS_FACTOR, _row_weight

    n, d_v = 64, 7
    causal = np.tril(np.ones((n, n), dtype=bool))
    expected = sum(k * (k - d_v - 1) for k in range(d_v + 2, n + 1)) / (n * (n - d_v - 1))
    assert _row_weight(causal, d_v) == pytest.approx(_OWN_KEYS_FACTOR * expected)
    assert 0.5 <= _OWN_KEYS_FACTOR <= 2.0  # fitted: see `_row_weight`
    assert _row_weight(np.ones((n, n), dtype=bool), d_v) == pytest.approx(n / 2.8)
    assert _row_weight(causal[: d_v + 1], d_v) == 0.0
    # k·(k − d_v − 1) weighs short rows less than (k / k_max)², the rule before it
    assert _row_weight(causal, d_v) < _OWN_KEYS_FACTOR * sum(
        (k / n) ** 2 for k in range(d_v + 2, n + 1)
    )
    window = np.triu(causal, -15)  # rows of at most 16 keys: the probe has 8 dimensions
    assert _row_weight(window, d_v) == pytest.approx(_OWN_KEYS_FACTOR * (n - 15 + sum(
        k * (k - 8) for k in range(9, 16)) / (16 * 8)))  # fmt: skip


def _one_row(n: int, d_v: int, seed: int):
    aq, a, movable, _ = shared_rows(n, d_v, 1, seed)
    return aq, a, np.ones(a.shape, bool), movable


def test_row_chains_draw_basic_keys_first():
    """Row order: the chains of a row share one pool of open keys and take the open key
    basic at their vertex first (`kernel.pool_next`, tested white-box in
    tests/attention/lp/test_kernel.py); against the same pool taken in index order
    (pool_rule=2), that costs fewer pivots (5-7 % on these rows) for the same bounds."""
    by_rule, by_index = 0, 0
    for seed in range(3):
        aq, a, keys, movable = _one_row(300, 40, seed)
        sol = engine(aq, a, keys, movable, chains_per_row=8, order="row")
        ref = engine(aq, a, keys, movable, chains_per_row=8, order="row", pool_rule=2)
        np.testing.assert_allclose(sol.upper, ref.upper, atol=1e-12, rtol=0)
        np.testing.assert_allclose(sol.lower, ref.lower, atol=1e-12, rtol=0)
        by_rule, by_index = by_rule + int(sol.pivots.sum()), by_index + int(ref.pivots.sum())
    assert by_rule < 0.97 * by_index
