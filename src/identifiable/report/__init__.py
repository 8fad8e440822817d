"""Reproduction report and offline attention viewer: self-contained HTML pages.

Public entry points: `build_viewer` / `viewer_html` (one text, interactive page) and,
in `identifiable.experiments.reproduce`, `reproduce` (the whole paper, one folder).
"""

from identifiable.report.viewer import build_viewer, viewer_html, viewer_html_for_trace

__all__ = ["build_viewer", "viewer_html", "viewer_html_for_trace"]
