"""`context_mixing(model, text, method=…)`: every context-mixing method on one interface.

The registry maps a method name to a `Method`: its defaults, whether it defines a
rollout, and a `compute` that reads only what `_Inputs` provides (the `Trace`, the
normalisation captures of `identifiable.models.blocks`, and the functional view
`Model.embed`/`Model.layer_outputs`). The maths lives in `rollout`, `flow`,
`decompose` and `perturb`; this module is glue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from identifiable.attribution.memory import DEFAULT_MEMORY_BUDGET
from identifiable.errors import IdentifiableError, seconds
from identifiable.mixing import decompose, flow, perturb
from identifiable.mixing.result import MixingResult
from identifiable.mixing.rollout import (
    clip_renormalise,
    head_average,
    rollout,
    row_normalise,
    with_residual,
)
from identifiable.models.arguments import check_model
from identifiable.models.budget import check_analysis
from identifiable.models.protocol import TracedModel
from identifiable.utils.progress import status, watching

TextOrPair = str | tuple[str, str]
Computed = tuple[Tensor, Tensor | None, dict[str, Any]]


@dataclass(frozen=True)
class Method:
    """One registered method.

    Attributes:
        name: registry key.
        summary: one line for listings.
        compute: (inputs, options) → (layerwise `[L, n, n]`, rolled `[L, n, n]` or None, meta).
        defaults: option name → default; `context_mixing` accepts exactly these options.
        needs_blocks: reads the normalisation captures (captured in the tracing pass).
    """

    name: str
    summary: str
    compute: Callable[[_Inputs, dict[str, Any]], Computed]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    needs_blocks: bool = False


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add a method to the registry (a name may be registered once)."""
    if method.name in METHODS:
        raise IdentifiableError(f"a mixing method named {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def method_names() -> list[str]:
    return list(METHODS)


def get_method(name: str) -> Method:
    """The registered method, or a one-line error listing the known ones."""
    if not isinstance(name, str) or name not in METHODS:
        raise IdentifiableError(f"unknown mixing method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def unavailable(model: TracedModel, methods: Sequence[str]) -> dict[str, str]:
    """method → why it cannot run on `model`, for those of `methods` that cannot; known
    before any text is traced (a run checks this before its first stage). Today that is
    the norm-based methods on a family whose normalisation layout is undescribed."""
    from identifiable.models.blocks import norm_layout

    out: dict[str, str] = {}
    for name in methods:
        if get_method(name).needs_blocks:
            try:
                norm_layout(model)
            except IdentifiableError as exc:
                out[name] = str(exc)
    return out


class _Inputs:
    """What the methods read, computed on first use and shared: one tracing pass captures
    both the `Trace` and (if asked) the normalisation inputs and outputs."""

    def __init__(self, model: TracedModel, text: TextOrPair, truncate: bool, blocks: bool) -> None:
        self.model, self.text, self.truncate, self._want_blocks = model, text, truncate, blocks
        self._blocks: Any = None

    @cached_property
    def encoding(self) -> Any:
        return self.model.encode(self.text, truncate=self.truncate)

    @cached_property
    def trace(self) -> Any:
        if not self._want_blocks:
            return self.model.trace(self.text, truncate=self.truncate)
        from identifiable.models.blocks import record_blocks

        with record_blocks(self.model) as rec:
            tr = self.model.trace(self.text, truncate=self.truncate)
        self._blocks = rec.result()
        return tr

    @property
    def blocks(self) -> Any:
        _ = self.trace
        return self._blocks

    @cached_property
    def norms(self) -> Any:
        from identifiable.models.blocks import block_norms

        return block_norms(self.model)

    @property
    def is_causal(self) -> bool:
        return bool(self.model.info.is_causal)

    @cached_property
    def layout(self) -> Any:
        """The block's `NormLayout`, or the one-line error saying why it is undefined."""
        from identifiable.models.blocks import norm_layout

        return norm_layout(self.model)

    @property
    def post_norm(self) -> bool:
        return bool(self.layout.kind == "post")

    def pieces(self, layer: int) -> decompose.BlockPieces:
        tr = self.trace
        return decompose.BlockPieces(
            attn=tr.attentions[layer],
            f=decompose.transformed_values(
                tr.values[layer], tr.value_bias[layer], tr.out_proj[layer]
            ),
            out_bias=tr.out_bias[layer],
            residual=tr.hidden_states[layer],
        )

    def layer_fn(self) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        enc = self.encoding
        e0 = self.model.embed(enc.input_ids, enc.token_type_ids)
        ids = enc.input_ids.to(e0.device)
        return e0, lambda x: self.model.layer_outputs(x, ids)


def context_mixing(
    model: TracedModel,
    text: TextOrPair,
    method: str = "rollout",
    *,
    truncate: bool = True,
    progress: bool | None = None,
    memory_budget: int | None = None,
    **options: Any,
) -> MixingResult:
    """How much each token mixes into each other token, per layer, by `method`.

    Args:
        model: an `identifiable.models.Model` (`identifiable.load_model`).
        text: a text or a pair (a, b), tokenised in the model's own format.
        method: a registry name (`method_names()`); see docs/mixing.md for definitions.
        truncate: cut texts longer than the model's maximum (else raise).
        progress: a status line while it computes (None: when a person watches; in a
            log, one line once it has taken 3 s).
        memory_budget: bytes the method's maps may use (default: the memory free now):
            4·L·H·n² (the trace's maps) + 32·L·n² (the layer maps and their rollout in
            float64, and the result's copies), checked before the model runs; for "hta"
            also its chunk budget.
        **options: the method's options (`METHODS[method].defaults`), e.g.
            `residual_weight=0.5` for rollout, `second_norm=False` for globenc,
            `probes=32` for hta. Unknown options are an error.
    Returns:
        a `MixingResult` with `layerwise` and (where defined) `rolled`, `[L, n, n]` float64.
    """
    check_model(model)
    spec = get_method(method)
    unknown = sorted(set(options) - set(spec.defaults))
    if unknown:
        allowed = ", ".join(spec.defaults) or "none"
        raise IdentifiableError(
            f"method {method!r} has no option {', '.join(unknown)}; its options: {allowed}"
        )
    if memory_budget is not None and "memory_budget" in spec.defaults:
        options["memory_budget"] = memory_budget
    opts = {**spec.defaults, **options}
    start = time.perf_counter()
    inputs = _Inputs(model, text, truncate, spec.needs_blocks)
    n = len(inputs.encoding)
    info = model.info
    check_analysis(
        4 * info.n_layers * n * n * (info.n_heads + 8),
        memory_budget,
        f"context mixing by {method}",
        python="shorten the text",
        cli="shorten the text or raise --memory-budget",
    )
    shown = watching() if progress is None else bool(progress)
    with status(f"context mixing by {method} …", enabled=shown):
        layerwise, rolled, meta = spec.compute(inputs, opts)
    if inputs.is_causal:  # the contract every method's tests check: no entry above the diagonal
        for maps in (layerwise, rolled):
            if maps is not None:
                perturb.causal_mask_(maps)
    enc = inputs.encoding
    return MixingResult(
        layerwise=layerwise.double().cpu(),
        rolled=None if rolled is None else rolled.double().cpu(),
        method=method,
        tokens=list(enc.tokens),
        options=opts,
        is_causal=inputs.is_causal,
        model_name=model.info.name,
        seconds=time.perf_counter() - start,
        meta={**meta, "truncated": int(getattr(enc, "n_dropped", 0))},
    )


# ---- attention-based -------------------------------------------------------------


def _residual_weight(opts: dict[str, Any]) -> float:
    w = opts["residual_weight"]
    if not isinstance(w, int | float) or not 0.0 <= float(w) <= 1.0:
        raise IdentifiableError(f"residual_weight must be a number in [0, 1], got {w!r}")
    return float(w)


def _attention(x: _Inputs, opts: dict[str, Any]) -> Computed:
    return head_average(x.trace.attentions), None, {}


def _rollout(x: _Inputs, opts: dict[str, Any]) -> Computed:
    layer = with_residual(head_average(x.trace.attentions), _residual_weight(opts))
    return layer, rollout(layer), {}


def check_flow_budget(n_tokens: int, n_layers: int, budget_s: float, workers: int = 1) -> None:
    """One-line error when flow on n tokens is predicted to exceed `budget_s` seconds
    (the one-process estimate divided among `workers` processes, at most one per core:
    more processes than cores cannot shorten it)."""
    import math
    import os

    cores = os.cpu_count() or 1
    parallel = max(1, min(workers, cores))
    need = flow.estimate_seconds(n_tokens, n_layers) / parallel
    if need > budget_s:
        limit = flow.max_tokens(n_layers, budget_s * parallel)
        enough = math.ceil(need * 1.2)  # whole seconds, so never the "0" the CLI refuses
        more = " or add processes (workers=, CLI --workers)" if parallel < cores else ""
        raise IdentifiableError(
            f"flow on {n_tokens} tokens would take about {seconds(need)}, over its budget of "
            f"{budget_s:g} s (about {limit} tokens for this {n_layers}-layer model with "
            f"{parallel} process{'es' if parallel > 1 else ''}); shorten the text, raise the "
            f"budget (budget_s={enough}, CLI --flow-budget {enough}){more}, or use rollout"
        )


def _flow(x: _Inputs, opts: dict[str, Any]) -> Computed:
    budget = opts["budget_s"]
    if not isinstance(budget, int | float) or not budget > 0:  # NaN would refuse nothing
        raise IdentifiableError(f"budget_s must be a positive number of seconds, got {budget!r}")
    workers = opts["workers"]
    flow.check_workers(workers)  # before the budget check divides by it
    check_flow_budget(len(x.encoding), x.model.info.n_layers, float(budget), workers)
    layer = with_residual(head_average(x.trace.attentions), _residual_weight(opts))
    flows = flow.attention_flow(
        layer, resolution=int(opts["resolution"]), causal=x.is_causal, workers=workers
    )
    return layer, flows, {"resolution": int(opts["resolution"]), "workers": workers}


def _effective_rollout(x: _Inputs, opts: dict[str, Any]) -> Computed:
    from identifiable.attention import effective_attention

    raw = head_average(x.trace.attentions)
    eff = effective_attention(x.trace, opts["variant"]).effective.mean(1)
    clipped, fallback = clip_renormalise(eff, raw)
    layer = with_residual(clipped, _residual_weight(opts))
    negative = float(eff.clamp_max(0).abs().sum() / eff.abs().sum().clamp_min(1e-300))
    return layer, rollout(layer), {"fallback_rows": fallback, "negative_mass": negative}


# ---- norm-based ------------------------------------------------------------------


def _norm(x: _Inputs, opts: dict[str, Any]) -> Computed:
    maps = [decompose.part_norms(x.pieces(i), residual=False) for i in range(x.trace.n_layers)]
    return torch.stack(maps), None, {}


def _needs_residual_structure(x: _Inputs, method: str) -> None:
    """Resolve the block layout first: an undefined family fails in one line before any work."""
    _ = x.layout


def norm_chain(x: _Inputs, layer: int, second_norm: bool) -> tuple[list[Any], list[Tensor]]:
    """The norms a layer's residual sum passes through and their actual divisors `[n]`:
    post-LN: LN1 (and LN2); pre-LN: none (N1 is inside each token's value, N2 inside
    the MLP branch)."""
    if not x.post_norm:
        return [], []
    first, second = x.norms[layer]
    if first is None or second is None:
        raise IdentifiableError(f"layer {layer} of this post-norm model has no layer norm")
    cap = x.blocks
    chain = [first]
    scales = [first.scale(cap.first_in[layer]).squeeze(-1)]
    if second_norm:
        chain.append(second)
        scales.append(second.scale(cap.second_in[layer]).squeeze(-1))
    return chain, scales


def _globenc(x: _Inputs, opts: dict[str, Any]) -> Computed:
    _needs_residual_structure(x, "globenc")
    second = opts["second_norm"]
    if second and not x.post_norm:
        raise IdentifiableError(
            f"globenc's second layer norm is undefined for the {_wiring(x)} '{x.model.spec.name}': "
            "that norm sits inside the MLP branch, not on the residual path; drop second_norm"
        )
    second = x.post_norm if second is None else bool(second)
    maps = []
    for layer in range(x.trace.n_layers):
        chain, scales = norm_chain(x, layer, second)
        maps.append(decompose.part_norms(x.pieces(layer), chain, scales, residual=True))
    layerwise = row_normalise(torch.stack(maps))
    return layerwise, rollout(layerwise), {"second_norm": second}


def _wiring(x: _Inputs) -> str:
    return "pre-norm" if x.layout.kind == "pre" else "parallel-block"


def alti_output(x: _Inputs, layer: int) -> Tensor:
    """y_i `[n, d]`: what ALTI's parts add up to: LN1's output (post-LN) or the residual
    stream after attention (pre-LN), both as captured from the model. A parallel block
    never forms x + Attn(N1(x)) (its MLP reads x), so there y is that sum from the trace."""
    if x.layout.kind == "parallel":
        tr = x.trace
        return tr.hidden_states[layer].double() + tr.attn_outputs[layer].double()
    cap = x.blocks
    return cap.first_out[layer] if x.post_norm else cap.second_in[layer]


def _alti(x: _Inputs, opts: dict[str, Any]) -> Computed:
    _needs_residual_structure(x, "alti")
    maps = []
    for layer in range(x.trace.n_layers):
        chain, scales = norm_chain(x, layer, second_norm=False)
        pieces = x.pieces(layer)
        maps.append(decompose.alti_map(pieces, alti_output(x, layer), chain, scales))
    layerwise = torch.stack(maps)
    return layerwise, rollout(layerwise), {}


# ---- perturbation- and gradient-based ----------------------------------------------


def _chunk(opts: dict[str, Any], n: int, per_copy: int) -> int:
    size = opts.get("chunk_size")
    if size is None:  # keep one chunk's largest activation under ~256 MB of float32
        return max(1, min(n, 2**26 // max(1, per_copy)))
    if not isinstance(size, int) or size < 1:
        raise IdentifiableError(f"chunk_size must be a positive integer, got {size!r}")
    return size


def value_zeroing_distances(x: _Inputs, chunk: int) -> Tensor:
    """`[L, n, n]` raw cosine distances 1 − cos(h^l_i, h^l_i with v_j zeroed in layer l)."""
    from identifiable.models.blocks import rerun_layers_zeroing_values

    tr, enc = x.trace, x.encoding
    n = tr.n_tokens
    clean = tr.hidden_states[1:]
    out = torch.zeros(tr.n_layers, n, n, dtype=torch.float64)
    for start in range(0, n, chunk):
        cols = torch.arange(start, min(n, start + chunk))
        zeroed = rerun_layers_zeroing_values(
            x.model, tr.hidden_states[:-1], enc.input_ids, cols, enc.token_type_ids
        )
        out[:, :, cols] = perturb.cosine_distances(clean, zeroed.cpu()).permute(1, 2, 0)
    return out


def _value_zeroing(x: _Inputs, opts: dict[str, Any]) -> Computed:
    tr = x.trace
    chunk = _chunk(opts, tr.n_tokens, tr.n_heads * tr.n_tokens**2)
    dist = value_zeroing_distances(x, chunk)
    if x.is_causal:
        perturb.causal_mask_(dist)
    layerwise = row_normalise(dist)
    return layerwise, rollout(layerwise), {"chunk_size": chunk}


def _erasure(x: _Inputs, opts: dict[str, Any]) -> Computed:
    e0, f = x.layer_fn()
    n = e0.shape[0]
    info = x.model.info
    chunk = _chunk(opts, n, info.n_heads * n * n)
    with torch.no_grad():
        clean = f(e0)
        out = torch.zeros(info.n_layers, n, n, dtype=torch.float64)
        for start in range(0, n, chunk):
            cols = torch.arange(start, min(n, start + chunk))
            blank = e0[None].repeat(len(cols), 1, 1)
            blank[torch.arange(len(cols)), cols.to(e0.device)] = 0.0
            change = perturb.change_norms(clean[1:], f(blank)[:, 1:]).cpu()  # [B, L, n]
            out[:, :, cols] = change.permute(1, 2, 0)
    return out, None, {"chunk_size": chunk}


def _grad_input(x: _Inputs, opts: dict[str, Any]) -> Computed:
    e0, f = x.layer_fn()
    n = e0.shape[0]
    info = x.model.info
    chunk = _chunk(opts, n, 2 * info.n_heads * n * n)
    out = torch.zeros(info.n_layers, n, n, dtype=torch.float64)
    for start in range(0, n, chunk):
        cols = torch.arange(start, min(n, start + chunk))
        jx = perturb.input_times_jacobian(f, e0.detach(), cols)  # [B, L+1, n, d]
        out[:, :, cols] = jx[:, 1:].double().norm(dim=-1).cpu().permute(1, 2, 0)
    return out, None, {"chunk_size": chunk}


def _hta(x: _Inputs, opts: dict[str, Any]) -> Computed:
    from identifiable.attribution import hidden_token_attribution

    res = hidden_token_attribution(
        x.model,
        x.text,
        opts["probes"],
        seed=int(opts["seed"]),
        truncate=x.truncate,
        memory_budget=opts["memory_budget"],
        progress=False,
    )
    meta = {"n_jvps": res.n_jvps, "mode": "exact" if opts["probes"] is None else "estimated"}
    return res.contributions.double(), None, meta


for _m in (
    Method("attention", "head-averaged raw attention of each layer", _attention),
    Method(
        "rollout",
        "attention rollout: product of 0.5·A + 0.5·I over layers (Abnar & Zuidema 2020)",
        _rollout,
        {"residual_weight": 0.5},
    ),
    Method(
        "flow",
        "attention flow: max flow through the layered attention graph (Abnar & Zuidema 2020)",
        _flow,
        {
            "residual_weight": 0.5,
            "resolution": flow.DEFAULT_RESOLUTION,
            "budget_s": 60.0,
            "workers": 1,
        },
    ),
    Method(
        "effective-rollout",
        "rollout of effective attention, negatives clipped and rows renormalised (ours)",
        _effective_rollout,
        {"residual_weight": 0.5, "variant": "paper"},
    ),
    Method("norm", "‖α_ij f(x_j)‖ of the attention output (Kobayashi et al. 2020)", _norm),
    Method(
        "globenc",
        "norms through residual and layer norms, rolled out (Modarressi et al. 2022)",
        _globenc,
        {"second_norm": None},
        needs_blocks=True,
    ),
    Method(
        "alti",
        "L1-distance contributions through residual and layer norm, rolled out (Ferrando et al. 2022)",
        _alti,
        needs_blocks=True,
    ),
    Method(
        "value-zeroing",
        "cosine change of each output when token j's values are zeroed (Mohebbi et al. 2023)",
        _value_zeroing,
        {"chunk_size": None},
    ),
    Method(
        "grad-input",
        "‖J_ij x_j‖: input × gradient of each hidden state (forward mode)",
        _grad_input,
        {"chunk_size": None},
    ),
    Method(
        "erasure",
        "‖h_i − h_i with x_j blanked to 0‖: change of each hidden state",
        _erasure,
        {"chunk_size": None},
    ),
    Method(
        "hta",
        "Hidden Token Attribution, exact or estimated with probes (Brunner et al. 2020)",
        _hta,
        {"probes": None, "seed": 0, "memory_budget": DEFAULT_MEMORY_BUDGET},
    ),
):
    register(_m)
