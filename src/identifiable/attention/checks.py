"""Input checks shared by the attention functions: shapes and finiteness."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from identifiable.errors import IdentifiableError
from identifiable.models.trace import Seq2SeqTrace, Trace
from identifiable.utils.checks import expect
from identifiable.utils.checks import indices as _checked_indices


def check_trace(trace: object) -> None:
    """One line for an argument that is not a `Trace`: a model, an encoder–decoder trace,
    None or anything else, saying how to get a trace."""
    if isinstance(trace, Seq2SeqTrace):
        raise IdentifiableError(
            "trace= takes one attention's Trace; an encoder–decoder trace holds three: pass "
            "its .encoder, .decoder or .cross"
        )
    if hasattr(trace, "hf_model") and callable(getattr(trace, "trace", None)):
        raise IdentifiableError(
            f"trace= takes a Trace, got a {type(trace).__name__}: trace a text first "
            "(trace = model.trace(text)) and pass the trace"
        )
    expect(trace, Trace, "trace", "a Trace (model.trace(text))")


def check_shapes(trace: Trace) -> None:
    """Raise unless the trace has per-head attention, values and output projection."""
    n_l, n_h, n = trace.n_layers, trace.n_heads, trace.n_tokens
    att, val, out = trace.attentions, trace.values, trace.out_proj
    if tuple(att.shape) != (n_l, n_h, n, n):
        raise IdentifiableError(
            f"trace attentions have shape {tuple(att.shape)}, expected [L, H, n, n] = "
            f"{[n_l, n_h, n, n]}; re-create the trace with identifiable.models"
        )
    if val.dim() != 4 or tuple(val.shape[:3]) != (n_l, n_h, n):
        raise IdentifiableError(
            f"trace values have shape {tuple(val.shape)}, expected [L, H, n, d_v] with "
            f"L, H, n = {n_l}, {n_h}, {n}; re-create the trace with identifiable.models"
        )
    if out.dim() != 4 or tuple(out.shape[:3]) != (n_l, n_h, val.shape[-1]):
        raise IdentifiableError(
            f"the trace's output projection is not per-head separable: out_proj has shape "
            f"{tuple(out.shape)}, expected [L, H, d_v, d] = [{n_l}, {n_h}, {val.shape[-1]}, d]. "
            "Attention identifiability needs a model whose W_O splits into one d_v×d block "
            "per head (softmax attention with separate value and output projections)."
        )


def check_finite(
    x: Tensor, what: str, *, layer: int | None = None, per_layer_head: bool = False
) -> None:
    """Raise naming the first layer/head whose tensor holds NaN or inf."""
    # One reduction first (a NaN or inf anywhere makes the sum non-finite); the
    # elementwise scan runs only when something is wrong.
    if bool(torch.isfinite(x.sum())):
        return
    bad = ~torch.isfinite(x.flatten(2 if per_layer_head else 1))
    if not bad.any():
        return  # finite values whose sum overflowed
    idx = bad.any(-1).nonzero()[0].tolist()
    where = f"layer {idx[0]}, head {idx[1]}" if per_layer_head else f"layer {layer}, head {idx[0]}"
    if "W_O" in what:  # a weight itself, not an activation: no dtype makes it finite
        raise IdentifiableError(
            f"NaN or inf in the {what} at {where}: the model's weights are not finite (a "
            "damaged checkpoint or a fine-tune that diverged); load finite weights"
        )
    raise IdentifiableError(
        f"NaN or inf in the {what} at {where}: either the model's weights hold NaN or inf "
        "(`identifiable trace` names them), or a float16/bfloat16 forward pass overflowed "
        "(then load it with dtype=torch.float32)"
    )


def check_trace_shapes(trace: Trace) -> None:
    """Self-attention traces: `check_shapes`. Cross-attention traces (rows are the n
    decoder tokens, keys the n_k encoder tokens): A `[L, H, n, n_k]`, V `[L, H, n_k, d_v]`.
    Either way the tensors the analyses read share one device."""
    devices = {str(t.device) for t in (trace.attentions, trace.values, trace.out_proj)}
    if len(devices) > 1:
        raise IdentifiableError(
            f"the trace's attentions, values and out_proj are on {', '.join(sorted(devices))}; "
            "an analysis runs on one device: move the whole trace with trace.to(device)"
        )
    if not trace.is_cross:
        check_shapes(trace)
        return
    n_l, n_h, n, n_k = trace.n_layers, trace.n_heads, trace.n_tokens, trace.n_keys
    if tuple(trace.attentions.shape) != (n_l, n_h, n, n_k) or trace.values.dim() != 4:
        raise IdentifiableError(
            f"cross-attention trace: attentions have shape {tuple(trace.attentions.shape)} and "
            f"values {tuple(trace.values.shape)}, expected [L, H, n, n_k] = {[n_l, n_h, n, n_k]} "
            "and [L, H, n_k, d_v]; re-create the trace with identifiable.models"
        )
    if tuple(trace.out_proj.shape[:3]) != (n_l, n_h, trace.values.shape[-1]):
        raise IdentifiableError(
            f"the trace's output projection has shape {tuple(trace.out_proj.shape)}, expected "
            f"[L, H, d_v, d] = [{n_l}, {n_h}, {trace.values.shape[-1]}, d]"
        )


def check_selection(
    trace: Trace, layers: Sequence[int] | None, heads: Sequence[int] | None
) -> tuple[list[int], list[int] | None]:
    """`layers=` and `heads=` as lists (heads None: all of them), each index checked.

    One line for an index out of range, a repeated index or an empty selection, naming
    the argument; nothing outside the selection is read afterwards.
    """
    check_trace(trace)
    chosen_layers = (
        list(range(trace.n_layers))
        if layers is None
        else _checked_indices(layers, trace.n_layers, "layers", "--layer")
    )
    if heads is None:
        return chosen_layers, None
    chosen_heads = _checked_indices(heads, trace.n_heads, "heads", "--head")
    return chosen_layers, None if chosen_heads == list(range(trace.n_heads)) else chosen_heads
