"""The certified head in the viewer: interval bands of every computed row, identifiable marks,
constrained attention as a fourth map on the shared scale, within the page and time budgets."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

import identifiable.attention as attention
import identifiable.viewer.build as viewer_mod
from identifiable.attention import constrained_attention, interval_map
from identifiable.cli import main
from identifiable.results.colormap import STOPS, panel_scale
from identifiable.results.colormap import colour as shared_colour
from identifiable.store.files import atomic_write_text
from identifiable.viewer.build import certify_head, viewer_html_for_trace
from identifiable.viewer.encoding import (
    IDENTIFIABLE_BELOW,
    CertifiedHead,
    decode_certified,
    decode_head,
    encode_certified,
    spread_order,
)
from identifiable.viewer.page import read_viewer_data, viewer_fragment, viewer_html
from viewer.test_viewer_browser import HOSTILE, P, assert_clean, synthetic_args

TEXT = ("The river rose after the storm, and the old bridge closed.", "Trains stopped.")


def fabricated_certified(
    raw: torch.Tensor,
    rows: list[int],
    *,
    layer: int = 1,
    head: int = 2,
    causal: bool = False,
    seed: int = 0,
    threshold: float = IDENTIFIABLE_BELOW,
) -> CertifiedHead:
    """Bands around the raw rows of one head with widths on both sides of the threshold:
    per key, width 0, 0.99·threshold, 1.01·threshold or a wide one (0.05 .. 0.5), in a
    pattern that differs by row, so marks that ignore the data cannot match."""
    rng = np.random.default_rng(seed)
    a = raw[layer, head].double().numpy()[rows]
    n = a.shape[1]
    keys = np.ones((len(rows), n), dtype=bool)
    if causal:
        keys = np.arange(n)[None, :] <= np.array(rows)[:, None]
    choice = rng.integers(0, 4, size=a.shape)
    wide = rng.uniform(0.05, 0.5, size=a.shape)
    width = np.select(
        [choice == 0, choice == 1, choice == 2], [0.0, 0.99 * threshold, 1.01 * threshold], wide
    )
    share = rng.uniform(0, 1, size=a.shape)  # where raw sits inside its band
    lower = np.where(keys, np.maximum(a - share * width, 0.0), 0.0)
    upper = np.where(keys, lower + width, 0.0)
    a = np.where(keys, a, 0.0)
    constrained = np.where(keys, lower + 0.5 * (upper - lower), 0.0)
    return CertifiedHead(
        layer=layer,
        head=head,
        rows=np.array(rows, dtype=np.int64),
        raw=a,
        lower=lower,
        upper=upper,
        constrained=constrained,
        keys=keys,
        threshold=threshold,
        n_rows=n,
        note=f"fabricated: rows {rows}",
    )


def certified_args(rows: list[int], **extra: Any) -> tuple[dict[str, Any], CertifiedHead]:
    args = synthetic_args(**extra)
    cert = fabricated_certified(args["raw"], rows, causal=args["is_causal"])
    return args | {"certified": cert}, cert


# ---- without a browser -----------------------------------------------------------------


def test_certified_data_round_trip_keeps_order_and_exact_marks() -> None:
    args, cert = certified_args([6, 0, 3, 7, 1])
    (data,) = read_viewer_data(viewer_html(**args))
    entry = data["certified"]
    assert entry["bits"] == 16 and entry["dropped"] == 0 and entry["threshold"] == 0.01
    got = decode_certified(entry, len(HOSTILE))
    order = np.argsort(cert.rows)
    assert got["rows"].tolist() == [0, 1, 3, 6, 7]
    step = entry["q"][1]
    for name in ("raw", "lower", "upper", "constrained"):
        assert np.abs(got[name] - getattr(cert, name)[order]).max() <= step / 2 + 1e-12
    # one monotone quantiser: bands never exclude the raw weight after rounding
    assert np.all(got["lower"] <= got["raw"]) and np.all(got["raw"] <= got["upper"])
    # the marks are exact: widths 0.99·t are marked, 1.01·t are not (both present)
    width = cert.upper - cert.lower
    assert np.array_equal(got["identifiable"], (width < 0.01)[order])
    near = np.isclose(width, 0.0099) | np.isclose(width, 0.0101)
    assert near.sum() >= 10 and 0 < got["identifiable"][near[order]].sum() < near.sum()
    assert got["keys"].all()


def test_the_page_budget_holds_at_512_tokens() -> None:
    # 512 tokens, every row certified; incompressible bands (uniform noise) in the worst case
    args = synthetic_args(repeat=64)
    n = len(args["tokens"])
    rng = np.random.default_rng(1)
    lower = rng.uniform(0, 0.5, size=(n, n))
    upper = lower + rng.uniform(0, 0.5, size=(n, n))
    cert = CertifiedHead(
        1, 2, np.array(spread_order(list(range(n)))), (lower + upper) / 2, lower, upper,
        rng.uniform(0, 1, size=(n, n)), np.ones((n, n), dtype=bool), n_rows=n,
    )  # fmt: skip
    for max_bytes, bits in ((9_000_000, 16), (2_000_000, 8), (1_000_000, 8)):
        page = viewer_html(**args | {"max_bytes": max_bytes, "certified": cert})
        assert len(page.encode()) <= max_bytes, max_bytes
        (data,) = read_viewer_data(page)
        entry = data["certified"]
        assert entry["bits"] == bits
        kept = len(entry["rows"])
        assert kept + entry["dropped"] == n
        # what a tight budget keeps is a prefix of the spread order, not the first rows
        assert sorted(entry["rows"]) == sorted(cert.rows[:kept].tolist())
        if bits == 8:  # noise does not fit a third of the page: a spread prefix of rows
            assert 0 < kept < n and max(entry["rows"]) == n - 1 and min(entry["rows"]) == 0
        else:
            assert kept == n
        assert data["matrices"]["1,2"]["f"] == 1  # the chosen head stays at full resolution
    small, used = encode_certified(cert, max_bytes=200_000)
    assert small is not None and used <= 200_000 and small["dropped"] > 0


def test_bad_certified_data_is_refused() -> None:
    args, cert = certified_args([0, 1])
    for change, message in (
        ({"layer": 3}, "outside the model"),
        ({"lower": cert.lower[:1]}, r"certified lower must be \[R, n\]"),
        ({"rows": np.array([1, 1])}, "distinct rows"),
        ({"threshold": 0.0}, r"threshold must be in \(0, 1\)"),
    ):
        with pytest.raises(ValueError, match=message):
            viewer_html(**args | {"certified": dataclasses.replace(cert, **change)})


# ---- in the browser ----------------------------------------------------------------------

PIXEL = """([sel, x, y]) => Array.from(document.querySelector(sel).getContext('2d')
  .getImageData(x, y, 1, 1).data.slice(0, 3))"""


def cell_colour(page: Any, kind: str, i: int, j: int, n: int, root: Any = None) -> list[int]:
    """The colour at the centre of cell (i, j) of a 300 px map."""
    sel = P(f"map-{kind}")
    if root is not None:
        return root.locator(sel).evaluate(
            "(c, [x, y]) => Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3))",
            [int((j + 0.5) * 300 / n), int((i + 0.5) * 300 / n)],
        )
    return page.evaluate(PIXEL, [sel, int((j + 0.5) * 300 / n), int((i + 0.5) * 300 / n)])


GREEN, PALE, GREY = [27, 122, 58], [244, 241, 236], [225, 225, 225]

BAND_SPANS = """(sel) => [...document.querySelectorAll(sel + ' table tr[data-key]')].map((tr) => {
  const s = tr.querySelector('.idf-span');
  return [+tr.dataset.key, parseFloat(s.style.left), parseFloat(s.style.width),
          tr.classList.contains('idf-ident'), s.classList.contains('idf-span-ident')];
})"""


@pytest.mark.browser
@pytest.mark.parametrize("causal", [False, True])
def test_bands_render_for_every_computed_row(tmp_path: Path, open_page: Any, causal: bool) -> None:
    rows = [0, 2, 3, 6, 7]
    args, cert = certified_args(rows, causal=causal)
    loaded = open_page(atomic_write_text(tmp_path / "v.html", viewer_html(**args)))
    page = loaded.page
    n = len(HOSTILE)
    for k, i in enumerate(rows):
        page.click(f".idf-tokens span[data-index='{i}']")
        expect(page.locator(P("interval-panel") + " h3")).to_contain_text(f"query {i} ")
        spans = page.evaluate(BAND_SPANS, P("interval-panel"))
        seen = np.flatnonzero(cert.keys[k])
        assert sorted(s[0] for s in spans) == seen.tolist()  # one band per key the row sees
        # bars are drawn on the row's own axis [x0, x1] (the table states it)
        x0, x1 = map(
            float, page.get_attribute(P("interval-panel") + " table", "data-axis").split(",")
        )
        for j, left, width, _, _ in spans:
            lo, hi = (100 * (v - x0) / (x1 - x0) for v in (cert.lower[k, j], cert.upper[k, j]))
            assert abs(left - lo) < 0.02
            want = max(0.5, hi - lo)
            assert abs(width - want) < 0.01
        assert "constrained row C" in page.inner_text(P("interval-panel"))
    # the width map: computed rows are drawn, the others pale, unseen keys grey
    for i in range(n):
        colours = [cell_colour(page, "width", i, j, n) for j in range(n)]
        if i not in rows:
            assert all(c == PALE for c in colours) and "idf-has-intervals" not in (
                page.get_attribute(f".idf-tokens span[data-index='{i}']", "class") or ""
            )
        else:
            k = rows.index(i)
            for j, c in enumerate(colours):
                assert (c == GREY) == (not cert.keys[k, j])
                assert c != PALE
    page.click(".idf-tokens span[data-index='1']")
    assert "not precomputed" in page.inner_text(P("interval-panel"))
    assert "fabricated: rows" in page.inner_text(P("coverage-note"))
    assert_clean(loaded)
    if not causal:
        loaded.screenshot("viewer-certified.png")


@pytest.mark.browser
def test_identifiable_marks_match_the_data(tmp_path: Path, open_page: Any) -> None:
    rows = list(range(len(HOSTILE)))
    args, cert = certified_args(rows)
    loaded = open_page(atomic_write_text(tmp_path / "v.html", viewer_html(**args)))
    page = loaded.page
    n = len(HOSTILE)
    exact = cert.upper - cert.lower < 0.01
    assert 5 < exact.sum() < exact.size - 5
    for i in rows:
        page.click(f".idf-tokens span[data-index='{i}']")
        expect(page.locator(P("interval-panel") + " h3")).to_contain_text(f"query {i} ")
        spans = page.evaluate(BAND_SPANS, P("interval-panel"))
        marked = sorted(j for j, _, _, ident, _ in spans if ident)
        assert marked == np.flatnonzero(exact[i]).tolist(), i
        assert all(ident == green for _, _, _, ident, green in spans)
        assert f"{exact[i].sum()} of {n} keys are identifiable" in page.inner_text(
            P("interval-panel")
        )
        for j in range(n):
            assert (cell_colour(page, "width", i, j, n) == GREEN) == bool(exact[i, j]), (i, j)
    # the threshold is stated and justified on the page
    note = page.inner_text(P("threshold-note"))
    assert "below 0.01" in note and "Why 0.01" in note
    page.hover(P("map-width"), position={"x": 5, "y": 5})
    readout = page.inner_text(P("hover"))
    assert ("✓ identifiable" in readout) == bool(exact[0, 0])
    assert_clean(loaded)


@pytest.mark.browser
def test_a_stricter_threshold_changes_the_marks(tmp_path: Path, open_page: Any) -> None:
    # The same bands with threshold 0.1: the wide ones (≥ 0.05) split, more keys are marked.
    args = synthetic_args()
    cert = fabricated_certified(args["raw"], list(range(8)), threshold=0.1)
    loaded = open_page(
        atomic_write_text(tmp_path / "v.html", viewer_html(**args | {"certified": cert}))
    )
    page = loaded.page
    exact = cert.upper - cert.lower < 0.1
    assert (exact & ~(cert.upper - cert.lower < 0.01)).any()
    page.click(".idf-tokens span[data-index='4']")
    spans = page.evaluate(BAND_SPANS, P("interval-panel"))
    assert sorted(j for j, _, _, ident, _ in spans if ident) == np.flatnonzero(exact[4]).tolist()
    assert "below 0.1" in page.inner_text(P("threshold-note"))
    assert_clean(loaded)


def colour(v: float, m: float) -> list[int]:
    """The page's diverging colour (viewer.js `colour`), for checking pixels."""
    return list(shared_colour(v, m))


