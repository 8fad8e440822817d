"""Residual-block internals that context-mixing measures need beyond the `Trace`.

Like `specs.py`, this is data plus hooks: where each layer's two normalisation modules
live and how the block is wired is the family's spec (`ArchSpec.norms`, `NormLayout`,
adjusted by the config switches of `ArchSpec.norm_rules`; a discovered family's layout
is found and proved on a probe by `identifiable.models.discover`). Here are the
parameters of those modules, their captured inputs and outputs, and a re-run of every
layer from its own captured input with chosen value vectors zeroed. Nothing here knows
about any mixing method.

Block structure (`NormLayout.kind`, see `specs.BlockKind`):
- "post" (BERT family): x → LN1(x + Attn(x)) = y → LN2(y + FFN(y)).
- "pre" (GPT-2, Llama): x → x + Attn(N1(x)) = y → y + MLP(N2(y)).
- "parallel" (GPT-NeoX, GPT-J-style Falcon): x → x + Attn(N1(x)) + MLP(N2(x)); the MLP
  reads x, not x + Attn, so y = x + Attn(N1(x)) is never formed by the model.
`first`/`second` below are LN1/LN2 respectively N1/N2 in that notation.

Families whose residual wiring the norm-based methods do not describe say why in their
spec (a `NormRule` without a layout), given to the user as one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.backends import inference
from identifiable.models.encoding import Encoding
from identifiable.models.hooks import HookSet, first_tensor, replace_hidden_input
from identifiable.models.protocol import TracedModel
from identifiable.models.quirks import BATCH_FIRST, Axes
from identifiable.models.specs import SPECS, BlockKind, NormLayout, NormRule
from identifiable.models.stack import distinct

__all__ = [
    "NORM_LAYOUTS",
    "NORM_PATHS",
    "NORM_UNDEFINED",
    "BlockCapture",
    "BlockKind",
    "BlockRecorder",
    "NormLayout",
    "NormParams",
    "block_norms",
    "capture_blocks",
    "norm_layout",
    "record_blocks",
    "rerun_layers_zeroing_values",
]

NORM_LAYOUTS: dict[str, NormLayout] = {s.name: s.norms for s in SPECS if s.norms is not None}
"""Spec name → the normalisation layout of its layers (a view of `ArchSpec.norms`)."""

NORM_UNDEFINED: dict[str, str] = {
    str(rule.value): rule.reason
    for s in SPECS
    for rule in s.norm_rules
    if rule.attr == "model_type" and rule.layout is None
}
"""model_type → why the residual-path methods are undefined for it (a view of the specs)."""

NORM_PATHS: dict[str, tuple[str, str]] = {k: (v.first, v.second) for k, v in NORM_LAYOUTS.items()}
"""Spec name → (first, second) normalisation module paths (a view of `NORM_LAYOUTS`)."""

_MISSING = object()


def norm_layout(model: TracedModel) -> NormLayout:
    """The layout of `model`'s layers, or a one-line error naming the family and why not.

    The spec's `norm_rules` apply first (the first whose config attribute matches wins):
    OPT with `do_layer_norm_before=False` (opt-350m) is post-LN; GPT-NeoX with
    `use_parallel_residual=False` is sequential pre-LN; Falcon without `parallel_attn` is
    sequential, and with `new_decoder_architecture` has one norm per branch (ln_attn,
    ln_mlp); BLOOM with `apply_residual_connection_post_layernorm` takes its residual
    after the norm, which no layout here describes.
    """
    spec, config = model.spec, model.hf_model.config
    family = str(getattr(config, "model_type", "")) or spec.name
    layout = spec.norms
    rule: NormRule
    for rule in spec.norm_rules:
        if getattr(config, rule.attr, _MISSING) == rule.value:
            if rule.layout is None:
                raise _undefined(family, f"it {rule.reason}")
            layout = rule.layout
            break
    if layout is None:
        raise _undefined(
            family, f"its normalisation layout is not described (ArchSpec.norms of '{spec.name}')"
        )
    return layout


def _undefined(family: str, why: str) -> IdentifiableError:
    return IdentifiableError(
        f"the norm-based residual methods (globenc, alti) are undefined for '{family}': "
        f"{why}; use norm, rollout or value-zeroing"
    )


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


def norm_modules(layers: list[nn.Module], layout: NormLayout) -> list[tuple[nn.Module, nn.Module]]:
    """(first, second) norm module of every logical layer (a shared layer repeats)."""
    return [
        (layer.get_submodule(layout.first), layer.get_submodule(layout.second)) for layer in layers
    ]


# LayerNorms (mean subtracted) that are not `nn.LayerNorm`: DeBERTa v1's own class
_CENTRED_NORMS = ("DebertaLayerNorm",)


def norm_params(module: nn.Module, unit_offset: bool = False) -> NormParams | None:
    """The parameters of one LayerNorm or RMSNorm module; None for an `nn.Identity`."""
    if isinstance(module, nn.Identity):  # ModernBERT's first layer has no attention norm
        return None
    if getattr(module, "weight", None) is None:
        raise IdentifiableError(
            f"normalisation module {type(module).__name__} has no weight; a residual "
            "decomposition through it is not described"
        )
    weight = torch.as_tensor(module.weight).detach().double().cpu()
    if unit_offset:  # Gemma's RMSNorm multiplies by (1 + weight)
        weight = weight + 1.0
    bias = getattr(module, "bias", None)
    eps = getattr(module, "eps", None)
    if eps is None:
        eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        raise IdentifiableError(f"normalisation module {type(module).__name__} has no epsilon")
    centred = isinstance(module, nn.LayerNorm) or type(module).__name__ in _CENTRED_NORMS
    return NormParams(
        weight=weight,
        bias=torch.zeros_like(weight) if bias is None else bias.detach().double().cpu(),
        eps=float(eps),
        centred=centred,
    )


def block_norms(model: TracedModel) -> list[tuple[NormParams | None, NormParams | None]]:
    """(first, second) normalisation parameters of every layer, float64 on the CPU; None for
    a position that holds no norm (an `nn.Identity`)."""
    layout = norm_layout(model)
    return [
        (norm_params(a, layout.unit_offset), norm_params(b, layout.unit_offset))
        for a, b in norm_modules(model.layers, layout)
    ]


class BlockRecorder:
    """Collects the norms' inputs and outputs of the next forward pass of one sequence.

    Each module is hooked once per role and its calls are kept in order, so a layer that
    runs at several depths (ALBERT shares one) is recorded once per run, never twice."""

    FIELDS = ("first_in", "first_out", "second_in", "second_out", "layer_out")

    def __init__(self, n_layers: int, *, axes: Axes = BATCH_FIRST) -> None:
        self.n_layers, self.axes = n_layers, axes
        self.store: dict[str, list[torch.Tensor]] = {f: [] for f in self.FIELDS}

    def hook(self, name: str, what: str) -> Any:
        def keep(module: nn.Module, args: Any, output: Any = None) -> None:
            value = args[0] if what == "in" else first_tensor(output)
            self.store[name].append(self.axes.first_sequence(value).detach())

        return keep

    def result(self) -> BlockCapture:
        wrong = {f: len(v) for f, v in self.store.items() if len(v) != self.n_layers}
        if wrong:
            name, count = next(iter(wrong.items()))
            raise IdentifiableError(
                f"{self.n_layers} layers, but {name} was captured {count} times; the spec's "
                "norm layout (ArchSpec.norms) does not match this model"
            )
        return BlockCapture(*(torch.stack(self.store[f]).double().cpu() for f in self.FIELDS))

    def record(self, hooks: HookSet, layers: list[nn.Module], layout: NormLayout) -> None:
        """Hook `layout`'s two norms and the output of every layer in `layers`."""
        mods = norm_modules(layers, layout)
        for field, group in (("first", [a for a, _ in mods]), ("second", [b for _, b in mods])):
            for mod in distinct(group):
                hooks.pre(mod, self.hook(f"{field}_in", "in"))
                hooks.post(mod, self.hook(f"{field}_out", "out"))
        for mod in distinct(layers):
            hooks.post(mod, self.hook("layer_out", "out"))


