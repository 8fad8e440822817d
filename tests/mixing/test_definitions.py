"""Each method checked against its own definition on tiny random models of every family."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.families import ARCHITECTURES, CAUSAL
from identifiable.errors import IdentifiableError
from identifiable.mixing import METHODS, context_mixing, decompose, method_names
from identifiable.mixing.api import _Inputs, norm_chain, value_zeroing_distances
from identifiable.mixing.rollout import rollout, row_normalise, with_residual
from identifiable.models.blocks import block_norms, capture_blocks
from identifiable.models.hooks import HookSet, first_tensor, get_submodule

TEXT = "The quick brown fox jumps over the lazy dog near the river bank today"
SHORT = "the cat sat on the mat"
POST = [a for a in ARCHITECTURES if a not in CAUSAL]
# Decompositions are float32 products summed to float32 model outputs: relative error
# ‖reconstruction − model‖ / ‖model‖ must stay below this.
RECON_RTOL = 1e-5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm(a.double() - b.double()) / torch.linalg.norm(b.double()))


def inputs(model, text: str = TEXT, blocks: bool = True) -> _Inputs:
    return _Inputs(model, text, True, blocks)


# ---- rollout ---------------------------------------------------------------------


def test_rollout_is_the_explicit_matrix_product(tiny_model):
    model = tiny_model("bert")
    res = context_mixing(model, TEXT, "rollout")
    att = model.trace(TEXT).attentions.double().numpy()  # [L, H, n, n]
    n = att.shape[-1]
    product = np.eye(n)
    for layer in range(att.shape[0]):
        a = 0.5 * att[layer].mean(0) + 0.5 * np.eye(n)
        a = a / a.sum(1, keepdims=True)
        product = a @ product
        np.testing.assert_allclose(res.rolled[layer].numpy(), product, atol=1e-12)
        np.testing.assert_allclose(res.layerwise[layer].numpy(), a, atol=1e-12)
    np.testing.assert_allclose(res.rolled.sum(-1).numpy(), 1.0, atol=1e-12)


def test_rollout_composes_in_order():
    # Non-commuting maps: the product must be M_2 · M_1, not M_1 · M_2.
    m1 = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    m2 = torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=torch.float64)
    out = rollout(torch.stack([m1, m2]))
    assert torch.equal(out[1], m2 @ m1)
    assert not torch.equal(out[1], m1 @ m2)


def test_residual_weight_changes_rollout(tiny_model):
    model = tiny_model("bert")
    a = context_mixing(model, SHORT, "rollout", residual_weight=0.5).rolled
    b = context_mixing(model, SHORT, "rollout", residual_weight=0.9).rolled
    assert not torch.allclose(a, b)
    with pytest.raises(IdentifiableError, match="residual_weight"):
        context_mixing(model, SHORT, "rollout", residual_weight=1.5)


# ---- flow ------------------------------------------------------------------------


def lp_max_flow(caps: np.ndarray, source: int, layer: int, sink: int) -> float:
    """Max flow by linear programming over every edge of the layered graph (brute force)."""
    from scipy.optimize import linprog

    n = caps.shape[-1]
    edges = [
        (k, j, i) for k in range(layer + 1) for i in range(n) for j in range(n) if caps[k, i, j] > 0
    ]
    index = {e: t for t, e in enumerate(edges)}
    bounds = [(0, caps[k, i, j]) for k, j, i in edges]
    a_eq, b_eq = [], []
    for k in range(1, layer + 1):  # conservation at every inner node (k, t)
        for t in range(n):
            row = np.zeros(len(edges))
            for j in range(n):
                if (k - 1, j, t) in index:
                    row[index[(k - 1, j, t)]] += 1  # into (k, t)
            for i in range(n):
                if (k, t, i) in index:
                    row[index[(k, t, i)]] -= 1  # out of (k, t)
            a_eq.append(row)
            b_eq.append(0.0)
    for t in range(n):  # only `source` may emit at layer 0
        if t == source:
            continue
        row = np.zeros(len(edges))
        for i in range(n):
            if (0, t, i) in index:
                row[index[(0, t, i)]] = 1
        a_eq.append(row)
        b_eq.append(0.0)
    into_sink = np.zeros(len(edges))
    for j in range(n):
        if (layer, j, sink) in index:
            into_sink[index[(layer, j, sink)]] = 1
    # Flow that reaches layer `layer + 1` anywhere but `sink` is not counted; forbid it.
    for i in range(n):
        if i == sink:
            continue
        row = np.zeros(len(edges))
        for j in range(n):
            if (layer, j, i) in index:
                row[index[(layer, j, i)]] = 1
        a_eq.append(row)
        b_eq.append(0.0)
    res = linprog(-into_sink, A_eq=np.array(a_eq), b_eq=np.array(b_eq), bounds=bounds)
    assert res.status == 0
    return float(-res.fun)


@pytest.mark.parametrize("causal", [False, True])
def test_flow_equals_a_brute_force_lp(causal):
    from identifiable.mixing.flow import attention_flow

    rng = np.random.default_rng(3)
    n, n_layers = 4, 4
    raw = rng.random((n_layers, n, n)) ** 3
    if causal:
        raw = np.tril(raw)
    caps = torch.from_numpy(with_residual(row_normalise(torch.from_numpy(raw))).numpy())
    flows = attention_flow(caps, causal=causal).numpy()
    c = caps.numpy()
    for layer in range(n_layers):
        for i in range(n):
            for j in range(n):
                want = lp_max_flow(c, j, layer, i)
                assert abs(flows[layer, i, j] - want) < 5e-6, (layer, i, j)
    if causal:
        assert np.all(np.triu(flows, 1) == 0)
    # Flow never exceeds what the sink can take in (its row sums to 1) nor is below rollout's path.
    assert flows.max() <= 1 + 1e-6


@pytest.mark.parametrize("causal", [False, True])
def test_flow_with_worker_processes_gives_the_same_values(causal):
    from identifiable.mixing.flow import attention_flow

    rng = np.random.default_rng(5)
    raw = rng.random((5, 9, 9)) ** 3
    if causal:
        raw = np.tril(raw)
    caps = with_residual(row_normalise(torch.from_numpy(raw)))
    one = attention_flow(caps, causal=causal)
    two = attention_flow(caps, causal=causal, workers=2)
    assert torch.equal(one, two)
    assert one[2:].abs().sum() > 0  # the solver layers really ran
    with pytest.raises(IdentifiableError, match="workers=0 must be at least 1"):
        attention_flow(caps, workers=0)


def test_flow_on_a_model_and_its_budget(tiny_model):
    model = tiny_model("gpt2")
    res = context_mixing(model, SHORT, "flow")
    assert res.rolled is not None and res.meta["resolution"] == 1_000_000
    assert torch.all(res.rolled.triu(1) == 0)
    # The first layer's flow is the capacity itself.
    assert torch.allclose(res.rolled[0], res.layerwise[0])


def test_flow_budget_error_names_the_limit_and_a_way_around(monkeypatch):
    import os

    from identifiable.mixing.api import check_flow_budget
    from identifiable.mixing.flow import estimate_seconds, max_tokens

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    # Two layers need no solver (closed form), so any length fits; six layers do not.
    assert estimate_seconds(500, 2) == 0
    limit = max_tokens(6, 60.0)
    assert estimate_seconds(limit, 6) <= 60.0 < estimate_seconds(limit + 1, 6)
    check_flow_budget(limit, 6, 60.0)
    with pytest.raises(IdentifiableError) as err:
        check_flow_budget(limit + 1, 6, 60.0)
    msg = str(err.value)
    assert "\n" not in msg and f"about {limit} tokens" in msg
    assert "--flow-budget" in msg and "rollout" in msg and "--workers" in msg
    # more processes, a longer admissible sequence: the estimate is shared among them
    check_flow_budget(limit + 1, 6, 60.0, workers=2)
    assert max_tokens(6, 120.0) > limit
    # More processes than cores cannot shorten it: 10**6 workers count as the 4 cores.
    far = max_tokens(6, 4 * 60.0) + 1
    with pytest.raises(IdentifiableError) as err:
        check_flow_budget(far, 6, 60.0, workers=10**6)
    assert "with 4 processes" in str(err.value) and "--workers" not in str(err.value)
    # A short estimate is not printed as "0 s", and the budget it advises is at least 1 s.
    with pytest.raises(IdentifiableError) as err:
        check_flow_budget(30, 6, 1e-6)
    msg = str(err.value)
    assert "about 0 s" not in msg and "--flow-budget 0" not in msg and "--flow-budget 1" in msg


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -1.0, "60"])
def test_flow_budget_must_be_a_positive_number(tiny_model, bad):
    # NaN compares False with every estimate: unchecked, it would disable the budget.
    with pytest.raises(IdentifiableError, match="budget_s must be a positive number of seconds"):
        context_mixing(tiny_model("gpt2"), SHORT, "flow", budget_s=bad)


# ---- norm, GlobEnc, ALTI: decompositions reconstruct what they decompose ------------


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_norm_decomposition_reconstructs_the_attention_output(tiny_model, arch):
    model = tiny_model(arch)
    x = inputs(model, blocks=False)
    res = context_mixing(model, TEXT, "norm")
    for layer in range(x.trace.n_layers):
        p = x.pieces(layer)
        parts, rest = decompose.decomposition(p, residual=False)
        assert rel(parts.sum(1) + rest, x.trace.attn_outputs[layer]) < RECON_RTOL
        # The Gram-matrix norms are the norms of the explicit vectors ‖Σ_h α_ij f_h(x_j)‖.
        explicit = parts.double().norm(dim=-1)
        torch.testing.assert_close(res.layerwise[layer], explicit, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_globenc_decomposition_reconstructs_the_block_output(tiny_model, arch):
    model = tiny_model(arch)
    x = inputs(model)
    enc = x.encoding
    cap = capture_blocks(model, enc.input_ids, enc.token_type_ids)
    second = arch in POST
    res = context_mixing(model, TEXT, "globenc")
    assert res.options["second_norm"] is None and res.meta["second_norm"] is second
    norms = []
    for layer in range(x.trace.n_layers):
        chain, scales = norm_chain(x, layer, second)
        extra = [None, cap.second_in[layer] - cap.first_out[layer]] if second else []
        parts, rest = decompose.decomposition(x.pieces(layer), chain, scales, extra)
        # post-LN: LN2(LN1(x + attn) + FFN) is the layer output; pre-LN: x + attn.
        target = cap.layer_out[layer] if second else cap.second_in[layer]
        assert rel(parts.sum(1) + rest, target) < RECON_RTOL
        if second:  # and through LN1 alone, LN1's output
            p1, r1 = decompose.decomposition(x.pieces(layer), chain[:1], scales[:1])
            assert rel(p1.sum(1) + r1, cap.first_out[layer]) < RECON_RTOL
        norms.append(parts.double().norm(dim=-1))
    want = row_normalise(torch.stack(norms))
    torch.testing.assert_close(res.layerwise, want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(res.rolled, rollout(want), rtol=1e-5, atol=1e-7)


def test_globenc_first_norm_only_differs_and_pre_ln_refuses_a_second(tiny_model):
    bert = tiny_model("bert")
    both = context_mixing(bert, TEXT, "globenc").layerwise
    one = context_mixing(bert, TEXT, "globenc", second_norm=False).layerwise
    assert not torch.allclose(both, one)
    with pytest.raises(IdentifiableError, match="undefined for the pre-norm 'gpt2'") as err:
        context_mixing(tiny_model("gpt2"), TEXT, "globenc", second_norm=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_alti_from_its_definition(tiny_model, arch):
    model = tiny_model(arch)
    x = inputs(model)
    enc = x.encoding
    cap = capture_blocks(model, enc.input_ids, enc.token_type_ids)
    res = context_mixing(model, TEXT, "alti")
    for layer in range(x.trace.n_layers):
        chain, scales = norm_chain(x, layer, second_norm=False)
        parts, rest = decompose.decomposition(x.pieces(layer), chain, scales)
        y = cap.first_out[layer] if arch in POST else cap.second_in[layer]
        assert rel(parts.sum(1) + rest, y) < RECON_RTOL
        # c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_ij‖₁) / row sum, written out with explicit loops.
        y64, t64 = y.double(), parts.double()
        n = y.shape[0]
        want = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            for j in range(n):
                want[i, j] = max(0.0, float(y64[i].abs().sum() - (y64[i] - t64[i, j]).abs().sum()))
            want[i] /= want[i].sum()
        torch.testing.assert_close(res.layerwise[layer], want, rtol=1e-4, atol=1e-5)
    # rolled is multiplied out in float32 before the cast, the reference in float64
    torch.testing.assert_close(res.rolled, rollout(res.layerwise), rtol=1e-5, atol=1e-7)


def test_alti_contributions_on_a_hand_example():
    # y = (2, 0): a part equal to y scores ‖y‖₁ = 2, the part (1, 1) scores 2 − 2 = 0,
    # the part (-1, 0) is farther than 0 and scores 0; the row then normalises to (1, 0, 0).
    y = torch.tensor([[2.0, 0.0]])
    parts = torch.tensor([[[2.0, 0.0], [1.0, 1.0], [-1.0, 0.0]]])
    out = decompose.alti_contributions(parts, y)
    assert out.tolist() == [[1.0, 0.0, 0.0]]


# ---- value zeroing ----------------------------------------------------------------


def explicit_value_zeroing(model, text: str, layer: int, token: int) -> torch.Tensor:
    """Layer `layer`'s output when token `token`'s value vector is zeroed in that layer only,
    from an ordinary forward pass of the whole model (layers below are untouched)."""
    enc = model.encode(text)
    value = get_submodule(model.layers[layer], model.spec.value)
    out: list[torch.Tensor] = []

    def zero(module, args, output):
        output = output.clone()
        if model.spec.fused is None:
            output[:, token] = 0
        else:  # GPT-2's [Q | K | V] thirds (fused "qkv_blocks" with H_kv = H)
            assert model.spec.fused == "qkv_blocks" and model.info.n_kv_heads == model.info.n_heads
            width = output.shape[-1] // 3
            output[:, token, 2 * width :] = 0
        return output

    with HookSet() as hooks, torch.no_grad():
        hooks.post(value, zero)
        hooks.post(model.layers[layer], lambda m, a, o: out.append(first_tensor(o)))
        model.hf_model(**model.batch_inputs([enc]))
    return out[0][0]


@pytest.mark.parametrize("arch", ["bert", "distilbert", "gpt2", "llama"])
def test_value_zeroing_equals_an_explicit_rerun(tiny_model, arch):
    model = tiny_model(arch)
    x = inputs(model, SHORT, blocks=False)
    tr = x.trace
    dist = value_zeroing_distances(x, chunk=3)  # batched, in chunks that do not divide n
    clean = tr.hidden_states[1:]
    n = tr.n_tokens
    for layer in range(tr.n_layers):
        for j in range(n):
            zeroed = explicit_value_zeroing(model, SHORT, layer, j)
            cos = torch.nn.functional.cosine_similarity(
                clean[layer].double(), zeroed.double(), dim=-1
            )
            torch.testing.assert_close(dist[layer, :, j], 1 - cos, rtol=1e-4, atol=2e-6)
            if arch in CAUSAL:  # tokens before j cannot see j: their outputs are unchanged
                assert torch.allclose(zeroed[:j], clean[layer, :j], atol=1e-5)
    res = context_mixing(model, SHORT, "value-zeroing")
    want = row_normalise(dist)
    if arch in CAUSAL:
        want = want.tril()
    torch.testing.assert_close(res.layerwise, row_normalise(want), rtol=1e-4, atol=1e-6)
    # rolled is multiplied out in float32 before the cast, the reference in float64
    torch.testing.assert_close(res.rolled, rollout(res.layerwise), rtol=1e-5, atol=1e-7)


# ---- erasure, grad-input, hta -----------------------------------------------------


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_erasure_and_grad_input_from_their_definitions(tiny_model, arch):
    model = tiny_model(arch)
    enc = model.encode(SHORT)
    e0 = model.embed(enc.input_ids, enc.token_type_ids)
    ids = enc.input_ids

    def f(z):
        return model.layer_outputs(z, ids)

    erasure = context_mixing(model, SHORT, "erasure", chunk_size=2).layerwise
    grad_input = context_mixing(model, SHORT, "grad-input", chunk_size=2).layerwise
    with torch.no_grad():
        clean = f(e0)
    for j in (0, 3):
        blank = e0.clone()
        blank[j] = 0
        with torch.no_grad():
            change = (f(blank) - clean)[1:].double().norm(dim=-1)  # [L, n]
        mask = torch.ones_like(change, dtype=torch.bool)
        if arch in CAUSAL:  # rows i < j cannot see token j: exactly 0 in the result
            mask[:, :j] = False
            assert torch.all(erasure[:, :j, j] == 0) and torch.all(grad_input[:, :j, j] == 0)
            assert j == 0 or float(change[:, :j].abs().max()) < 1e-5
        torch.testing.assert_close(erasure[:, :, j][mask], change[mask], rtol=1e-5, atol=1e-6)
        # grad-input: J x_j by reverse-over-reverse autograd (independent of torch.func).
        tangent = torch.zeros_like(e0)
        tangent[j] = e0[j]
        _, jx = torch.autograd.functional.jvp(f, e0, tangent)
        want_gi = jx[1:].double().norm(dim=-1)
        torch.testing.assert_close(grad_input[:, :, j][mask], want_gi[mask], rtol=1e-4, atol=1e-6)


def test_hta_wraps_hidden_token_attribution(tiny_model):
    from identifiable.attribution import hidden_token_attribution

    model = tiny_model("bert")
    res = context_mixing(model, SHORT, "hta")
    want = hidden_token_attribution(model, SHORT).contributions
    torch.testing.assert_close(res.layerwise, want.double())
    assert res.rolled is None and torch.equal(res.global_map, res.layerwise)
    est = context_mixing(model, SHORT, "hta", probes=4, seed=1)
    assert est.meta["mode"] == "estimated" and not torch.allclose(est.layerwise, res.layerwise)


# ---- effective rollout ------------------------------------------------------------


def test_effective_rollout_is_rollout_when_attention_is_identifiable(tiny_model):
    model = tiny_model("bert")  # head width 16: a 9-token text is identifiable (A_eff = A)
    assert len(model.encode(SHORT)) <= model.info.head_dim
    eff = context_mixing(model, SHORT, "effective-rollout")
    raw = context_mixing(model, SHORT, "rollout")
    # Equal up to float32 rounding: the trace's rows sum to 1 only to ~1e-8, and the clip
    # step renormalises them exactly.
    torch.testing.assert_close(eff.rolled, raw.rolled, rtol=1e-7, atol=1e-7)


def test_clip_renormalise_on_fabricated_rows():
    from identifiable.mixing.rollout import clip_renormalise

    eff = torch.tensor([[[0.6, 0.6, -0.2], [-0.1, -0.3, 0.0], [0.5, 0.25, 0.25]]]).double()
    raw = torch.tensor([[[0.2, 0.3, 0.5], [0.1, 0.1, 0.8], [0.5, 0.25, 0.25]]]).double()
    out, fallback = clip_renormalise(eff, raw)
    assert fallback == 1  # row 1 has no positive entry: it takes the raw row
    torch.testing.assert_close(out[0, 0], torch.tensor([0.5, 0.5, 0.0]).double())
    torch.testing.assert_close(out[0, 1], raw[0, 1])
    torch.testing.assert_close(out[0, 2], eff[0, 2])


def test_effective_rollout_on_a_non_identifiable_sequence(tiny_model):
    from identifiable.attention import effective_attention

    model = tiny_model("bert")
    long = " ".join([TEXT] * 2)
    assert len(model.encode(long)) > model.info.head_dim
    res = context_mixing(model, long, "effective-rollout")
    eff = effective_attention(model.trace(long), dtype=torch.float64).effective.mean(1)
    clipped = row_normalise(eff.clamp_min(0))
    torch.testing.assert_close(res.layerwise, with_residual(clipped))
    assert torch.all(res.layerwise >= 0)
    torch.testing.assert_close(res.rolled.sum(-1), torch.ones_like(res.rolled[..., 0]))
    # Beyond the head width, effective attention differs from raw attention, so must its rollout.
    assert not torch.allclose(res.rolled, context_mixing(model, long, "rollout").rolled)


# ---- the interface ----------------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(CAUSAL))
def test_causal_rows_stay_causal(tiny_model, arch):
    model = tiny_model(arch)
    for name in method_names():
        res = context_mixing(model, SHORT, name)
        assert res.is_causal
        for maps in (res.layerwise, res.rolled):
            if maps is not None:
                assert torch.all(maps.triu(1) == 0), name
                assert torch.all(maps.tril() >= 0), name


def test_every_method_returns_one_result_type(tiny_model):
    model = tiny_model("distilbert")
    n = len(model.encode(SHORT))
    for name in method_names():
        res = context_mixing(model, SHORT, name)
        assert res.method == name and res.layerwise.shape == (2, n, n)
        assert res.layerwise.dtype == torch.float64
        assert (res.rolled is not None) == (name in {
            "rollout", "flow", "effective-rollout", "globenc", "alti", "value-zeroing"
        })  # fmt: skip
        assert set(res.options) == set(METHODS[name].defaults)
        assert torch.isfinite(res.layerwise).all()
        d = res.to_dict()
        assert d["method"] == name and len(d["layerwise"]) == 2


def test_unknown_method_and_option_are_one_line(tiny_model):
    model = tiny_model("bert")
    with pytest.raises(IdentifiableError) as err:
        context_mixing(model, SHORT, "saliency")
    msg = str(err.value)
    assert "\n" not in msg and all(name in msg for name in method_names())
    with pytest.raises(IdentifiableError, match="has no option probes; its options: none"):
        context_mixing(model, SHORT, "attention", probes=3)


def test_grad_input_failure_is_one_line(tiny_model, monkeypatch):
    model = tiny_model("bert")

    def broken(e0, ids):
        raise RuntimeError("forward-mode AD is not implemented for this op\nmore")

    monkeypatch.setattr(model, "layer_outputs", broken)
    with pytest.raises(IdentifiableError, match="grad-input needs derivatives") as err:
        context_mixing(model, SHORT, "grad-input")
    assert "\n" not in str(err.value)


def test_norm_capture_paths_match_the_norm_modules(tiny_model):
    for arch in ARCHITECTURES:
        model = tiny_model(arch)
        enc = model.encode(SHORT)
        cap = capture_blocks(model, enc.input_ids, enc.token_type_ids)
        tr = model.trace(SHORT)
        assert rel(cap.layer_out, tr.hidden_states[1:]) < 1e-6
        for layer, (first, second) in enumerate(block_norms(model)):
            assert rel(first(cap.first_in[layer]), cap.first_out[layer]) < 1e-5
            assert rel(second(cap.second_in[layer]), cap.second_out[layer]) < 1e-5
