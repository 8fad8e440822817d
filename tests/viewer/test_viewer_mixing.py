"""Context-mixing maps in the viewer: chosen in place of raw/effective/null attention, one
map per layer (the head selector does not apply), within the page budget, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

from identifiable.cli import main
from identifiable.store.files import atomic_write_text
from identifiable.viewer.encoding import MixingMaps, decode_map
from identifiable.viewer.page import read_viewer_data, viewer_fragment, viewer_html
from viewer.test_viewer_browser import CANVAS_STATS, HOSTILE, P, assert_clean, synthetic_args

PIXELS = """(sel) => {
  const c = document.querySelector(sel);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let s = 0;
  for (let k = 0; k < d.length; k += 4 * 13) s = (s * 31 + d[k] + 7 * d[k + 1] + 13 * d[k + 2]) % 1000000007;
  return s;
}"""


def fabricated_mixing(n_layers: int, n: int, seed: int = 0) -> list[MixingMaps]:
    """Two methods whose maps differ by layer and by method (rows sum to 1)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.softmax(3 * torch.randn(n_layers, n, n, generator=gen), -1).double()
    b = torch.eye(n).expand(n_layers, n, n).double() * torch.arange(1, n_layers + 1)[:, None, None]
    return [MixingMaps("globenc", a, "rolled out"), MixingMaps("alti", b / n_layers, "layer")]


def test_mixing_maps_are_stored_per_layer_within_their_error() -> None:
    args = synthetic_args()
    mixing = fabricated_mixing(3, len(HOSTILE))
    (data,) = read_viewer_data(viewer_html(**args, mixing=mixing))
    assert list(data["mixing"]) == ["globenc", "alti"]
    for m in mixing:
        layers = data["mixing"][m.name]["layers"]
        assert len(layers) == 3
        for layer, entry in enumerate(layers):
            got = decode_map(entry, len(HOSTILE))
            step = entry["v"][1]
            assert np.abs(got - m.maps[layer].numpy()).max() <= step / 2 + 1e-12


def test_mixing_maps_fit_the_page_budget_on_a_long_text() -> None:
    args = synthetic_args(repeat=64, max_bytes=1_000_000)  # 512 tokens
    n = len(args["tokens"])
    gen = torch.Generator().manual_seed(3)
    noise = [MixingMaps(f"m{k}", torch.rand(3, n, n, generator=gen).double()) for k in range(3)]
    page = viewer_html(**args, mixing=noise)
    assert len(page.encode()) <= 1_000_000
    (data,) = read_viewer_data(page)
    # incompressible noise does not fit at full resolution: previews, one per layer
    assert all(e["f"] > 1 for m in data["mixing"].values() for e in m["layers"])


def test_bad_mixing_shapes_and_names_are_refused() -> None:
    args = synthetic_args()
    with pytest.raises(ValueError, match=r"must be \[L, n, n\]"):
        viewer_html(**args, mixing=[MixingMaps("x", torch.zeros(2, 8, 8))])
    twice = fabricated_mixing(3, len(HOSTILE))[:1] * 2
    with pytest.raises(ValueError, match="distinct names"):
        viewer_html(**args, mixing=twice)


