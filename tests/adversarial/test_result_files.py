"""Tampered result files through the public loaders (`identifiable.results.load`,
`Class.load`): each is one `IdentifiableError` that names the file; no module the file
names is imported, nothing runs, nothing is written."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from identifiable.attention import effective_attention
from identifiable.errors import IdentifiableError
from identifiable.results import Result, load

TEXT = "The miller sells bread to every traveller who stops by the old stone bridge at night."


@pytest.fixture(scope="module")
def saved(tiny_model, tmp_path_factory) -> Path:
    """A genuine EffectiveAttention file (with its NullSpace sub-result)."""
    eff = effective_attention(tiny_model("bert").trace(TEXT))
    return eff.save(tmp_path_factory.mktemp("results") / "e.st")


def _parts(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        header = json.loads(f.metadata()["identifiable"])
    return header, load_file(str(path))


def _write(path: Path, header: Any, tensors: dict[str, torch.Tensor], raw: str | None = None):
    from safetensors.torch import save

    text = raw if raw is not None else json.dumps(header)
    path.write_bytes(save(tensors, metadata={"identifiable": text}))
    return path


def _refused(call: Callable[[], Any], path: Path, fragment: str) -> str:
    with pytest.raises(IdentifiableError) as info:
        call()
    message = str(info.value)
    assert str(path) in message, message
    assert "\n" not in message and len(message) < 400, message
    assert fragment in message, message
    return message


# ---- a class name that is not one of ours ------------------------------------------------

FOREIGN_CLASSES = [
    ("identifiable.__main__:EffectiveAttention", "not a result class"),
    ("identifiable.cli:main", "not a result class"),
    ("identifiable.cli.view:view", "not a result class"),
    ("identifiable.results:Result", "not a result class"),
    ("identifiable.attention.effective:LayerEffective", "not a result class"),
    ("identifiable:load_model", "not a result class"),
    ("os:system", "outside identifiable"),
    ("builtins:eval", "outside identifiable"),
    ("identifiable_evil:X", "outside identifiable"),
    ("tests.results.test_mixin:Maps", "outside identifiable"),
    ("", "names no class"),
    (5, "names no class"),
]


@pytest.mark.parametrize(
    ("name", "fragment"), FOREIGN_CLASSES, ids=[str(n) for n, _ in FOREIGN_CLASSES]
)
@pytest.mark.parametrize("where", ["top", "null_space"])
def test_a_class_outside_the_registry_is_never_imported(saved, tmp_path, name, fragment, where):
    from identifiable.attention.effective import EffectiveAttention

    header, tensors = _parts(saved)
    (header if where == "top" else header["fields"]["null_space"])["class"] = name
    path = _write(tmp_path / "t.st", header, tensors)
    before = set(sys.modules)
    loaders = [load] if where == "top" else [load, EffectiveAttention.load]
    for loader in loaders:
        _refused(lambda loader=loader: loader(path), path, fragment)
    assert not {m for m in set(sys.modules) - before if m.startswith(("identifiable", "os"))}


MAIN_SCRIPT = """
import sys
sys.argv = ["identifiable", "view", "x", "--model", {model!r}, "--out", "side.html",
            "--no-certify"]
from identifiable.errors import IdentifiableError
from identifiable.attention.effective import EffectiveAttention
import identifiable.results as results
for loader in (results.load, EffectiveAttention.load):
    try:
        loader({path!r})
    except IdentifiableError as exc:
        print("refused:", exc)
