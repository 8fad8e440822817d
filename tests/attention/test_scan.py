"""`identifiable.scan` against today's per-trace analyses: every statistic of every text,
layer and head recomputed in numpy from `Model.trace` and `effective_attention`, on the
routes a scan meets (encoder, causal with grouped heads, sliding windows, eager and
recomputed maps), plus what a scan keeps, its result's manners and its memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.families import build_tiny_hf_model
from identifiable import scan
from identifiable.attention import ScanResult, effective_attention
from identifiable.attention.scan import STATISTICS
from identifiable.models import Model

TEXTS = [
    "the cat sat on the mat and the dog sat on the log while the bird flew over the old "
    "tree, the fish swam in the bowl and the cat watched the fish swim round and round",
    "a short one, with a comma",
    ("a pair of texts", "the second half of the pair"),
]


@pytest.fixture(scope="module")
def models(bert_tokenizer):
    made = {}
    for arch, impl in (("llama", "sdpa"), ("llama", "eager"), ("bert", "eager"),
                       ("gemma2", "eager"), ("gemma3_text", "sdpa")):  # fmt: skip
        hf = build_tiny_hf_model(arch, attn_implementation=impl)
        made[f"{arch}-{impl}"] = Model.from_hf(hf, bert_tokenizer, name=f"tiny-{arch}")
    return made


def reference(model, text, sink: int, variant: str = "paper") -> np.ndarray:
    """`[L, H, len(STATISTICS)]` of one text from the trace and today's effective attention,
    in numpy float64 (rows that see key j from the trace's own key mask)."""
    tr = model.trace(text)
    ea = effective_attention(tr, variant)
    raw, eff = ea.raw.double().numpy(), ea.effective.double().numpy()
    dims = (ea.null_space.dim if variant == "paper" else ea.null_space.dim_stochastic).numpy()
    n_l, n_h, n, _ = raw.shape
    out = np.zeros((n_l, n_h, len(STATISTICS)))
    for layer in range(n_l):
        seen = tr.keys_seen(layer).numpy()
        for h in range(n_h):
            a, e = raw[layer, h], eff[layer, h]
            rows = seen[:, sink]
            top_a = np.where(seen, a, -np.inf).argmax(-1)
            top_e = np.where(seen, e, -np.inf).argmax(-1)
            out[layer, h] = [
                n,
                np.median(dims[layer, h]),
                np.linalg.norm(a - e) / np.linalg.norm(a),
                a[rows, sink].mean(),
                e[rows, sink].mean(),
                np.diagonal(a).mean(),
                np.diagonal(e).mean(),
                (top_a == top_e).mean(),
            ]
    return out


@pytest.mark.parametrize(
    "name", ["llama-sdpa", "llama-eager", "bert-eager", "gemma2-eager", "gemma3_text-sdpa"]
)
def test_every_statistic_matches_the_trace_analyses(models, name):
    model = models[name]
    result = scan(model, TEXTS, sink=1, progress=False)
    assert isinstance(result, ScanResult) and result.n_texts == len(TEXTS)
    for t, text in enumerate(TEXTS):
        want = reference(model, text, sink=1)
        got = np.stack([getattr(result, s)[t].numpy() for s in STATISTICS], -1)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"text {t}")
    assert result.null_fraction.max() > 0.01  # the long text is not identifiable everywhere


def test_the_row_stochastic_variant(models):
    model = models["llama-sdpa"]
    result = scan(model, TEXTS[:1], variant="row-stochastic", progress=False)
    got = np.stack([getattr(result, s)[0].numpy() for s in STATISTICS], -1)
    want = reference(model, TEXTS[0], sink=0, variant="row-stochastic")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_layers_heads_and_kept_maps(models):
    model = models["llama-sdpa"]
    full = scan(model, TEXTS, progress=False)
    part = scan(model, TEXTS, layers=[1], heads=[3, 0], keep=[(1, 3)], progress=False)
    assert part.layers == (1,) and part.heads == (0, 3)  # heads in the model's order
    for s in STATISTICS:
        torch.testing.assert_close(getattr(part, s), getattr(full, s)[:, 1:, [0, 3]])
    assert part.kept == tuple((t, 1, 3) for t in range(len(TEXTS)))
    for t, text in enumerate(TEXTS):
        ea = effective_attention(model.trace(text))
        head = part.head(t, 1, 3)
        assert head.raw.shape[-1] == len(model.encode(text))
        torch.testing.assert_close(head.raw[0, 0], ea.raw[1, 3], atol=0, rtol=0)
        torch.testing.assert_close(head.effective[0, 0], ea.effective[1, 3], atol=1e-6, rtol=0)
        assert torch.equal(head.null_space.dim[0, 0], ea.null_space.dim[1, 3])
    n0 = len(model.encode(TEXTS[1]))
    assert torch.isnan(part.kept_raw[1, n0:]).all()  # padding beyond a shorter text
    assert full.kept == () and full.kept_raw is None


