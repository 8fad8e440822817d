"""A GGUF file as a model folder: dequantized once by transformers, cached as safetensors.

The first load reads the file with transformers' own GGUF loading (its config, its
tokenizer, `load_gguf_checkpoint` for the weights, which dequantizes each tensor to float32)
and writes config.json, model.safetensors, the tokenizer files and a manifest into the user
cache (`store.usercache`, folder `gguf/`). The entry is named after the file and keyed by the
XXH3-128 hash of its bytes; it is built in a temporary folder and renamed into place, so it
is there whole or not at all. Later loads read the folder like any checkpoint, after
checking every file against the manifest's hashes: an entry that fails is rebuilt, never
used (`CacheCorruptWarning`). An entry built by another transformers version is rebuilt too.

config.json carries `dequantized_from` (the file, its hash, its quantization type and its
tensor types), so that the model's fingerprint, `ModelInfo`, traces and reports say that the
weights were dequantized and from what.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError
from identifiable.models.fingerprint import file_digest
from identifiable.models.gguf import (
    GgufHeader,
    check_dequantizable,
    read_header,
    require_gguf,
    tokenizer_error,
    tokenizer_missing,
)
from identifiable.store.cache import CacheCorruptWarning
from identifiable.store.usercache import CACHE_ENV, user_cache_dir, user_cache_root
from identifiable.utils.progress import status

FORMAT = 1
MANIFEST = "gguf.json"
WEIGHTS = "model.safetensors"
STALE_TEMPORARY_S = 24 * 3600  # a build left by a killed process: removed after a day


@dataclass(frozen=True)
class Dequantized:
    """A cache entry: the model folder and what its manifest says.

    Attributes:
        folder: config.json, model.safetensors and the tokenizer files.
        quantization: the GGUF file's type ("Q4_1").
        tokenizer_problem: why no tokenizer could be rebuilt ("the file has no
            tokenizer.ggml.merges"), or None (rebuilt).
        built: whether this call built the entry (False: read from the cache).
    """

    folder: Path
    quantization: str
    tokenizer_problem: str | None
    built: bool


def dequantized(
    path: Path, *, progress: bool = True, tokenizer_needed: bool = False, name: str = ""
) -> Dequantized:
    """The cache entry of the GGUF file `path`, built on first use (see the module docstring).

    Refuses in one line, before anything is written: a file that is not a complete GGUF
    file, a tensor type or an architecture transformers cannot dequantize. The file is read
    whole into memory before the cache folder is touched. `tokenizer_needed`: refuse at once
    a file whose metadata lacks what its tokenizer needs (`name`: the model's name).
    """
    require_gguf()
    try:
        key = file_digest(path).hex()
    except OSError as err:
        raise IdentifiableError(f"cannot read '{path}': {err.strerror or err}") from None
    entry = user_cache_root() / "gguf" / f"{path.stem[:80]}-{key[:16]}"
    manifest = _checked(entry, key)
    if manifest is not None:  # built from these very bytes, which were checked then
        return Dequantized(entry, manifest["quantization"], manifest["tokenizer_problem"], False)
    header = read_header(path)
    check_dequantizable(header)
    missing = tokenizer_missing(header)
    if tokenizer_needed and missing:
        raise tokenizer_error(name or str(path), f"the file has no {missing}")
    parts = _read(header, progress)
    root = user_cache_dir("gguf")
    _remove_stale(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=root))
    try:
        with status(f"{parts.label}: writing the cache …", enabled=progress):
            manifest = _write(parts, header, key, tmp)
        _install(tmp, entry)
    except OSError as err:
        raise IdentifiableError(
            f"cannot write the dequantized weights of '{path.name}' into {root}: "
            f"{err.strerror or err}; free some space or set ${CACHE_ENV} to another folder"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Dequantized(entry, manifest["quantization"], manifest["tokenizer_problem"], True)


def _checked(entry: Path, key: str) -> dict[str, Any] | None:
    """The entry's manifest when every file matches its hash; None (and the entry is to be
    rebuilt) when it is absent, from another transformers version, or fails a check."""
    import transformers

    if not entry.is_dir():
        return None
    try:
        manifest = json.loads((entry / MANIFEST).read_text("utf-8"))
        files = manifest["files"]
        ok = (
            manifest["format"] == FORMAT
            and manifest["source"]["xxh3_128"] == key
            and isinstance(manifest["quantization"], str)
            and isinstance(manifest["tokenizer_problem"], str | None)
        )
        if ok and manifest["transformers"] != transformers.__version__:
            return None  # another conversion: rebuilt, no warning
        bad = [n for n, h in files.items() if not ok or file_digest(entry / n).hex() != h]
    except (OSError, ValueError, KeyError, TypeError) as err:
        bad = [f"{MANIFEST} ({type(err).__name__})"]
    if bad:
        warnings.warn(
            f"the cached dequantized weights in {entry} failed their check ({bad[0]}); they "
            "are rebuilt from the GGUF file",
            CacheCorruptWarning,
            stacklevel=4,
        )
        return None
    return manifest  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _Parts:
    """What transformers read from the file, before anything is written."""

    label: str
    config: Any
    tokenizer: Any
    tokenizer_problem: str | None
    tensors: dict[str, Any]


def _read(header: GgufHeader, progress: bool) -> _Parts:
    """Config, tokenizer and dequantized weights of `header`'s file, step by step."""
    label = f"dequantizing {header.path.name} ({header.quantization}) once"
    with status(f"{label}: config …", enabled=progress):
        config = _config(header)
    with status(f"{label}: tokenizer …", enabled=progress):
        tokenizer, problem = _tokenizer(header, config)
    with status(f"{label}: {sum(header.tensor_types.values())} tensors …", enabled=progress):
        tensors = _weights(header, config)
    return _Parts(label, config, tokenizer, problem, tensors)


def _write(parts: _Parts, header: GgufHeader, key: str, folder: Path) -> dict[str, Any]:
    """The entry's files in `folder`, the manifest (their hashes) last."""
    import transformers

    name = header.path.name
    parts.config.dequantized_from = {
        "format": "GGUF",
        "file": name,
        "xxh3_128": key,
        "quantization": header.quantization,
        "tensor_types": header.tensor_types,
    }
    parts.config.save_pretrained(folder)
    _save_weights(parts.tensors, folder / WEIGHTS)
    if parts.tokenizer is not None:
        parts.tokenizer.save_pretrained(folder)
    manifest = {
        "format": FORMAT,
        "source": {"file": name, "bytes": header.size, "xxh3_128": key},
        "architecture": header.architecture,
        "quantization": header.quantization,
        "tensor_types": header.tensor_types,
        "tokenizer_problem": parts.tokenizer_problem,
        "transformers": transformers.__version__,
        "files": {p.name: file_digest(p).hex() for p in sorted(folder.iterdir()) if p.is_file()},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2), "utf-8")
    return manifest


