"""Per-head identifiability of every layer of a model, one text at a time, on the model's
own device: the analysis behind `identifiable.scan` (docs/scan.md).

For each chosen layer the forward pass is tapped as it runs (`models.layerscan`); each
group of heads' maps is filled on the layer's device, projected to effective attention
with the routes of `effective_attention` (same rank decisions, same products), reduced
to the statistics of `STATISTICS` and dropped. Only the heads named in `keep` leave the
device as full maps. So a scan holds one group of heads' maps besides the forward pass,
never L·H·n².

Statistics of one text, layer and query head (A the raw map, A_eff its effective map in
the chosen variant, rows i, keys j; "rows that see j" follows the layer's key mask):

    n                   tokens of the text
    dim                 dim LN(T) (of [T, 1] for the row-stochastic variant): the median
                        over rows of the row's null-space dimension (every row's for an
                        encoder; a decoder row i has its prefix's)
    null_fraction       ‖A − A_eff‖_F / ‖A‖_F
    sink_raw            mean over rows that see the sink key s of A[i, s]
    sink_effective      the same of A_eff[i, s]
    diagonal_raw        mean over rows of A[i, i]
    diagonal_effective  mean over rows of A_eff[i, i]
    top_key_same        share of rows whose largest weight (over the keys the row sees)
                        is on the same key in A and A_eff
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from identifiable.attention.effective import EffectiveAttention, NullSpace
from identifiable.attention.linalg import head_factors
from identifiable.attention.outproj import HeadFactors, OutProj
from identifiable.attention.routes import layer_dims, project_layer
from identifiable.attention.sinks import key_mass
from identifiable.errors import IdentifiableError
from identifiable.results import Result
from identifiable.utils.precision import exact_device, has_float64
from identifiable.utils.threads import one_thread

if TYPE_CHECKING:  # pragma: no cover - types only
    from matplotlib.figure import Figure

    from identifiable.models.layerscan import LayerView

STATISTICS: tuple[str, ...] = (
    "n",
    "dim",
    "null_fraction",
    "sink_raw",
    "sink_effective",
    "diagonal_raw",
    "diagonal_effective",
    "top_key_same",
)
_STATS_DIMS = ("text", "layer", "head")
_KEPT_DIMS = ("kept", "query", "key")
# entries of a row chunk of the n×n work (statistics of a group; products of one head):
# fewer, larger kernels than effective_attention's, as `models.layerscan.FILL_CHUNK`
_CHUNK = 1 << 21


@dataclass(frozen=True)
class ScanResult(
    Result,
    dims={
        **dict.fromkeys(STATISTICS, _STATS_DIMS),
        "kept_raw": _KEPT_DIMS,
        "kept_effective": _KEPT_DIMS,
        "kept_rank": ("kept", "query"),
        "kept_dim": ("kept", "query"),
        "kept_dim_stochastic": ("kept", "query"),
        "kept_full_row_rank": ("kept",),
    },
    plot={"fields": ("null_fraction", "sink_raw", "sink_effective"), "axes": ("layer", "head")},
    summary=("variant", "sink"),
):
    """Per-head statistics of a scan (see the module docstring), `[T, L, H]` each: T
    texts in input order, L and H the layers and heads scanned (`layers`, `heads`: the
    model's indices; None: all). `n` is int64, the rest float64.

    Attributes:
        variant: "paper" or "row-stochastic" (which A_eff the statistics describe).
        sink: the sink key's position in each text (default 0, the first token).
        texts: the first 80 characters of each text; truncated: tokens cut from each.
        kept: `(text, layer, head)` of each map kept (`keep=`), in the order of the
            `kept_*` arrays; kept_raw, kept_effective: `[K, n_max, n_max]` float32 (NaN
            beyond a text's own n); kept_rank, kept_dim, kept_dim_stochastic: `[K, n_max]`
            per row (−1 beyond n); kept_full_row_rank `[K]`; kept_tokens: each kept
            map's tokens. `head(text, layer, head)` gives one as `EffectiveAttention`.
    """

    n: Tensor
    dim: Tensor
    null_fraction: Tensor
    sink_raw: Tensor
    sink_effective: Tensor
    diagonal_raw: Tensor
    diagonal_effective: Tensor
    top_key_same: Tensor
    variant: str = "paper"
    sink: int = 0
    model_name: str = ""
    is_causal: bool = False
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    texts: tuple[str, ...] = ()
    truncated: tuple[int, ...] = ()
    kept: tuple[tuple[int, int, int], ...] = ()
    kept_raw: Tensor | None = None
    kept_effective: Tensor | None = None
    kept_rank: Tensor | None = None
    kept_dim: Tensor | None = None
    kept_dim_stochastic: Tensor | None = None
    kept_full_row_rank: Tensor | None = None
    kept_tokens: tuple[tuple[str, ...], ...] = field(default=())

    def __post_init__(self) -> None:
        # a file stores tuples as JSON lists: back to tuples, so a loaded result equals
        for name in ("layers", "heads"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(v) for v in value))
        object.__setattr__(self, "kept", tuple(tuple(int(v) for v in k) for k in self.kept))
        object.__setattr__(self, "kept_tokens", tuple(tuple(t) for t in self.kept_tokens))
        object.__setattr__(self, "texts", tuple(self.texts))
        object.__setattr__(self, "truncated", tuple(int(t) for t in self.truncated))

    @property
    def n_texts(self) -> int:
        return int(self.n.shape[0])

    def head(self, text: int, layer: int, head: int) -> EffectiveAttention:
        """A kept map as a one-layer, one-head `EffectiveAttention` (plot, to_pandas,
        to_bertviz); one line naming the kept maps for any other."""
        key = (int(text), int(layer), int(head))
        if key not in self.kept:
            shown = ", ".join(map(str, self.kept[:8])) or "none (scan with keep=[(layer, head)])"
            raise IdentifiableError(
                f"the scan kept no map of text {text}, layer {layer}, head {head}; "
                f"kept (text, layer, head): {shown}"
            )
        assert self.kept_raw is not None and self.kept_effective is not None
        assert self.kept_rank is not None and self.kept_dim is not None
        assert self.kept_dim_stochastic is not None and self.kept_full_row_rank is not None
        k = self.kept.index(key)
        n = int(self.n[key[0], 0, 0])
        tokens = list(self.kept_tokens[k]) if self.kept_tokens else None
        sel = {"layers": (key[1],), "heads": (key[2],)}
        ns = NullSpace(
            self.kept_rank[k, :n][None, None],
            self.kept_dim[k, :n][None, None],
            self.kept_dim_stochastic[k, :n][None, None],
            self.kept_full_row_rank[k].reshape(1, 1),
            self.is_causal,
            tokens,
            self.model_name,
            **sel,
        )
        raw = self.kept_raw[k, :n, :n][None, None]
        eff = self.kept_effective[k, :n, :n][None, None]
        return EffectiveAttention(raw, eff, self.variant, ns, tokens, None, self.model_name, **sel)

    def plot(self, *fields: str, **sel: Any) -> Figure:  # type: ignore[override]
        """Layer × head heat maps, one panel per statistic (default null_fraction, sink_raw,
        sink_effective), of one text (`text=i`) or the mean over texts (default)."""
        from identifiable.results import plots

        names = list(fields) or list(self._plot["fields"])
        for name in names:
            if name not in STATISTICS:
                raise IdentifiableError(
                    f"ScanResult.plot draws the statistics {', '.join(STATISTICS)}; got {name!r}"
                )
        text = sel.pop("text", None)
        if sel:
            raise IdentifiableError(f"ScanResult.plot takes text=; got {', '.join(sel)}")
        coords = {
            "layer": self._coord("layer", int(self.n.shape[1])),
            "head": self._coord("head", int(self.n.shape[2])),
        }
        panels = []
        for name in names:
            arr = getattr(self, name).double()
            values = arr.mean(0) if text is None else arr[int(text)]
            panels.append((name, values.numpy(), ("layer", "head"), coords))
        title = f"mean of {self.n_texts} texts" if text is None else f"text {text}"
        return plots.heatmaps(self, panels, title)


@dataclass(frozen=True)
class ScanPlan:
    """What one scan computes, checked by the caller: the model's layers and heads (all
    named), the sink key, the kept `(layer, head)` pairs, the variant, A_eff's dtype and
    how many heads share one group of maps."""

    layers: tuple[int, ...]
    heads: tuple[int, ...]
    sink: int
    keep: frozenset[tuple[int, int]]
    variant: str
    dtype: torch.dtype
    group: int


@dataclass
class TextScan:
    """One text's statistics `[L, H, len(STATISTICS)]` (float64, CPU) and its kept maps,
    (layer, head) → (raw, effective `[n, n]` float32, rank, dim, dim_stochastic `[n]`,
    full row rank), all on the CPU."""

    stats: Tensor
    kept: dict[tuple[int, int], tuple[Tensor, ...]]


class LayerScanner:
    """Reduces each `LayerView` of one text to its statistics, group by group of heads;
    W_O factors are made once per layer and kept for the next texts."""

    def __init__(self, plan: ScanPlan, kv_head_of: Tensor) -> None:
        self.plan = plan
        kv = kv_head_of[list(plan.heads)].tolist()
        order = sorted(range(len(plan.heads)), key=lambda s: (kv[s], s))
        self.groups = [order[i : i + plan.group] for i in range(0, len(order), plan.group)]
        self._factors: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def start(self) -> TextScan:
        shape = (len(self.plan.layers), len(self.plan.heads), len(STATISTICS))
        return TextScan(torch.zeros(shape, dtype=torch.float64), {})

    def __call__(self, view: LayerView, into: TextScan) -> None:
        plan = self.plan
        li = plan.layers.index(view.layer)
        factors = self._layer_factors(view)
        # the maps' fill, the small float64 solves and the row reductions: on a shared CPU
        # a second thread waits on a descheduled peer at every kernel (utils.threads)
        small = one_thread if factors[0].device.type == "cpu" else nullcontext
        buffers = _Buffers(view.device)
        shared: list[Any] = []  # the last group's causal route data, for the next group
        for slots in self.groups:
            shape = (len(slots), view.n, view.n)
            with small():
                trace = view.trace(slots, buffers.take("raw", shape, view.values.dtype))
            sel = HeadFactors(*(f[slots][None] for f in factors))
            with small():
                rank, dim, dim_s, bases, solves = _group_dims(trace, sel, shared)
            raw = trace.attentions[0]
            eff = buffers.take("eff", shape, plan.dtype)
            rows = max(256, _CHUNK // raw.shape[-1])
            dims_both = (dim, dim_s)
            project_layer(
                raw,
                plan.variant,
                bases,
                dims_both,
                eff,
                plan.dtype,
                view.layer,
                small,
                rows,
                solves,
            )
            del bases
            dims = dim if plan.variant == "paper" else dim_s
            seen = trace.key_mask[0] if trace.key_mask is not None else None
            with small():
                into.stats[li, slots] = head_statistics(
                    raw, eff, dims, plan.sink, seen, trace.is_causal
                )
            for i, s in enumerate(slots):
                if (view.layer, plan.heads[s]) in plan.keep:  # copies: the buffers are reused
                    into.kept[(view.layer, plan.heads[s])] = (
                        raw[i].to("cpu", torch.float32, copy=True),
                        eff[i].to("cpu", torch.float32, copy=True),
                        rank[i].cpu(),
                        dim[i].cpu(),
                        dim_s[i].cpu(),
                        sel.full_row_rank[0, i].cpu(),
                    )
            del trace, raw, eff

    def _layer_factors(self, view: LayerView) -> tuple[Tensor, Tensor, Tensor]:
        """(factor, full row rank, well-conditioned) of the chosen heads' W_O rows."""
        if view.layer not in self._factors:
            w_o = view.out_proj[0]
            self._factors[view.layer] = head_factors(
                w_o.to(exact_device(w_o.device), torch.float64)
            )
        return self._factors[view.layer]


def _group_dims(trace: Any, sel: HeadFactors, shared: list[Any]) -> tuple:
    """`layer_dims` of one group's trace, plus a dict of its block solves. On the causal
    route, a group whose heads all use V itself (`routes._causal_prefixes`: X = V for a
    proved well-conditioned W_O) has the pivots and solves of the previous group that
    read the same values (the query heads of one key/value head): those are reused
    (`shared` holds that group's values and results)."""
    values, ok = trace.values[0], bool(sel.well_conditioned.all())
    if ok and shared and torch.equal(shared[0], values):
        return shared[1]
    got = layer_dims(trace, 0, OutProj(trace, sel), None)
    out: tuple = (*got, {})
    route, data = got[3]
    n_kv = int(torch.unique(trace.kv_head_of).numel())
    shared.clear()
    if ok and route == "causal" and data[0].coords.shape[0] == n_kv:  # X = V for every head
        shared.extend((values, out))
    return out


class _Buffers:
    """One layer's n×n buffers (maps, A_eff), reused by its groups and dropped with it: a
    fresh buffer per group paid its page faults (and their release) every time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._flat: dict[str, Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        size = math.prod(shape)
        flat = self._flat.get(name)
        if flat is None or flat.numel() < size or flat.dtype != dtype:
            self._flat.pop(name, None)  # the old buffer goes before the new one is made
            flat = self._flat[name] = torch.empty(size, dtype=dtype, device=self.device)
        return flat[:size].view(shape)


def scan_text(model: Any, enc: Any, scanner: LayerScanner, weights: Any) -> TextScan:
    """One text's `TextScan`: one forward pass of `model` (an `identifiable.models.Model`)
    on `enc`, each chosen layer reduced by `scanner` as soon as it has run, on its device
    (`weights`: the scan's `models.layerscan.LayerWeights`)."""
    from identifiable.models.layerscan import scan_model

    into = scanner.start()
    scan_model(
        model, enc, lambda view: scanner(view, into), layers=scanner.plan.layers, weights=weights
    )
    return into


def head_statistics(
    raw: Tensor, eff: Tensor, dims: Tensor, sink: int, seen: Tensor | None, causal: bool
) -> Tensor:
    """`[H, len(STATISTICS)]` float64 (CPU) of maps raw, eff `[H, n, n]` on one device and
    the per-row null-space dimensions `dims` `[H, n]`, reduced in row chunks on that
    device (sums in float64 where the device has it); `seen`: `[n, n]` bool on that
    device, the keys each row sees (the layer's key mask: windows, a sparse selection),
    None: every key, or keys ≤ i where `causal` (never formed as an n×n mask)."""
    g, n, _ = raw.shape
    dev = raw.device
    acc = torch.float64 if has_float64(dev) else torch.float32
    sq_a = torch.zeros(g, dtype=acc, device=dev)
    sq_d, same = torch.zeros_like(sq_a), torch.zeros_like(sq_a)
    step = max(1, _CHUNK // max(1, g * n))
    # causal rows r0..r1-1 see keys < r1 only: A and A_eff are 0 after, and not read
    cut = causal and seen is None
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        keys = r1 if cut else n
        a, e = raw[:, r0:r1, :keys], eff[:, r0:r1, :keys]
        # each row's norm in the maps' own precision (no converted copy), rows summed in acc
        sq_a += torch.linalg.vector_norm(a, dim=-1).to(acc).square().sum(-1)
        d = a.to(e.dtype) - e
        sq_d += torch.linalg.vector_norm(d, dim=-1).to(acc).square().sum(-1)
        del d
        # A is > 0 on the keys a row sees (a softmax) and 0 elsewhere, and A_eff is 0
        # where a row cannot see: an argmax over the whole row is the row's top key,
        # except where A_eff's largest weight is ≤ 0 (then a hidden 0 may win): those
        # rows are taken again with the hidden keys masked
        top_a = a.max(-1).indices  # max's indices: the same key as argmax, at less cost here
        top_v, top_e = e.max(-1)
        bad = (top_v <= 0).nonzero() if causal or seen is not None else None
        if bad is not None and bad.numel():
            g_i, rows = bad[:, 0], r0 + bad[:, 1]
            hidden = (
                ~seen[rows] if seen is not None else torch.arange(keys, device=dev) > rows[:, None]
            )
            top_e[g_i, bad[:, 1]] = e[g_i, bad[:, 1]].masked_fill(hidden, -math.inf).argmax(-1)
        same += (top_a == top_e).sum(-1, dtype=acc)
    if seen is not None:
        rows_seeing = seen[:, sink]
    else:
        rows_seeing = torch.arange(n, device=dev) >= (sink if causal else 0)
    sink_raw, sink_eff = key_mass(raw, eff, sink, rows_seeing)
    out = torch.empty(g, len(STATISTICS), dtype=torch.float64)
    out[:, 0] = n
    out[:, 1] = torch.quantile(dims.to(torch.float64), 0.5, dim=-1).cpu()
    out[:, 2] = (sq_d / sq_a.clamp_min(torch.finfo(acc).tiny)).sqrt().cpu().double()
    out[:, 3] = sink_raw.cpu().double()
    out[:, 4] = sink_eff.cpu().double()
    out[:, 5] = raw.diagonal(dim1=-2, dim2=-1).sum(-1, dtype=acc).cpu().double() / n
    out[:, 6] = eff.diagonal(dim1=-2, dim2=-1).sum(-1, dtype=acc).cpu().double() / n
    out[:, 7] = same.cpu().double() / n
    return out


def plan_groups(per_head: int, room: int, heads_per_kv: int) -> int:
    """Heads per group: the heads that read one key/value head (they share prefix
    solves), fewer where `room` bytes hold fewer groups of `per_head` bytes, at least 1."""
    return max(1, min(heads_per_kv, room // max(1, per_head)))


def check_keep(
    keep: Sequence[Sequence[int]] | None, layers: Sequence[int], heads: Sequence[int]
) -> frozenset[tuple[int, int]]:
    """`keep=` as a set of (layer, head) pairs inside the selection, or one line."""
    if keep is None:
        return frozenset()
    if isinstance(keep, str | bytes) or not hasattr(keep, "__iter__"):
        raise IdentifiableError(
            f"keep= takes (layer, head) pairs, e.g. keep=[(3, 5)], got {keep!r}"[:160],
            cli=f"--keep takes LAYER:HEAD pairs, e.g. --keep 3:5,3:6, got {keep!r}"[:160],
        )
    pairs = []
    for item in keep:
        try:
            layer, head = (int(v) for v in item)
        except (TypeError, ValueError):
            raise IdentifiableError(
                f"keep= takes (layer, head) pairs, e.g. keep=[(3, 5)]; got {item!r}"[:160],
                cli=f"--keep takes LAYER:HEAD pairs, e.g. --keep 3:5; got {item!r}"[:160],
            ) from None
        if layer not in layers or head not in heads:
            what = f"layer {layer}" if layer not in layers else f"head {head}"
            raise IdentifiableError(
                f"keep= names ({layer}, {head}), but {what} is not scanned (layers "
                f"{_span(layers)}, heads {_span(heads)}); keep only heads inside layers= "
                "and heads=",
                cli=f"--keep names {layer}:{head}, but {what} is not scanned (layers "
                f"{_span(layers)}, heads {_span(heads)}); keep only heads inside --layers "
                "and --heads",
            )
        pairs.append((layer, head))
    return frozenset(pairs)


def _span(values: Sequence[int]) -> str:
    v = list(values)
    return f"{v[0]}..{v[-1]}" if v == list(range(v[0], v[-1] + 1)) else ", ".join(map(str, v))
