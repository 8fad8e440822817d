"""The result file format: one safetensors file, arrays as tensors, the rest as JSON.

`Result.save(path)` writes it and `Result.load(path)` / `identifiable.results.load(path)`
read it. A result file is input from anywhere (a colleague, a download, a tampered copy),
so reading it is bounded and checked before anything is built:

* Nothing is unpickled, and no module named in the file is ever imported. The class a file
  names is looked up in `RESULT_CLASSES`, the explicit table of identifiable's result
  classes; a name not in it (`os:system`, `identifiable.__main__:EffectiveAttention`) is
  refused. Only the module the table itself gives is imported, never the file's text.
  (`tests/results/test_registry.py` checks the table against every `Result` subclass.)
* Every malformed header (not JSON, nested too deeply, a missing or mistyped `class`,
  `fields`, `kind` or `value`, a bad `version`, a table whose columns do not line up) is
  one `IdentifiableError` that names the file.
* Arrays are checked against the class's declared dimensions (`Result._dims`): the number
  of axes, and one size per dimension name across the result's arrays. Plain fields are
  checked against their annotation (a `layer: int` holding text is refused).

This module sits on the lowest floor with `identifiable.results`: it imports only
`identifiable.errors` and `identifiable.store`, and numpy, pandas, safetensors and torch
lazily.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError

FORMAT = "identifiable.result"
FORMAT_VERSION = 1
META_KEY = "identifiable"

# Every result class a file may name: "module:qualname". Files store this name; loading
# looks it up here and imports only the module this table gives (a lazy table, like the
# package's public names, so that `import identifiable.results` stays cheap).
RESULT_CLASSES: tuple[str, ...] = (
    "identifiable.models.trace:Trace",
    "identifiable.attention.effective:NullSpace",
    "identifiable.attention.effective:EffectiveAttention",
    "identifiable.attention.intervals:Witness",
    "identifiable.attention.intervals:AttentionIntervals",
    "identifiable.attention.intervals:IntervalMap",
    "identifiable.attention.constrained:ConstrainedAttention",
    "identifiable.attention.sinks:SinkMass",
    "identifiable.attention.posterior:AttentionPosterior",
    "identifiable.attention.scan:ScanResult",
    "identifiable.attribution.api:HTAResult",
    "identifiable.experiments.tokens:TokenIdentifiabilityResult",
    "identifiable.mixing.result:MixingResult",
)


# Names files written by earlier versions use for classes that have moved since.
FORMER_NAMES: dict[str, str] = {
    f"identifiable.attention.certify:{qual}": f"identifiable.attention.intervals:{qual}"
    for qual in ("Witness", "AttentionIntervals", "IntervalMap")
}


def class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def current_name(stored: Any) -> Any:
    """The table's name for a class name read from a file (a moved class's former name
    maps to where it lives now); anything else unchanged."""
    return FORMER_NAMES.get(stored, stored) if isinstance(stored, str) else stored


def _damaged(path: str, why: str) -> IdentifiableError:
    return IdentifiableError(f"{path} is damaged or was edited ({why}); save the result again")


def is_result(value: Any) -> bool:
    """Whether `value` (an instance or a class) is a `Result` dataclass, by the class flag
    `Result._is_result`: this module never imports `identifiable.results`, which imports it."""
    return dataclasses.is_dataclass(value) and bool(getattr(value, "_is_result", False))


def resolve_class(name: Any, path: str) -> type:
    """The result class `name` from `RESULT_CLASSES`; anything else is refused."""
    name = current_name(name)
    if not isinstance(name, str) or not name:
        raise _damaged(path, "its class name is not text")
    if name not in RESULT_CLASSES:
        module, _, qual = name.partition(":")
        if not (module == "identifiable" or module.startswith("identifiable.")):
            raise IdentifiableError(
                f"{path} names a class outside identifiable ({name[:200]!r}); not loaded"
            )
        raise IdentifiableError(
            f"{path} names {name[:200]!r}, which is not a result class of this version of "
            "identifiable; not loaded"
        )
    module, _, qual = RESULT_CLASSES[RESULT_CLASSES.index(name)].partition(":")
    cls = getattr(importlib.import_module(module), qual)  # the table's module, not the file's
    if not (isinstance(cls, type) and is_result(cls)):  # pragma: no cover - table test
        raise IdentifiableError(f"{path} names {name}, which is not a result class")
    return cls


# ---- writing --------------------------------------------------------------------------------


def encode(obj: Any, prefix: str, tensors: dict[str, Any]) -> dict[str, Any]:
    """The JSON node of a result (its arrays go into `tensors` under `prefix`)."""
    import numpy as np
    import pandas as pd
    import torch

    fields: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if value is None:
            fields[f.name] = {"kind": "none"}
        elif isinstance(value, torch.Tensor):
            tensors[key] = value.detach().cpu()
            fields[f.name] = {"kind": "tensor"}
        elif isinstance(value, np.ndarray):
            tensors[key] = torch.from_numpy(np.ascontiguousarray(value))
            fields[f.name] = {"kind": "ndarray"}
        elif is_result(value):
            fields[f.name] = {"kind": "result", **encode(value, f"{key}.", tensors)}
        elif isinstance(value, pd.DataFrame):
            fields[f.name] = _encode_table(value, f"{key}/", tensors)
        else:
            fields[f.name] = {
                "kind": "json",
                "tuple": isinstance(value, tuple),
                "value": json.loads(json.dumps(_plain(value), default=str)),
            }
    return {"class": class_name(type(obj)), "fields": fields}


def _encode_table(df: Any, prefix: str, tensors: dict[str, Any]) -> dict[str, Any]:
    """Numeric columns as tensors (exact), the rest as JSON lists."""
    import pandas as pd
    import torch

    cols, numeric, text = [str(c) for c in df.columns], [], {}
    for col in df.columns:
        series = df[col]
        if pd.api.types.is_bool_dtype(series) or pd.api.types.is_numeric_dtype(series):
            tensors[f"{prefix}{col}"] = torch.from_numpy(series.to_numpy().copy())
            numeric.append(str(col))
        else:
            text[str(col)] = [None if pd.isna(v) else _plain(v) for v in series.tolist()]
    index = None
    if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        index = [_plain(v) for v in df.index.tolist()]
    return {"kind": "table", "columns": cols, "numeric": numeric, "text": text, "index": index}


def _plain(value: Any) -> Any:
    """JSON-ready copy: numpy/torch scalars to Python, tuples to lists, keys to str."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def unshare(tensors: dict[str, Any]) -> dict[str, Any]:
    """safetensors refuses tensors that share memory or are not contiguous: copy those."""
    seen: set[int] = set()
    out = {}
    for key, t in tensors.items():
        t = t.contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else -1
        if ptr in seen:
            t = t.clone()
        elif ptr != -1:
            seen.add(ptr)
        out[key] = t
    return out


