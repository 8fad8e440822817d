"""Effective attention invariants on every head of every architecture, and bad input."""

from __future__ import annotations

import pytest
import torch

from helpers.families import ARCHITECTURES
from helpers.traces import TEXT_LONG, TEXT_SHORT, exact_rank, synthetic_trace
from identifiable.attention import (
    compute_head_factors,
    effective_attention,
    iter_effective_attention,
    null_space,
    result_dtype,
)
from identifiable.attention.reference import effective_attention_reference
from identifiable.errors import IdentifiableError


def check_invariants(trace, tol: float = 1e-9) -> None:
    """Every invariant of docs/definitions.md, on every head, for both variants."""
    a = trace.attentions.double()
    v, h = trace.values.double(), trace.out_proj.double()
    t = v @ h  # [L, H, n, d]
    biased = (v + trace.value_bias.double()[:, :, None]) @ h
    n = trace.n_tokens
    ns = null_space(trace)
    for ly in range(trace.n_layers):
        for hd in range(trace.n_heads):
            rows = range(n) if trace.is_causal else [n - 1]
            for i in rows:
                seen = i + 1 if trace.is_causal else n
                ones = torch.ones(seen, 1, dtype=torch.float64)
                assert int(ns.rank[ly, hd, i]) == exact_rank(t[ly, hd, :seen], trace.head_dim)
                r_aug = exact_rank(torch.cat([t[ly, hd, :seen], ones], 1), trace.head_dim + 1)
                assert int(ns.dim_stochastic[ly, hd, i]) == seen - r_aug
    assert torch.equal(ns.dim, torch.arange(1, n + 1) - ns.rank if trace.is_causal else n - ns.rank)
    for variant in ("paper", "row-stochastic"):
        ea = effective_attention(trace, variant, dtype=torch.float64)
        eff = ea.effective
        scale = (a @ t).norm(dim=(-2, -1), keepdim=True)
        assert ((eff @ t - a @ t).norm(dim=(-2, -1), keepdim=True) <= tol * scale).all()
        dims = ns.dim if variant == "paper" else ns.dim_stochastic
        full = dims == 0  # [L, H, n]: rank = keys seen
        assert torch.equal(eff[full], a[full])  # A_eff = A exactly when rank(T) = n
        if trace.is_causal:
            assert torch.count_nonzero(eff.triu(1)) == 0
        if variant == "row-stochastic":
            torch.testing.assert_close(eff.sum(-1), a.sum(-1), atol=1e-10, rtol=0)
            out_scale = (a @ biased).norm(dim=(-2, -1), keepdim=True)
            assert (
                (eff @ biased - a @ biased).norm(dim=(-2, -1), keepdim=True) <= tol * out_scale
            ).all()
        torch.testing.assert_close(ea.null, a - eff)
        ref = effective_attention_reference(
            trace.attentions,
            trace.values,
            trace.out_proj,
            stochastic=variant == "row-stochastic",
            causal=trace.is_causal,
        )
        torch.testing.assert_close(eff, ref, atol=1e-6, rtol=0)
        # The default call: the trace's precision (float32 here), the invariant to 1e-5.
        e32 = effective_attention(trace, variant)
        assert e32.effective.dtype == result_dtype(trace) == torch.float32
        err = (e32.effective.double() @ t - a @ t).norm(dim=(-2, -1), keepdim=True)
        assert (err <= 1e-5 * scale).all()
        assert torch.equal(e32.effective.double()[full], a[full])
        torch.testing.assert_close(e32.effective.double(), eff, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("text", [TEXT_SHORT, TEXT_LONG], ids=["short", "long"])
def test_invariants_every_architecture(tiny_model, arch, text):
    trace = tiny_model(arch).trace(text)
    check_invariants(trace)
    ns = null_space(trace)
    if trace.n_tokens <= trace.head_dim and not trace.is_causal:
        assert (ns.dim == 0).all()
    if trace.n_tokens > trace.head_dim + 1:
        assert (ns.dim[..., -1] >= trace.n_tokens - trace.head_dim).all()
        assert (ns.dim_stochastic[..., -1] >= trace.n_tokens - trace.head_dim - 1).all()


@pytest.mark.integration
def test_invariants_embedded_model(minilm):
    for text in ("A short sentence.", TEXT_LONG + " " + TEXT_LONG):
        trace = minilm.trace(text)
        check_invariants(trace)
        eff = effective_attention(trace).effective
        if trace.n_tokens <= trace.head_dim:
            assert torch.equal(eff, trace.attentions.double())


def test_llama_repeated_tokens_lower_the_rank(tiny_model):
    """Layer 1 of Llama sees no positions in V: repeated tokens give identical rows."""
    trace = tiny_model("llama").trace("a b a b a b")  # n = 8 with [CLS]/[SEP]
    ns = null_space(trace)
    distinct = len(set(trace.tokens))
    assert int(ns.rank[0, 0, -1]) == distinct < trace.n_tokens
    check_invariants(trace)


@pytest.mark.parametrize("causal", [False, True])
def test_synthetic_invariants_and_rank_deficient_out_proj(causal):
    trace = synthetic_trace(n=9, d_v=4, d=6, causal=causal)
    trace.out_proj[1, 2, 3] = trace.out_proj[1, 2, 0]  # H of layer 1, head 2 loses a rank
    factors = compute_head_factors(trace)
    assert not bool(factors.full_row_rank[1, 2]) and int(factors.full_row_rank.sum()) == 5
    ns = null_space(trace, factors=factors)
    assert int(ns.rank[1, 2, -1]) == 3 and int(ns.rank[0, 0, -1]) == 4
    check_invariants(trace)


def test_the_default_dtype_follows_the_trace():
    """No `dtype`: float32 for float32 and bfloat16 traces (null spaces still decided in
    float64), float64 for a float64 trace, `out`'s dtype when one is given; an explicit
    dtype wins. Each case fails if the rule is changed."""
    for dtype, want in ((torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                        (torch.float64, torch.float64)):  # fmt: skip
        trace = synthetic_trace(n=10, d_v=3, dtype=dtype)
        assert result_dtype(trace) == want
        ea = effective_attention(trace, "row-stochastic")
        assert ea.effective.dtype == want
        assert next(iter_effective_attention(trace)).effective.dtype == want
        e64 = effective_attention(trace, "row-stochastic", dtype=torch.float64)
        assert e64.effective.dtype == torch.float64
        assert torch.equal(ea.null_space.dim_stochastic, e64.null_space.dim_stochastic)
        torch.testing.assert_close(ea.effective.double(), e64.effective, atol=1e-5, rtol=0)
    trace = synthetic_trace(n=10, d_v=3)
    buf = torch.empty(trace.attentions.shape, dtype=torch.float64)
    assert effective_attention(trace, out=buf).effective is buf
    check_invariants(synthetic_trace(n=10, d_v=3, dtype=torch.bfloat16))


def test_streaming_equals_full_and_accepts_layers():
    trace = synthetic_trace(n=11, layers=3, d_v=4)
    full = effective_attention(trace, "row-stochastic")
    got = list(iter_effective_attention(trace, "row-stochastic", layers=[2, 0]))
    assert [le.layer for le in got] == [2, 0]
    for le in got:
        torch.testing.assert_close(le.effective, full.effective[le.layer], atol=0, rtol=0)
        torch.testing.assert_close(le.null, full.null[le.layer])
        assert torch.equal(le.dim, full.null_space.dim[le.layer])


def test_nan_in_attention_names_layer_and_head():
    trace = synthetic_trace(n=6)
    trace.attentions[1, 2, 3, 4] = float("nan")
    with pytest.raises(IdentifiableError, match=r"NaN or inf in the attention at layer 1, head 2"):
        effective_attention(trace)


def test_inf_in_values_and_out_proj_are_reported():
    trace = synthetic_trace(n=6)
    trace.values[0, 1, 2, 0] = float("inf")
    with pytest.raises(IdentifiableError, match=r"values .* layer 0, head 1"):
        null_space(trace)
    trace = synthetic_trace(n=6)
    trace.out_proj[1, 0, 0, 0] = float("-inf")
    with pytest.raises(IdentifiableError, match=r"output projection .* layer 1, head 0"):
        effective_attention(trace)


def test_bad_variant_layer_and_shapes():
    trace = synthetic_trace(n=6)
    with pytest.raises(IdentifiableError, match=r"unknown variant 'bias'.*row-stochastic"):
        effective_attention(trace, "bias")  # type: ignore[arg-type]
    with pytest.raises(IdentifiableError, match=r"valid layers are 0\.\.1"):
        list(iter_effective_attention(trace, layers=[5]))
    trace.out_proj = trace.out_proj.reshape(2, 3 * 4, 10)  # fused W_O, not split per head
    with pytest.raises(IdentifiableError, match="not per-head separable"):
        null_space(trace)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
def test_float32_opt_in_holds_the_invariant_to_float32_accuracy(causal, variant):
    """dtype=torch.float32: the same null spaces (decided in float64), A_eff T = A T to
    1e-5 of ‖A T‖ per head, within 1e-5 of the float64 result, A itself where dim = 0."""
    big = synthetic_trace(n=40, d_v=8, d=16, causal=causal)
    small = synthetic_trace(n=6, d_v=8, d=16)  # n ≤ d_v: every head is the identity
    diffs = []
    for trace in (big, small):
        e64 = effective_attention(trace, variant, dtype=torch.float64)
        e32 = effective_attention(trace, variant, dtype=torch.float32)
        assert e32.effective.dtype == torch.float32 and e32.null.dtype == torch.float32
        for field in ("rank", "dim", "dim_stochastic"):
            assert torch.equal(getattr(e32.null_space, field), getattr(e64.null_space, field))
        a = trace.attentions.double()
        t = trace.values.double() @ trace.out_proj.double()
        err = (e32.effective.double() @ t - a @ t).norm(dim=(-2, -1))
        assert (err <= 1e-5 * (a @ t).norm(dim=(-2, -1))).all()
        diffs.append(float((e32.effective.double() - e64.effective).abs().max()))
        assert diffs[-1] <= 1e-5
        dims = e64.null_space.dim if variant == "paper" else e64.null_space.dim_stochastic
        full = dims == 0
        assert torch.equal(e32.effective[full], trace.attentions[full])
        streamed = list(iter_effective_attention(trace, variant, dtype=torch.float32))
        for le in streamed:
            assert torch.equal(le.effective, e32.effective[le.layer])
    # Projected in float32 where n > d_v (a rounding of float64, not a copy of it);
    # exactly A where every head is the identity.
    assert diffs[0] > 0 and diffs[1] == 0


def test_unsupported_dtype_is_one_line():
    trace = synthetic_trace(n=6)
    with pytest.raises(IdentifiableError, match=r"unsupported dtype torch.float16: use"):
        effective_attention(trace, dtype=torch.float16)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_attention_beyond_the_head_width_names_layer_and_head(dtype, bad):
    """n > d_v: finiteness is checked on A Q, not A; the message must still name the head."""
    trace = synthetic_trace(n=12, d_v=4)
    trace.attentions[1, 2, 7, 0] = bad
    with pytest.raises(IdentifiableError, match=r"NaN or inf in the attention at layer 1, head 2"):
        effective_attention(trace, dtype=dtype)


def test_head_factors_are_shared_by_traces_of_one_model_and_renewed_after_a_weight_change(
    bert_tokenizer,
):
    from helpers.families import build_tiny_hf_model
    from identifiable.models import Model

    hf = build_tiny_hf_model("bert")
    model = Model.from_hf(hf, bert_tokenizer, name="tiny-bert-fresh")
    t1, t2 = model.trace("the cat sat on the mat"), model.trace("a dog ran far away today")
    assert t1.out_proj is t2.out_proj  # one W_O per model, not a copy per trace
    f1 = compute_head_factors(t1)
    assert compute_head_factors(t2) is f1
    # An in-place weight change (as an optimizer step makes) gives a new W_O and new factors.
    with torch.no_grad():
        next(iter(model.stack.out_modules[0].parameters())).mul_(2.0)
    t3 = model.trace("the cat sat on the mat")
    assert t3.out_proj is not t1.out_proj
    torch.testing.assert_close(t3.out_proj[0], 2 * t1.out_proj[0])
    f3 = compute_head_factors(t3)
    assert f3 is not f1
    torch.testing.assert_close(f3.factor[0], 2 * f1.factor[0])
    check_invariants(t3, tol=1e-9)
    # Editing a trace's W_O in place also invalidates its cached factors.
    t3.out_proj[1].mul_(3.0)
    f4 = compute_head_factors(t3)
    assert f4 is not f3
    torch.testing.assert_close(f4.factor[1], 3 * f3.factor[1])


def test_ones_in_the_column_space_adds_no_stochastic_direction():
    """n > d_v with a constant value column: 1 ∈ col(T), so dim LN([T, 1]) = dim LN(T)
    (the explicit Gram-Schmidt decides); with random values it is one less."""
    trace = synthetic_trace(n=12, d_v=4, d=10)
    ns = null_space(trace)
    assert torch.equal(ns.dim_stochastic, ns.dim - 1)
    trace.values[:, :, :, 0] = 0.7
    ns = null_space(trace)
    assert torch.equal(ns.dim_stochastic, ns.dim)
    check_invariants(trace)


@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_certified_out_proj_route_equals_the_exact_factors_bit_for_bit(variant, dtype):
    """Without cached factors, an encoder trace whose W_O is proved well-conditioned from
    a float32 Gram never factors W_O in float64, and its result equals, bit for bit, the
    one computed with the exact factors; a head that cannot be proved (κ(H) = 1e5) makes
    the call factor that layer's W_O exactly, with the same result again. Causal traces
    take the certificate too (their prefixes then run on V itself)."""
    from identifiable.attention.effective import _FACTOR_CACHE, _FLAGS_CACHE, _LAYER_FACTORS

    def run(trace):
        for cache in (_FACTOR_CACHE, _FLAGS_CACHE, _LAYER_FACTORS):
            cache.clear()
        got = effective_attention(trace, variant, dtype=dtype)
        factored = any(c.get(trace.out_proj) for c in (_FACTOR_CACHE, _LAYER_FACTORS))
        want = effective_attention(trace, variant, factors=compute_head_factors(trace), dtype=dtype)
        assert torch.equal(got.effective, want.effective)
        for field in ("rank", "dim", "dim_stochastic", "out_proj_full_row_rank"):
            assert torch.equal(getattr(got.null_space, field), getattr(want.null_space, field))
        assert torch.equal(null_space(trace).dim, want.null_space.dim)
        return factored

    trace = synthetic_trace(n=20, d_v=4, d=24)
    assert not run(trace)  # proved: W_O never factored in float64
    bad = synthetic_trace(n=20, d_v=4, d=24)
    u, _, vh = torch.linalg.svd(bad.out_proj[1, 2].double(), full_matrices=False)
    bad.out_proj[1, 2] = (u @ torch.diag(torch.tensor([1.0, 0.5, 0.1, 1e-5]).double()) @ vh).float()
    assert run(bad)  # one head not provable: exact factors, same numbers
    causal = synthetic_trace(n=20, d_v=4, d=24, causal=True)
    assert not run(causal)
    causal.out_proj[1, 2] = bad.out_proj[1, 2]
    assert run(causal)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_out_buffer_is_filled_exactly_and_reused(dtype, causal):
    """`out=`: the same numbers as a fresh result, written into (and returned as) the
    buffer; a buffer holding another sequence's (or garbage) values is overwritten entirely."""
    t1 = synthetic_trace(n=14, d_v=4, d=12, causal=causal, seed=1)
    t2 = synthetic_trace(n=14, d_v=4, d=12, causal=causal, seed=2)
    buf = torch.full(t1.attentions.shape, float("nan"), dtype=dtype)
    for trace in (t1, t2):
        want = effective_attention(trace, dtype=dtype)
        got = effective_attention(trace, dtype=dtype, out=buf)
        assert got.effective is buf
        assert torch.equal(got.effective, want.effective)
        assert torch.equal(got.null_space.dim, want.null_space.dim)


def test_bad_out_buffers_are_one_line_and_untouched():
    trace = synthetic_trace(n=14, d_v=4, d=12)
    shape = tuple(trace.attentions.shape)
    cases = [
        (torch.zeros((*shape[:-1], 13), dtype=torch.float64), r"out has shape .* expected \[L, H, n, n_k\]"),
        (torch.zeros(shape, dtype=torch.float32), r"out has dtype torch.float32; pass dtype=torch.float64"),
        (torch.zeros(shape[:-2] + shape[-1:] + shape[-2:-1], dtype=torch.float64).transpose(-1, -2),
         r"out is not contiguous"),
        ("buffer", r"out must be a torch.Tensor, got str"),
    ]  # fmt: skip
    for out, message in cases:
        with pytest.raises(IdentifiableError, match=message):
            effective_attention(trace, dtype=torch.float64, out=out)
        if isinstance(out, torch.Tensor):
            assert not bool(out.any())  # nothing written
    raw = trace.attentions.clone()
    with pytest.raises(IdentifiableError, match=r"out shares memory with the trace's attentions"):
        effective_attention(trace, dtype=torch.float32, out=trace.attentions)
    assert torch.equal(trace.attentions, raw)


def test_shapes_are_checked_when_the_factors_are_cached_or_given():
    """A trace whose values no longer fit gets the one-line shape error even when its
    W_O's factors come from the cache or from the caller (no factoring runs then)."""
    trace = synthetic_trace(n=12, d_v=4, d=10)
    factors = compute_head_factors(trace)  # cached for this W_O
    trace.values = trace.values[:, :, :-1]
    for given in (None, factors):
        with pytest.raises(IdentifiableError, match=r"trace values have shape"):
            effective_attention(trace, factors=given)


def test_sees_all_keys_agrees_with_the_key_mask():
    """`Trace.sees_all_keys` (which picks the encoder route without forming a mask) equals
    `keys_seen(layer).all()` for encoder, causal, one-token causal, cross-attention and
    masked traces."""
    from identifiable.models.trace import Trace

    g = torch.Generator().manual_seed(0)
    a_sq = torch.softmax(torch.randn(2, 3, 6, 6, generator=g), -1)
    a_cross = torch.softmax(torch.randn(2, 3, 4, 7, generator=g), -1)
    v6, v7 = torch.randn(2, 3, 6, 4, generator=g), torch.randn(2, 3, 7, 4, generator=g)
    h = torch.randn(2, 3, 4, 10, generator=g)
    window = torch.ones(6, 6, dtype=torch.bool).triu(-2).tril(2)
    traces = [
        synthetic_trace(n=6),
        synthetic_trace(n=6, causal=True),
        synthetic_trace(n=1, causal=True),
        Trace.from_tensors(a_cross, v7, h),
        Trace.from_tensors(a_sq, v6, h, key_mask=torch.ones(6, 6, dtype=torch.bool)),
        Trace.from_tensors(a_sq.masked_fill(~window, 0), v6, h, key_mask=window),
    ]
    got = [[t.sees_all_keys(layer) for layer in range(t.n_layers)] for t in traces]
    want = [[bool(t.keys_seen(layer).all()) for layer in range(t.n_layers)] for t in traces]
    assert got == want
    assert [row[0] for row in got] == [True, False, True, True, True, False]


@pytest.mark.parametrize("api", ["legacy", "per-backend"])
def test_float32_route_refuses_reduced_precision_matmuls(api):
    """Under `torch.set_float32_matmul_precision("medium")`, or the per-backend
    `torch.backends.mkldnn.matmul.fp32_precision = "bf16"` (after which torch's legacy
    getter raises), a CPU with bfloat16 support multiplies float32 in bfloat16 (the
    invariant then fails by ~3e-3): the float32 route says so in one line before any
    work, leaving `out` untouched; float64 is unaffected and the certificate proves
    nothing."""
    from identifiable.attention.linalg import certified_well_conditioned

    trace = synthetic_trace(n=30, d_v=4, d=12)
    want = effective_attention(trace, dtype=torch.float64)
    buffer = torch.full(trace.attentions.shape, float("nan"))
    try:
        if api == "legacy":
            torch.set_float32_matmul_precision("medium")
        else:
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        match = r"reduced precision \('bf16'.*set_float32_matmul_precision\('highest'\)"
        with pytest.raises(IdentifiableError, match=match):
            effective_attention(trace, dtype=torch.float32, out=buffer)
        with pytest.raises(IdentifiableError, match=match):
            next(iter_effective_attention(trace, dtype=torch.float32))
        assert bool(buffer.isnan().all())
        # Without a dtype, the call takes float64 then (its float32 could not hold).
        assert result_dtype(trace) == torch.float64
        assert torch.equal(effective_attention(trace).effective, want.effective)
        assert not bool(certified_well_conditioned(trace.out_proj.flatten(0, 1)).any())
    finally:
        torch.set_float32_matmul_precision("highest")


@pytest.mark.parametrize("causal", [False, True])
def test_layers_and_heads_select_what_is_computed(causal):
    """`layers=`/`heads=`: the selected slices of the full result, in the order asked for,
    labelled with the model's indices; bad selections are one line naming the argument."""
    trace = synthetic_trace(n=14, layers=3, heads=4, d_v=4, d=12, causal=causal)
    full = effective_attention(trace, "row-stochastic")
    part = effective_attention(trace, "row-stochastic", layers=[2, 0], heads=[3, 1])
    assert part.layers == (2, 0) and part.heads == (3, 1)
    assert part.effective.shape == (2, 2, 14, 14) and part.raw.shape == (2, 2, 14, 14)
    # the same arithmetic on fewer heads: a batched product may round differently per batch
    # shape (OpenBLAS's Haswell kernels do on AMD), so equal to a few float32 ulps
    tol = 8 * torch.finfo(full.effective.dtype).eps
    for i, ly in enumerate((2, 0)):
        for j, hd in enumerate((3, 1)):
            torch.testing.assert_close(
                part.effective[i, j], full.effective[ly, hd], atol=tol, rtol=0
            )
            assert torch.equal(part.raw[i, j], trace.attentions[ly, hd])
            assert torch.equal(part.null_space.dim[i, j], full.null_space.dim[ly, hd])
    ns = null_space(trace, layers=[1], heads=[2])
    assert ns.rank.shape == (1, 1, 14) and torch.equal(ns.rank[0, 0], full.null_space.rank[1, 2])
    streamed = list(iter_effective_attention(trace, layers=[1], heads=[0, 2]))
    assert streamed[0].heads == (0, 2) and streamed[0].effective.shape == (2, 14, 14)
    df = part.to_pandas("effective")
    assert set(df["layer"]) == {0, 2} and set(df["head"]) == {1, 3}
    cases = [
        ({"heads": [4]}, r"heads= holds 4, out of range: valid heads are 0\.\.3"),
        ({"layers": [3]}, r"layers= holds 3, out of range: valid layers are 0\.\.2"),
        ({"heads": [1, 1]}, r"heads= repeats an index"),
        ({"layers": []}, r"layers= is empty"),
        ({"heads": 2}, r"heads= takes a list of integers"),
        ({"heads": [1.5]}, r"heads= holds integers"),
    ]
    for kwargs, message in cases:
        for fn in (effective_attention, null_space):
            with pytest.raises(IdentifiableError, match=message):
                fn(trace, **kwargs)
