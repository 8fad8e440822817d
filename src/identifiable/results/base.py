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

This module sits on the lowest floor: it imports only `identifiable.errors`,
`identifiable.store` and `identifiable.results.files`, and numpy, pandas, matplotlib, safetensors, torch and xarray
lazily, so that `import identifiable.results` stays cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from identifiable.errors import IdentifiableError
from identifiable.store.files import atomic_write_bytes

if TYPE_CHECKING:  # pragma: no cover - types only
    import numpy as np
    import pandas as pd
    import xarray as xr
    from matplotlib.figure import Figure

TOKEN_DIMS = ("query", "token", "row")
# a dimension takes its coordinates from this attribute when the result has one of that length
COORD_ATTRS = {"layer": "layers", "head": "heads", "row": "rows"}
HTML_TOKENS = 64
# arrays larger than this are summarised by shape and dtype only (min/max would cost a pass)
HTML_STATS_LIMIT = 5_000_000


class Result:
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

    _dims: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    _tables: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    _plot: ClassVar[Mapping[str, Any]] = {}
    _summary: ClassVar[tuple[str, ...]] = ()
    # How `result_files` (which this module imports) recognises a result without importing it.
    _is_result: ClassVar[bool] = True

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
            cls.__repr__ = Result.__repr__  # type: ignore[method-assign]

    # ---- labels ------------------------------------------------------------------------
    @property
    def _tokens(self) -> list[str] | None:
        tokens = getattr(self, "tokens", None)
        return list(tokens) if tokens is not None else None

    @property
    def _key_tokens(self) -> list[str] | None:
        keys = getattr(self, "key_tokens", None)
        return list(keys) if keys is not None else self._tokens

    @property
    def _model(self) -> str:
        settings = getattr(self, "settings", None)
        fallback = settings.get("model", "") if isinstance(settings, Mapping) else ""
        return str(getattr(self, "model_name", "") or fallback or "")

    @property
    def n_tokens(self) -> int | None:
        """The number of query tokens (the `n` of the shapes), or None for a result without
        tokens or a query axis; `repr` prints it under this name."""
        return self._n()

    def _n(self) -> int | None:
        tokens = self._tokens
        if tokens is not None:
            return len(tokens)
        for name, dims in self._dims.items():
            value = self._raw_value(name, compute=False)
            if value is not None and "query" in dims:
                return int(value.shape[dims.index("query")])
        return None

    def _raw_value(self, name: str, *, compute: bool = True) -> Any:
        """The attribute `name`; properties (computed on access) only when `compute`."""
        if not compute and name not in {f.name for f in dataclasses.fields(self)}:  # type: ignore[arg-type]
            return None
        return getattr(self, name, None)

    def _array(self, name: str) -> np.ndarray | None:
        return _to_numpy(self._raw_value(name))

    def _coord(self, dim: str, size: int) -> np.ndarray:
        import numpy as np

        attr = COORD_ATTRS.get(dim)
        values = getattr(self, attr, None) if attr else None
        if values is not None and not isinstance(values, str) and len(values) == size:
            return np.asarray([int(v) for v in values])
        return np.arange(size)  # every coordinate is numbered from 0 (docs/results.md, 'Numbering')

    def _labels(self, dim: str, positions: Sequence[int]) -> list[str] | None:
        tokens = self._key_tokens if dim == "key" else self._tokens if dim in TOKEN_DIMS else None
        if tokens is None or not len(positions) or max(positions) >= len(tokens):
            return None
        return [tokens[int(p)] for p in positions]

    def _present(self) -> list[str]:
        return [name for name in self._dims if self._raw_value(name, compute=False) is not None]

    def _default_fields(self) -> list[str]:
        """The primary array and every other one with the same dimensions."""
        names = [n for n in self._dims if self._raw_value(n) is not None]
        if not names:
            return []
        first = self._dims[names[0]]
        return [n for n in names if self._dims[n] == first]

    def _check_field(self, name: str) -> None:
        if name not in self._dims and name not in self._tables:
            known = ", ".join([*self._dims, *self._tables]) or "none"
            raise IdentifiableError(
                f"{type(self).__name__} has no array or table {name!r}: choose one of {known}"
            )

    # ---- selection ---------------------------------------------------------------------
    def _select(
        self, name: str, sel: Mapping[str, Any]
    ) -> tuple[np.ndarray, tuple[str, ...], dict[str, np.ndarray]]:
        """Array `name` with the dimensions in `sel` fixed (an int) or subset (a list of
        coordinates); returns the array, its remaining dims and their coordinates."""
        import numpy as np

        self._check_field(name)
        arr = self._array(name)
        if arr is None:
            raise IdentifiableError(f"{type(self).__name__}.{name} is empty (None) in this result")
        dims = tuple(self._dims[name])
        index: list[Any] = []
        kept: list[str] = []
        coords: dict[str, np.ndarray] = {}
        for axis, dim in enumerate(dims):
            coord = self._coord(dim, arr.shape[axis])
            if dim not in sel:
                index.append(slice(None))
                kept.append(dim)
                coords[dim] = coord
                continue
            wanted = sel[dim]
            if isinstance(wanted, (list, tuple, range)) or hasattr(wanted, "__array__"):
                pos = [_position(dim, coord, w) for w in wanted]
                index.append(pos)
                kept.append(dim)
                coords[dim] = coord[pos]
            else:
                index.append(_position(dim, coord, wanted))
        out = arr
        # one axis at a time so that two lists do not broadcast against each other
        for axis in reversed(range(len(dims))):
            out = out[(slice(None),) * axis + (index[axis],)]
        return np.asarray(out), tuple(kept), coords

    # ---- text --------------------------------------------------------------------------
    def __repr__(self) -> str:
        parts: list[str] = []
        if self._model:
            parts.append(f"model={self._model!r}")
        n = self._n()
        if n is not None:
            parts.append(f"n_tokens={n}")
        for attr in self._summary:
            parts.append(f"{attr}={getattr(self, attr, None)!r}")
        for name in self._present():
            parts.append(f"{name}: {_shape_text(self._raw_value(name), self._dims[name])}")
        for name, _ in self._tables.items():
            table = getattr(self, name, None)
            if table is not None:
                parts.append(f"{name}: table[{len(table)} rows × {len(table.columns)} columns]")
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Result):
                parts.append(f"{f.name}={type(value).__name__}(…)")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _repr_html_(self) -> str:
        """A headline, a small inline SVG picture and the arrays' table, for Jupyter (every
        piece of text escaped; no tensors, no script): `identifiable.results.html`."""
        from markupsafe import Markup, escape

        from identifiable.results import html as result_html

        head = [Markup("<b>{}</b>").format(type(self).__name__)]
        if self._model:
            head.append(Markup("model <code>{}</code>").format(self._model))
        n = self._n()
        if n is not None:
            head.append(Markup("n = {} tokens").format(n))
        for attr in self._summary:
            head.append(Markup("{} = <code>{}</code>").format(attr, getattr(self, attr, None)))
        rows = []
        for name in self._present():
            value = self._raw_value(name)
            dims = self._dims[name]
            shape = ", ".join(f"{d}={s}" for d, s in zip(dims, value.shape, strict=False))
            lo, hi = _min_max(name, value)
            rows.append(
                Markup(
                    "<tr><td><code>{}</code></td><td>[{}]</td><td>{}</td>"
                    "<td>{}</td><td>{}</td></tr>"
                ).format(name, shape, _dtype_name(value), lo, hi)
            )
        for name in self._tables:
            table = getattr(self, name, None)
            if table is None:
                continue
            rows.append(
                Markup("<tr><td><code>{}</code></td><td>{} rows</td><td>table</td>"
                       "<td colspan=2>{}</td></tr>").format(
                    name, len(table), ", ".join(map(str, table.columns)))
            )  # fmt: skip
        table_html = Markup("")
        if rows:
            table_html = (
                Markup(
                    '<table class="idf-result-table"><thead><tr><th>array</th>'
                    "<th>dimensions</th><th>dtype</th><th>min</th><th>max</th></tr>"
                    "</thead><tbody>"
                )
                + Markup("").join(rows)
                + Markup("</tbody></table>")
            )
        tokens_html = Markup("")
        tokens = self._tokens
        if tokens:
            shown = tokens[:HTML_TOKENS]
            more = len(tokens) - len(shown)
            spans = Markup(" ").join(Markup("<code>{}</code>").format(t) for t in shown)
            tail = Markup(" … ({} more)").format(more) if more > 0 else Markup("")
            tokens_html = Markup("<div><small>tokens: {}{}</small></div>").format(spans, tail)
        return str(
            Markup('<div class="idf-result">{}{}{}{}{}</div>').format(
                escape(" · ").join(head) if head else "",
                result_html.headline_html(self),
                result_html.picture(self),
                table_html,
                tokens_html,
            )
        )

    # ---- tables --------------------------------------------------------------------------
    def to_pandas(self, *fields: str, **sel: Any) -> pd.DataFrame:
        """Tidy long format: one row per entry, one column per named dimension (coordinates,
        e.g. layer 0-based), a `<dim>_token` column beside query/key/token/row positions,
        one value column per array.

        fields: arrays with the same dimensions (default: the primary one and every array
            shaped like it, e.g. raw, effective and null). For results held as tables, the
            table's name (default: the first) and `sel` filters its rows by column value.
        sel: fix a dimension (`layer=2`) or keep some coordinates (`head=[0, 3]`).
        """
        import numpy as np
        import pandas as pd

        if self._tables and (not fields or fields[0] in self._tables):
            name = fields[0] if fields else next(iter(self._tables))
            table = getattr(self, name).copy()
            for col, wanted in sel.items():
                if col not in table.columns:
                    raise IdentifiableError(f"table {name!r} has no column {col!r}")
                keep = list(wanted) if isinstance(wanted, (list, tuple)) else [wanted]
                table = table[table[col].isin(keep)]
            return table.reset_index(drop=True)
        names = list(fields) or self._default_fields()
        if not names:
            raise IdentifiableError(f"{type(self).__name__} holds no arrays to tabulate")
        first = self._dims.get(names[0], ())
        for name in names:
            self._check_field(name)
            if tuple(self._dims[name]) != tuple(first):
                raise IdentifiableError(
                    f"to_pandas takes arrays with the same dimensions: {names[0]} has "
                    f"{list(first)}, {name} has {list(self._dims[name])}; call it once per array"
                )
        columns: dict[str, Any] = {}
        values: dict[str, np.ndarray] = {}
        dims: tuple[str, ...] = ()
        coords: dict[str, np.ndarray] = {}
        for name in names:
            arr, dims, coords = self._select(name, sel)
            values[name] = arr.reshape(-1)
        shape = tuple(len(coords[d]) for d in dims)
        grid = np.indices(shape).reshape(len(dims), -1) if dims else np.zeros((0, 1), int)
        for axis, dim in enumerate(dims):
            pos = coords[dim][grid[axis]]
            columns[dim] = pos
            labels = self._labels(dim, list(coords[dim]))
            if labels is not None:
                columns[f"{dim}_token"] = np.asarray(labels, dtype=object)[grid[axis]]
        for dim, wanted in sel.items():  # fixed dimensions stay visible as constant columns
            if dim in self._dims[names[0]] and dim not in dims:
                columns[dim] = np.full(grid.shape[1], wanted)
        columns.update(values)
        return pd.DataFrame(columns)

    def to_xarray(self, *fields: str) -> xr.Dataset:
        """An `xarray.Dataset` with named dimensions (layer, head, query, key, …), integer
        coordinates and a `<dim>_token` coordinate of token labels; scalar fields go to
        `attrs`. Needs the optional `xarray` package (`pip install identifiable[xarray]`).
        For results held as tables: the table (default the first) indexed by its keys."""
        try:
            import xarray as xr
        except ImportError:
            raise IdentifiableError(
                "to_xarray needs xarray: pip install 'identifiable[xarray]'"
            ) from None
        attrs = self._attrs()
        if self._tables and (not fields or fields[0] in self._tables):
            name = fields[0] if fields else next(iter(self._tables))
            table = getattr(self, name)
            keys = [k for k in self._tables[name] if k in table.columns]
            ds = table.set_index(keys).to_xarray()
            ds.attrs.update(attrs)
            return ds
        names = list(fields) or [n for n in self._dims if self._raw_value(n) is not None]
        data_vars: dict[str, Any] = {}
        coords: dict[str, Any] = {}
        for name in names:
            arr, dims, cs = self._select(name, {})
            data_vars[name] = (dims, arr)
            for dim, coord in cs.items():
                coords.setdefault(dim, coord)
                labels = self._labels(dim, list(coord))
                if labels is not None:
                    coords.setdefault(f"{dim}_token", (dim, labels))
        return xr.Dataset(data_vars, coords=coords, attrs=attrs)

    def _attrs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"result": type(self).__name__}
        if self._model:
            out["model"] = self._model
        for attr in self._summary:
            value = getattr(self, attr, None)
            if isinstance(value, (str, int, float, bool)):
                out[attr] = value
        return out

    # ---- peers -----------------------------------------------------------------------------
    def to_bertviz(self, field: str | None = None, *, layers: Sequence[int] | None = None):
        """What `bertviz.head_view(attention, tokens)` expects: a tuple with one
        `[1, H, n, n]` float tensor per layer, from a `[layer, head, query, key]` array
        (default: the primary one, e.g. `effective`; also "raw" or "null").

        bertviz draws each weight as a line's opacity: negative effective or null weights
        are drawn as no line, so compare `raw` with `effective` head by head.
        """
        import torch

        name = field or next(
            (n for n in self._dims if tuple(self._dims[n]) == ("layer", "head", "query", "key")),
            None,
        )
        shaped = [
            n for n in self._dims if tuple(self._dims[n]) == ("layer", "head", "query", "key")
        ]
        if name is None:
            raise IdentifiableError(
                f"to_bertviz needs a [layer, head, query, key] array, and {type(self).__name__} "
                f"has none (its arrays: {', '.join(self._dims)}); bertviz draws attention "
                "heads: use an EffectiveAttention result (idf.effective_attention(trace))"
            )
        if name not in shaped:
            raise IdentifiableError(
                f"to_bertviz needs a [layer, head, query, key] array; {type(self).__name__}"
                f".{name} is not one (those that are: {', '.join(shaped) or 'none'})"
            )
        sel = {} if layers is None else {"layer": list(layers)}
        arr, _, _ = self._select(name, sel)
        return tuple(torch.from_numpy(arr[i][None].astype("float32")) for i in range(len(arr)))

    # ---- figures ---------------------------------------------------------------------------
    def plot(self, *fields: str, **sel: Any) -> Figure:
        """A labelled matplotlib `Figure` (not drawn on screen; Jupyter shows it).

        fields: arrays to draw side by side on one colour scale (default: the class's
            choice, e.g. raw, effective and null attention); sel: the coordinates of the
            dimensions not drawn (`layer=2, head=5`; defaults are the class's), `axes`: the
            two dimensions drawn. Token tick labels where they fit (every k-th otherwise).
        """
        from identifiable.results import plots

        spec = dict(self._plot)
        kind = sel.pop("kind", spec.pop("kind", None))
        if self._tables and kind in (None, "layer_lines"):
            return plots.layer_lines(self, fields[0] if fields else next(iter(self._tables)), sel)
        names = list(fields) or [
            n
            for n in (list(spec.pop("fields", ())) or self._default_fields()[:1])
            if self._raw_value(n) is not None  # e.g. a witness that does not exist
        ]
        if not names:
            raise IdentifiableError(f"{type(self).__name__} holds no arrays to plot")
        axes = tuple(sel.pop("axes", spec.pop("axes", ())))
        for name in names:
            self._check_field(name)
        dims = tuple(self._dims[names[0]])
        drawn = axes or (dims[-2:] if kind != "interval" and len(dims) >= 2 else dims[-1:])
        unknown = set(sel) - set(dims)
        if unknown:
            raise IdentifiableError(
                f"plot: {', '.join(sorted(unknown))} is not a dimension of {names[0]} "
                f"({', '.join(dims)})"
            )
        shape = self._raw_value(names[0]).shape
        chosen = {}
        for axis, d in enumerate(dims):
            if d not in drawn:  # the class's default, else the first coordinate
                coord = self._coord(d, shape[axis])
                chosen[d] = int(coord[_position(d, coord, sel.get(d, spec.get(d, coord[0])))])
        title = ", ".join(f"{d} {v}" for d, v in chosen.items())
        if kind == "interval":
            return plots.interval_plot(self, names, chosen, title)
        panels = []
        for name in names:
            arr, kept, coords = self._select(name, chosen)
            if tuple(kept) != tuple(d for d in dims if d in drawn):
                raise IdentifiableError(f"plot: cannot draw {name} over {list(drawn)}")
            if drawn != tuple(kept):  # the caller asked for the axes in the other order
                arr = arr.T
                kept = tuple(reversed(kept))
            panels.append((name, arr, kept, coords))
        if len(drawn) == 1:
            return plots.bars(self, panels, title)
        return plots.heatmaps(self, panels, title)

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
        from identifiable.results import files as rf

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