def file_bytes(obj: Any) -> bytes:
    """The bytes of the result file for `obj`."""
    from safetensors.torch import save

    tensors: dict[str, Any] = {}
    header = {"format": FORMAT, "version": FORMAT_VERSION, **encode(obj, "", tensors)}
    return save(unshare(tensors), metadata={META_KEY: json.dumps(header)})


# ---- reading --------------------------------------------------------------------------------


def read(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, tensors) of a result file; the header's top level is checked here."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise IdentifiableError(f"{path}: no such file; write one with result.save(path)")
    not_ours = f"{path} is not an identifiable result file; write one with result.save(path)"
    try:
        with safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            text = meta.get(META_KEY)
            if text is None:
                raise IdentifiableError(not_ours)
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
    except IdentifiableError:
        raise
    except Exception:  # safetensors raises its own error types for a foreign file
        raise IdentifiableError(not_ours) from None
    try:
        header = json.loads(text)
    except RecursionError:
        raise _damaged(str(path), "its header is JSON nested too deeply") from None
    except ValueError:  # not JSON, or an integer too long to read
        raise IdentifiableError(not_ours) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise IdentifiableError(not_ours)
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < 10**6:
        raise _damaged(str(path), f"format version {str(version)[:40]!r} is not a version number")
    if version > FORMAT_VERSION:
        raise IdentifiableError(
            f"{path} was written by a newer identifiable (format {version}); upgrade"
        )
    _check_node(header, str(path), "the file")
    return header, tensors


def _check_node(node: Any, path: str, where: str) -> None:
    if not isinstance(node, dict):
        raise _damaged(path, f"{where} is not an object")
    if not isinstance(node.get("class"), str) or not node["class"]:
        raise _damaged(path, f"{where} names no class")
    if not isinstance(node.get("fields"), dict):
        raise _damaged(path, f"{where} has no fields")


def decode(header: dict[str, Any], tensors: dict[str, Any], cls: type | None, path: str) -> Any:
    """Build the result a checked header describes (`cls`: the class asked for, or None to
    take the file's)."""
    cls = cls or resolve_class(header["class"], path)
    return _build(cls, header["fields"], "", tensors, path)


def _build(cls: type, fields: dict[str, Any], prefix: str, tensors: dict[str, Any], path: str):
    # Fields the class does not have are skipped, never followed: the nesting of a file is
    # bounded by its class's own (EffectiveAttention → NullSpace), whatever the JSON holds.
    kwargs: dict[str, Any] = {}
    known = {f.name for f in dataclasses.fields(cls)}
    for name, entry in fields.items():
        if name not in known:
            continue  # a field this version dropped
        key = f"{prefix}{name}"
        kwargs[name] = _field_value(cls, name, entry, key, tensors, path)
    _check_arrays(cls, kwargs, path, prefix)
    _check_types(cls, kwargs, path, prefix)
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise IdentifiableError(f"{path} does not fit {cls.__name__}: {err}") from None


