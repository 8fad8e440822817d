"""Attention probabilities recomputed from the query and key a model's attention function
receives, so that the forward pass itself can run on sdpa or flash attention.

transformers 5.x attention modules call one function for the attention itself, chosen by
`config._attn_implementation` through `AttentionInterface.get_interface`:
`fn(module, query, key, value, attention_mask, scaling=..., dropout=..., sliding_window=...,
softcap=..., s_aux=..., **kwargs)`, with the post-rotary query `[B, H, n, d_k]` and key
`[B, H_kv, n_k, d_k]` and the mask the model built for that implementation. `watch`
intercepts that call for chosen modules (the first call of `get_interface` wraps whatever
function it returns in a pass-through that looks the module up; unwatched modules pay one
dict look-up), and hands the handler an `AttentionCall` holding what the function received.
`AttentionCall.fill` then computes, head by head and in row chunks, what eager attention
computes:

    A = softmax(softcap(Q Kᵀ · scaling) + mask)        (+ a sink logit per head: gpt-oss)

with the mask as the model gave it (additive float or boolean, `[B or 1, H or 1, n, n_k]`),
or, where the implementation gets none (sdpa's causal fast path, flash attention), keys
j ≤ i + (n_k − n) narrowed to i − j < sliding_window and to the 2-D padding mask. Any other
tensor the function receives (T5's position bias) changes the scores in a way not covered
here: `AttentionCall` refuses it (`CannotRecompute`), and the model falls back to eager.
Families whose attention is not dispatched through the interface (BLOOM's ALiBi, Falcon,
GPT-Neo, DeBERTa, XLNet) are never watched: they run eager (models/backends.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.hooks import HookSet

# One chunk of scores: rows × keys ≤ this many floats (4 MiB in float32).
CHUNK_ELEMENTS = 1 << 20
# tensors an attention function may receive that do not change its probabilities
_INERT_TENSORS = {"s_aux", "position_ids", "cache_position", "cu_seq_lens_q", "cu_seq_lens_k"}
_HALF = (torch.float16, torch.bfloat16)

Handler = Callable[[nn.Module, Any, Callable[[], "AttentionCall"]], None]
"""(module, the attention function's output, a function giving what it received)."""
_WATCHED: dict[int, Handler] = {}
_WRAPPED: dict[int, Callable[..., Any]] = {}


class CannotRecompute(IdentifiableError):
    """The attention function received something the recomputation does not model."""


@dataclass(frozen=True)
class AttentionCall:
    """What one call of a model's attention function received (batch-first, on its device).

    Attributes:
        query: `[B, H, n, d_k]` post-rotary queries.
        key: `[B, H_kv, n_k, d_k]` post-rotary keys (H_kv divides H).
        mask: as the model built it: additive float or boolean (True: attend)
            `[B or 1, H or 1, n, ≥ n_k]`; `[B, n_k]` key padding (flash); or None.
        scaling: the factor on Q Kᵀ.
        softcap: soft-capping of the scores (Gemma-2): c·tanh(s / c); None: none.
        window: sliding window (keys i − j < w), applied only where `mask` is None or 2-D.
        causal: keys j ≤ i + (n_k − n), applied only where `mask` is None or 2-D.
        sinks: `[H]` one extra logit per head in the softmax's denominator (gpt-oss), or None.
    """

    query: torch.Tensor
    key: torch.Tensor
    mask: torch.Tensor | None
    scaling: float
    softcap: float | None
    window: int | None
    causal: bool
    sinks: torch.Tensor | None

    @classmethod
    def from_arguments(
        cls,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> AttentionCall:
        """Read the attention function's arguments, or `CannotRecompute` naming what is not
        modelled (a score bias, dropout while training)."""
        strange = [k for k, v in kwargs.items() if torch.is_tensor(v) and k not in _INERT_TENSORS]
        if strange or args:
            raise CannotRecompute(
                f"the attention function of {type(module).__name__} receives "
                f"{', '.join(strange) or 'positional arguments'}, which the recomputation "
                "does not model"
            )
        if float(kwargs.get("dropout", 0.0) or 0.0) > 0:
            raise CannotRecompute("attention dropout is active (the model is in training mode)")
        if mask is not None and not torch.is_tensor(mask):
            raise CannotRecompute(f"the attention mask is a {type(mask).__name__}")
        scaling = kwargs.get("scaling")
        causal = kwargs.get("is_causal")
        window = kwargs.get("sliding_window")
        softcap = kwargs.get("softcap")
        return cls(
            query=query,
            key=key,
            mask=mask,
            scaling=float(scaling) if scaling is not None else query.shape[-1] ** -0.5,
            softcap=float(softcap) if softcap else None,
            window=int(window) if isinstance(window, int) and window > 0 else None,
            causal=bool(causal if causal is not None else getattr(module, "is_causal", False)),
            sinks=kwargs.get("s_aux"),
        )

    @property
    def n_heads(self) -> int:
        return int(self.query.shape[1])

    @property
    def shared_mask(self) -> bool:
        """Every head sees the same keys (the mask has no head dimension)."""
        return self.mask is None or self.mask.dim() != 4 or self.mask.shape[1] == 1

    def fill(
        self,
        b: int,
        heads: Sequence[int] | None,
        n: int,
        n_k: int,
        out: torch.Tensor,
        chunk: int = CHUNK_ELEMENTS,
    ) -> None:
        """Write A of sequence `b`'s first n rows and n_k keys, for `heads` (None: all), into
        `out` `[len(heads), n, n_k]` (any dtype and device), in row chunks of at most
        `chunk` scores, head by head; each chunk's mask is built once for all heads
        and the scores are formed in place in `out` where it has the working dtype."""
        chosen = list(range(self.n_heads)) if heads is None else list(heads)
        step = max(1, chunk // max(n_k, 1))
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            mask: tuple[int, torch.Tensor] | None = None
            for slot, h in enumerate(chosen):
                owner = -1 if self.shared_mask else h
                if mask is None or mask[0] != owner:
                    mask = (owner, self._mask_rows(b, max(owner, 0), r0, r1, n_k))
                self._write(out[slot, r0:r1], b, h, r0, n_k, mask[1])

    def rows(self, b: int, h: int, r0: int, r1: int, n_k: int) -> torch.Tensor:
        """`[r1 − r0, n_k]` probabilities of head h, rows r0..r1−1, in float32 (or float64)."""
        work = torch.float32 if self.query.dtype in _HALF else self.query.dtype
        out = torch.empty(r1 - r0, n_k, dtype=work, device=self.query.device)
        self._write(out, b, h, r0, n_k, self._mask_rows(b, h, r0, r1, n_k))
        return out

    def _write(
        self, target: torch.Tensor, b: int, h: int, r0: int, n_k: int, mask: torch.Tensor
    ) -> None:
        """Head h's probabilities of rows r0..r0+len(target)−1 into `target`; `mask`: the
        rows' keys to drop (bool) or the additive mask (float)."""
        work = torch.float32 if self.query.dtype in _HALF else self.query.dtype
        group = self.n_heads // int(self.key.shape[1])
        rows = target.shape[0]
        seen = self._keys_seen(r0 + rows, n_k)
        if seen < n_k:  # causal rows: the keys after the chunk's last row are 0, not scored
            target[:, seen:] = 0
            target, mask = target[:, :seen], mask[:, :seen]
        q = self.query[b, h, r0 : r0 + rows].to(work)
        k = self.key[b, h // group, :seen].to(work)
        direct = target.dtype == work and target.device == q.device and target.is_contiguous()
        s = torch.empty(target.shape, dtype=work, device=q.device)  # the scores
        torch.matmul(q, k.T, out=s)
        s.mul_(self.scaling)
        if self.softcap is not None:
            s.div_(self.softcap).tanh_().mul_(self.softcap)
        if mask.dtype == torch.bool:
            s.masked_fill_(mask, -math.inf)
        else:
            s.add_(mask.to(s))
        if self.sinks is not None:
            sink = self.sinks.reshape(-1)[h].to(s)
            s.sub_(torch.logaddexp(torch.logsumexp(s, -1, keepdim=True), sink)).exp_()
            target.copy_(s)
        elif direct:  # eager's own softmax kernel, written straight into the maps
            torch.softmax(s, -1, out=target)
        else:
            target.copy_(torch.softmax(s, -1))

    def _keys_seen(self, r1: int, n_k: int) -> int:
        """Keys 0..k−1 hold every key rows < r1 may see: k = r1 + (n_k − n) for a causal
        call whose mask the recomputation builds (none or 2-D), else all n_k."""
        if not self.causal or (self.mask is not None and self.mask.dim() != 2):
            return n_k
        return max(0, min(n_k, r1 + int(self.key.shape[2]) - int(self.query.shape[2])))

    def _mask_rows(self, b: int, h: int, r0: int, r1: int, n_k: int) -> torch.Tensor:
        """`[r1 − r0, n_k]`: the keys to drop (bool) or the additive mask (float)."""
        m = self.mask
        if m is not None and m.dim() == 4:
            part = m[b if m.shape[0] > 1 else 0, h if m.shape[1] > 1 else 0, r0:r1, :n_k]
            return ~part if part.dtype == torch.bool else part
        device = self.query.device
        i = torch.arange(r0, r1, device=device)[:, None] + (self.key.shape[2] - self.query.shape[2])
        j = torch.arange(n_k, device=device)[None, :]
        drop = torch.zeros(r1 - r0, n_k, dtype=torch.bool, device=device)
        if self.causal:
            drop |= j > i
        if self.window is not None:
            if not self.causal:
                raise CannotRecompute("a bidirectional sliding window without a mask")
            drop |= i - j >= self.window
        if m is not None and m.dim() == 2:
            drop |= ~m[b, :n_k].bool()[None, :]
        elif m is not None:
            raise CannotRecompute(f"an attention mask of {m.dim()} dimensions")
        return drop


def fill_maps(
    maps: torch.Tensor | AttentionCall,
    b: int,
    heads: Sequence[int] | None,
    n: int,
    n_k: int,
    out: torch.Tensor,
    chunk: int = CHUNK_ELEMENTS,
) -> None:
    """Write sequence b's maps `[len(heads), n, n_k]` into `out`, from a module's own
    `[B, H, n, n_k]` probabilities (eager) or from an `AttentionCall` (recomputed, in row
    chunks of `chunk` scores)."""
    if isinstance(maps, AttentionCall):
        maps.fill(b, heads, n, n_k, out, chunk)
    elif heads is None:
        out.copy_(maps[b, :, :n, :n_k])
    else:
        out.copy_(maps[b, list(heads), :n, :n_k])


# ---- the interception --------------------------------------------------------------


def supported() -> bool:
    """Whether this transformers release dispatches attention through the interface."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return False  # 4.x modules index the mapping and call eager outside it
    from transformers.modeling_utils import AttentionInterface

    return hasattr(AttentionInterface, "get_interface")


def watch(hooks: HookSet, module: nn.Module, handler: Handler) -> None:
    """Call `handler(module, output, call)` after each call of `module`'s attention function
    (`call()` reads its arguments as an `AttentionCall`), until `hooks` is removed; the
    interface is wrapped on first use."""
    _install()
    key = id(module)
    if key in _WATCHED:
        raise IdentifiableError(
            f"{type(module).__name__} is already being traced (one capture at a time per model)"
        )
    _WATCHED[key] = handler

    def forget() -> None:
        _WATCHED.pop(key, None)

    hooks.on_remove(forget)


def _install() -> None:
    from transformers.modeling_utils import AttentionInterface

    original = AttentionInterface.get_interface
    if getattr(original, "_identifiable", False):
        return

    def get_interface(self: Any, attn_implementation: str, default: Callable[..., Any]) -> Any:
        return _wrap(original(self, attn_implementation, default))

    get_interface._identifiable = True  # type: ignore[attr-defined]
    AttentionInterface.get_interface = get_interface  # type: ignore[method-assign]


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    found = _WRAPPED.get(id(fn))
    if found is not None:
        return found

    def dispatch(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        out = fn(module, query, key, value, attention_mask, *args, **kwargs)
        handler = _WATCHED.get(id(module))
        if handler is not None:
            handler(
                module,
                out,
                lambda: AttentionCall.from_arguments(
                    module, query, key, attention_mask, args, kwargs
                ),
            )
        return out

    _WRAPPED[id(fn)] = dispatch
    dispatch.__wrapped__ = fn  # type: ignore[attr-defined]
    return dispatch
