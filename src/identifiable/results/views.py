"""A result as tables for other tools: tidy pandas, an xarray Dataset, bertviz's tuple."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from identifiable.errors import IdentifiableError
from identifiable.results.core import ResultCore

if TYPE_CHECKING:  # pragma: no cover - types only
    import numpy as np
    import pandas as pd
    import xarray as xr


class Views(ResultCore):
    """`to_pandas`, `to_xarray` and `to_bertviz` of every result."""

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
