"""Rendering: the reproduction report and the offline attention viewer as self-contained HTML.

This floor only renders tables and tensors it is given; it imports nothing above it.
`identifiable.viewer_compute.build_viewer` runs a model and renders a viewer page;
`identifiable.reproduction.reproduce` runs the whole paper into one folder.
"""

from identifiable.report.viewer_options import ViewerOptions, ViewerPage
from identifiable.report.viewer_page import viewer_html

__all__ = ["ViewerOptions", "ViewerPage", "viewer_html"]