@contextmanager
def record_blocks(model: TracedModel) -> Iterator[BlockRecorder]:
    """Within the block, any forward pass of one sequence (e.g. `model.trace(text)`) also
    records both norms' inputs and outputs; read them with `.result()` afterwards.
    Batch element 0 is kept, so pass one sequence without padding."""
    layout = norm_layout(model)
    rec = BlockRecorder(len(model.layers), axes=model.spec.axes)
    with HookSet() as hooks:
        rec.record(hooks, model.layers, layout)
        yield rec


def capture_blocks(
    model: TracedModel, input_ids: torch.Tensor, token_type_ids: Any = None
) -> BlockCapture:
    """Run one sequence `[n]` and capture both norms' inputs and outputs per layer."""
    with record_blocks(model) as rec, torch.no_grad(), inference(model.hf_model):
        model.hf_model(**model.batch_inputs([_encoding(input_ids, token_type_ids)]))
    return rec.result()


def rerun_layers_zeroing_values(
    model: TracedModel,
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
        `[B, L, n, d]` each layer's output in each copy. One forward pass at batch B whose
        layer inputs are all replaced by the given ones.
    """
    n_layers, n, _ = layer_inputs.shape
    if model.spec.weight_layout == "heads":
        raise IdentifiableError(
            f"value zeroing is not available for {model.spec.name}: its values are formed inside "
            "the attention from raw parameters, with no value module whose output can be zeroed; "
            "use another method (see identifiable.mixing.method_names())"
        )
    if model.stack.others:  # a trace's next state is not the next attention layer's input
        raise IdentifiableError(
            f"value zeroing is not available for a hybrid stack ({model.stack.others_line()}): "
            "it re-runs each attention layer from the previous one's output; use another method"
        )
    b = int(zero.shape[0])
    device = model.device
    rows = torch.arange(b, device=device)[:, None]
    cols = zero.to(device)[:, None]
    # the value module's output columns that hold v (fused QKV too)
    v_cols: slice | torch.Tensor = model.stack.v_cols  # type: ignore[assignment]
    if not isinstance(v_cols, slice):
        v_cols = torch.as_tensor(v_cols, device=device)[None, :]
    outs: list[torch.Tensor] = []
    runs = [0]  # layers run so far: a layer shared across depths (ALBERT) is fed in turn

    def zero_values(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        out = output.clone()
        # latent attention feeds its expansion as one head, [B, 1, n, width]: same rows
        out.view(out.shape[0], -1, out.shape[-1])[rows, cols, v_cols] = 0
        return out

    def feed(module: nn.Module, args: Any, kwargs: Any) -> Any:
        layer = runs[0]
        runs[0] += 1
        x = layer_inputs[layer].to(device=device, dtype=_dtype(model)).expand(b, n, -1)
        return replace_hidden_input(x)(module, args, kwargs)

    with HookSet() as hooks, torch.no_grad(), inference(model.hf_model):
        for layer in distinct(model.layers):
            hooks.pre(layer, feed, with_kwargs=True)
            hooks.post(layer, lambda m, a, o: outs.append(first_tensor(o)))
        for value in distinct(model.stack.value_modules):
            hooks.post(value, zero_values)
        # B copies of the sequence, so that every mask and position table (BLOOM's ALiBi is
        # built per batch element) has batch B; the embeddings are replaced at every layer.
        if model.modality == "image":  # every layer's input is replaced
            model.hf_model(pixel_values=model.placeholder_pixels(b, _dtype(model)))
        else:
            model.hf_model(**model.batch_inputs([_encoding(input_ids, token_type_ids)] * b))
    if len(outs) != n_layers:
        raise IdentifiableError(f"expected {n_layers} layer outputs, captured {len(outs)}")
    return torch.stack(outs, 1)


def _encoding(input_ids: torch.Tensor, token_type_ids: Any) -> Encoding:
    return Encoding(input_ids.cpu(), [], 0, token_type_ids)


def _dtype(model: TracedModel) -> torch.dtype:
    return next(model.hf_model.parameters()).dtype
