"""Residual-block internals that context-mixing measures need beyond the `Trace`.

Like `specs.py`, this is data plus hooks: where each layer's two normalisation
modules live and how the block is wired (per spec name, `NORM_LAYOUTS`, adjusted by
the few config switches that rewire a family), their parameters, their captured inputs
and outputs, and a re-run of every layer from its own captured input with chosen value
vectors zeroed. Nothing here knows about any mixing method.

Block structure (`NormLayout.kind`):
- "post" (BERT family): x → LN1(x + Attn(x)) = y → LN2(y + FFN(y)).
- "pre" (GPT-2, Llama): x → x + Attn(N1(x)) = y → y + MLP(N2(y)).
- "parallel" (GPT-NeoX, GPT-J-style Falcon): x → x + Attn(N1(x)) + MLP(N2(x)); the MLP
  reads x, not x + Attn, so y = x + Attn(N1(x)) is never formed by the model.
`first`/`second` below are LN1/LN2 respectively N1/N2 in that notation.

Families whose residual wiring the norm-based methods do not describe are listed in
`NORM_UNDEFINED` with the reason, given to the user as one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.hooks import HookSet, first_tensor, replace_hidden_input

BlockKind = Literal["post", "pre", "parallel"]


@dataclass(frozen=True)
class NormLayout:
    """Where a family's two normalisation modules sit inside one layer, and the wiring.

    Attributes:
        first: dotted path (inside a layer) of LN1 / N1.
        second: dotted path of LN2 / N2 (Falcon's parallel block has one norm feeding both
            branches: then `second` is the same module as `first`).
        kind: "post", "pre" or "parallel" (module docstring).
        unit_offset: the RMSNorm scales by (1 + weight) rather than weight (Gemma).
    """

    first: str
    second: str
    kind: BlockKind
    unit_offset: bool = False


_BERT_LN = NormLayout("attention.output.LayerNorm", "output.LayerNorm", "post")
_PRE_RMS = NormLayout("input_layernorm", "post_attention_layernorm", "pre")

NORM_LAYOUTS: dict[str, NormLayout] = {
    "bert": _BERT_LN,
    "roberta": _BERT_LN,
    "electra": _BERT_LN,
    "deberta-v2": _BERT_LN,
    "distilbert": NormLayout("sa_layer_norm", "output_layer_norm", "post"),
    # ALBERT's layer is shared across depths: one hook per module, calls taken in order.
    "albert": NormLayout("attention.LayerNorm", "full_layer_layer_norm", "post"),
    "gpt2": NormLayout("ln_1", "ln_2", "pre"),
    "gpt-neo": NormLayout("ln_1", "ln_2", "pre"),
    "llama": _PRE_RMS,
    "phi3": _PRE_RMS,
    "qwen3": _PRE_RMS,  # q/k norms sit inside the attention scores, not on the residual path
    "mixtral": _PRE_RMS,
    "bloom": _PRE_RMS,
    "gemma": replace(_PRE_RMS, unit_offset=True),
    "opt": NormLayout("self_attn_layer_norm", "final_layer_norm", "pre"),
    "gpt-neox": NormLayout("input_layernorm", "post_attention_layernorm", "parallel"),
    "falcon": NormLayout("input_layernorm", "input_layernorm", "parallel"),
    "modernbert": NormLayout("attn_norm", "mlp_norm", "pre"),  # layer 0's attn_norm: Identity
    "vit": NormLayout("layernorm_before", "layernorm_after", "pre"),
    "clip-vision": NormLayout("layer_norm1", "layer_norm2", "pre"),
}
"""Spec name → the normalisation layout of its layers (see `norm_layout` for config switches)."""

_SANDWICH = (
    "normalises the attention output before adding it to the residual stream (sandwich "
    "norm), a wiring the norm-based decompositions here do not describe"
)
NORM_UNDEFINED: dict[str, str] = {
    "gemma2": _SANDWICH,
    "gemma3_text": _SANDWICH,
    "olmo2": _SANDWICH,
}
"""model_type (or spec name) → why the residual-path methods are undefined for it."""

NORM_PATHS: dict[str, tuple[str, str]] = {k: (v.first, v.second) for k, v in NORM_LAYOUTS.items()}
"""Spec name → (first, second) normalisation module paths (a view of `NORM_LAYOUTS`)."""


def norm_layout(model: Any) -> NormLayout:
    """The layout of `model`'s layers, or a one-line error naming the family and why not.

    Config switches that rewire a family: OPT with `do_layer_norm_before=False` (opt-350m)
    is post-LN; GPT-NeoX with `use_parallel_residual=False` is sequential pre-LN; Falcon
    without `parallel_attn` is sequential, and with `new_decoder_architecture` has one norm
    per branch (ln_attn, ln_mlp); BLOOM with `apply_residual_connection_post_layernorm`
    takes its residual after the norm, which no layout here describes.
    """
    spec, config = model.spec, model.hf_model.config
    model_type = str(getattr(config, "model_type", ""))
    for key in (model_type, spec.name):
        if key in NORM_UNDEFINED:
            raise IdentifiableError(
                f"the norm-based residual methods (globenc, alti) are undefined for "
                f"'{model_type or spec.name}': it {NORM_UNDEFINED[key]}; use norm, rollout or "
                "value-zeroing"
            )
    layout = NORM_LAYOUTS.get(spec.name)
    if layout is None:
        raise IdentifiableError(
            f"the normalisation layout of architecture '{spec.name}' is not described; add it "
            "to NORM_LAYOUTS in identifiable/models/blocks.py, or use norm, rollout or "
            "value-zeroing"
        )
    if spec.name == "opt" and not getattr(config, "do_layer_norm_before", True):
        layout = replace(layout, kind="post")
    if spec.name == "gpt-neox" and not getattr(config, "use_parallel_residual", True):
        layout = replace(layout, kind="pre")
    if spec.name == "falcon":
        if getattr(config, "new_decoder_architecture", False):
            layout = NormLayout("ln_attn", "ln_mlp", "parallel")
        elif not getattr(config, "parallel_attn", True):
            layout = NormLayout("input_layernorm", "post_attention_layernorm", "pre")
    if spec.name == "bloom" and getattr(config, "apply_residual_connection_post_layernorm", False):
        raise IdentifiableError(
            "the norm-based residual methods (globenc, alti) are undefined for this BLOOM "
            "model: apply_residual_connection_post_layernorm takes the residual after the "
            "norm, which no layout here describes; use norm, rollout or value-zeroing"
        )
    return layout


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
    """(first, second) norm module of every logical layer (a shared layer repeats)."""
    layout = norm_layout(model)
    return [
        (layer.get_submodule(layout.first), layer.get_submodule(layout.second))
        for layer in model.layers
    ]


def _params(module: nn.Module, unit_offset: bool = False) -> NormParams | None:
    if isinstance(module, nn.Identity):  # ModernBERT's first layer has no attention norm
        return None
    if getattr(module, "weight", None) is None:
        raise IdentifiableError(
            f"normalisation module {type(module).__name__} has no weight; a residual "
            "decomposition through it is not described"
        )
    weight = module.weight.detach().double().cpu()
    if unit_offset:  # Gemma's RMSNorm multiplies by (1 + weight)
        weight = weight + 1.0
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


def block_norms(model: Any) -> list[tuple[NormParams | None, NormParams | None]]:
    """(first, second) normalisation parameters of every layer, float64 on the CPU; None for
    a position that holds no norm (an `nn.Identity`)."""
    offset = norm_layout(model).unit_offset
    return [(_params(a, offset), _params(b, offset)) for a, b in _norm_modules(model)]


class BlockRecorder:
    """Collects the norms' inputs and outputs of the next forward pass of one sequence.

    Each module is hooked once per role and its calls are kept in order, so a layer that
    runs at several depths (ALBERT shares one) is recorded once per run, never twice."""

    FIELDS = ("first_in", "first_out", "second_in", "second_out", "layer_out")

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.store: dict[str, list[torch.Tensor]] = {f: [] for f in self.FIELDS}

    def hook(self, name: str, what: str) -> Any:
        def keep(module: nn.Module, args: Any, output: Any = None) -> None:
            value = args[0] if what == "in" else first_tensor(output)
            # OPT flattens (batch, token) before its second norm: one sequence is [n, d] there.
            self.store[name].append((value[0] if value.dim() == 3 else value).detach())

        return keep

    def result(self) -> BlockCapture:
        wrong = {f: len(v) for f, v in self.store.items() if len(v) != self.n_layers}
        if wrong:
            name, count = next(iter(wrong.items()))
            raise IdentifiableError(
                f"{self.n_layers} layers, but {name} was captured {count} times; the entry in "
                "NORM_LAYOUTS (identifiable/models/blocks.py) does not match this model"
            )
        return BlockCapture(*(torch.stack(self.store[f]).double().cpu() for f in self.FIELDS))


def _distinct(modules: list[nn.Module]) -> list[nn.Module]:
    return list({id(m): m for m in modules}.values())


@contextmanager
def record_blocks(model: Any) -> Iterator[BlockRecorder]:
    """Within the block, any forward pass of one sequence (e.g. `model.trace(text)`) also
    records both norms' inputs and outputs; read them with `.result()` afterwards.
    Batch element 0 is kept, so pass one sequence without padding."""
    mods = _norm_modules(model)
    rec = BlockRecorder(len(mods))
    with HookSet() as hooks:
        for mod in _distinct([first for first, _ in mods]):
            hooks.pre(mod, rec.hook("first_in", "in"))
            hooks.post(mod, rec.hook("first_out", "out"))
        for mod in _distinct([second for _, second in mods]):
            hooks.pre(mod, rec.hook("second_in", "in"))
            hooks.post(mod, rec.hook("second_out", "out"))
        for mod in _distinct(list(model.layers)):
            hooks.post(mod, rec.hook("layer_out", "out"))
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
    b = int(zero.shape[0])
    device = model.device
    rows = torch.arange(b, device=device)[:, None]
    cols = zero.to(device)[:, None]
    v_cols = model._v_cols  # the value module's output columns that hold v (fused QKV too)
    if not isinstance(v_cols, slice):
        v_cols = torch.as_tensor(v_cols, device=device)[None, :]
    outs: list[torch.Tensor] = []
    runs = [0]  # layers run so far: a layer shared across depths (ALBERT) is fed in turn

    def zero_values(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        out = output.clone()
        out[rows, cols, v_cols] = 0
        return out

    def feed(module: nn.Module, args: Any, kwargs: Any) -> Any:
        layer = runs[0]
        runs[0] += 1
        x = layer_inputs[layer].to(device=device, dtype=_dtype(model)).expand(b, n, -1)
        return replace_hidden_input(x)(module, args, kwargs)

    with HookSet() as hooks, torch.no_grad():
        for layer in _distinct(list(model.layers)):
            hooks.pre(layer, feed, with_kwargs=True)
            hooks.post(layer, lambda m, a, o: outs.append(first_tensor(o)))
        for value in _distinct(list(model._value_modules)):
            hooks.post(value, zero_values)
        # B copies of the sequence, so that every mask and position table (BLOOM's ALiBi is
        # built per batch element) has batch B; the embeddings are replaced at every layer.
        if getattr(model, "modality", "text") == "image":  # every layer's input is replaced
            model.hf_model(pixel_values=model.placeholder_pixels(b, _dtype(model)))
        else:
            model.hf_model(**model._batch_inputs([_encoding(input_ids, token_type_ids)] * b))
    if len(outs) != n_layers:
        raise IdentifiableError(f"expected {n_layers} layer outputs, captured {len(outs)}")
    return torch.stack(outs, 1)


def _encoding(input_ids: torch.Tensor, token_type_ids: Any) -> Any:
    from identifiable.models.model import Encoding

    return Encoding(input_ids.cpu(), [], 0, token_type_ids)


def _dtype(model: Any) -> torch.dtype:
    return next(model.hf_model.parameters()).dtype