def test_texts_from_a_dataset_and_a_corpus(models):
    datasets = pytest.importorskip("datasets", reason="the datasets extra reads Datasets")
    from identifiable.corpus import load_corpus

    model = models["bert-eager"]
    texts = [TEXTS[0], TEXTS[1]]
    base = scan(model, texts, progress=False)
    ds = datasets.Dataset.from_dict({"body": texts})
    from_ds = scan(model, ds, column="body", progress=False)
    torch.testing.assert_close(from_ds.null_fraction, base.null_fraction, atol=0, rtol=0)
    corpus = load_corpus(texts, unit="document")
    from_corpus = scan(model, corpus, progress=False)
    torch.testing.assert_close(from_corpus.dim, base.dim, atol=0, rtol=0)


def test_result_manners(models, tmp_path):
    model = models["llama-sdpa"]
    result = scan(model, TEXTS, keep=[(0, 1)], progress=False)
    df = result.to_pandas()
    assert list(df.columns) == ["text", "layer", "head", *STATISTICS]
    assert len(df) == len(TEXTS) * 2 * 4 and df["n"].dtype == np.int64
    ds = result.to_xarray()
    assert ds["null_fraction"].dims == ("text", "layer", "head")
    fig = result.plot()
    assert [ax.get_title() for ax in fig.axes[:3]] == [
        "null_fraction", "sink_raw", "sink_effective",
    ]  # fmt: skip
    one = result.plot("dim", text=2)
    assert "text 2" in one._suptitle.get_text()
    html = result._repr_html_()
    assert "ScanResult" in html and "<script" not in html and "<svg" in html
    assert "mean null fraction" in html and "does not reach the output" in html
    path = result.save(tmp_path / "scan.safetensors")
    back = ScanResult.load(path)
    assert back.kept == result.kept and back.texts == result.texts
    for name in (*STATISTICS, "kept_raw", "kept_effective", "kept_dim"):
        torch.testing.assert_close(getattr(back, name), getattr(result, name), equal_nan=True)
    torch.testing.assert_close(back.head(1, 0, 1).effective, result.head(1, 0, 1).effective)