def _config(header: GgufHeader) -> Any:
    """transformers' config of the file (`AutoConfig.from_pretrained(..., gguf_file=)`), or
    one line naming an architecture it cannot read."""
    from transformers import AutoConfig

    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # a transformers without GGUF support
        GGUF_SUPPORTED_ARCHITECTURES = []

    try:
        with _quiet():
            config = AutoConfig.from_pretrained(
                str(header.path.parent), gguf_file=header.path.name, local_files_only=True
            )
    except Exception as exc:
        arch = header.architecture or "(none)"
        if "not supported" in str(exc) or arch not in GGUF_SUPPORTED_ARCHITECTURES:
            raise IdentifiableError(
                f"'{header.path.name}' is a GGUF file of the architecture '{arch}', which "
                f"transformers {_tf_version()} cannot dequantize (it reads GGUF files of "
                f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES)[:12])}, …); load the "
                "original checkpoint instead"
            ) from None
        raise _read_error(header, "config", exc) from None
    return config


def _tokenizer(header: GgufHeader, config: Any) -> tuple[Any, str | None]:
    """(the tokenizer rebuilt from the file's metadata, in the class `AutoTokenizer` picks for
    the config, so that the config is not read a second time; None), or (None, why not):
    load_model says why, unless the caller brings a tokenizer."""
    try:
        with _quiet():
            tokenizer = _tokenizer_class(config).from_pretrained(
                str(header.path.parent), gguf_file=header.path.name, local_files_only=True
            )
        return tokenizer, None
    except Exception as exc:
        missing = tokenizer_missing(header)
        if missing:
            return None, f"the file has no {missing}"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"transformers {_tf_version()} could not rebuild it: {reason[:160]}"


