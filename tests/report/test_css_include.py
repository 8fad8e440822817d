"""Stylesheets share their colours through `/* include NAME.css */` (report/html.asset)."""

from __future__ import annotations

from identifiable.report.html import asset


def test_both_pages_inline_the_shared_palette() -> None:
    palette = asset("palette.css")
    assert "--accent:" in palette
    for sheet in ("base.css", "viewer.css"):
        text = asset(sheet)
        assert palette in text
        assert "/* include" not in text  # every include is resolved, nothing left to fetch
