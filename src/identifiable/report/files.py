"""Files of the reports: tables (CSV, Parquet) and figures (PNG, SVG), reproducible byte for
byte, written atomically."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from identifiable.store.files import atomic_write_bytes, write_table

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


def figure_bytes(fig: Figure) -> tuple[bytes, bytes]:
    """(PNG, SVG) encodings of a matplotlib figure, reproducible byte for byte.

    Metadata that changes from run to run (dates, random SVG ids) is removed so a
    resumed run writes the same files as an uninterrupted one.
    """
    import matplotlib

    png, svg = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=110, metadata={"Software": None})
    # The layout is settled by the first save; freezing it saves redoing it for the SVG.
    fig.set_layout_engine("none")
    with matplotlib.rc_context({"svg.hashsalt": "identifiable"}):
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    return png.getvalue(), svg.getvalue()


def write_figure(fig: Figure, stem: str | Path) -> tuple[bytes, list[Path]]:
    """Write `stem.png` and `stem.svg`; returns the PNG bytes (for inlining) and paths."""
    stem = Path(stem)
    png, svg = figure_bytes(fig)
    paths = [
        atomic_write_bytes(stem.with_suffix(".png"), png),
        atomic_write_bytes(stem.with_suffix(".svg"), svg),
    ]
    return png, paths


def write_tables(tables: dict[str, pd.DataFrame], folder: Path) -> list[Path]:
    """Every table as `folder/<name>.csv` and `.parquet`, in the mapping's order."""
    files: list[Path] = []
    for name, df in tables.items():
        files += write_table(df, folder / name)
    return files