# ---- small helpers ------------------------------------------------------------------------


def _to_numpy(value: Any) -> np.ndarray | None:
    import numpy as np

    if value is None:
        return None
    if hasattr(value, "detach"):
        t = value.detach().cpu()
        if t.dtype.is_floating_point and t.element_size() < 4:
            t = t.float()  # bfloat16 has no numpy dtype
        return t.numpy()
    return np.asarray(value)


def _dtype_name(value: Any) -> str:
    return str(getattr(value, "dtype", type(value).__name__)).removeprefix("torch.")


def _shape_text(value: Any, dims: Sequence[str]) -> str:
    shape = getattr(value, "shape", ())
    inner = ", ".join(f"{d}={s}" for d, s in zip(dims, shape, strict=False))
    return f"{_dtype_name(value)}[{inner}]"


def _min_max(name: str, value: Any) -> tuple[str, str]:
    """min and max as text; "—" where they mean nothing (token ids, masks) or cost a pass
    over a very large array."""
    from identifiable.results.html import stats

    if getattr(value, "numel", lambda: getattr(value, "size", 0))() > HTML_STATS_LIMIT:
        return "—", "—"
    got = stats(name, value)
    return got if got is not None else ("—", "—")


def _position(dim: str, coord: np.ndarray, wanted: Any) -> int:
    """Index of coordinate `wanted` along `dim` (a negative int counts from the end)."""
    import numpy as np

    try:
        value = int(wanted)
    except (TypeError, ValueError):
        raise IdentifiableError(f"{dim} must be an integer, got {wanted!r}") from None
    hits = np.flatnonzero(coord == value)
    if hits.size:
        return int(hits[0])
    if value < 0 and -value <= len(coord):
        return len(coord) + value
    shown = ", ".join(str(int(c)) for c in coord[:12]) + (" …" if len(coord) > 12 else "")
    raise IdentifiableError(f"{dim} {value} is not in this result: choose one of {shown}")
