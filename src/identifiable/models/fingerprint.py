"""Fingerprints of a model that see every weight, for keying caches.

`model_fingerprint(module)` hashes the config and, in registration order, the name,
dtype, shape and every byte of every parameter and buffer (tied weights once). Each
tensor's bytes go through xxHash's XXH3-128 (several GB/s on one core, about 12× SHA-256
here: benchmarks/bench_training.py measures both), and SHA-256 combines the per-tensor
digests with the names. So an in-place edit of any single value (`p.add_`, `p.data[…] =`,
`load_state_dict`) gives a new key; torch's version counters cannot be trusted for that,
since writes through `.data` do not bump them.

Tensors on the meta device (weights offloaded to disk by accelerate) have no values in
memory: their checkpoint's safetensors files on disk are hashed instead, where the
config names a local folder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

_CHUNK = 1 << 28  # bytes per copy from an accelerator (bounded host memory)


def tensor_digest(t: torch.Tensor) -> bytes:
    """XXH3-128 of a tensor's bytes (any dtype and device; copied to the CPU in chunks)."""
    import xxhash

    h = xxhash.xxh3_128()
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return h.digest()
    step = max(1, _CHUNK // flat.element_size())
    for start in range(0, flat.numel(), step):
        part = flat[start : start + step]
        if part.device.type != "cpu":
            part = part.cpu()
        raw = part.contiguous().view(torch.uint8).numpy()
        h.update(memoryview(raw))  # type: ignore[arg-type]  # numpy stubs: ndarray is a Buffer
    return h.digest()


def _tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters()
    yield from module.named_buffers()


def _checkpoint_files(module: nn.Module) -> list[Path]:
    config = getattr(module, "config", None)
    source = Path(str(getattr(config, "_name_or_path", "") or "")).expanduser()
    return sorted(source.glob("*.safetensors")) if source.is_dir() else []


def model_fingerprint(module: nn.Module) -> str:
    """16 hex digits: the config and every weight of `module` (see the module docstring)."""
    config = getattr(module, "config", None)
    h = hashlib.sha256(config.to_json_string().encode() if config is not None else b"")
    on_meta = False
    for name, t in _tensors(module):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.device.type == "meta":
            on_meta = True
            continue
        h.update(tensor_digest(t))
    if on_meta:
        for path in _checkpoint_files(module):
            h.update(path.name.encode())
            h.update(file_digest(path))
    return h.hexdigest()[:16]


def file_digest(path: Path) -> bytes:
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.digest()