def _tokenizer_class(config: Any) -> Any:
    from transformers import PreTrainedTokenizerFast
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING

    try:
        found: Any = TOKENIZER_MAPPING[type(config)]
    except KeyError:
        return PreTrainedTokenizerFast
    if isinstance(found, tuple):  # transformers 4.x: (slow, fast)
        found = found[1] or found[0]
    return found or PreTrainedTokenizerFast


def _meta_model(config: Any) -> Any:
    """The model the file's weights belong to, on the meta device (no memory, no values):
    the class the config names, else a causal (or sequence-to-sequence) language model."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    named = getattr(config, "architectures", None) or []
    with torch.device("meta"):
        if named and hasattr(transformers, str(named[0])):
            return getattr(transformers, str(named[0]))(config)
        seq2seq = getattr(config, "is_encoder_decoder", False)
        return (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_config(config)


class _WeightNames:
    """What `load_gguf_checkpoint` reads of the model it maps names for: its config, its
    weight names, and one level of children (the base model, for checkpoints converted from
    it). Building these from a meta-device model is instant; walking every module of the
    model itself rebuilds gguf's name table once per module (13 s for SmolLM2's 397)."""

    def __init__(self, config: Any, names: list[str], prefix: str | None) -> None:
        self.config, self.names, self.prefix = config, names, prefix

    def state_dict(self) -> dict[str, None]:
        return dict.fromkeys(self.names)

    def named_children(self) -> list[tuple[str, _WeightNames]]:
        if not self.prefix:
            return []
        cut = len(self.prefix) + 1
        inner = [n[cut:] for n in self.names if n.startswith(self.prefix + ".")]
        return [(self.prefix, _WeightNames(self.config, inner, None))]


def _weights(header: GgufHeader, config: Any) -> dict[str, Any]:
    """Every weight of the model, dequantized to float32 by transformers (checked complete)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = _meta_model(config)
    config.architectures = [type(model).__name__]
    names = list(model.state_dict())
    shim = _WeightNames(config, names, getattr(model, "base_model_prefix", None))
    try:
        with _quiet():
            parsed = load_gguf_checkpoint(str(header.path), return_tensors=True, model_to_load=shim)
    except Exception as exc:
        raise _read_error(header, "weights", exc) from None
    tensors: dict[str, Any] = parsed["tensors"]
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [n for n in names if n not in tensors and n not in tied]
    if missing:
        raise IdentifiableError(
            f"transformers {_tf_version()} read {len(tensors)} weights of '{header.path.name}' "
            f"but the {header.architecture} model has {len(missing)} more ({', '.join(missing[:3])}"
            f"{', …' if len(missing) > 3 else ''}); this GGUF file cannot be dequantized here"
        )
    return {n: tensors[n].contiguous() for n in names if n in tensors}


def _save_weights(tensors: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


def _install(tmp: Path, entry: Path) -> None:
    """Rename the finished build into place; an entry already there (a stale or corrupt one,
    or one another process finished first) is moved aside first and removed."""
    old = None
    if entry.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
        os.replace(entry, old / "entry")
    try:
        os.replace(tmp, entry)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _remove_stale(root: Path) -> None:
    """Remove the temporary folders of builds killed more than a day ago."""
    now = time.time()
    for p in root.iterdir():
        with contextlib.suppress(OSError):
            old = now - p.stat().st_mtime > STALE_TEMPORARY_S
            if p.name.startswith(".") and p.name.endswith(".tmp") and p.is_dir() and old:
                shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def _quiet() -> Any:
    """transformers' GGUF reading with its log at errors only and its tqdm bar (printed on
    stderr, whatever the progress settings) kept off the screen: `status` shows the steps."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        hf_logging.set_verbosity(level)


def _read_error(header: GgufHeader, what: str, exc: Exception) -> IdentifiableError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return IdentifiableError(
        f"transformers {_tf_version()} could not read the {what} of '{header.path.name}' "
        f"({reason[:200]}); the file may be damaged: download or copy it again"
    )


def _tf_version() -> str:
    import transformers

    return str(transformers.__version__)
