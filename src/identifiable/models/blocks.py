"""Residual-block internals that context-mixing measures need beyond the `Trace`.

Like `specs.py`, this is data plus hooks: where each layer's two normalisation
modules live (per spec name), their parameters, their captured inputs and outputs,
and a re-run of every layer from its own captured input with chosen value vectors
zeroed. Nothing here knows about any mixing method.

Block structure by `ArchSpec.norm`:
- "post" (BERT family): x → LN1(x + Attn(x)) = y → LN2(y + FFN(y)).
- "pre" (GPT-2, Llama): x → x + Attn(N1(x)) = y → y + MLP(N2(y)).
`first`/`second` below are LN1/LN2 respectively N1/N2 in that notation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.hooks import HookSet, first_tensor, replace_hidden_input

NORM_PATHS: dict[str, tuple[str, str]] = {
    "bert": ("attention.output.LayerNorm", "output.LayerNorm"),
    "roberta": ("attention.output.LayerNorm", "output.LayerNorm"),
    "electra": ("attention.output.LayerNorm", "output.LayerNorm"),
    "distilbert": ("sa_layer_norm", "output_layer_norm"),
    "gpt2": ("ln_1", "ln_2"),
    "llama": ("input_layernorm", "post_attention_layernorm"),
}
"""Spec name → (first, second) normalisation module inside a layer (see module docstring)."""


@dataclass(frozen=True)
class NormParams:
    """One LayerNorm or RMSNorm: y = γ ⊙ (x − μ(x)) / sqrt(var(x) + eps) + β (RMSNorm: μ = 0,
    var = mean(x²), β = 0).

    Attributes:
        weight: `[d]` γ.  bias: `[d]` β (zeros for RMSNorm).  eps: the module's epsilon.
        centred: True for LayerNorm (subtracts the mean), False for RMSNorm.
    """

    weight: torch.Tensor
    bias: torch.Tensor
    eps: float
    centred: bool

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """`[..., 1]` the per-token divisor sqrt(var(x) + eps) of the input x `[..., d]`."""
        centre = x - x.mean(-1, keepdim=True) if self.centred else x
        return (centre.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def linear_part(self, parts: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """γ ⊙ (p − μ(p)) / scale for each part p `[..., d]`: with the scale of the *sum* of the
        parts, these add up to norm(Σ p) − β exactly (the norm is linear once its scale is fixed)."""
        centre = parts - parts.mean(-1, keepdim=True) if self.centred else parts
        return self.weight * centre / scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_part(x, self.scale(x)) + self.bias


@dataclass(frozen=True)
class BlockCapture:
    """Inputs and outputs of both normalisation modules of every layer, one sequence.

    All `[L, n, d]` float64 on the CPU: first_in/first_out (LN1 or N1), second_in/second_out
    (LN2 or N2), and layer_out (the layer's output).
    """

    first_in: torch.Tensor
    first_out: torch.Tensor
    second_in: torch.Tensor
    second_out: torch.Tensor
    layer_out: torch.Tensor


def _norm_modules(model: Any) -> list[tuple[nn.Module, nn.Module]]:
    paths = NORM_PATHS.get(model.spec.name)
    if paths is None:
        raise IdentifiableError(
            f"no normalisation paths are known for architecture '{model.spec.name}'; add them to "
            "NORM_PATHS in identifiable/models/blocks.py"
        )
    return [
        (layer.get_submodule(paths[0]), layer.get_submodule(paths[1])) for layer in model.layers
    ]


def _params(module: nn.Module) -> NormParams:
    weight = module.weight.detach().double().cpu()
    bias = getattr(module, "bias", None)
    eps = getattr(module, "eps", None)
    if eps is None:
        eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        raise IdentifiableError(f"normalisation module {type(module).__name__} has no epsilon")
    centred = isinstance(module, nn.LayerNorm)
    return NormParams(
        weight=weight,
        bias=torch.zeros_like(weight) if bias is None else bias.detach().double().cpu(),
        eps=float(eps),
        centred=centred,
    )


def block_norms(model: Any) -> list[tuple[NormParams, NormParams]]:
    """(first, second) normalisation parameters of every layer, float64 on the CPU."""
    return [(_params(a), _params(b)) for a, b in _norm_modules(model)]


class BlockRecorder:
    """Collects the norms' inputs and outputs of the next forward pass of one sequence."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.store: dict[tuple[int, str], torch.Tensor] = {}

    def hook(self, layer: int, name: str, what: str) -> Any:
        def keep(module: nn.Module, args: Any, output: Any = None) -> None:
            value = args[0] if what == "in" else first_tensor(output)
            self.store[(layer, name)] = value[0].detach()

        return keep

    def result(self) -> BlockCapture:
        fields = ("first_in", "first_out", "second_in", "second_out", "layer_out")
        missing = [f for f in fields for i in range(self.n_layers) if (i, f) not in self.store]
        if missing:
            raise IdentifiableError(
                f"the forward pass did not run the normalisation modules ({missing[0]}); the "
                "entry in NORM_PATHS does not match this model"
            )
        return BlockCapture(
            *(
                torch.stack([self.store[(i, f)] for i in range(self.n_layers)]).double().cpu()
                for f in fields
            )
        )


@contextmanager
def record_blocks(model: Any) -> Iterator[BlockRecorder]:
    """Within the block, any forward pass of one sequence (e.g. `model.trace(text)`) also
    records both norms' inputs and outputs; read them with `.result()` afterwards.
    Batch element 0 is kept, so pass one sequence without padding."""
    mods = _norm_modules(model)
    rec = BlockRecorder(len(mods))
    with HookSet() as hooks:
        for i, (first, second) in enumerate(mods):
            hooks.pre(first, rec.hook(i, "first_in", "in"))
            hooks.post(first, rec.hook(i, "first_out", "out"))
            hooks.pre(second, rec.hook(i, "second_in", "in"))
            hooks.post(second, rec.hook(i, "second_out", "out"))
            hooks.post(model.layers[i], rec.hook(i, "layer_out", "out"))
        yield rec


def capture_blocks(model: Any, input_ids: torch.Tensor, token_type_ids: Any = None) -> BlockCapture:
    """Run one sequence `[n]` and capture both norms' inputs and outputs per layer."""
    with record_blocks(model) as rec, torch.no_grad():
        model.hf_model(**model._batch_inputs([_encoding(input_ids, token_type_ids)]))
    return rec.result()


def rerun_layers_zeroing_values(
    model: Any,
    layer_inputs: torch.Tensor,
    input_ids: torch.Tensor,
    zero: torch.Tensor,
    token_type_ids: Any = None,
) -> torch.Tensor:
    """Re-run every layer from its own given input, with one token's value vector zeroed.

    Args:
        layer_inputs: `[L, n, d]` the input of each layer (a trace's hidden_states[:-1]).
        input_ids: `[n]`; sets the length, positions and masks, as in `Model.layer_outputs`.
        zero: `[B]` int64; copy b zeroes the value vector v_j = x_j W_V + b_V (every head,
            bias included) of token j = zero[b] in every layer. Each layer l still reads the
            unmodified `layer_inputs[l]`, so copy b at layer l differs from the clean model
            only through layer l's own zeroed value (no effect carries over between layers).
    Returns:
        `[B, L, n, d]` each layer's output in each copy. One forward pass at batch B: the
        embeddings run once at batch 1 and each layer's input is replaced by B copies, which
        the attention masks and rotary tables broadcast over.
    """
    n_layers, n, _ = layer_inputs.shape
    b = int(zero.shape[0])
    device = model.device
    spec = model.spec
    rows = torch.arange(b, device=device)
    cols = zero.to(device)
    outs: list[torch.Tensor] = []

    def zero_values(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        out = output.clone()
        if spec.fused_qkv is None:
            out[rows, cols] = 0
        else:
            chunks, index = spec.fused_qkv
            width = out.shape[-1] // chunks
            out[rows, cols, index * width : (index + 1) * width] = 0
        return out

    def feed(layer: int) -> Any:
        x = layer_inputs[layer].to(device=device, dtype=_dtype(model)).expand(b, n, -1)
        return replace_hidden_input(x)

    with HookSet() as hooks, torch.no_grad():
        for i, layer in enumerate(model.layers):
            hooks.pre(layer, feed(i), with_kwargs=True)
            hooks.post(model._value_modules[i], zero_values)
            hooks.post(layer, lambda m, a, o: outs.append(first_tensor(o)))
        enc_inputs = model._batch_inputs([_encoding(input_ids, token_type_ids)])
        model.hf_model(**enc_inputs)
    if len(outs) != n_layers:
        raise IdentifiableError(f"expected {n_layers} layer outputs, captured {len(outs)}")
    return torch.stack(outs, 1)


def _encoding(input_ids: torch.Tensor, token_type_ids: Any) -> Any:
    from identifiable.models.model import Encoding

    return Encoding(input_ids.cpu(), [], 0, token_type_ids)


def _dtype(model: Any) -> torch.dtype:
    return next(model.hf_model.parameters()).dtype
