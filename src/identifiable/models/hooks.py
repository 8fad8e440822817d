"""Forward hooks that always come off again.

Every hook the package registers goes through `HookSet`, a context manager that
removes all of them on exit, also when the forward pass raises (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def get_submodule(root: nn.Module, path: str) -> nn.Module:
    """`root.get_submodule(path)` with an error that names the missing path."""
    try:
        return root.get_submodule(path)
    except AttributeError as exc:  # torch raises AttributeError for a missing name
        from identifiable.errors import IdentifiableError

        raise IdentifiableError(
            f"the model has no module '{path}' ({exc}); its architecture spec does not match "
            "this model class (see docs/families.md, 'Adding an architecture')."
        ) from None


def module_list(root: nn.Module, path: str) -> list[nn.Module]:
    """The entries of the `ModuleList` at `path`, or one line saying the spec does not fit."""
    found = get_submodule(root, path)
    if not isinstance(found, nn.ModuleList | nn.Sequential):
        from identifiable.errors import IdentifiableError

        raise IdentifiableError(
            f"'{path}' is a {type(found).__name__}, not a list of layers; the architecture "
            "spec does not match this model class (see docs/families.md, 'Adding an architecture')."
        )
    return list(found)


def first_tensor(output: Any) -> torch.Tensor:
    """Layers return a tensor or a tuple whose first item is the hidden states.

    transformers 4.x DistilBERT returns (attention weights, hidden states) when asked for
    attentions: a leading 4-D attention map is skipped (hidden states are 3-D, [B, N, d]).
    """
    if not isinstance(output, tuple | list):
        return output
    if len(output) > 1 and isinstance(output[0], torch.Tensor) and output[0].dim() == 4:
        return output[1]
    return output[0]


class HookSet:
    """Collects hook handles; `with HookSet() as hooks:` removes them all on exit."""

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []
        self._undo: list[Callable[[], None]] = []

    def pre(self, module: nn.Module, fn: Callable[..., Any], *, with_kwargs: bool = False) -> None:
        self._handles.append(module.register_forward_pre_hook(fn, with_kwargs=with_kwargs))

    def post(self, module: nn.Module, fn: Callable[..., Any]) -> None:
        self._handles.append(module.register_forward_hook(fn))

    def replace_forward(self, module: nn.Module, fn: Callable[..., Any]) -> None:
        """Run `fn` in place of `module.forward` until the set is removed.

        For a module whose own forward cannot be transformed (a custom
        `autograd.Function` without forward-mode AD) but has a plain-torch
        equivalent. Hooks still run (they wrap `__call__`). An instance-level
        forward that was there before (accelerate's device hooks) is restored.
        """
        had = "forward" in module.__dict__
        before: Any = module.__dict__.get("forward")
        module.forward = fn  # type: ignore[method-assign]

        def undo() -> None:
            if had:
                module.forward = before  # type: ignore[method-assign]
            else:
                del module.forward

        self._undo.append(undo)

    def on_remove(self, fn: Callable[[], None]) -> None:
        """Run `fn` when the set is removed (after the hooks, in reverse order)."""
        self._undo.append(fn)

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> HookSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def replace_hidden_input(
    value: torch.Tensor, *, first_call_only: bool = False
) -> Callable[..., Any]:
    """A pre-hook (with kwargs) that feeds `value` to a layer in place of its hidden states.

    Layers take the hidden states as the first positional argument or as the
    keyword `hidden_states`, depending on the model class. With `first_call_only`,
    later calls of the same module (a layer shared across depths, ALBERT) run unchanged.
    """
    calls = [0]

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls[0] += 1
        if first_call_only and calls[0] > 1:
            return None
        if args:
            return (value, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": value}

    return hook


def hidden_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]
