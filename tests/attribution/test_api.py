"""`hidden_token_attribution` on tiny random models of every architecture and on MiniLM."""

from __future__ import annotations

import pytest
import torch

from helpers.families import ARCHITECTURES, CAUSAL
from identifiable.attribution import hidden_token_attribution, reverse_mode_sq_norms
from identifiable.attribution.contributions import contributions
from identifiable.errors import IdentifiableError

TEXT = "The cat sat on the mat today."


@pytest.fixture(scope="module")
def exact_results(tiny_model):
    return {arch: hidden_token_attribution(tiny_model(arch), TEXT) for arch in ARCHITECTURES}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_exact_rows_sum_to_one_and_causal_zeros(exact_results, tiny_model, arch):
    r = exact_results[arch]
    model = tiny_model(arch)
    n = len(model.encode(TEXT))
    assert r.contributions.shape == (model.info.n_layers, n, n)
    assert r.n_jvps == n * model.info.hidden_size and r.stderr is None
    torch.testing.assert_close(
        r.contributions.sum(-1), torch.ones(model.info.n_layers, n, dtype=torch.float64)
    )
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)
    if arch in CAUSAL:
        assert r.is_causal
        assert (r.contributions[:, upper] == 0).all()  # exactly, from the computation itself
        assert (r.contributions[:, ~upper] > 0).all()
    else:
        assert (r.contributions > 0).all()


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_exact_matches_reverse_mode_reference(exact_results, tiny_model, arch):
    model = tiny_model(arch)
    enc = model.encode(TEXT)
    e0 = model.embed(enc.input_ids, enc.token_type_ids)
    n = len(enc)
    rows = [(1, 0), (2, n // 2), (2, n - 1)]
    ref = reverse_mode_sq_norms(lambda x: model.layer_outputs(x, enc.input_ids), e0, rows=rows)
    got = exact_results[arch]
    for layer, i in rows:
        torch.testing.assert_close(
            got.sq_norms[layer - 1, i], ref[layer - 1, i], rtol=1e-4, atol=1e-7
        )
        c_ref = contributions(ref[layer - 1, i])
        assert (got.contributions[layer - 1, i] - c_ref).abs().max() < 1e-5


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_probes_equal_width_reproduce_exact(exact_results, tiny_model, arch):
    model = tiny_model(arch)
    est = hidden_token_attribution(model, TEXT, probes=model.info.hidden_size, seed=1)
    exact = exact_results[arch]
    torch.testing.assert_close(est.sq_norms, exact.sq_norms, rtol=1e-4, atol=1e-6)
    assert est.stderr is not None and est.stderr.max() < 1e-3


def test_estimator_returns_standard_errors(tiny_model):
    model = tiny_model("gpt2")
    r = hidden_token_attribution(model, TEXT, probes=8, seed=3)
    n = r.n_tokens
    assert r.n_jvps == 8 * n and r.probes == 8
    assert r.stderr is not None and r.sq_norms_stderr is not None
    assert r.stderr.shape == r.contributions.shape and (r.stderr >= 0).all()
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)
    assert (r.contributions[:, upper] == 0).all() and (r.stderr[:, upper] == 0).all()
    assert (r.stderr[:, ~upper].sum() > 0).item()


def test_special_tokens_and_summary(exact_results):
    r = exact_results["bert"]
    assert r.tokens[0] == "[CLS]" and r.tokens[-1] == "[SEP]"
    assert r.special.tolist() == [True] + [False] * (r.n_tokens - 2) + [True]
    d = r.to_dict()
    assert d["mode"] == "exact" and len(d["layers"]) == r.n_layers
    first = d["layers"][0]["tokens"][0]
    assert first["own"] == pytest.approx(float(r.contributions[0, 0, 0]))
    assert first["top_contributor"] == int(r.contributions[0, 0].argmax())


@pytest.mark.parametrize("bad", [0, 65, -3])
def test_bad_probe_count(tiny_model, bad):
    with pytest.raises(IdentifiableError, match="between 1 and the model width d = 64"):
        hidden_token_attribution(tiny_model("bert"), TEXT, probes=bad)


def test_memory_budget_too_small_stops_before_any_jvp(tiny_model, monkeypatch):
    """The refusal comes from the formula before the embedding or any layer runs, and
    names the Python arguments."""
    model = tiny_model("bert")
    seen = []
    calls = []
    monkeypatch.setattr(model, "layer_outputs", lambda *a: calls.append(a))
    monkeypatch.setattr(model, "embed", lambda *a: calls.append(a))
    with pytest.raises(IdentifiableError, match=r"memory_budget= .*probes=K"):
        hidden_token_attribution(
            model, TEXT, memory_budget=10_000, progress=lambda *a: seen.append(a)
        )
    assert not seen and not calls


def test_mixing_hta_refusal_is_immediate_and_names_memory_budget(tiny_model, monkeypatch):
    import time

    from identifiable.mixing import context_mixing

    model = tiny_model("bert")
    monkeypatch.setattr(model, "layer_outputs", lambda *a: pytest.fail("no layer may run"))
    start = time.perf_counter()
    with pytest.raises(IdentifiableError, match=r"memory_budget="):
        context_mixing(model, TEXT, "hta", memory_budget=10_000)
    assert time.perf_counter() - start < 1.0


def test_progress_callback_reaches_total(tiny_model):
    seen = []
    r = hidden_token_attribution(
        tiny_model("bert"), TEXT, probes=2, chunk_size=5, progress=lambda *a: seen.append(a)
    )
    assert seen[-1] == (r.n_jvps, r.n_jvps) and len(seen) == -(-r.n_jvps // 5)


@pytest.mark.integration
def test_minilm_estimate_runs_end_to_end(minilm):
    """Plumbing on the embedded model (accuracy against exact mode is in the benchmark)."""
    r = hidden_token_attribution(minilm, "Paris is nice.", probes=4, seed=0)
    assert r.tokens == ["[CLS]", "paris", "is", "nice", ".", "[SEP]"]
    assert r.contributions.shape == (6, 6, 6) and r.n_jvps == 24
    torch.testing.assert_close(r.contributions.sum(-1), torch.ones(6, 6, dtype=torch.float64))
    assert r.stderr is not None and torch.isfinite(r.stderr).all()
    assert r.special.tolist() == [True, False, False, False, False, True]


def test_token_ids_give_the_same_attribution_as_the_text(tiny_model):
    """hidden_token_attribution takes what trace takes: ids (list or tensor) as well as text."""
    from identifiable.attribution import hidden_token_attribution

    model = tiny_model("gpt2")
    ids = model.encode(TEXT).input_ids
    by_text = hidden_token_attribution(model, TEXT, probes=4, progress=False)
    for given in (ids, ids.tolist()):
        by_ids = hidden_token_attribution(model, given, probes=4, progress=False)
        assert torch.equal(by_ids.input_ids, by_text.input_ids)
        torch.testing.assert_close(by_ids.contributions, by_text.contributions, atol=0, rtol=0)
    with pytest.raises(IdentifiableError, match="ambiguous"):
        hidden_token_attribution(model, [TEXT, TEXT], probes=4, progress=False)


def test_a_time_budget_changes_nothing_it_can_fit(exact_results, tiny_model):
    timed = hidden_token_attribution(tiny_model("bert"), TEXT, time_budget=600.0)
    # other chunk sizes: batched float32 kernels round differently, nothing more
    torch.testing.assert_close(
        timed.contributions, exact_results["bert"].contributions, rtol=1e-6, atol=1e-9
    )


def test_a_time_budget_out_of_reach_is_refused_after_a_few_jvps(tiny_model):
    """Exact mode on the tiny BERT is n·d JVPs; the first, a chunk of one, prices them."""
    seen: list[tuple[int, int]] = []
    with pytest.raises(
        IdentifiableError,
        match=r"^hidden_token_attribution needs about .* JVPs, 1 of them run\), more than the "
        r"time budget of 1e-05 s: raise time_budget= or pass fewer probes \(probes=k",
    ):
        hidden_token_attribution(
            tiny_model("bert"), TEXT, time_budget=1e-5, progress=lambda *a: seen.append(a)
        )
    assert seen[-1][0] == 1 < seen[-1][1]
    with pytest.raises(IdentifiableError, match="time_budget"):
        hidden_token_attribution(tiny_model("bert"), TEXT, time_budget=-1.0)
