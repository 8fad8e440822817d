"""Device names from users (`--device`, `load_model(device=...)`), checked before any work."""

from __future__ import annotations

import torch

from identifiable.errors import IdentifiableError

DEVICE_CHOICES = ("cpu", "cuda", "cuda:N", "mps", "auto")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A torch device that exists on this machine, or one IdentifiableError line.

    "auto" picks the first available of cuda, mps and cpu.
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, torch.device):
        dev = device
    else:
        name = str(device).strip().lower()
        if name == "auto":
            if torch.cuda.is_available():
                return torch.device("cuda")
            return torch.device("mps") if _mps_available() else torch.device("cpu")
        try:
            dev = torch.device(name)
        except (RuntimeError, ValueError):
            raise IdentifiableError(
                f"unknown device '{device}': use one of {', '.join(DEVICE_CHOICES)}"
            ) from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise IdentifiableError(
                f"device '{device}' is not available: this torch build or machine has no CUDA "
                "GPU; use --device cpu (or auto)"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise IdentifiableError(
                f"device '{device}' does not exist: this machine has {count} CUDA device(s), "
                f"cuda:0..cuda:{count - 1}"
            )
        return dev
    if dev.type == "mps":
        if not _mps_available():
            raise IdentifiableError(
                f"device '{device}' is not available on this machine (no Apple MPS); "
                "use --device cpu (or auto)"
            )
        return dev
    raise IdentifiableError(
        f"device type '{dev.type}' is not supported: use one of {', '.join(DEVICE_CHOICES)}"
    )
