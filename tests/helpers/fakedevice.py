"""A stand-in for a GPU on a machine without one, strict about device mixing.

`on_fake_cuda()` is a context manager: inside it, `to_fake(t)` gives a tensor whose
`device` is `cuda:0` and whose numbers live on the CPU. Every aten op is checked the way
CUDA checks it: an op that mixes such a tensor with a CPU tensor of one or more dimensions
raises "Expected all tensors to be on the same device" (CPU scalars and CPU index
tensors are allowed, as on CUDA), a factory call with `device=` a CUDA device makes a fake
tensor, and `.numpy()` of a fake tensor fails as it does on CUDA. So a function that runs
here without error, on fake inputs, creates every tensor it mixes on its inputs' device:
the property a real GPU run needs, tested without one. The numbers are the CPU's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

FAKE = torch.device("meta")
_aten = torch.ops.aten
# ops that may take CPU index tensors with CUDA data, or copy across devices
_INDEX_OPS = {
    _aten.index.Tensor,
    _aten.index_put.default,
    _aten.index_put_.default,
    _aten._index_put_impl_.default,
}
_COPY_OPS = {_aten.copy_.default, _aten._to_copy.default, _aten.copy.default}


class FakeDevice(torch.Tensor):
    """A CPU tensor that says it is on cuda:0 (see the module docstring)."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> FakeDevice:
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            device=FAKE,
            requires_grad=False,
        )

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    def __repr__(self) -> str:  # type: ignore[override]
        return f"FakeDevice({self.inner!r})"

    # A list index becomes a CPU index tensor (as CUDA copies it over): torch would build
    # it on the tensor's own device in C++, out of the stand-in's sight.
    def __getitem__(self, index: Any) -> Any:
        return super().__getitem__(_lists_to_tensors(index))

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(_lists_to_tensors(index), value)

    def tolist(self) -> Any:  # type: ignore[override]
        return self.inner.tolist()  # CUDA copies to the host for this too

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise TypeError("can't convert a device tensor to numpy (fake device)")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        raise RuntimeError(f"FakeDevice used outside on_fake_cuda(): {func}")


def _lists_to_tensors(index: Any) -> Any:
    if isinstance(index, list):
        return torch.tensor(index)
    if isinstance(index, tuple):
        return tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)
    return index


def _is_fake(device: Any) -> bool:
    return device is not None and torch.device(device).type == FAKE.type


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = dict(kwargs or {})
        flat, _ = tree_flatten((args, kwargs))
        fake_in = any(isinstance(t, FakeDevice) for t in flat)
        if any(isinstance(t, torch.Tensor) and t.is_meta and not isinstance(t, FakeDevice)
               for t in flat):  # fmt: skip
            raise RuntimeError(
                f"{func} got a tensor made on the device from Python data (torch.tensor(..., "
                "device=) or a list index), whose values the stand-in cannot see: build it on "
                "the CPU and index with it, or move it with .to(device)"
            )
        device = kwargs.get("device")
        to_fake = _is_fake(device)
        if to_fake:
            kwargs["device"] = torch.device("cpu")
        if fake_in and func not in _COPY_OPS:
            indices = args[1] if func in _INDEX_OPS and len(args) > 1 else None
            index_ids = {id(t) for t in tree_flatten(indices)[0]} if indices is not None else set()
            for t in flat:
                if (
                    isinstance(t, torch.Tensor)
                    and not isinstance(t, FakeDevice)
                    and t.dim() > 0
                    and id(t) not in index_ids
                ):
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least "
                        f"two devices, the device and cpu! ({func}, a CPU tensor of shape "
                        f"{tuple(t.shape)})"
                    )
        if func is _aten._local_scalar_dense.default:
            return func(*tree_map(_unwrap, args), **kwargs)
        wrap = to_fake or (fake_in and device is None)
        if func in (_aten._to_copy.default, _aten.copy.default) and device is not None:
            wrap = to_fake
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        if func is _aten.copy_.default or (func.__name__.endswith("_") and args):
            return args[0]  # in-place: the caller's tensor, updated through its inner data
        if "out" in kwargs and isinstance(kwargs["out"], torch.Tensor):
            return kwargs["out"]
        return tree_map(lambda t: _wrap(t) if wrap else t, out)


def _unwrap(t: Any) -> Any:
    return t.inner if isinstance(t, FakeDevice) else t


def _wrap(t: Any) -> Any:
    return FakeDevice(t) if isinstance(t, torch.Tensor) and not isinstance(t, FakeDevice) else t


def to_fake(t: torch.Tensor) -> torch.Tensor:
    """`t` on the fake CUDA device (a copy, as `.to("cuda")` makes)."""
    return FakeDevice(t.detach().clone())


def to_cpu(t: Any) -> Any:
    """A fake tensor's numbers as a plain CPU tensor (anything else unchanged)."""
    return t.inner.clone() if isinstance(t, FakeDevice) else t


@contextmanager
def on_fake_device() -> Iterator[None]:
    """Run the block with fake CUDA tensors checked (see the module docstring)."""
    with _Mode():
        yield
