"""Which attention implementation a traced model runs, and the proof that maps recomputed
under it equal eager attention's.

`attention=` on `load_model` and `Model.from_hf`:

- "auto" (default): families whose attention modules dispatch through transformers 5.x's
  attention interface (Llama, Mistral, Qwen, Gemma, Gemma-3, Phi-3, OLMo-2, Mixtral,
  GPT-2, GPT-NeoX, OPT, BERT, …) keep the implementation they were loaded with
  (`load_model` loads sdpa where the class has it): the maps are recomputed from the
  query and key the attention function receives (models/recompute.py), proved equal to
  eager's on a 16-token probe when the model is wrapped. Other families run eager.
- "sdpa": as "auto", but an eager model is switched to sdpa; a family that cannot be
  recomputed (no sdpa, attention not dispatched through the interface: Gemma-2, BLOOM,
  Falcon, GPT-Neo) falls back to eager with a warning.
- "eager": the model runs eager attention, which returns its probabilities.

A family where neither works (a custom kernel that returns no probabilities and cannot be
switched) is refused in one line when it is traced (`AttentionStack._maps_in`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models import recompute
from identifiable.models.encoding import InputEncoder
from identifiable.models.hooks import HookSet
from identifiable.models.stack import AttentionStack, Captured, Tap

AttentionChoice = Literal["auto", "sdpa", "eager"]
ATTENTION_CHOICES: tuple[str, ...] = ("auto", "sdpa", "eager")
PROBE_TOKENS = 16
MAPS: tuple[Tap, ...] = ("maps",)
HALF = (torch.float16, torch.bfloat16)


class EagerFallback(UserWarning):
    """A model whose maps cannot be recomputed under the implementation it was loaded with
    (or asked for) is traced eager."""


def implementation(hf_model: nn.Module) -> str:
    """The attention implementation the model runs now ("eager", "sdpa", …)."""
    return str(getattr(hf_model.config, "_attn_implementation", None) or "eager")


def why_not_recomputed(hf_model: nn.Module, stack: AttentionStack) -> str | None:
    """Why maps cannot be recomputed for this model (None: they can)."""
    if not recompute.supported():
        return "this transformers release has no attention interface"
    if stack.spec.modality != "text":
        return "image models are traced eager"
    cls = type(hf_model)
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if can_set is None or not can_set():
        return f"{cls.__name__}'s attention is not dispatched through transformers' interface"
    return None


def check_choice(attention: object) -> AttentionChoice:
    if attention not in ATTENTION_CHOICES:
        raise IdentifiableError(
            f"attention= must be one of {', '.join(map(repr, ATTENTION_CHOICES))}, got "
            f"{attention!r}"
        )
    return attention  # type: ignore[return-value]


def capture_implementation(
    hf_model: nn.Module, stack: AttentionStack, attention: AttentionChoice
) -> str:
    """The implementation traces run under: "eager", or one whose maps are recomputed
    (the model's own where it was loaded with one, "sdpa" where `attention="sdpa"`)."""
    loaded = implementation(hf_model)
    if attention == "eager":
        return "eager"
    reason = why_not_recomputed(hf_model, stack)
    if (
        attention == "sdpa"
        and reason is None
        and not getattr(type(hf_model), "_supports_sdpa", False)
    ):
        reason = f"{type(hf_model).__name__} has no sdpa attention"
    if reason is not None:
        if attention == "sdpa" or loaded != "eager":
            under = "sdpa" if attention == "sdpa" else loaded
            warnings.warn(
                f"attention maps cannot be recomputed under {under} ({reason}): switched the "
                "model to eager attention",
                EagerFallback,
                stacklevel=4,
            )
        return "eager"
    return "sdpa" if attention == "sdpa" and loaded == "eager" else loaded


def set_implementation(hf_model: nn.Module, impl: str) -> None:
    try:
        hf_model.set_attn_implementation(impl)  # type: ignore[operator]
    except Exception as exc:
        raise IdentifiableError(
            f"could not switch {type(hf_model).__name__} to '{impl}' attention ({exc}); load "
            f"it with attn_implementation='{impl}'"
        ) from None


@contextlib.contextmanager
def running(hf_model: nn.Module, impl: str, *, keep_mode: bool = False) -> Iterator[None]:
    """The model on implementation `impl` inside the block, restored afterwards: the
    model a user holds keeps its own implementation between our calls. It is also in
    eval mode inside the block (`inference`), unless `keep_mode` (training's penalty
    runs in the mode the caller chose)."""
    with contextlib.ExitStack() as stack:
        if not keep_mode:
            stack.enter_context(inference(hf_model))
        if impl == "eager":
            stack.enter_context(_switched_to_eager(hf_model))
        elif implementation(hf_model) != impl:
            before, saved = implementation(hf_model), _settings(hf_model)
            set_implementation(hf_model, impl)
            stack.callback(_restore, hf_model, before, saved)
        yield


@contextlib.contextmanager
def eager(hf_model: nn.Module, *, keep_mode: bool = False) -> Iterator[None]:
    """Eager attention inside the block (it returns the probabilities: traces of families
    that cannot be recomputed, Hidden Token Attribution's forward-mode derivatives,
    training's attention maps, discovery's probes); the model's own implementation,
    every config's setting included, is restored afterwards. Eval mode as in `running`."""
    with running(hf_model, "eager", keep_mode=keep_mode):
        yield


@contextlib.contextmanager
def inference(hf_model: nn.Module) -> Iterator[None]:
    """Eval mode (dropout off) inside the block; each module's own training flag is put
    back afterwards, so a model the user holds in training mode stays in it."""
    training = [m for m in hf_model.modules() if m.training]
    hf_model.eval()
    try:
        yield
    finally:
        for module in training:  # the flag alone: Module.train() would recurse
            module.training = True


@contextlib.contextmanager
def _switched_to_eager(hf_model: nn.Module) -> Iterator[None]:
    before = implementation(hf_model)
    if before == "eager":
        yield
        return
    saved = _settings(hf_model)
    ensure_eager(hf_model, quiet=True)
    try:
        yield
    finally:
        _restore(hf_model, before, saved)


def _settings(hf_model: nn.Module) -> list[tuple[Any, Any]]:
    """(config, its `_attn_implementation`) of every distinct config in the model."""
    seen: dict[int, tuple[Any, Any]] = {}
    for module in hf_model.modules():
        config = getattr(module, "config", None)
        if (
            config is not None
            and id(config) not in seen
            and hasattr(config, "_attn_implementation")
        ):
            seen[id(config)] = (config, vars(config).get("_attn_implementation_internal", _UNSET))
    return list(seen.values())


_UNSET = object()


def _restore(hf_model: nn.Module, before: str, saved: list[tuple[Any, Any]]) -> None:
    """Back to `before`: through `set_attn_implementation` where the class has it (so
    that whatever else it sets follows), then every config's own value as it was."""
    with contextlib.suppress(Exception):
        if hasattr(hf_model, "set_attn_implementation"):
            hf_model.set_attn_implementation(before)  # type: ignore[operator]
    for config, value in saved:
        if value is _UNSET:
            vars(config).pop("_attn_implementation_internal", None)
        else:
            vars(config)["_attn_implementation_internal"] = value


def ensure_eager(hf_model: nn.Module, *, quiet: bool = False) -> None:
    """Switch the model to eager attention, which returns the attention probabilities."""
    impl = implementation(hf_model)
    if impl == "eager":
        return
    try:
        if hasattr(hf_model, "set_attn_implementation"):
            hf_model.set_attn_implementation("eager")  # type: ignore[operator]
        else:  # transformers 4.x towers (CLIP's vision model): the setting lives in configs
            for module in hf_model.modules():
                config = getattr(module, "config", None)
                if config is not None and hasattr(config, "_attn_implementation"):
                    config._attn_implementation = "eager"
        if implementation(hf_model) != "eager":
            # a class outside the attention interface (Falcon) declines the switch, but its
            # modules read the setting at every call
            hf_model.config._attn_implementation = "eager"  # type: ignore[union-attr]
    except Exception as exc:
        raise IdentifiableError(
            f"the model uses '{impl}' attention, which returns no attention probabilities, and "
            f"could not be switched to eager ({exc}); load it with attn_implementation='eager'."
        ) from None
    if not quiet:
        warnings.warn(
            f"switched the model from '{impl}' to eager attention", UserWarning, stacklevel=4
        )


def probe_maps(
    hf_model: nn.Module,
    stack: AttentionStack,
    inputs: InputEncoder,
    ids: torch.Tensor,
    *,
    from_call: bool,
) -> list[torch.Tensor]:
    """Each layer's `[H, n, n]` maps on `ids` under the model's current implementation:
    recomputed from the attention function's arguments (`from_call`), else what it returns
    (eager) or, where it returns nothing, recomputed."""
    enc = inputs.encode_ids(ids, truncate=True)
    n = len(enc)
    got: list[torch.Tensor] = []

    def sink(tap: Tap, layer: int, x: Captured) -> None:
        out = torch.empty(stack.n_heads, n, n)
        recompute.fill_maps(x, 0, None, n, n, out)
        got.append(out)

    with HookSet() as hooks, torch.no_grad(), inference(hf_model):
        if from_call:
            for mod in {id(m): m for m in stack.attention_modules}.values():
                recompute.watch(hooks, mod, lambda m, out, call: sink("maps", len(got), call()))
        else:
            stack.tap(hooks, sink, MAPS, map_shape=(n, n), recompute=True)
        hf_model(**inputs.batch([enc], hf_model))
    return got


def recompute_error(
    hf_model: nn.Module, stack: AttentionStack, inputs: InputEncoder, ids: torch.Tensor
) -> float:
    """Largest |A_recomputed − A_eager| over every layer, head and entry of a probe: the
    model's current implementation against one eager forward of the same ids (an eager
    model: maps recomputed from its attention calls against what those calls return)."""
    impl = implementation(hf_model)
    with running(hf_model, "eager"):
        eager = probe_maps(hf_model, stack, inputs, ids, from_call=False)
        if impl == "eager":
            mine = probe_maps(hf_model, stack, inputs, ids, from_call=True)
    if impl != "eager":
        mine = probe_maps(hf_model, stack, inputs, ids, from_call=False)
    if len(mine) != len(eager) or not mine:
        raise recompute.CannotRecompute(
            f"the probe gave {len(mine)} recomputed and {len(eager)} eager attention maps"
        )
    return max(float((a - b).abs().max()) for a, b in zip(mine, eager, strict=True))


def tolerance(dtype: torch.dtype) -> float:
    """Largest |A_recomputed − A_eager| accepted: float32 rounding of two orders of the same
    sums (1e-5); half precision: eager rounds Q Kᵀ and A to the dtype, the recomputation
    does not (5e-2; a wrong mask or scale errs by far more on a random probe)."""
    return 5e-2 if dtype in HALF else 1e-5


def prove(
    hf_model: nn.Module, stack: AttentionStack, inputs: InputEncoder, ids: torch.Tensor
) -> tuple[bool, float | None, str]:
    """(recompute proved, its error, why not): the probe check of `recompute_error`."""
    dtype = next(hf_model.parameters()).dtype
    try:
        err = recompute_error(hf_model, stack, inputs, ids[:PROBE_TOKENS])
    except recompute.CannotRecompute as exc:
        return False, None, str(exc)
    if not err <= tolerance(dtype):
        return False, err, f"recomputed maps differ from eager's by {err:.1e} on a probe"
    return True, err, ""
