"""The data model every result shares: the class declarations (`_dims`, `_tables`, `_plot`,
`_summary`), token labels, coordinates and the selection of an array by named dimensions.

`Result` (`identifiable.results.base`) combines this core with its views: `display` (repr,
HTML), `views` (pandas, xarray, bertviz), `figures` (plot) and its files (save, load).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from identifiable.errors import IdentifiableError

if TYPE_CHECKING:  # pragma: no cover - types only
    import numpy as np

TOKEN_DIMS = ("query", "token", "row")
# a dimension takes its coordinates from this attribute when the result has one of that length
COORD_ATTRS = {"layer": "layers", "head": "heads", "row": "rows"}


class ResultCore:
    """What a result's arrays mean (declared by the subclass) and how to select from them."""

    _dims: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    _tables: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    _plot: ClassVar[Mapping[str, Any]] = {}
    _summary: ClassVar[tuple[str, ...]] = ()
    # How `result_files` (which this module imports) recognises a result without importing it.
    _is_result: ClassVar[bool] = True

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