@pytest.mark.browser
def test_the_constrained_map_renders_on_its_own_scale(tmp_path: Path, open_page: Any) -> None:
    rows = [0, 1, 2, 3, 4, 5, 6, 7]
    args, cert = certified_args(rows)
    # one constrained weight far above the rest: the 99th percentile rule keeps the scale
    # below it (it saturates), and raw attention keeps its own scale
    cert.constrained[5, 2] = 1.7
    loaded = open_page(atomic_write_text(tmp_path / "v.html", viewer_html(**args)))
    page = loaded.page
    n = len(HOSTILE)
    (data,) = read_viewer_data(page.content())
    got = decode_certified(data["certified"], n)["constrained"]
    s_con = panel_scale(got)
    assert s_con < 1.7
    shown = float(page.get_attribute(P("scale-constrained"), "data-scale"))
    assert abs(shown - s_con) < 1e-9
    for i in (0, 5, 7):
        for j in (0, 2, 6):
            want = colour(got[i, j], s_con)
            assert all(
                abs(a - b) <= 1
                for a, b in zip(cell_colour(page, "constrained", i, j, n), want, strict=True)
            )
    # raw attention is drawn on its own scale
    raw, _ = decode_head(data["matrices"]["1,2"], n)
    s_raw = panel_scale(raw)
    assert abs(float(page.get_attribute(P("scale-raw"), "data-scale")) - s_raw) < 1e-9
    for j in range(n):
        want = colour(raw[0, j], s_raw)
        assert all(
            abs(a - b) <= 1 for a, b in zip(cell_colour(page, "raw", 0, j, n), want, strict=True)
        )
    page.hover(P("map-constrained"), position={"x": 5, "y": 5})
    assert "constrained" in page.inner_text(P("hover"))
    # another head: the certified maps say which head they belong to
    page.locator("table.idf-grid td[data-layer='0'][data-head='0']").click()
    expect(page.locator(P("head-status"))).to_contain_text("layer 0, head 0")
    pale = cell_colour(page, "constrained", 4, 4, n)
    assert pale == [244, 246, 248]  # the placeholder's background
    page.locator("table.idf-grid td[data-layer='1'][data-head='2']").click()
    expect(page.locator(P("head-status"))).to_contain_text("layer 1, head 2")
    assert cell_colour(page, "constrained", 5, 2, n) == colour(1.7, s_con) == list(STOPS[-1])
    assert_clean(loaded)


