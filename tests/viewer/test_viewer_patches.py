"""The viewer for image models (issue 9): a patch grid in place of the token strip.

Tiny random ViT, DeiT and CLIP vision towers (tests/helpers/families.py VISION_CONFIGS: 32×32
images in 8×8 patches, a 4×4 grid plus [CLS], DeiT also [DIST]). The page's data is
checked against the trace and the analyses; in Chromium (the shared session of
tests/report/conftest.py), clicking a patch shades every key cell by the chosen map's row,
read back from the cells' data-value and computed colour.
"""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

from helpers.cli import run_main as run
from helpers.families import VISION_FAMILIES, build_tiny_hf_model
from identifiable.errors import IdentifiableError
from identifiable.models import Model
from identifiable.results.colormap import colour
from identifiable.store.files import atomic_write_text
from identifiable.viewer.build import build_viewer, check_grid, image_rgb, patch_grid
from identifiable.viewer.encoding import (
    PatchGrid,
    decode_certified,
    decode_head,
    decode_map,
    png_bytes,
)
from identifiable.viewer.page import read_viewer_data, viewer_html

GRID = 4  # 32 / 8 patches a side


def P(name: str) -> str:
    return f"[data-part='{name}']"


def pixels(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def vision() -> dict[str, Model]:
    return {a: Model.from_hf(build_tiny_hf_model(a)) for a in VISION_FAMILIES}


class _Elements(HTMLParser):
    """Every start tag of a page with its attributes, and the text inside each button."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.texts: dict[int, str] = {}
        self._open: int | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        if tag == "button":
            self._open = len(self.tags) - 1
            self.texts[self._open] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "button":
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.texts[self._open] += data


def elements(page: str) -> _Elements:
    parser = _Elements()
    parser.feed(page)
    return parser


def cells(page: str) -> tuple[list[dict[str, str]], list[tuple[dict[str, str], str]]]:
    """(patch cells, [(special cell, its text)]) of the page, in document order."""
    els = elements(page)
    patch, special = [], []
    for k, (tag, attrs) in enumerate(els.tags):
        cls = attrs.get("class", "").split()
        if tag == "button" and "idf-patch" in cls:
            patch.append(attrs)
        elif tag == "button" and "idf-special" in cls:
            special.append((attrs, els.texts[k]))
    return patch, special


# ---- the grid from the tokens ---------------------------------------------------------------


def test_patch_grid_reads_the_tokens_and_refuses_anything_else() -> None:
    tokens = ["[CLS]", "[DIST]"] + [f"patch({r},{c})" for r in range(3) for c in range(5)]
    g = patch_grid(tokens)
    assert g is not None and (g.rows, g.cols) == (3, 5)
    assert g.special == (0, 1) and g.patches == tuple(range(2, 17))
    assert patch_grid(["[CLS]", "the", "cat", "[SEP]"]) is None  # a text
    assert patch_grid([f"patch({r},{c})" for r in range(2) for c in range(2)]) is None  # no [CLS]
    holed = tokens[:7] + tokens[8:]  # patch(1,0) missing
    assert patch_grid(holed) is None
    column_major = ["[CLS]"] + [f"patch({r},{c})" for c in range(3) for r in range(3)]
    assert patch_grid(column_major) is None
    assert patch_grid(["[CLS]", "patch(0,0)", "[SEP]"]) is None


def test_a_grid_the_config_disagrees_with_is_refused(vision: dict[str, Model]) -> None:
    m = vision["vit"]
    assert (check_grid(m, m.trace(pixels()).tokens).rows, GRID) == (GRID, GRID)
    wrong = ["[CLS]"] + [f"patch({r},{c})" for r in range(2) for c in range(8)]
    with pytest.raises(IdentifiableError, match=r"2 × 8 grid.*says 4 × 4") as exc:
        check_grid(m, wrong)
    assert "\n" not in str(exc.value)
    with pytest.raises(IdentifiableError, match="no patch grid"):
        check_grid(m, ["[CLS]", "a", "b"])


# ---- the page's structure and data ----------------------------------------------------------


@pytest.mark.parametrize("arch", VISION_FAMILIES)
def test_the_page_holds_the_grid_and_every_map(vision: dict[str, Model], arch: str) -> None:
    from identifiable.attention import effective_attention
    from identifiable.mixing import context_mixing

    m = vision[arch]
    tr = m.trace(pixels())
    n = tr.n_tokens
    specials = ["[CLS]", "[DIST]"] if arch == "deit" else ["[CLS]"]
    certify = arch == "vit"  # the certified map's shape once; the others skip the LPs
    page = build_viewer(
        m, pixels(), mixing=("rollout",), certify=certify, interval_seconds=60, max_rows=1
    )
    patch, special = cells(page)
    assert len(patch) == GRID * GRID and n == GRID * GRID + len(specials)
    for attrs in patch:
        k, r, c = int(attrs["data-index"]), int(attrs["data-row"]), int(attrs["data-col"])
        assert attrs["data-label"] == f"patch({r},{c})" == tr.tokens[k]
        assert k == len(specials) + GRID * r + c
    assert sorted((int(a["data-row"]), int(a["data-col"])) for a in patch) == [
        (r, c) for r in range(GRID) for c in range(GRID)
    ]
    assert [(int(a["data-index"]), text) for a, text in special] == list(enumerate(specials))
    assert 'data-part="tokens"' not in page  # the grid replaces the token strip
    (data,) = read_viewer_data(page)
    assert data["patches"] == {
        "rows": GRID,
        "cols": GRID,
        "cells": list(range(len(specials), n)),
        "special": list(range(len(specials))),
        "image": True,
    }
    # every head's raw and effective attention at full resolution, within its error
    eff = effective_attention(tr).effective
    assert len(data["matrices"]) == tr.n_layers * tr.n_heads and data["omitted"] == []
    for key, entry in data["matrices"].items():
        layer, head = map(int, key.split(","))
        raw, got_eff = decode_head(entry, n)
        assert raw.shape == got_eff.shape == (n, n) and entry["f"] == 1
        assert np.abs(raw - tr.attentions[layer, head].numpy()).max() <= entry["raw"][1] / 2 + 1e-6
        assert np.abs(got_eff - eff[layer, head].numpy()).max() <= entry["eff"][1] / 2 + 1e-6
    want = context_mixing(m, pixels(), "rollout").global_map
    layers = data["mixing"]["rollout"]["layers"]
    assert len(layers) == tr.n_layers
    for layer, entry in enumerate(layers):
        got = decode_map(entry, n)
        assert got.shape == (n, n)
        assert np.abs(got - want[layer].numpy()).max() <= entry["v"][1] / 2 + 1e-9
    if certify:
        c = decode_certified(data["certified"], n)
        assert c["rows"].tolist() == list(range(n))  # 60 s covers every row of 17
        for name in ("raw", "lower", "upper", "constrained", "keys"):
            assert c[name].shape == (n, n), name
        step = data["certified"]["q"][1]
        assert np.abs(c["raw"] - tr.attentions[0, 0].numpy()).max() <= step / 2 + 1e-6
    else:
        assert data["certified"] is None


def test_the_page_is_self_contained_and_draws_the_image(vision: dict[str, Model]) -> None:
    from PIL import Image

    m = vision["vit"]
    page = build_viewer(m, pixels(), certify=False)
    urls = re.findall(r'\b(?:src|href)\s*=\s*"([^"]*)"', page)
    assert urls and all(u.startswith("data:") for u in urls), urls
    assert not re.search(r"\b(?:src|href)\s*=\s*[\"']?\s*https?:", page, re.I)
    (img,) = [a for t, a in elements(page).tags if t == "img"]
    assert img["src"].startswith("data:image/png;base64,")
    png = base64.b64decode(img["src"].split(",", 1)[1])
    shown = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    # no image processor: the pixel values scaled min–max, channel for channel
    px = pixels().numpy()
    want = np.rint((px - px.min()) / (px.max() - px.min()) * 255).transpose(1, 2, 0)
    assert shown.shape == (32, 32, 3) and np.abs(shown - want).max() <= 0
    assert "min–max" in page
    # show_image=False: the grid alone, no image
    bare = build_viewer(m, pixels(), certify=False, show_image=False)
    assert "<img" not in bare and "No image was given" in bare
    assert read_viewer_data(bare)[0]["patches"]["image"] is False
    assert len(cells(bare)[0]) == GRID * GRID


def test_png_bytes_decode_to_the_array() -> None:
    from PIL import Image

    rgb = np.random.default_rng(0).integers(0, 256, (7, 13, 3), dtype=np.uint8)
    back = np.asarray(Image.open(io.BytesIO(png_bytes(rgb))))
    np.testing.assert_array_equal(back, rgb)
    with pytest.raises(ValueError, match="uint8"):
        png_bytes(rgb.astype(np.float32))


def test_a_pil_image_is_shown_as_the_processor_made_it() -> None:
    from PIL import Image
    from transformers import ViTImageProcessor

    proc = ViTImageProcessor(size={"height": 32, "width": 32})
    m = Model.from_hf(build_tiny_hf_model("vit"), image_processor=proc)
    picture = Image.fromarray((np.random.default_rng(1).random((40, 50, 3)) * 255).astype("uint8"))
    rgb, note = image_rgb(m, picture)
    # independent of the processor: PIL's own bilinear resize of the same picture
    ref = np.asarray(picture.resize((32, 32), Image.BILINEAR)).astype(int)
    assert rgb.shape == (32, 32, 3) and np.abs(rgb.astype(int) - ref).max() <= 2
    assert "normalisation undone" in note
    page = build_viewer(m, picture, certify=False)
    assert len(cells(page)[0]) == GRID * GRID and "normalisation undone" in page


def hostile_page(image: bool) -> str:
    """viewer_html on fabricated attention for a 2 × 3 grid whose special token is hostile."""
    gen = torch.Generator().manual_seed(3)
    tokens = ["[<script>alert(1)</script>]"] + [
        f"patch({r},{c})" for r in range(2) for c in range(3)
    ]
    n = len(tokens)
    raw = torch.softmax(2 * torch.randn(2, 2, n, n, generator=gen), -1)
    eff = raw + 0.2 * torch.randn(raw.shape, generator=gen)
    grid = patch_grid(tokens)
    assert grid is not None
    if image:
        grid = PatchGrid(
            grid.rows,
            grid.cols,
            grid.patches,
            grid.special,
            png_bytes(np.zeros((2, 3, 3), np.uint8)),
            "<b>x</b>",
        )
    return viewer_html(
        tokens=tokens,
        raw=raw,
        effective=eff,
        null_dims=torch.ones(2, 2, dtype=torch.long),
        head_dim=4,
        patches=grid,
    )


def test_text_in_the_grid_is_escaped() -> None:
    page = hostile_page(image=True)
    assert "<script>alert(1)</script>" not in page and "<b>x</b>" not in page
    assert "[&lt;script&gt;alert(1)&lt;/script&gt;]" in page and "&lt;b&gt;x&lt;/b&gt;" in page
    _, special = cells(page)
    assert [text for _, text in special] == ["[<script>alert(1)</script>]"]


def test_a_grid_that_does_not_cover_the_tokens_is_refused() -> None:
    gen = torch.Generator().manual_seed(0)
    raw = torch.softmax(torch.randn(1, 1, 5, 5, generator=gen), -1)
    args = dict(
        tokens=list("abcde"), raw=raw, effective=raw, null_dims=torch.zeros(1, 1), head_dim=2
    )
    with pytest.raises(ValueError, match="rows × cols"):
        viewer_html(**args, patches=PatchGrid(2, 2, (1, 2, 3), (0,)))
    with pytest.raises(ValueError, match="each once"):
        viewer_html(**args, patches=PatchGrid(2, 2, (1, 2, 3, 3), (0,)))


def test_an_image_with_a_text_trace_is_refused(tiny_model: Any) -> None:
    from identifiable.viewer.build import viewer_html_for_trace

    tr = tiny_model("bert").trace("the cat sat")
    rgb = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(IdentifiableError, match="only be drawn for an image model"):
        viewer_html_for_trace(tr, certify=False, image=(rgb, ""))
    assert patch_grid(tr.tokens) is None
    assert read_viewer_data(viewer_html_for_trace(tr, certify=False))[0]["patches"] is None


# ---- in the browser ---------------------------------------------------------------------------

CELL_STATE = """(root) => Array.from(document.querySelectorAll(
    "[data-part='patch-special'] .idf-patch-cell, [data-part='patch-grid'] .idf-patch-cell"))
  .map((c) => [+c.dataset.index, c.dataset.value === undefined ? null : +c.dataset.value,
               getComputedStyle(c).backgroundColor])"""


def js_colour(v: float, m: float) -> tuple[int, int, int]:
    """viewer.js colour(): the shared diverging colormap on ±m."""
    return colour(v, m)


def js_purple(t: float) -> tuple[int, int, int]:
    t = max(0.0, min(1.0, t))
    return tuple(int(np.floor(255 + (x - 255) * t + 0.5)) for x in (94, 60, 153))  # type: ignore[return-value]


def rgba(css: str) -> tuple[tuple[int, int, int], float]:
    nums = [float(x) for x in re.findall(r"[\d.]+", css)]
    return (int(nums[0]), int(nums[1]), int(nums[2])), nums[3] if len(nums) > 3 else 1.0


def read_cells(page: Any, n: int) -> dict[int, tuple[float | None, str]]:
    got = {k: (v, bg) for k, v, bg in page.evaluate(CELL_STATE)}
    assert sorted(got) == list(range(n))
    return got


def check_shading(
    got: dict[int, tuple[float | None, str]],
    want: np.ndarray,
    err: float,
    *,
    alpha: float,
    width: bool = False,
    ident: np.ndarray | None = None,
) -> None:
    """Each key cell's value is the map's row entry within `err`, and its colour is the one
    the page's scale gives that value (row max |value| → full colour)."""
    values = np.array([got[k][0] for k in range(len(want))], dtype=np.float64)
    assert np.abs(values - want).max() <= err + 1e-9, (values, want)
    top = np.abs(values).max() or 1.0
    for k, (v, bg) in got.items():
        rgb, a = rgba(bg)
        assert a == pytest.approx(alpha, abs=0.01)
        if width:
            expected = (27, 122, 58) if ident is not None and ident[k] else js_purple(v / top)
        else:
            expected = js_colour(v, top)
        assert max(abs(x - y) for x, y in zip(rgb, expected, strict=True)) <= 1, (
            k,
            v,
            rgb,
            expected,
        )


@pytest.mark.browser
def test_clicking_a_patch_shades_the_keys_by_every_map(
    vision: dict[str, Model], tmp_path: Path, open_page: Any
) -> None:
    from identifiable.attention import effective_attention
    from identifiable.mixing import context_mixing

    m = vision["deit"]
    tr = m.trace(pixels())
    n = tr.n_tokens
    page_html = build_viewer(m, pixels(), mixing=("rollout",), interval_seconds=60, max_rows=1)
    (data,) = read_viewer_data(page_html)
    loaded = open_page(atomic_write_text(tmp_path / "patches.html", page_html))
    page = loaded.page
    grid = page.locator(P("patch-grid"))
    assert page.locator(P("patch-grid") + " .idf-patch-cell").count() == GRID * GRID
    assert page.locator(P("patch-special") + " .idf-patch-cell").all_inner_texts() == [
        "[CLS]",
        "[DIST]",
    ]
    assert page.locator(P("tokens")).count() == 0
    # nothing chosen yet: no cell carries a value
    assert all(v is None for v, _ in read_cells(page, n).values())

    eff = effective_attention(tr).effective
    raw_err, eff_err = data["matrices"]["0,0"]["raw"][1] / 2, data["matrices"]["0,0"]["eff"][1] / 2
    cert = decode_certified(data["certified"], n)
    q = 2 + GRID * 1 + 2  # patch(1,2)
    page.click(P("patch-grid") + f" [data-index='{q}']")
    expect(grid).to_have_attribute("data-row", str(q))
    assert (
        page.locator(P("patch-grid") + " .idf-selected").get_attribute("data-label") == "patch(1,2)"
    )
    raw_cells = read_cells(page, n)
    check_shading(raw_cells, tr.attentions[0, 0, q].numpy(), raw_err, alpha=0.72)
    assert "patch(1,2)" in page.inner_text(P("patch-legend"))

    row = cert["rows"].tolist().index(q)
    k_cert = cert["upper"][row] - cert["lower"][row]
    cases = [
        ("effective", eff[0, 0, q].numpy(), eff_err, {}),
        ("null", (tr.attentions[0, 0, q].double() - eff[0, 0, q]).numpy(), raw_err + eff_err, {}),
        ("constrained", cert["constrained"][row], data["certified"]["q"][1] / 2, {}),
        (
            "width",
            k_cert,
            data["certified"]["q"][1],
            {"width": True, "ident": cert["identifiable"][row]},
        ),
    ]
    for kind, want, err, extra in cases:
        page.select_option(P("patch-map"), kind)
        expect(grid).to_have_attribute("data-map", kind)
        check_shading(read_cells(page, n), np.asarray(want), err, alpha=0.72, **extra)
    # null attention has negative entries in this row: blue on the diverging scale
    null_row = (tr.attentions[0, 0, q].double() - eff[0, 0, q]).numpy()
    page.select_option(P("patch-map"), "null")
    expect(grid).to_have_attribute("data-map", "null")
    shown = read_cells(page, n)
    assert (null_row < -0.01).any() and (null_row > 0.01).any()
    for k in range(n):
        r, _, b = rgba(shown[k][1])[0]
        if abs(null_row[k]) > 0.01:
            assert (b > r) == (null_row[k] < 0), (k, null_row[k], shown[k])

    # a mixing method's map of the layer shown
    rollout = context_mixing(m, pixels(), "rollout").global_map
    page.select_option(P("patch-map"), "mix:rollout")
    expect(grid).to_have_attribute("data-map", "mix:rollout")
    mix_err = data["mixing"]["rollout"]["layers"][0]["v"][1] / 2
    check_shading(read_cells(page, n), rollout[0, q].numpy(), mix_err, alpha=0.72)

    # another query: [CLS]; the shading follows its row
    page.select_option(P("patch-map"), "raw")
    page.click(P("patch-special") + " [data-index='0']")
    expect(grid).to_have_attribute("data-row", "0")
    expect(grid).to_have_attribute("data-map", "raw")
    cls_cells = read_cells(page, n)
    assert [bg for _, bg in cls_cells.values()] != [bg for _, bg in raw_cells.values()]
    check_shading(cls_cells, tr.attentions[0, 0, 0].numpy(), raw_err, alpha=0.72)
    # another layer and head: their row
    page.select_option(P("layer"), index=1)  # second layer (value "1", labelled "1")
    page.select_option(P("head"), "3")
    expect(grid).to_have_attribute("data-head", "3")
    expect(grid).to_have_attribute("data-layer", "1")
    err13 = data["matrices"]["1,3"]["raw"][1] / 2
    check_shading(read_cells(page, n), tr.attentions[1, 3, 0].numpy(), err13, alpha=0.72)
    # the certified maps belong to layer 0, head 0 only: the page says so and shades nothing
    page.select_option(P("patch-map"), "width")
    expect(grid).to_have_attribute("data-map", "width")
    assert "layer 0, head 0 only" in page.inner_text(P("patch-legend"))
    assert all(v is None for v, _ in read_cells(page, n).values())
    # hovering a key reads its value out
    page.select_option(P("patch-map"), "raw")
    expect(grid).to_have_attribute("data-map", "raw")
    page.hover(P("patch-grid") + f" [data-index='{n - 1}']")
    assert "patch(3,3)" in page.inner_text(P("patch-readout"))
    assert loaded.console_errors == [] and loaded.dialogs == [] and loaded.requests == []
    loaded.screenshot("viewer-patches.png")


@pytest.mark.browser
def test_the_grid_alone_is_opaque_and_hostile_labels_stay_text(
    tmp_path: Path, open_page: Any
) -> None:
    page_html = hostile_page(image=False)
    loaded = open_page(atomic_write_text(tmp_path / "hostile.html", page_html))
    page = loaded.page
    special = page.locator(P("patch-special") + " .idf-patch-cell")
    assert special.inner_text() == "[<script>alert(1)</script>]"
    special.click()
    expect(page.locator(P("patch-grid"))).to_have_attribute("data-row", "0")
    got = read_cells(page, 7)
    assert all(rgba(bg)[1] == 1.0 for _, bg in got.values())  # no image: full colours
    assert loaded.dialogs == [] and loaded.console_errors == [] and loaded.requests == []


# ---- the CLI ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, bert_tokenizer: Any) -> Path:
    from PIL import Image
    from transformers import ViTImageProcessor

    root = tmp_path_factory.mktemp("view-image")
    build_tiny_hf_model("vit").save_pretrained(root / "vit")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(root / "vit")
    build_tiny_hf_model("vit").save_pretrained(root / "vit-bare")  # no image processor
    build_tiny_hf_model("bert").save_pretrained(root / "bert")
    bert_tokenizer.save_pretrained(root / "bert")
    rgb = (np.random.default_rng(2).random((48, 40, 3)) * 255).astype("uint8")
    Image.fromarray(rgb).save(root / "photo.png")
    np.save(root / "pixels.npy", pixels().numpy())
    (root / "notes.png").write_text("not an image")
    return root


def test_view_cli_draws_an_image(folders: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "v.html"
    rc, _, stderr = run(
        [
            "view",
            "--image",
            str(folders / "photo.png"),
            "--model",
            str(folders / "vit"),
            "--no-certify",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert rc == 0, stderr
    page = out.read_text("utf-8")
    assert len(cells(page)[0]) == GRID * GRID and "normalisation undone" in page
    assert read_viewer_data(page)[0]["patches"]["image"] is True
    # pixel values from .npy work without an image processor
    out2 = tmp_path / "v2.html"
    rc, _, stderr = run(
        [
            "view",
            "--image",
            str(folders / "pixels.npy"),
            "--model",
            str(folders / "vit-bare"),
            "--no-certify",
            "--out",
            str(out2),
        ],
        capsys,
    )
    assert rc == 0, stderr
    assert "min–max" in out2.read_text("utf-8")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--image", "{root}/photo.png", "--model", "{root}/bert"], "is a text model"),
        (["a photo of a cat", "--model", "{root}/vit"], "is an image model"),
        (["a cat", "--image", "{root}/photo.png", "--model", "{root}/vit"], "not both"),
        (["--model", "{root}/vit"], "Missing argument 'TEXT'"),
        (["  ", "--model", "{root}/vit"], "the text is empty"),
        (["--image", "{root}/missing.png", "--model", "{root}/vit"], "no such file"),
        (["--image", "{root}/notes.png", "--model", "{root}/vit"], "not an image file"),
        (["--image", "{root}/photo.png", "--model", "{root}/vit-bare"], "no image processor"),
        (["--image", "{root}/photo.png", "--pair", "b", "--model", "{root}/vit"], "--pair"),
    ],
)
def test_view_cli_image_errors_are_one_line(
    folders: Path, tmp_path: Path, capsys: Any, args: list[str], message: str
) -> None:
    out = tmp_path / "v.html"
    argv = ["view", *(a.replace("{root}", str(folders)) for a in args), "--out", str(out)]
    rc, _, stderr = run(argv, capsys)
    assert rc == 2 and message in stderr, stderr
    assert stderr.strip().count("\n") == 0 and "Traceback" not in stderr
    assert not out.exists()
