"""The screenshots in docs/img/ (taken by tests/viewer/test_viewer_reading.py in Chromium):
small, real PNGs, each shown by README or the docs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"


def test_screenshots_are_small_pngs_that_the_docs_show() -> None:
    shots = sorted(IMG.glob("*.png"))
    assert len(shots) >= 3
    text = (ROOT / "README.md").read_text("utf-8") + "".join(
        p.read_text("utf-8") for p in (ROOT / "docs").glob("*.md")
    )
    for shot in shots:
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", shot.name
        assert len(data) < 200_000, f"{shot.name}: {len(data)} bytes"
        assert f"img/{shot.name}" in text, f"{shot.name} is shown nowhere"