@pytest.mark.browser
def test_rows_without_a_constrained_row_are_pale_and_say_so(tmp_path: Path, open_page: Any) -> None:
    rows = [0, 7, 3, 5]
    args, cert = certified_args(rows)
    cert = dataclasses.replace(cert, constrained_rows=np.array([True, True, False, False]))
    loaded = open_page(
        atomic_write_text(tmp_path / "v.html", viewer_html(**args | {"certified": cert}))
    )
    page = loaded.page
    n = len(HOSTILE)
    for i in range(n):
        pale = cell_colour(page, "constrained", i, 2, n) == PALE
        assert pale == (i not in (0, 7)), i
        # the bands do not depend on it: rows 3 and 5 still have theirs
        assert (cell_colour(page, "width", i, 2, n) == PALE) == (i not in rows), i
    page.click(".idf-tokens span[data-index='5']")
    expect(page.locator(P("interval-panel") + " h3")).to_contain_text("query 5 ")
    panel = page.inner_text(P("interval-panel"))
    assert "constrained row C" not in panel
    assert len(page.evaluate(BAND_SPANS, P("interval-panel"))) == n
    page.hover(P("map-constrained"), position={"x": 125, "y": 5.5 * 250 / n})  # CSS size 250 px
    assert "constrained not computed for this row" in page.inner_text(P("hover"))
    page.click(".idf-tokens span[data-index='7']")
    expect(page.locator(P("interval-panel") + " h3")).to_contain_text("query 7 ")
    assert "constrained row C" in page.inner_text(P("interval-panel"))
    assert_clean(loaded)


