"""Former path of `identifiable.viewer_compute` (the viewer's compute side), kept for
existing imports: `from identifiable.viewer import build_viewer` still works."""

from identifiable.viewer_compute import (
    build_viewer,
    certify_head,
    head_distance,
    mixing_maps,
    patch_grid,
    viewer_html_for_trace,
)

__all__ = [
    "build_viewer",
    "certify_head",
    "head_distance",
    "mixing_maps",
    "patch_grid",
    "viewer_html_for_trace",
]