def _field_value(
    cls: type, name: str, entry: Any, key: str, tensors: dict[str, Any], path: str
) -> Any:
    if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str):
        raise _damaged(path, f"field {key} has no kind")
    kind = entry["kind"]
    if kind == "none":
        return None
    if kind in ("tensor", "ndarray"):
        if key not in tensors:
            raise _damaged(path, f"the array {key} is missing")
        return tensors[key] if kind == "tensor" else tensors[key].numpy()
    if kind == "result":
        _check_node(entry, path, f"field {key}")
        sub = _field_class(cls, name, entry["class"]) or resolve_class(entry["class"], path)
        return _build(sub, entry["fields"], f"{key}.", tensors, path)
    if kind == "table":
        return _decode_table(entry, f"{key}/", tensors, path)
    if kind == "json":
        if "value" not in entry:
            raise _damaged(path, f"field {key} has no value")
        value = entry["value"]
        return tuple(value) if entry.get("tuple") is True and isinstance(value, list) else value
    raise _damaged(path, f"unknown field kind {kind[:40]!r}")


def _field_class(cls: type, name: str, stored: str) -> type | None:
    """The class a field is annotated with, when it is the stored one (no import needed)."""
    hint = _hints(cls).get(name)
    return hint if isinstance(hint, type) and class_name(hint) == current_name(stored) else None


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # annotations that only resolve under TYPE_CHECKING
        return {}


def _decode_table(entry: dict[str, Any], prefix: str, tensors: dict[str, Any], path: str) -> Any:
    import pandas as pd

    columns, numeric, text = entry.get("columns"), entry.get("numeric"), entry.get("text")
    if not (
        isinstance(columns, list)
        and all(isinstance(c, str) for c in columns)
        and isinstance(numeric, list)
        and isinstance(text, dict)
        and all(isinstance(v, list) for v in text.values())
    ):
        raise _damaged(path, f"table {prefix[:-1]} has malformed columns")
    data: dict[str, Any] = {}
    for col in columns:
        if col in numeric:
            t = tensors.get(f"{prefix}{col}")
            if t is None or t.dim() != 1:
                raise _damaged(path, f"column {prefix}{col} is missing or not one-dimensional")
            data[col] = t.numpy()
        elif col in text:
            data[col] = text[col]
        else:
            raise _damaged(path, f"column {prefix}{col} is missing")
    lengths = {len(v) for v in data.values()}
    index = entry.get("index")
    if index is not None:
        if not isinstance(index, list):
            raise _damaged(path, f"table {prefix[:-1]} has a malformed index")
        lengths.add(len(index))
    if len(lengths) > 1:
        raise _damaged(path, f"the columns of table {prefix[:-1]} differ in length")
    df = pd.DataFrame(data, columns=columns)
    if index is not None:
        df.index = index
    return df


def _check_arrays(cls: type, kwargs: dict[str, Any], path: str, prefix: str) -> None:
    """Each array has its declared number of axes, and one size per dimension name."""
    sizes: dict[str, tuple[int, str]] = {}
    for name, dims in getattr(cls, "_dims", {}).items():
        value = kwargs.get(name)
        if value is None:
            continue
        shape = getattr(value, "shape", None)
        if shape is None:
            raise _damaged(path, f"{prefix}{name} is not an array")
        shape = tuple(int(s) for s in shape)
        if len(shape) != len(dims):
            raise _damaged(
                path,
                f"{prefix}{name} has shape {list(shape)}, but a {cls.__name__} holds it as "
                f"[{', '.join(dims)}]",
            )
        for dim, size in zip(dims, shape, strict=True):
            seen = sizes.setdefault(dim, (size, name))
            if seen[0] != size:
                raise _damaged(
                    path,
                    f"{prefix}{name} has {dim} = {size} but {prefix}{seen[1]} has "
                    f"{dim} = {seen[0]}",
                )


def _check_types(cls: type, kwargs: dict[str, Any], path: str, prefix: str) -> None:
    """Each value is of its field's annotated kind (an `int` field holds an int, …)."""
    hints = _hints(cls)
    for name, value in kwargs.items():
        hint = hints.get(name)
        if hint is not None and not _fits(value, hint):
            raise _damaged(
                path, f"{prefix}{name} holds {type(value).__name__}, expected {_hint_text(hint)}"
            )


_UNIONS = (typing.Union, types.UnionType)


def _fits(value: Any, hint: Any) -> bool:
    """Whether `value` is of the kind `hint` names (origin classes only; unknown hints
    pass, so a new annotation never refuses a good file)."""
    import numpy as np
    import torch

    if hint is Any or isinstance(hint, typing.TypeVar):
        return True
    origin = typing.get_origin(hint)
    if origin in _UNIONS:
        return any(_fits(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    target = origin or hint
    if not isinstance(target, type):
        return True
    if target is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if target is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if issubclass(target, str):
        return isinstance(value, str)
    if issubclass(target, Sequence):
        if not isinstance(value, (list, tuple)):
            return False
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        plain = len(set(args)) == 1 and args[0] in (str, int, float, bool)
        return not plain or all(_fits(v, args[0]) for v in value)
    if issubclass(target, Mapping):
        return isinstance(value, dict)
    if target is torch.Tensor:
        return isinstance(value, torch.Tensor)
    if target is np.ndarray:
        return isinstance(value, np.ndarray)
    return isinstance(value, target)


def _hint_text(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