@pytest.mark.browser
def test_a_method_map_replaces_the_attention_maps_and_switches(
    tmp_path: Path, open_page: Any
) -> None:
    args = synthetic_args()
    path = atomic_write_text(
        tmp_path / "mix.html", viewer_html(**args, mixing=fabricated_mixing(3, len(HOSTILE)))
    )
    loaded = open_page(path)
    page = loaded.page
    assert page.locator(P("figure-mixing")).is_hidden()
    assert page.locator(P("show") + " option").all_inner_texts() == [
        "raw · effective · null attention",
        "mixing: globenc",
        "mixing: alti",
    ]
    page.select_option(P("show"), "globenc")
    expect(page.locator(P("figure-mixing"))).to_be_visible()
    for kind in ("raw", "effective", "null"):
        assert page.locator(P(f"figure-{kind}")).is_hidden()
    expect(page.locator(P("head"))).to_be_disabled()
    expect(page.locator(P("head-status"))).to_contain_text("head selector does not apply")
    assert page.evaluate(CANVAS_STATS, P("map-mixing")) > 3, "method map is blank"
    layer1 = page.evaluate(PIXELS, P("map-mixing"))
    # the hover reads the method's value at that cell (layer 2 = index 1, the start layer)
    want = fabricated_mixing(3, len(HOSTILE))[0].maps[1, 0, 0].item()
    page.hover(P("map-mixing"), position={"x": 5, "y": 5})
    readout = page.inner_text(P("hover"))
    assert "globenc" in readout and "query 0" in readout
    assert abs(float(readout.split("globenc ")[1].split()[0]) - want) < 0.005
    # another layer: another map
    page.select_option(P("layer"), index=0)
    expect(page.locator(P("head-status"))).to_contain_text("layer 0 · globenc")
    assert page.evaluate(PIXELS, P("map-mixing")) != layer1
    # another method: another map, same layer selector
    page.select_option(P("show"), "alti")
    expect(page.locator(P("caption-mixing"))).to_contain_text("alti")
    expect(page.locator(P("head-status"))).to_contain_text("layer 0 · alti")
    assert page.evaluate(PIXELS, P("map-mixing")) != layer1
    # back to attention: the three maps and the head selector return
    page.select_option(P("show"), "attention")
    expect(page.locator(P("figure-raw"))).to_be_visible()
    assert page.locator(P("figure-mixing")).is_hidden()
    expect(page.locator(P("head"))).to_be_enabled()
    assert page.evaluate(CANVAS_STATS, P("map-raw")) > 3
    assert_clean(loaded)
    loaded.screenshot("viewer-mixing.png")


@pytest.mark.browser
def test_without_methods_the_map_selector_is_hidden(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(atomic_write_text(tmp_path / "v.html", viewer_html(**synthetic_args())))
    assert loaded.page.locator(P("show")).is_hidden()
    assert_clean(loaded)


@pytest.mark.browser
def test_two_viewers_switch_their_methods_independently(tmp_path: Path, open_page: Any) -> None:
    mixing = fabricated_mixing(3, len(HOSTILE))
    parts = [viewer_fragment(**synthetic_args(), mixing=mixing) for _ in range(2)]
    doc = (
        '<!doctype html><html><head><meta charset="utf-8"><title>host</title></head><body>'
        + "".join(parts)
        + "</body></html>"
    )
    loaded = open_page(atomic_write_text(tmp_path / "two.html", doc), wait_ready=False)
    page = loaded.page
    roots = page.locator(".idf-viewer")
    for k in range(2):
        roots.nth(k).and_(page.locator("[data-ready='1']")).wait_for(timeout=15_000)
    roots.nth(0).locator(P("show")).select_option("alti")
    expect(roots.nth(0).locator(P("figure-mixing"))).to_be_visible()
    assert roots.nth(1).locator(P("figure-mixing")).is_hidden()
    expect(roots.nth(1).locator(P("head"))).to_be_enabled()
    assert roots.nth(1).locator(P("show")).input_value() == "attention"
    assert_clean(loaded)


def test_build_viewer_embeds_the_methods_maps(tiny_model: Any) -> None:
    from identifiable.mixing import context_mixing
    from identifiable.viewer.build import build_viewer

    model = tiny_model("bert")
    text = "the cat sat on the mat"
    page = build_viewer(model, text, mixing=("globenc", "rollout"), max_rows=1)
    (data,) = read_viewer_data(page)
    assert list(data["mixing"]) == ["globenc", "rollout"]
    for name in ("globenc", "rollout"):
        want = context_mixing(model, text, name).global_map
        for layer, entry in enumerate(data["mixing"][name]["layers"]):
            got = decode_map(entry, data["n"])
            assert np.abs(got - want[layer].numpy()).max() <= entry["v"][1] / 2 + 1e-9
        assert "rolled out" in data["mixing"][name]["caption"]


def test_view_cli_unknown_method_is_one_line(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "v.html"
    with pytest.raises(SystemExit) as exit_:
        main(["view", "the cat", "--mixing", "globenc,saliency", "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unknown mixing method 'saliency'" in err and "alti" in err
    assert "Traceback" not in err and not out.exists()