@pytest.mark.browser
def test_a_512_token_page_with_a_certified_head_renders_offline(
    tmp_path: Path, open_page: Any
) -> None:
    args = synthetic_args(repeat=64, max_bytes=2_000_000)
    n = len(args["tokens"])
    cert = fabricated_certified(args["raw"], spread_order(list(range(n))))
    page_html = viewer_html(**args | {"certified": cert})
    assert len(page_html.encode()) <= 2_000_000
    loaded = open_page(atomic_write_text(tmp_path / "v.html", page_html))
    page = loaded.page
    (data,) = read_viewer_data(page_html)
    covered = set(data["certified"]["rows"])
    exact = (cert.upper - cert.lower < 0.01)[np.argsort(cert.rows)]
    for i in (0, 255, n - 1):
        if i in covered:
            page.click(f".idf-tokens span[data-index='{i}']")
            expect(page.locator(P("interval-panel") + " h3")).to_contain_text(f"query {i} ")
            spans = page.evaluate(BAND_SPANS, P("interval-panel"))
            assert len(spans) == n
            assert (
                sorted(j for j, _, _, ident, _ in spans if ident)
                == np.flatnonzero(exact[i]).tolist()
            )
    for kind in ("constrained", "width"):
        assert cell_colour(page, kind, 0, 100, n) not in (PALE, [244, 246, 248])
    assert_clean(loaded)


