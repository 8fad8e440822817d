"""Notebook-native results: one mixin gives every result dataclass the same manners.

A result class declares *what its arrays mean*, not how to show them:

    @dataclass(frozen=True)
    class EffectiveAttention(Result):
        _dims = {"raw": ("layer", "head", "query", "key"), ...}

and `Result` turns those declarations into

* a short `repr` (class, model, n, every array's named shape; never the values),
* `_repr_html_`, a compact escaped summary table for Jupyter,
* `to_pandas()` (tidy long format: one column per named dimension, token labels beside
  the positions), `to_xarray()` (named dimensions, token coordinates),
* `plot()`, a labelled matplotlib `Figure` (heatmaps with token tick labels for `[n, n]`
  maps, interval or bar charts for one row, lines per layer for per-layer tables),
* `save(path)` and `Class.load(path)`: one safetensors file whose header carries the
  non-array fields as JSON. Nothing is ever pickled and no module a file names is
  imported, so loading a file runs no code (`identifiable.results.files`).

Dimension names (the vocabulary every result shares):
    layer, head: model coordinates (0-based unless a class says otherwise);
    query, key: the rows and columns of an attention-like `[n, n_k]` map (for mixing and
    attribution maps: the receiving token i and the contributing token j);
    token: a position in the sequence that is not a query or key of a map;
    row: a chosen subset of query positions (the class's `rows` attribute gives them).
Dimensions named query, token and row are labelled with `tokens`, key with `key_tokens`
(cross-attention) or `tokens`.

Each concern lives in its own module, and `Result` combines them: `core` (declarations,
labels, selection), `display` (repr, HTML), `views` (pandas, xarray, bertviz), `figures`
(plot) and, here, the files (save, load; the format is `identifiable.results.files`).
The folder sits on the lowest floor: it imports only `identifiable.errors` and
`identifiable.store`, and numpy, pandas, matplotlib, safetensors, torch and xarray lazily,
so that `import identifiable.results` stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError
from identifiable.results.display import Display
from identifiable.results.figures import Figures
from identifiable.results.views import Views
from identifiable.store.files import atomic_write_bytes


class Result(Display, Views, Figures):
    """Mixin for result dataclasses (see the module docstring).

    Class attributes a subclass sets (as class keywords: `class X(Result, dims={...})`):
        _dims: field or property name → dimension names, one per axis, in order. The first
            entry is the primary array (`to_pandas`, `plot` and `to_bertviz` default to it).
        _tables: DataFrame field name → its index columns (for results held as tables).
        _plot: defaults for `plot`: "fields" (tuple), "axes" (the dims drawn), a default
            coordinate per other dimension (e.g. {"layer": 0}), "kind" ("heatmap",
            "interval", "bars" or "layer_lines").
        _summary: scalar attributes shown in `repr` and the HTML header.
    """

    def __init_subclass__(
        cls,
        *,
        dims: Mapping[str, tuple[str, ...]] | None = None,
        tables: Mapping[str, tuple[str, ...]] | None = None,
        plot: Mapping[str, Any] | None = None,
        summary: tuple[str, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        """`class X(Result, dims={...}, plot={...})` sets the class attributes above (class
        keywords keep the declarations out of the dataclass's fields)."""
        super().__init_subclass__(**kwargs)
        from types import MappingProxyType

        for attr, value in (("_dims", dims), ("_tables", tables), ("_plot", plot)):
            if value is not None:
                setattr(cls, attr, MappingProxyType(dict(value)))
        if summary is not None:
            cls._summary = tuple(summary)
        # @dataclass runs after this and never replaces a __repr__ the class itself holds:
        # put ours there so that a result never prints its tensors.
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = Display.__repr__  # type: ignore[method-assign]

    # ---- files ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write this result to one `.safetensors` file (arrays as tensors, everything else
        as JSON in the file's header), atomically. Read it back with `Class.load(path)`."""
        from identifiable.results.files import file_bytes

        return atomic_write_bytes(path, file_bytes(self), hint="choose another path")

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Read a file written by `save`. Refuses, in one line naming the file, a file that
        is not ours, holds another result class, or is damaged or edited (see
        `identifiable.results.files`); never unpickles anything or imports a module the
        file names."""
        import os

        from identifiable.results import files as rf

        if not isinstance(path, str | os.PathLike) or not str(path):
            raise IdentifiableError(f"path= takes a result file's path, got {path!r:.60}")
        header, tensors = rf.read(path)
        stored = rf.current_name(header["class"])
        if cls is not Result and stored != rf.class_name(cls):
            short = stored.rsplit(":", 1)[-1][:80]
            raise IdentifiableError(
                f"{path} holds a {short}, not a {cls.__name__}: load it with {short}.load"
            )
        return rf.decode(header, tensors, cls if cls is not Result else None, str(path))


def load(path: str | Path) -> Any:
    """Load any result written by `Result.save` (its class is read from the file)."""
    return Result.load(path)
