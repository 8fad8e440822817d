"""Former path of `identifiable.report.viewer_page` (the viewer's renderer), kept for
existing imports: `from identifiable.report.viewer import viewer_iframe` still works."""

from identifiable.report.viewer_page import (
    read_viewer_data,
    viewer_fragment,
    viewer_html,
    viewer_iframe,
)

__all__ = ["read_viewer_data", "viewer_fragment", "viewer_html", "viewer_iframe"]
