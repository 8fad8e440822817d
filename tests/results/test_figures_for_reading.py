"""The shared colormap and panel-scale rule (`identifiable.results.colormap`), the plots that use it,
and `_repr_html_`'s headline and picture, checked against values computed here."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from identifiable.attention.effective import EffectiveAttention, NullSpace
from identifiable.attribution.api import HTAResult
from identifiable.mixing.result import MixingResult
from identifiable.results.colormap import NEUTRAL, STOPS, colour, matplotlib_cmap, panel_scale

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
TOKENS = ["[CLS]", "the", "<script>x</script>", "sat", "on", "a", "mat", "[SEP]"]
N = len(TOKENS)


def test_zero_is_neutral_the_ends_are_the_end_stops_and_signs_differ() -> None:
    for s in (1e-4, 0.3, 7.0):
        assert colour(0.0, s) == NEUTRAL == (247, 247, 247)
        assert colour(s, s) == STOPS[-1] and colour(-s, s) == STOPS[0]
        assert colour(5 * s, s) == STOPS[-1] and colour(-5 * s, s) == STOPS[0]  # saturates
        r, _, b = colour(0.4 * s, s)
        assert r > b  # red above 0
        r, _, b = colour(-0.4 * s, s)
        assert b > r  # blue below 0
    # between two stops the colour is their linear mix: t = 1/8 is halfway from NEUTRAL
    # (t = 0) to the next stop (t = 1/4)
    mid = colour(0.25, 2.0)
    want = tuple(int(np.floor((a + b) / 2 + 0.5)) for a, b in zip(NEUTRAL, STOPS[5], strict=True))
    assert mid == want


def test_matplotlib_uses_the_same_colours() -> None:
    cmap = matplotlib_cmap()
    for t in np.linspace(-1, 1, 41):
        got = np.round(np.array(cmap((t + 1) / 2)[:3]) * 255)
        want = np.array(colour(float(t), 1.0))
        # matplotlib samples the ramp at 256 levels: within one level of the exact mix
        assert np.abs(got - want).max() <= 2.5, (t, got, want)


def cls_panel(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rest = rng.uniform(-0.009, 0.009, size=(N, N - 1))  # about 100× below the [CLS] column
    return np.concatenate([np.full((N, 1), 0.95), rest], axis=1)


def test_a_panel_100x_below_its_cls_column_still_spans_the_scale() -> None:
    v = cls_panel()
    s = panel_scale(v)
    assert s == pytest.approx(np.percentile(np.abs(v[:, 1:]), 99))  # the stated rule
    assert s < 0.01 < 0.95
    t = v[:, 1:] / s
    assert t.max() > 0.9 and t.min() < -0.9  # both ends of the colormap are used
    # the scale the viewer used to take (the largest |value|, set by [CLS]) washes it out
    washed = [colour(float(x), panel_scale(v, skip_first_key=False)) for x in v[:, 1:].ravel()]
    assert panel_scale(v, skip_first_key=False) > 0.9
    assert max(abs(c - n) for rgb in washed for c, n in zip(rgb, NEUTRAL, strict=True)) < 8
    # masked cells do not count; an all-zero panel has scale 1; a panel whose only
    # non-zero column is key 0 falls back to its largest value
    visible = np.ones_like(v, dtype=bool)
    visible[:, 1:] = np.tril(np.ones((N, N - 1), dtype=bool))
    assert panel_scale(v, visible=visible) == pytest.approx(
        np.percentile(np.abs(v[:, 1:][visible[:, 1:]]), 99)
    )
    assert panel_scale(np.zeros((3, 3))) == 1.0
    only_cls = np.zeros((4, 4))
    only_cls[:, 0] = 0.5
    assert panel_scale(only_cls) == 0.5


def effective_result(n: int = N) -> EffectiveAttention:
    g = torch.Generator().manual_seed(3)
    raw = torch.rand(2, 3, n, n, generator=g, dtype=torch.float64).softmax(-1)
    raw[..., 0] += 2.0  # a [CLS]-heavy column
    raw = raw / raw.sum(-1, keepdim=True)
    amp = torch.tensor([0.01, 0.05, 0.1, 0.02, 0.2, 0.0], dtype=torch.float64).reshape(2, 3, 1, 1)
    eff = raw + amp * torch.randn(raw.shape, generator=g, dtype=torch.float64)
    dims = torch.tensor([[4, 4, 4], [4, 4, 0]]).reshape(2, 3, 1).expand(2, 3, n).contiguous()
    ns = NullSpace(
        rank=n - dims, dim=dims, dim_stochastic=dims, out_proj_full_row_rank=torch.ones(2, 3, dtype=torch.bool),
        is_causal=False, tokens=TOKENS[:n],
    )  # fmt: skip
    return EffectiveAttention(raw, eff, "paper", ns, tokens=TOKENS[:n], model_name="m<1>")


def test_effective_plot_gives_each_panel_its_own_scale_and_states_the_rule() -> None:
    res = effective_result()
    fig = res.plot(layer=1, head=1)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["raw", "effective", "null"]
    a = res.raw[1, 1].numpy()
    e = res.effective[1, 1].numpy()
    for ax, values in zip(panels, (a, e, a - e), strict=True):
        image = ax.images[0]
        s = np.percentile(np.abs(values[:, 1:]), 99)
        assert image.get_clim() == pytest.approx((-s, s))
        assert image.get_cmap().name == "identifiable"
    scales = [ax.images[0].get_clim()[1] for ax in panels]
    assert len({round(v, 9) for v in scales}) == 3  # no panel is drawn on another's scale
    labels = [ax.get_xlabel() for ax in fig.axes if not ax.get_title()]
    assert len(labels) == 3 and all("99th pct of |value| outside key 0" in t for t in labels)
    ARTIFACTS.mkdir(exist_ok=True)
    fig.savefig(ARTIFACTS / "plot-effective.png", dpi=80)


def _number(html: str, before: str) -> float:
    m = re.search(re.escape(before) + r"\s*([-\d.]+)", html)
    assert m, (before, html[:600])
    return float(m.group(1))


def test_effective_headline_and_picture() -> None:
    res = effective_result()
    html = res._repr_html_()
    frac = [
        torch.linalg.matrix_norm(res.raw[k, h] - res.effective[k, h])
        / torch.linalg.matrix_norm(res.raw[k, h])
        for k in range(2)
        for h in range(3)
    ]
    want = float(torch.stack(frac).mean())
    assert _number(html, "‖A − A_eff‖_F / ‖A‖_F =") == pytest.approx(want, abs=6e-4)
    assert "largest" in html and "layer 1, head 1" in html  # amp 0.2 is head (1, 1)
    assert f"n = {N} tokens against rank(T)" in html and "dim LN(T) = 4" in html
    assert html.count("<svg") == 1 and html.count("<rect") == 6  # one cell per head
    assert "<script" not in html and "&lt;script&gt;" in html and "m&lt;1&gt;" in html


def test_hta_headline_is_the_own_token_share_and_ids_have_no_min_max() -> None:
    g = torch.Generator().manual_seed(1)
    c = torch.rand(3, N, N, generator=g, dtype=torch.float64)
    c = c / c.sum(-1, keepdim=True)
    ids = torch.tensor([101, 1996, 4937, 2938, 2006, 1037, 13523, 102])
    res = HTAResult(
        contributions=c, stderr=None, sq_norms=c, sq_norms_stderr=None, tokens=TOKENS,
        input_ids=ids, special=torch.zeros(N, dtype=torch.bool), probes=None, seed=0,
        n_jvps=0, chunk_size=1, seconds=0.0,
    )  # fmt: skip
    html = res._repr_html_()
    want = sum(float(c[-1, i, i]) for i in range(N)) / N
    assert _number(html, "mean c_ii =") == pytest.approx(want, abs=6e-4)
    assert "last layer (layer 2)" in html
    row = re.search(r"<tr><td><code>input_ids</code>.*?</tr>", html).group(0)
    assert "101" not in row and "1.352e+04" not in row  # token ids have no min / max
    assert html.count("<svg") == 1


def test_mixing_headline_names_the_method_and_its_locality() -> None:
    g = torch.Generator().manual_seed(2)
    maps = torch.rand(2, N, N, generator=g, dtype=torch.float64)
    maps[-1] = torch.eye(N, dtype=torch.float64) * 3 + maps[-1]
    res = MixingResult(maps, None, "alti", TOKENS, {})
    html = res._repr_html_()
    last = maps[-1].numpy()
    near = [sum(last[i, j] for j in range(N) if abs(i - j) <= 1) / last[i].sum() for i in range(N)]
    assert "method alti" in html
    assert _number(html, "locality at the last layer:") == pytest.approx(np.mean(near), abs=6e-4)
    assert html.count("<svg") == 1 and "layerwise, layer 1" in html


def test_interval_plot_fits_its_axis_to_the_row() -> None:
    from identifiable.attention.intervals import AttentionIntervals

    raw = torch.tensor([0.25, 0.2, 0.15, 0.12, 0.1, 0.08, 0.06, 0.04], dtype=torch.float64)
    res = AttentionIntervals(0, 0, 3, raw, raw - 0.02, raw + 0.03, 4, 0, tokens=TOKENS)
    ax = res.plot().axes[0]
    lo, hi = ax.get_ylim()
    assert lo < 0.02 and hi > 0.28 and hi - lo < 0.3  # not 0..1: a 0.05 interval is 1/6 of it
    assert "fitted to the row" in ax.get_ylabel()
