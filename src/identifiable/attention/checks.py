"""Input checks shared by the attention functions: shapes and finiteness."""

from __future__ import annotations

import torch
from torch import Tensor

from identifiable.errors import IdentifiableError
from identifiable.models.trace import Trace


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
    raise IdentifiableError(
        f"NaN or inf in the {what} at {where}: the model produced non-finite numbers "
        "(often fp16 overflow); trace it in float32 (dtype=torch.float32) and try again"
    )