@pytest.mark.browser
def test_two_viewers_keep_their_own_certified_heads(tmp_path: Path, open_page: Any) -> None:
    a, cert_a = certified_args([3])
    b = synthetic_args(seed=1, layer=1, head=2)
    cert_b = fabricated_certified(b["raw"], [3], seed=5)
    doc = (
        '<!doctype html><html><head><meta charset="utf-8"><title>host</title></head><body>'
        + viewer_fragment(**a)
        + viewer_fragment(**b | {"certified": cert_b})
        + "</body></html>"
    )
    loaded = open_page(atomic_write_text(tmp_path / "two.html", doc), wait_ready=False)
    page = loaded.page
    roots = page.locator(".idf-viewer")
    for k in range(2):
        roots.nth(k).and_(page.locator("[data-ready='1']")).wait_for(timeout=15_000)
    for root, cert in ((roots.nth(0), cert_a), (roots.nth(1), cert_b)):
        root.locator(".idf-tokens span[data-index='3']").click()
        marked = root.locator(P("interval-panel") + " tr.idf-ident").evaluate_all(
            "(trs) => trs.map((t) => +t.dataset.key)"
        )
        assert sorted(marked) == np.flatnonzero(cert.upper[0] - cert.lower[0] < 0.01).tolist()
    assert np.any((cert_a.upper - cert_a.lower < 0.01) != (cert_b.upper - cert_b.lower < 0.01))
    assert_clean(loaded)


# ---- on real (tiny) models ------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_the_page_holds_the_interval_map_and_constrained_attention(
    tiny_model: Any, arch: str
) -> None:
    trace = tiny_model(arch).trace(TEXT)
    n = trace.n_tokens
    html = viewer_html_for_trace(trace, layer=1, head=2, rows=[4], max_rows=2, interval_seconds=60)
    (data,) = read_viewer_data(html)
    entry = data["certified"]
    assert (entry["layer"], entry["head"]) == (1, 2)
    assert entry["rows"] == list(range(n)) and entry["constrained_rows"] == list(range(n))
    assert f"interval bands for all {n} rows; constrained attention for all {n}" in entry["note"]
    got = decode_certified(entry, n)
    imap = interval_map(trace, layers=[1], heads=[2])
    con = constrained_attention(trace, 1, 2)
    err = entry["q"][1] / 2 + 1e-12
    assert np.abs(got["lower"] - imap.lower[0, 0].numpy()).max() <= err
    assert np.abs(got["upper"] - imap.upper[0, 0].numpy()).max() <= err
    assert np.abs(got["constrained"] - con.weights.numpy()).max() <= err
    assert np.array_equal(got["keys"], imap.keys[0].numpy())
    width = (imap.upper - imap.lower)[0, 0].numpy()
    assert np.array_equal(got["identifiable"], (width < 0.01) & imap.keys[0].numpy())
    # constrained attention is a distribution inside every band
    assert np.allclose(con.weights.sum(-1).numpy(), 1, atol=1e-9)
    assert np.all(got["lower"] <= got["constrained"] + 2 * err)
    assert np.all(got["constrained"] <= got["upper"] + 2 * err)
    if trace.is_causal:
        assert np.array_equal(got["keys"], np.tril(np.ones((n, n), dtype=bool)))
    # witnesses: the row asked for first, then spread rows, --max-rows in all
    assert sorted(data["intervals"]) == ["1,2,0", "1,2,4"]
    iv = data["intervals"]["1,2,4"]
    assert np.allclose(iv["lo"], imap.lower[0, 0, 4].numpy(), atol=6e-5)
    assert data["start_row"] == 4


