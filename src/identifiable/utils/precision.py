"""The precision of float32 matrix products (CPU and CUDA), read without raising, and where
float64 work runs for a device.

torch has two ways to lower it: the legacy `torch.set_float32_matmul_precision`
("high", "medium") and, since 2.9, per-backend settings such as
`torch.backends.mkldnn.matmul.fp32_precision = "bf16"`. Once both were used, the
legacy getter `torch.get_float32_matmul_precision()` raises, so this module reads
the per-backend settings, the most specific one that is set winning (as torch
resolves them), and falls back on the legacy getter only where they do not exist.
"""

from __future__ import annotations

import torch

_LEGACY = {"highest": "ieee", "high": "tf32", "medium": "bf16"}


def float32_matmul_precision(device: torch.device | str | None = None) -> str:
    """The precision in force for float32 matmuls on `device` (default the CPU, whose
    oneDNN settings are read; a CUDA device reads cuBLAS's): "ieee" (full float32),
    "tf32" or "bf16" (products rounded to 10 or 7 mantissa bits on hardware that has
    them), or "unknown"."""
    backends = torch.backends
    if device is not None and torch.device(device).type == "cuda":
        cuda = getattr(getattr(backends, "cuda", None), "matmul", None)
        settings: tuple[object, ...] = (
            getattr(cuda, "fp32_precision", None),
            getattr(backends, "fp32_precision", None),
        )
        if any(value not in (None, "none") for value in settings):
            return next(str(v) for v in settings if v not in (None, "none"))
        try:
            return "tf32" if bool(getattr(cuda, "allow_tf32", False)) else _legacy()
        except RuntimeError:  # torch refuses the legacy flag once the new API was used
            return "unknown"
    mkldnn = getattr(backends, "mkldnn", None)
    settings = (
        getattr(getattr(mkldnn, "matmul", None), "fp32_precision", None),
        getattr(mkldnn, "fp32_precision", None),
        getattr(backends, "fp32_precision", None),
    )
    if any(value is not None for value in settings):
        return next((str(v) for v in settings if v not in (None, "none")), "ieee")
    return _legacy()


def _legacy() -> str:
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:
        return "unknown"
    return _LEGACY.get(legacy, "unknown")


def float32_matmuls_exact(device: torch.device | str | None = None) -> bool:
    """Whether float32 matmuls on `device` (default the CPU) run at full float32 precision
    (no TF32 or bfloat16)."""
    return float32_matmul_precision(device) == "ieee"


def has_float64(device: torch.device | str) -> bool:
    """Whether `device` computes in float64 (Apple's MPS does not)."""
    return torch.device(device).type != "mps"


def exact_device(device: torch.device | str) -> torch.device:
    """Where the float64 rank decisions for tensors on `device` run: the device itself, or
    the CPU for a device without float64 (MPS), whose n×n products stay on the device in
    float32 (docs/definitions.md#devices)."""
    device = torch.device(device)
    return device if has_float64(device) else torch.device("cpu")
