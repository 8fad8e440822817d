"""The functional view for attribution: hidden states as a differentiable function of e^0.

Hidden Token Attribution (and grad-input) differentiate every layer's output with
respect to the input of layer 1. `embed` gives that input for a sequence; `layer_outputs`
runs the layers from a given e^0 (hooks replace the embeddings), under autograd,
`torch.func.jvp` and `vmap`. Modules without a forward-mode derivative run plain-torch
equivalents while it does (`ArchSpec.forward_ad`; mixture-of-experts layers on their eager
loop), and the model is restored afterwards.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.backends import inference, running
from identifiable.models.encoding import Encoding, InputEncoder
from identifiable.models.hooks import (
    HookSet,
    first_tensor,
    get_submodule,
    hidden_input,
    replace_hidden_input,
)
from identifiable.models.stack import AttentionStack, distinct


class _Embedded(Exception):
    """Ends the forward pass once layer 1's input is known."""


def embed(
    hf_model: nn.Module,
    stack: AttentionStack,
    inputs: InputEncoder,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    pixel_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """e^0 `[n, d]`, the input of layer 1 (see `Model.embed`)."""
    captured: list[torch.Tensor] = []
    if inputs.spec.modality == "image":
        last = inputs.last_image
        if pixel_values is None and last is not None and last[0] is input_ids:
            pixel_values = last[1]
        if pixel_values is None:
            raise IdentifiableError("embed() of an image model needs pixel_values=")

    def stop(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        captured.append(stack.batch_first(hidden_input(args, kwargs)))
        raise _Embedded

    enc = Encoding(input_ids, [], 0, token_type_ids, pixel_values)
    with HookSet() as hooks, torch.no_grad(), inference(hf_model):
        hooks.pre(stack.layers[0], stop, with_kwargs=True)
        with contextlib.suppress(_Embedded):
            hf_model(**inputs.batch([enc], hf_model))
    return captured[0][0].detach()


def layer_outputs(
    hf_model: nn.Module,
    stack: AttentionStack,
    inputs: InputEncoder,
    e0: torch.Tensor,
    input_ids: torch.Tensor,
) -> torch.Tensor:
    """`[L+1, n, d]` (or `[B, L+1, n, d]`) hidden states from e0 (see `Model.layer_outputs`)."""
    batched = e0.dim() == 3
    x = e0 if batched else e0.unsqueeze(0)
    device = next(hf_model.parameters()).device
    ids = input_ids.to(device).reshape(1, -1).expand(x.shape[0], -1)
    outs: list[torch.Tensor] = []
    # eager attention (sdpa kernels have no forward-mode derivative), the model's own after
    with running(hf_model, "eager"), HookSet() as hooks, _forward_mode_experts(hf_model):
        _forward_ad_substitutes(stack, hooks)
        hooks.pre(
            stack.layers[0],
            replace_hidden_input(stack.batch_first(x), first_call_only=True),
            with_kwargs=True,
        )
        for layer in distinct(stack.layers):
            hooks.post(layer, lambda m, a, o: outs.append(stack.batch_first(first_tensor(o))))
        if inputs.spec.modality == "image":
            hf_model(pixel_values=inputs.placeholder_pixels(x.shape[0], x.dtype, device))
        else:
            hf_model(input_ids=ids, attention_mask=torch.ones_like(ids))
    result = torch.stack([x, *outs], dim=1)
    return result if batched else result[0]


def _forward_ad_substitutes(stack: AttentionStack, hooks: HookSet) -> None:
    """Swap in the spec's plain-torch equivalents of forward-AD-less modules (`ArchSpec.forward_ad`)."""
    for path, fn_name in stack.spec.forward_ad:
        for layer in distinct(stack.layers):
            module = get_submodule(layer, path)
            fn = getattr(sys.modules[type(module).__module__], fn_name, None)
            if fn is None:  # a transformers version without it: the module is left as it is
                continue
            hooks.replace_forward(module, fn)


@contextlib.contextmanager
def _forward_mode_experts(hf_model: nn.Module) -> Iterator[None]:
    """Mixture-of-experts layers on the eager experts loop while `layer_outputs` runs.

    transformers 5.x dispatches experts to `grouped_mm`, which has no forward-mode
    derivative; the eager loop computes the same function. The model's own setting
    is restored afterwards.
    """
    before = getattr(hf_model.config, "_experts_implementation", None)
    switch = getattr(hf_model, "set_experts_implementation", None)
    if before in (None, "eager") or switch is None:
        yield
        return
    switch("eager")
    try:
        yield
    finally:
        switch(before)