def test_the_time_budget_keeps_a_spread_prefix(tiny_model: Any, monkeypatch: Any) -> None:
    trace = tiny_model("bert").trace(TEXT)
    n = trace.n_tokens
    clock = [0.0]
    solve, project = attention.interval_map, attention.constrained_attention
    cost = {"bands": 1.0, "constrained": 3.0}  # simulated seconds per row

    def timed_map(tr: Any, **kw: Any) -> Any:
        clock[0] += cost["bands"] * len(kw["rows"])
        return solve(tr, **kw)

    def timed_con(tr: Any, layer: int, head: int, **kw: Any) -> Any:
        clock[0] += cost["constrained"] * len(kw["rows"])
        return project(tr, layer, head, **kw)

    monkeypatch.setattr(attention, "interval_map", timed_map)
    monkeypatch.setattr(attention, "constrained_attention", timed_con)
    monkeypatch.setattr(viewer_mod, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    cert = certify_head(trace, 0, 1, seconds=24)
    done = cert.rows.tolist()
    with_con = cert.constrained_rows
    assert 1 < len(done) < n and done == spread_order(list(range(n)))[: len(done)]
    # constrained rows are a prefix of the band rows: spread too
    k = int(with_con.sum())
    assert 1 <= k < len(done) and with_con[:k].all() and not with_con[k:].any()
    # each gets about half of the time, and the budget holds (both costs are exact here)
    spent_bands, spent_con = len(done) * 1.0, k * 3.0
    assert clock[0] == spent_bands + spent_con <= 24
    assert abs(spent_bands - spent_con) <= 6
    assert f"interval bands for {len(done)} of {n} rows" in cert.note
    assert f"constrained attention for {k} of {n} rows" in cert.note
    assert "stopped after 24 s" in cert.note
    # constrained rows hold constrained_attention's rows, the others are not claimed
    want = project(trace, 0, 1, rows=done[:k]).weights.numpy()
    assert np.abs(cert.constrained[:k] - want).max() < 1e-12
    clock[0] = 0.0
    first = certify_head(trace, 0, 1, seconds=0, rows=[7, 3])  # asked rows always done
    assert first.rows.tolist() == [7, 3] and first.constrained_rows.tolist() == [True, True]
    clock[0] = 0.0
    assert certify_head(trace, 0, 1, seconds=0).rows.tolist() == [0]
    clock[0] = 0.0
    cost["constrained"] = 0.0
    everything = certify_head(trace, 0, 1, seconds=1000)
    assert sorted(everything.rows.tolist()) == list(range(n))
    assert everything.constrained_rows.all() and f"all {n} rows" in everything.note


def test_no_certify_leaves_the_map_out(tiny_model: Any) -> None:
    trace = tiny_model("bert").trace(TEXT)
    (data,) = read_viewer_data(viewer_html_for_trace(trace, certify=False))
    assert data["certified"] is None and data["intervals"] == {}
    assert "--no-certify" in data["interval_note"]


# ---- the CLI ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "1", "-0.1", "nan", "2"])
def test_view_cli_bad_threshold_is_one_line(tmp_path: Path, capsys: Any, value: str) -> None:
    out = tmp_path / "v.html"
    with pytest.raises(SystemExit) as exit_:
        main(["view", "the cat", "--identifiable-below", value, "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--identifiable-below must be" in err
    assert "Traceback" not in err and not out.exists()


def test_view_cli_certify_flags(tiny_model: Any, tmp_path: Path) -> None:
    model = tiny_model("bert")
    folder = tmp_path / "tiny-bert"
    model.hf_model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    on, off = tmp_path / "on.html", tmp_path / "off.html"
    base = ["view", "the cat sat on the mat", "--model", str(folder), "--layer", "1", "--head", "1"]
    main([*base, "--out", str(on), "--identifiable-below", "0.05", "--interval-seconds", "60"])
    main([*base, "--out", str(off), "--no-certify"])
    (data_on,) = read_viewer_data(on.read_text("utf-8"))
    (data_off,) = read_viewer_data(off.read_text("utf-8"))
    assert data_on["certified"]["threshold"] == 0.05 and data_on["threshold"] == 0.05
    assert (data_on["certified"]["layer"], data_on["certified"]["head"]) == (1, 1)
    assert len(data_on["certified"]["rows"]) == data_on["n"]
    assert data_off["certified"] is None