print("main imported:", "identifiable.__main__" in sys.modules)
"""


@pytest.mark.parametrize("where", ["top", "null_space"])
def test_the_cli_never_runs_from_a_loaded_file(saved, tmp_path, model_dir, where) -> None:
    """The issue's reproduction: a script whose argv is a `view` command loads a file that
    names identifiable.__main__; before the fix this wrote side.html or raised SystemExit."""
    header, tensors = _parts(saved)
    node = header if where == "top" else header["fields"]["null_space"]
    node["class"] = "identifiable.__main__:EffectiveAttention"
    path = _write(tmp_path / "e.st", header, tensors)
    script = MAIN_SCRIPT.format(model=str(model_dir), path=str(path))
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("refused:") == 2, proc.stdout + proc.stderr
    assert "main imported: False" in proc.stdout
    assert not (tmp_path / "side.html").exists()
    assert "Traceback" not in proc.stderr


def test_python_dash_m_still_runs_the_cli(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "identifiable", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.startswith("identifiable ")


# ---- malformed headers -------------------------------------------------------------------


def _set(path: list[Any], value: Any) -> Callable[[dict], None]:
    def edit(h: dict) -> None:
        node = h
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value

    return edit


_DELETE = object()
NS = ["fields", "null_space"]

HEADER_EDITS: dict[str, tuple[Callable[[dict], None], str]] = {
    "no class": (_set(["class"], _DELETE), "names no class"),
    "no fields": (_set(["fields"], _DELETE), "has no fields"),
    "fields a list": (_set(["fields"], []), "has no fields"),
    "field not an object": (_set(["fields", "raw"], "tensor"), "field raw has no kind"),
    "field without kind": (_set(["fields", "raw", "kind"], _DELETE), "field raw has no kind"),
    "kind not text": (_set(["fields", "raw", "kind"], 3), "field raw has no kind"),
    "unknown kind": (_set(["fields", "raw", "kind"], "pickle"), "unknown field kind"),
    "json without value": (_set(["fields", "variant", "value"], _DELETE), "has no value"),
    "sub-result without fields": (_set([*NS, "fields"], _DELETE), "has no fields"),
    "sub-result fields a string": (_set([*NS, "fields"], "x"), "has no fields"),
    "sub-result without class": (_set([*NS, "class"], _DELETE), "names no class"),
    "missing array": (_set(["fields", "effective", "kind"], "ndarray"), "effective"),
    "version text": (_set(["version"], "1"), "format version"),
    "version float": (_set(["version"], 1.5), "format version"),
    "version bool": (_set(["version"], True), "format version"),
    "version zero": (_set(["version"], 0), "format version"),
    "version negative": (_set(["version"], -7), "format version"),
    "version null": (_set(["version"], None), "format version"),
    "version list": (_set(["version"], [1]), "format version"),
    "version missing": (_set(["version"], _DELETE), "format version"),
    "version newer": (_set(["version"], 99), "newer identifiable"),
    "version huge": (_set(["version"], 10**300), "format version"),
    "format missing": (_set(["format"], _DELETE), "not an identifiable result file"),
    "format other": (_set(["format"], "pickle"), "not an identifiable result file"),
    "variant a number": (_set(["fields", "variant", "value"], 3), "variant holds int"),
    "tokens a dict": (_set(["fields", "tokens", "value"], {"a": 1}), "tokens holds dict"),
    "tokens of numbers": (_set(["fields", "tokens", "value"], [1, 2]), "tokens holds list"),
    "is_causal text": (_set([*NS, "fields", "is_causal", "value"], "yes"), "is_causal holds str"),
    "null_space a tensor": (_set([*NS, "kind"], "tensor"), "null_space"),
    "null_space none": (_set([*NS], {"kind": "none"}), "null_space holds NoneType"),
    "wrong sub-class": (_set([*NS, "class"], "identifiable.models.trace:Trace"), "does not fit"),
}


@pytest.mark.parametrize("name", list(HEADER_EDITS))
def test_a_malformed_header_is_one_error(saved, tmp_path, name) -> None:
    edit, fragment = HEADER_EDITS[name]
    header, tensors = _parts(saved)
    edit(header)
    path = _write(tmp_path / "h.st", header, tensors)
    from identifiable.attention.effective import EffectiveAttention

    for loader in (load, EffectiveAttention.load):
        _refused(lambda loader=loader: loader(path), path, fragment)


RAW_HEADERS = {
    "not JSON": ("{not json", "not an identifiable result file"),
    "a list": ("[1, 2]", "not an identifiable result file"),
    "a string": ('"identifiable.result"', "not an identifiable result file"),
    "null": ("null", "not an identifiable result file"),
    "100k-deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "100k-deep object": ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    "huge integer": (
        '{"format": "identifiable.result", "version": ' + "9" * 100_000 + "}",
        "not an identifiable result file",
    ),
}


@pytest.mark.parametrize("name", list(RAW_HEADERS))
def test_a_header_that_is_not_a_header_is_one_error(saved, tmp_path, name) -> None:
    raw, fragment = RAW_HEADERS[name]
    _, tensors = _parts(saved)
    path = _write(tmp_path / "r.st", None, tensors, raw=raw)
    _refused(lambda: load(path), path, fragment)


def test_a_deep_chain_under_a_field_the_class_lacks_is_skipped(saved, tmp_path) -> None:
    header, tensors = _parts(saved)
    node = header["fields"]["null_space"]
    for _ in range(40):  # NullSpace has no result field: a chain of fields it lacks
        node["fields"]["null_space"] = {"kind": "result", "class": node["class"],
                                        "fields": dict(node["fields"])}  # fmt: skip
        node = node["fields"]["null_space"]
    path = _write(tmp_path / "n.st", header, tensors)
    back = load(path)  # skipped, not followed (the JSON itself is bounded by its parser)
    assert isinstance(back.null_space, Result) and not hasattr(back.null_space, "null_space")


# ---- arrays checked against the declared dimensions -------------------------------------


def _tensor_edit(key: str, fn: Callable[[torch.Tensor], torch.Tensor]):
    def edit(tensors: dict[str, torch.Tensor]) -> None:
        tensors[key] = fn(tensors[key]).contiguous()

    return edit


SHAPE_EDITS = {
    "1-D effective": (_tensor_edit("effective", lambda t: t.flatten()), "has shape"),
    "scalar effective": (_tensor_edit("effective", lambda t: t.sum()), "has shape"),
    "5-D raw": (_tensor_edit("raw", lambda t: t[None]), "has shape"),
    "a layer less": (_tensor_edit("effective", lambda t: t[:-1]), "layer"),
    "a key less": (_tensor_edit("raw", lambda t: t[..., :-1]), "key"),
    "null space, a head less": (_tensor_edit("null_space.rank", lambda t: t[:, :-1]), "head"),
    "null space, 1-D": (_tensor_edit("null_space.dim", lambda t: t.flatten()), "has shape"),
}


@pytest.mark.parametrize("name", list(SHAPE_EDITS))
def test_arrays_that_do_not_fit_the_declared_dims_are_refused_at_load(
    saved, tmp_path, name
) -> None:
    edit, fragment = SHAPE_EDITS[name]
    header, tensors = _parts(saved)
    edit(tensors)
    path = _write(tmp_path / "s.st", header, tensors)
    _refused(lambda: load(path), path, fragment)


def test_a_genuine_file_still_loads_and_tabulates(saved) -> None:
    back = load(saved)
    table = back.to_pandas(layer=0, head=0)
    assert len(table) == back.raw.shape[-1] ** 2


# ---- tables ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_table(tmp_path_factory) -> Path:
    import pandas as pd

    from identifiable.experiments.tokens import TokenIdentifiabilityResult

    frame = pd.DataFrame({"layer": [1, 2], "probe": ["linear", "mlp"], "rate": [0.5, 0.25]})
    res = TokenIdentifiabilityResult(frame, frame.copy(), frame.copy(), {"seed": 0}, {})
    return res.save(tmp_path_factory.mktemp("tables") / "t.st")


TABLE_EDITS = {
    "columns not a list": (_set(["fields", "per_layer", "columns"], "layer"), "malformed"),
    "text column missing": (_set(["fields", "per_layer", "text"], {}), "is missing"),
    "text column short": (_set(["fields", "per_layer", "text", "probe"], ["x"]), "length"),
    "numeric names a missing tensor": (
        _set(["fields", "per_layer", "numeric"], ["layer", "rate", "probe"]),
        "is missing",
    ),
    "index short": (_set(["fields", "per_layer", "index"], [0]), "length"),
    "index a dict": (_set(["fields", "per_layer", "index"], {"a": 1}), "malformed index"),
    "settings a list": (_set(["fields", "settings", "value"], [1]), "settings holds list"),
}


@pytest.mark.parametrize("name", list(TABLE_EDITS))
def test_a_malformed_table_is_one_error(saved_table, tmp_path, name) -> None:
    edit, fragment = TABLE_EDITS[name]
    header, tensors = _parts(saved_table)
    edit(header)
    path = _write(tmp_path / "t.st", header, tensors)
    _refused(lambda: load(path), path, fragment)


def test_a_numeric_column_of_the_wrong_shape_is_refused(saved_table, tmp_path) -> None:
    header, tensors = _parts(saved_table)
    tensors["per_layer/rate"] = tensors["per_layer/rate"].reshape(2, 1).contiguous()
    path = _write(tmp_path / "t.st", header, tensors)
    _refused(lambda: load(path), path, "not one-dimensional")
