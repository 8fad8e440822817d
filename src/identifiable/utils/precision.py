"""The precision of float32 matrix products on the CPU, read without raising.

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


def float32_matmul_precision() -> str:
    """The precision in force for the CPU's (oneDNN's) float32 matmuls: "ieee" (full
    float32), "tf32" or "bf16" (products rounded to 10 or 7 mantissa bits on
    hardware that has them), or "unknown"."""
    backends = torch.backends
    mkldnn = getattr(backends, "mkldnn", None)
    settings = (
        getattr(getattr(mkldnn, "matmul", None), "fp32_precision", None),
        getattr(mkldnn, "fp32_precision", None),
        getattr(backends, "fp32_precision", None),
    )
    if any(value is not None for value in settings):
        return next((str(v) for v in settings if v not in (None, "none")), "ieee")
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:
        return "unknown"
    return _LEGACY.get(legacy, "unknown")


def float32_matmuls_exact() -> bool:
    """Whether float32 matmuls run at full float32 precision (no TF32 or bfloat16)."""
    return float32_matmul_precision() == "ieee"