def _allocated_peak(run) -> int:
    """Peak bytes torch's CPU allocator holds during `run()`, above what it held before."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return peak


def test_a_scan_holds_one_group_of_maps_never_the_whole_model(bert_tokenizer):
    """16 layers of 8 heads at n ≈ 200: a whole model's maps are 21 MB, one group of 4
    heads' maps and A_eff 1.4 MB. The scan's allocator peak stays near the group."""
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.for_model(
        "llama", hidden_size=64, num_hidden_layers=16, num_attention_heads=8,
        num_key_value_heads=2, head_dim=8, intermediate_size=64, vocab_size=30522,
        max_position_embeddings=256, pad_token_id=0, bos_token_id=101, eos_token_id=102,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = AutoModel.from_config(cfg, attn_implementation="sdpa").eval()
    model = Model.from_hf(hf, bert_tokenizer, name="deep")
    ids = torch.randint(1000, 20000, (200,), generator=torch.Generator().manual_seed(0))
    text = model.tokenizer.decode(ids)
    n = len(model.encode(text))
    assert n >= 190
    scan(model, [text], progress=False)  # warm-up
    peak = _allocated_peak(lambda: scan(model, [text], progress=False))
    whole = 16 * 8 * n * n * 4
    group = 4 * n * n * 8
    # a group's A and A_eff and two row chunks of temporaries: 16 maps' worth of 128
    assert peak < whole / 5, (peak, whole)
    assert peak > group / 2, (peak, group)  # the measure sees the group's maps


def _view(device_fn, *, causal: bool, window: int | None, n: int = 40):
    """A `LayerView` of random query, key and values (4 query heads reading 2 key/value
    heads, width 4), its tensors passed through `device_fn`."""
    from identifiable.models.capture import TraceMeta
    from identifiable.models.encoding import Encoding
    from identifiable.models.layerscan import LayerView
    from identifiable.models.recompute import AttentionCall

    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g)
    values = torch.randn(2, n, 4, generator=g)[[0, 0, 1, 1]]
    out_proj = torch.randn(1, 4, 4, 12, generator=g)
    call = AttentionCall(device_fn(q), device_fn(k), None, 0.5, None, window, causal, None)
    enc = Encoding(torch.arange(n), [f"t{i}" for i in range(n)], 0)
    return LayerView(
        2, [0, 1, 2, 3], device_fn(values), device_fn(out_proj), call, window, causal,
        device_fn(torch.tensor([0, 0, 1, 1])), enc, TraceMeta("m", "llama"), None,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
@pytest.mark.parametrize(
    ("causal", "window"), [(True, None), (True, 9), (False, None)], ids=["causal", "window", "enc"]
)
def test_a_layer_is_reduced_on_its_device(causal, window, variant):
    """The scan's per-layer work on the strict stand-in device equals the CPU's: maps
    filled there, projected, reduced, and a kept head copied back."""
    from helpers.fakedevice import on_fake_device, to_fake
    from identifiable.attention.scan import LayerScanner, ScanPlan

    plan = ScanPlan((2,), (0, 1, 2, 3), 3, frozenset({(2, 1)}), variant, torch.float32, 2)
    kv = torch.tensor([0, 0, 1, 1])
    cpu = LayerScanner(plan, kv)
    want = cpu.start()
    cpu(_view(lambda t: t, causal=causal, window=window), want)
    dev = LayerScanner(plan, kv)
    with on_fake_device():
        got = dev.start()
        dev(_view(to_fake, causal=causal, window=window), got)
    torch.testing.assert_close(got.stats, want.stats, atol=1e-12, rtol=0)
    assert want.stats[0, :, 2].max() > 0.05  # n = 40 > d_v: not identifiable
    for a, b in zip(got.kept[(2, 1)], want.kept[(2, 1)], strict=True):
        assert a.device.type == "cpu"
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_the_stage_hands_over_the_scan_contract(models):
    """The tables of the scan stage meet `report.tables.ScanStageTables` (a report section
    reads them through it), and rebuild the same result."""
    from identifiable.experiments.pipeline import concat_reduce
    from identifiable.experiments.scan import scan_result, scan_stage
    from identifiable.report.tables import ScanStageTables
    from identifiable.runs.scan import encode, make_plan

    model = models["llama-sdpa"]
    encs = [encode(model, t, None) for t in TEXTS]
    plan = make_plan(model, encs, [0, 1], [0, 1, 2, 3], 0, frozenset(), "paper",
                     torch.device("cpu"), None)  # fmt: skip
    stage = scan_stage(model, encs, plan, ["a", "b", "c"])
    tables = concat_reduce(
        [stage.compute(s, k, lambda m: None) for k, s in enumerate(stage.shards)]
    )
    contract = ScanStageTables.of({"scan": tables})
    assert list(contract.heads.columns) == ["text", "layer", "head", *STATISTICS]
    assert list(contract.texts["text"]) == [0, 1, 2] and contract.kept.empty
    rebuilt = scan_result(tables, plan, model, all_heads=True)
    direct = scan(model, TEXTS, progress=False)
    torch.testing.assert_close(rebuilt.null_fraction, direct.null_fraction, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["llama-sdpa", "gemma2-eager"])
def test_the_sink_columns_are_sink_mass(models, name):
    """One reduction behind both (`attention.sinks.key_mass`): the scan's sink columns at
    key 0 equal `sink_mass` of the trace, causal rows and sliding windows alike."""
    from identifiable.attention import sink_mass

    model = models[name]
    result = scan(model, TEXTS[:2], progress=False)
    for t, text in enumerate(TEXTS[:2]):
        sm = sink_mass(model.trace(text))
        torch.testing.assert_close(result.sink_raw[t], sm.raw, atol=1e-6, rtol=0)
        torch.testing.assert_close(result.sink_effective[t], sm.effective, atol=1e-5, rtol=0)
    assert result.sink_raw.max() > result.sink_raw.min()  # heads differ: not a constant


def test_a_device_the_model_is_not_on_is_refused(models):
    from identifiable.errors import IdentifiableError

    with pytest.raises(IdentifiableError, match=r"the model is on cpu, not on meta") as err:
        scan(models["llama-sdpa"], TEXTS, device="meta", progress=False)
    assert "\n" not in str(err.value) and "--device cpu" in err.value.for_cli()


def test_groups_of_one_key_value_head_share_its_solves(monkeypatch):
    """Groups of one head each (4 query heads reading 2 key/value heads): the second group
    of each key/value head reuses the first's rank decisions and block solves, and the
    reused map buffers leave the statistics and a kept map of the first group as they are
    with groups of 2."""
    import identifiable.attention.scan as scan_module
    from identifiable.attention.scan import LayerScanner, ScanPlan

    calls = []
    real = scan_module.layer_dims
    monkeypatch.setattr(scan_module, "layer_dims", lambda *a, **k: calls.append(1) or real(*a, **k))
    kv = torch.tensor([0, 0, 1, 1])
    got = {}
    for group in (1, 2):
        plan = ScanPlan((2,), (0, 1, 2, 3), 3, frozenset({(2, 0)}), "paper", torch.float32, group)
        scanner = LayerScanner(plan, kv)
        into = scanner.start()
        calls.clear()
        scanner(_view(lambda t: t, causal=True, window=None, n=60), into)
        got[group] = (into, len(calls))
    assert got[1][1] == 2 and got[2][1] == 2  # one decision per key/value head
    torch.testing.assert_close(got[1][0].stats, got[2][0].stats, atol=1e-12, rtol=0)
    assert got[1][0].stats[0, :, 2].min() > 0.05  # n = 60 > d_v: the projection did work
    for a, b in zip(got[1][0].kept[(2, 0)], got[2][0].kept[(2, 0)], strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_the_scan_keeps_no_key_value_cache(models):
    """The scan reads each layer's keys and values as the layer runs; the forward pass it
    runs builds no cache, which would hold every layer's to the end (benchmarks/records/
    scan.md: 9.5 MB a layer at 32 layers, n = 2,048)."""
    m = models["llama-sdpa"]
    seen: list[object] = []

    def record(module, args, kwargs):
        seen.append(kwargs.get("use_cache", "absent"))

    handle = m.hf_model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        got = scan(m, [TEXTS[0]], progress=False)
    finally:
        handle.remove()
    assert seen == [False]
    stats = np.stack([getattr(got, s)[0].numpy() for s in STATISTICS], -1)
    np.testing.assert_allclose(stats, reference(m, TEXTS[0], sink=0), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w_o_rows_are_views_or_one_layer_copy(models, dtype):
    """Every head of a float32 model: views of W_O, kept per layer at no cost. A
    half-precision model's float32 rows are converted copies: only the last layer asked
    for is kept, not one per layer (a float32 W_O of the whole model on its device)."""
    from identifiable.models.layerscan import LayerWeights

    hf = build_tiny_hf_model("llama", attn_implementation="sdpa").to(dtype)
    stack = Model.from_hf(hf, models["llama-sdpa"].tokenizer, name="tiny").stack
    weights = LayerWeights(stack, list(range(stack.n_heads)))
    first, second = weights.out_proj(0), weights.out_proj(1)
    assert first.dtype == second.dtype == torch.float32
    h, d_v = stack.n_heads, stack.head_dim
    expected = stack.weights[0].w_o.float().reshape(1, h, d_v, -1)
    torch.testing.assert_close(weights.out_proj(0), expected, rtol=0, atol=0)
    shares = first.data_ptr() == stack.weights[0].w_o.data_ptr()
    assert shares == (dtype == torch.float32)
    # kept: the same tensor again; a copy: made anew once another layer was asked for
    assert (weights.out_proj(0) is first) == (dtype == torch.float32)
    assert weights.out_proj(0) is weights.out_proj(0)
    subset = LayerWeights(stack, [1])
    assert subset.out_proj(0).data_ptr() != stack.weights[0].w_o.data_ptr()
    torch.testing.assert_close(subset.out_proj(0)[0, 0], expected[0, 1], rtol=0, atol=0)


def test_a_half_precision_scan_matches_its_float32_trace(models):
    """A bfloat16 model's scan (W_O converted per layer, one copy at a time) over two texts
    gives the statistics of the float32 analyses of its own trace."""
    hf = build_tiny_hf_model("llama", attn_implementation="sdpa").to(torch.bfloat16)
    m = Model.from_hf(hf, models["llama-sdpa"].tokenizer, name="tiny-bf16")
    got = scan(m, TEXTS[:2], progress=False)
    for i, text in enumerate(TEXTS[:2]):
        stats = np.stack([getattr(got, s)[i].numpy() for s in STATISTICS], -1)
        np.testing.assert_allclose(stats, reference(m, text, sink=0), rtol=0, atol=1e-5)
