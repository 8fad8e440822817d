"""Automatic discovery of an `ArchSpec` for families that are not in the table.

By introspection of the base model: the layer list is the `ModuleList` with
`config.num_hidden_layers` entries; inside the first layer, the value
projection is a linear module whose input width is d and whose output holds
H_kv·d_v columns (a separate V projection, preferred when its name says
value) or (H + 2·H_kv)·d_v columns (fused QKV, tried in both fused layouts);
the output projection is a linear module from H·d_v to d, preferably a sibling
of the value projection. Causal masking is read off the probe's attention.

A candidate is accepted only when `Trace.verify()` proves it on a probe input
(token ids, so no tokenizer is needed); candidates are tried in order of how
well their names match, and the first one proved wins.

The residual block's normalisation layout (`NormLayout`, which the norm-based
context-mixing methods need) is then found the same way: every pair of the layer's
normalisation modules, in each wiring, is checked on the same probe
(`prove_norm_layout`), and the first that the captures prove wins. A family whose
wiring no layout describes (sandwich norms) keeps its verified attention spec, and the
norm-based methods refuse it in one line that says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.arguments import check_hf_model
from identifiable.models.blocks import norm_params
from identifiable.models.capture import TraceMeta, trace_batch
from identifiable.models.compat import layer_attr, refuse_varying_layers
from identifiable.models.encoding import InputEncoder, input_encoder, pair
from identifiable.models.hooks import HookSet, first_tensor
from identifiable.models.keyselect import NOT_PER_ROW, find_selector
from identifiable.models.latent import MLA
from identifiable.models.specs import ArchSpec, NormLayout, NormRule
from identifiable.models.stack import AttentionStack, Captured, Tap, distinct, stack_of
from identifiable.models.unsupported import refuse
from identifiable.models.valuenorm import find_value_norm

_VALUE_NAMES = ("v_proj", "value", "v", "v_lin", "value_proj", "wv", "v_linear")
_FUSED_NAMES = ("qkv_proj", "query_key_value", "wqkv", "c_attn", "qkv", "in_proj", "qkv_linear")
_OUT_NAMES = ("o_proj", "out_proj", "dense", "o", "out_lin", "wo", "c_proj", "out", "proj")
_MLP_WIDTHS = ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim", "d_inner")
PROBE_LENGTH = 24


@dataclass(frozen=True)
class Discovery:
    """What discovery found.

    Attributes:
        spec: the accepted spec (`source="discovered"`), with its proved norm layout
            (`spec.norms`) or, if none was proved, a `NormRule` that says why.
        errors: `[L]` the probe trace's per-layer relative reconstruction errors.
        tolerance: the tolerance they were verified against.
        tried: one line per candidate, "value → out (layout): outcome".
        norms: one line: the proved norm layout, or why none was.
    """

    spec: ArchSpec
    errors: torch.Tensor
    tolerance: float
    tried: list[str] = field(default_factory=list)
    norms: str = ""


def linears(layer: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Linear-like modules of a layer: name → (module, weight layout)."""
    found: dict[str, tuple[nn.Module, str]] = {}
    for name, mod in layer.named_modules():
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or not name:
            continue
        if isinstance(mod, nn.Linear):
            found[name] = (mod, "linear")
        elif type(mod).__name__ == "Conv1D":  # GPT-2 style, weight [in, out]
            found[name] = (mod, "conv1d")
    return found


def _in_out(mod: nn.Module, layout: str) -> tuple[int, int]:
    out_f, in_f = torch.as_tensor(mod.weight).shape
    return (out_f, in_f) if layout == "conv1d" else (in_f, out_f)


def _layer_list(base: nn.Module) -> tuple[str, nn.ModuleList] | None:
    n_layers = int(getattr(base.config, "num_hidden_layers", 0) or 0)
    lists = [
        (name, mod)
        for name, mod in base.named_modules()
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and name
    ]
    exact = [(n, m) for n, m in lists if len(m) == n_layers]
    pool = exact or lists
    return min(pool, key=lambda nm: nm[0].count(".")) if pool else None


def _candidates(base: nn.Module, layers_path: str, layer: nn.Module, index: int) -> list[ArchSpec]:
    config: Any = base.config
    d = int(config.hidden_size)
    n_heads = int(config.num_attention_heads)
    d_v = int(layer_attr(config, "head_dim", index) or d // n_heads)
    mods = linears(layer)

    def last(name: str) -> str:
        return name.rsplit(".", 1)[-1].lower()

    def parent(name: str) -> str:
        return name.rsplit(".", 1)[0] if "." in name else ""

    values: list[tuple[int, str, str, str | None]] = []  # (rank, name, layout, fused)
    outs: list[tuple[str, str]] = []
    for name, (mod, layout) in mods.items():
        d_in, d_out = _in_out(mod, layout)
        if d_in == d and d_out % d_v == 0:
            if last(name) in _VALUE_NAMES and n_heads % (d_out // d_v) == 0:
                values.append((0, name, layout, None))
            if last(name) in _FUSED_NAMES or (d_out // d_v - n_heads) % 2 == 0:
                rank = 1 if last(name) in _FUSED_NAMES else 3
                if d_out // d_v > n_heads:
                    values.append((rank, name, layout, "qkv_blocks"))
                    values.append((rank, name, layout, "per_kv_group"))
            elif n_heads % max(1, d_out // d_v) == 0 and last(name) not in _VALUE_NAMES:
                values.append((4, name, layout, None))  # unnamed V-shaped projection
        if d_in == n_heads * d_v and d_out == d:
            outs.append((name, layout))
    mlp_width = next((a for a in _MLP_WIDTHS if getattr(config, a, None)), _MLP_WIDTHS[0])
    specs = _latent_candidates(config, layers_path, mods, mlp_width)
    for _, v_name, v_layout, fused in sorted(values, key=lambda t: t[0]):
        ranked = sorted(
            (o for o in outs if o[1] == v_layout),
            key=lambda o: (last(o[0]) not in _OUT_NAMES, parent(o[0]) != parent(v_name)),
        )
        for o_name, _ in ranked:
            if o_name == v_name or last(o_name) in _VALUE_NAMES + _FUSED_NAMES:
                continue
            specs.append(
                ArchSpec(
                    name=str(config.model_type),
                    model_types=(str(config.model_type),),
                    layers=layers_path,
                    value=v_name,
                    out_proj=o_name,
                    weight_layout=v_layout,  # type: ignore[arg-type]
                    fused=fused,  # type: ignore[arg-type]
                    source="discovered",
                    mlp_width=mlp_width,
                )
            )
    return specs


def _latent_candidates(
    config: Any, layers_path: str, mods: dict[str, tuple[nn.Module, str]], mlp_width: str
) -> list[ArchSpec]:
    """Multi-head latent attention (config names `MLA`'s widths): the latent expansion
    r → H·(d_k + d_v) as the value module and H·d_v → d as the output projection."""
    try:
        r, d_k, d_v = (
            int(getattr(config, a)) for a in (MLA.latent_attr, MLA.key_attr, MLA.value_attr)
        )
    except (AttributeError, TypeError, ValueError):
        return []
    d, n_heads = int(config.hidden_size), int(config.num_attention_heads)
    shapes = {name: _in_out(mod, layout) for name, (mod, layout) in mods.items()}
    values = [n for n, io in shapes.items() if io == (r, n_heads * (d_k + d_v))]
    outs = [n for n, io in shapes.items() if io == (n_heads * d_v, d)]
    return [
        ArchSpec(
            name=str(config.model_type),
            model_types=(str(config.model_type),),
            layers=layers_path,
            value=v,
            out_proj=o,
            source="discovered",
            mlp_width=mlp_width,
            latent=MLA,
        )
        for v in values
        for o in outs
    ]


def layer_candidates(base: nn.Module, layers_path: str, layers: nn.ModuleList) -> list[ArchSpec]:
    """The candidates of every distinct layer structure, in layer order, each once: layers
    may differ in their MLP (dense, mixture of experts) or their token mixer (hybrids)."""
    seen: set[tuple[str, ...]] = set()
    found: dict[tuple[str, str, str | None, bool], ArchSpec] = {}
    for index, layer in enumerate(layers):
        shape = tuple(sorted(linears(layer)))
        if shape in seen:
            continue
        seen.add(shape)
        for spec in _candidates(base, layers_path, layer, index):
            found.setdefault((spec.value, spec.out_proj, spec.fused, spec.latent is None), spec)
    # sparse attention: an indexer beside the attention module picks each row's keys
    specs = [_with_selector(s, layers) for s in found.values()]
    specs = [replace(s, value_norm=find_value_norm(list(layers), s)) for s in specs]
    # by how well the names match, then one every layer holds before one some layers hold
    return sorted(
        specs,
        key=lambda s: (_rank(s), not all(s.value in linears(x) for x in layers)),
    )


def _with_selector(spec: ArchSpec, layers: nn.ModuleList) -> ArchSpec:
    attention = spec.value.rsplit(".", 1)[0] if "." in spec.value else ""
    path = find_selector(list(layers), attention)
    return spec if path is None else replace(spec, key_selector=path)


def _rank(spec: ArchSpec) -> int:
    name = spec.value.rsplit(".", 1)[-1].lower()
    if spec.latent is not None:
        return 0
    if spec.fused is None and name in _VALUE_NAMES:
        return 1
    return 2 if name in _FUSED_NAMES else 3


def probe_ids(base: nn.Module) -> torch.Tensor:
    """`[PROBE_LENGTH]` random token ids without padding or BOS tokens, fixed seed."""
    vocab = int(getattr(base.config, "vocab_size", 0) or 1000)
    specials = {
        int(t)
        for t in (getattr(base.config, k, None) for k in ("pad_token_id", "bos_token_id"))
        if isinstance(t, int)
    }
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (PROBE_LENGTH,), generator=g)
    for s in specials:  # no padding tokens inside the probe
        ids[ids == s] = (s + 7) % vocab
    return ids


_probe_ids = probe_ids  # the name `identifiable.cli` imports


def discover_spec(base: nn.Module, tokenizer: Any = None) -> Discovery:
    """Find and prove a spec for `base` (a Hugging Face base model), or raise one line."""
    check_hf_model(base, tokenizer)
    refuse(base)  # audio, layout and chunked or sparse attention: one line by name
    model_type = str(getattr(base.config, "model_type", None) or type(base).__name__)
    how = (
        "write an ArchSpec (docs/families.md, 'Adding an architecture') and pass it as "
        "Model.from_hf(model, spec=...)"
    )
    config = base.config
    refuse_varying_layers(config, model_type)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    towers = sorted(
        (n for n, m in base.named_children() if hasattr(m, "config")),
        key=lambda n: "text" not in n and "language" not in n,  # a text tower first
    )
    if not heads and getattr(config, "sub_configs", None) and towers:
        raise IdentifiableError(
            f"architecture '{model_type}' is a composite of towers ({', '.join(towers)}) "
            "without a language model that runs on token ids alone: not supported as a "
            f"whole; pass one tower, for example Model.from_hf(model.{towers[0]})"
        )
    if not heads or not getattr(config, "hidden_size", None):
        # state-space and recurrent models (Mamba, RWKV) have no attention to identify
        raise IdentifiableError(
            f"architecture '{model_type}' has no attention heads (its config gives no "
            "num_attention_heads): identifiable analyses self-attention, so attention-free "
            "models (state-space, recurrent) are not supported; use a Transformer"
        )
    found = _layer_list(base)
    if found is None:
        raise IdentifiableError(
            f"architecture '{model_type}' is not in the table and discovery found no list of "
            f"layers (nn.ModuleList) in {type(base).__name__}; {how}"
        )
    layers_path, layer_list = found
    candidates = layer_candidates(base, layers_path, layer_list)
    if not candidates:
        raise IdentifiableError(
            f"architecture '{model_type}' is not in the table and discovery found no value and "
            f"output projections (linear d→H_kv·d_v and H·d_v→d) in any layer of "
            f"'{layers_path}' (no softmax attention it can prove); {how}"
        )
    ids = probe_ids(base)
    tried: list[str] = []
    for spec in candidates:
        label = f"{spec.value} → {spec.out_proj}" + (f" ({spec.fused})" if spec.fused else "")
        # Decoder first: an encoder's attention beyond the diagonal fails the
        # causal key mask; a decoder would pass as an encoder, so that order is wrong.
        for causal in (True, False):
            cand = replace(spec, causal=causal)
            try:
                stack = stack_of(base, cand)
                inputs = input_encoder(base, stack.spec, tokenizer)
                enc = inputs.encode_ids(ids)
                trace = trace_batch(base, stack, inputs, [enc], TraceMeta("", cand.name))[0]
                errors = trace.verify()
            except IdentifiableError as exc:
                if NOT_PER_ROW in str(exc):  # the model's selection, whatever the candidate
                    raise IdentifiableError(f"architecture '{model_type}': {exc}") from None
                if causal and "outside the mask" in str(exc):
                    continue  # attends beyond the diagonal: try it as an encoder
                named = spec.out_proj.rsplit(".", 1)[-1].lower() in _OUT_NAMES
                if _rank(cand) <= 1 and named and "does not reproduce" in str(exc):
                    _refuse_if_gated(base, stack, inputs, enc, cand, model_type)
                tried.append(f"{label}: {str(exc).split(';')[0][:120]}")
                break
            except Exception as exc:  # a forward pass that breaks under this spec
                reason = (str(exc).strip().splitlines() or [""])[0][:80]
                tried.append(f"{label}: {type(exc).__name__} {reason}".rstrip())
                break
            cand, note = _with_norms(cand, base, stack, inputs, trace.tolerance)
            return Discovery(cand, errors, trace.tolerance, [*tried, f"{label}: verified"], note)
    shown = "; ".join(tried[:4]) + (f"; … {len(tried) - 4} more" if len(tried) > 4 else "")
    raise IdentifiableError(
        f"architecture '{model_type}' is not in the table and no discovered spec reproduced "
        f"the model on a probe (tried {len(tried)} in '{layers_path}': {shown}); {how}"
    )


def _refuse_if_gated(
    base: nn.Module,
    stack: AttentionStack,
    inputs: InputEncoder,
    enc: Any,
    spec: ArchSpec,
    model_type: str,
) -> None:
    """Raise one line when a well-named value → output pair fails because the output
    projection does not read A·(E W_V): a trace of head 0 alone reconstructs from the output
    projection's own input, so it fails only when the heads' outputs are changed after the
    attention (Qwen3-Next's query-dependent output gate)."""
    try:
        one = trace_batch(base, stack, inputs, [enc], TraceMeta("", spec.name), heads=[0])[0]
        one.verify(rtol=0.05)  # far beyond rounding: reduced precision stays inside it
    except IdentifiableError as exc:
        if "does not reproduce" not in str(exc):
            return
        where = f"layer {stack.model_index[0]}'s {spec.value.rsplit('.', 1)[0]}"
        raise IdentifiableError(
            f"architecture '{model_type}': {where} is softmax attention, but its output "
            f"projection '{spec.out_proj}' does not read A·(E W_V): each head's output is "
            "changed after the attention (a query-dependent output gate, as in gated "
            "attention), which the decomposition identifiable analyses does not describe; "
            "this family is not supported"
        ) from None
    except Exception:  # a forward pass that breaks: the candidate's own failure stands
        return


def _with_norms(
    spec: ArchSpec, base: nn.Module, stack: AttentionStack, inputs: InputEncoder, tol: float
) -> tuple[ArchSpec, str]:
    """`spec` with the norm layout discovery proves, or a rule saying why there is none."""
    probe = probe_norms(base, stack, inputs, probe_ids(base), candidates=None)
    layout, tried = discover_norms(probe, tol)
    if layout is not None:
        note = f"{layout.first} → {layout.second} ({layout.kind}): verified"
        return replace(spec, norms=layout), note
    why = (
        "has no normalisation layout that discovery could prove on a probe "
        f"({'; '.join(tried[:2]) or 'no normalisation modules found'})"
    )
    rule = NormRule("model_type", spec.model_types[0], reason=why)
    return replace(spec, norm_rules=(rule,)), why


def discover_norms(probe: NormProbe, tol: float) -> tuple[NormLayout | None, list[str]]:
    """The first layout the probe proves, trying post, pre, then parallel wirings (two
    distinct norms before one norm feeding both branches); and why the others failed."""
    names = list(probe.norms)
    tried: list[str] = []
    for kind in ("post", "pre", "parallel"):
        pairs = [(a, b) for a in names for b in names if a != b]
        if kind == "parallel":
            pairs += [(a, a) for a in names]
        for first, second in pairs:
            layout = NormLayout(first, second, kind)  # type: ignore[arg-type]
            reason = probe.disproves(layout, tol)
            if reason is None:
                return replace(layout, unit_offset=probe.unit_offset(first)), tried
            tried.append(f"{first} → {second} ({kind}): {reason}")
    return None, tried


def prove_norm_layout(
    base: nn.Module, stack: AttentionStack, inputs: InputEncoder, layout: NormLayout, tol: float
) -> str | None:
    """Why `layout` does not describe the model's blocks on a probe, or None when it does."""
    names = {layout.first, layout.second}
    probe = probe_norms(base, stack, inputs, probe_ids(base), candidates=names)
    reason = probe.disproves(layout, tol)
    if reason is None and probe.unit_offset(layout.first) != layout.unit_offset:
        return f"unit_offset={layout.unit_offset} does not reproduce the norms' outputs"
    return reason


# ---- the norm probe ------------------------------------------------------------


@dataclass(frozen=True)
class _NormCapture:
    ins: torch.Tensor  # [L, n, d] float64, the module's input in every layer
    outs: torch.Tensor  # [L, n, d] its output
    offset: bool | None  # the scaling (weight or 1 + weight) that reproduces it; None: neither


@dataclass(frozen=True)
class NormProbe:
    """One probe sequence through the model, every layer `[L, n, d]` float64: the layer
    input x, the attention block output a, E, the layer output, each candidate norm's
    input and output, and the inputs of the layer's other modules outside the attention."""

    x: torch.Tensor
    a: torch.Tensor
    e: torch.Tensor
    out: torch.Tensor
    norms: dict[str, _NormCapture]
    reads: list[torch.Tensor]  # inputs of the layer's modules outside the attention and norms

    def unit_offset(self, name: str) -> bool:
        return bool(self.norms[name].offset)

    def disproves(self, layout: NormLayout, tol: float) -> str | None:
        """Why the captures contradict `layout`, or None when every check holds:
        the norms are their parameters applied to their inputs; post: N1 reads x + a,
        N2's output is the layer's; pre: N1 reads x, its output is E, N2 reads x + a;
        parallel: N1 reads x, its output is E, N2 reads x; and a module outside
        the attention reads the norm that feeds the MLP (post: N1, else N2)."""
        f, s = self.norms.get(layout.first), self.norms.get(layout.second)
        if f is None or s is None:
            return "not a normalisation module in every layer"
        if f.offset is None or s.offset is None:
            return "a norm's output is not its parameters applied to its input"
        if f.offset != s.offset:
            return "the two norms scale differently"
        if layout.kind == "post":
            checks = [
                ("N1 reads x + Attn", f.ins, self.x + self.a),
                ("N2 ends the layer", s.outs, self.out),
            ]
        else:
            second_in = self.x + self.a if layout.kind == "pre" else self.x
            # latent attention: E is the latent projected from N1's output, not N1's output
            same = self.e.shape == f.outs.shape
            checks = [
                ("N1 reads x", f.ins, self.x),
                *([("N1's output is E", f.outs, self.e)] if same else []),
                (f"N2 reads {'x + Attn' if layout.kind == 'pre' else 'x'}", s.ins, second_in),
            ]
        for what, got, want in checks:
            if (err := _rel(got, want)) > tol:
                return f"not {what} (relative error {err:.1e})"
        feeds = f.outs if layout.kind == "post" else s.outs
        if not any(_rel(r, feeds) <= tol for r in self.reads):
            return (
                f"no module outside the attention reads {'N1' if layout.kind == 'post' else 'N2'}"
            )
        return None


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    return float(((got - want).norm(dim=(-2, -1)) / want.norm(dim=(-2, -1)).clamp_min(1e-30)).max())


def _norm_like(module: nn.Module, d: int) -> bool:
    if isinstance(module, nn.LayerNorm):
        return True
    w = getattr(module, "weight", None)
    has_eps = hasattr(module, "eps") or hasattr(module, "variance_epsilon")
    return (
        "norm" in type(module).__name__.lower()
        and isinstance(w, torch.Tensor)
        and w.shape == (d,)
        and has_eps
    )


def _norm_names(stack: AttentionStack) -> list[str]:
    """Names (inside a layer) of the modules that are a norm in some layer and a norm or an
    `nn.Identity` in every layer (ModernBERT's first layer has no attention norm)."""
    layers = distinct(stack.layers)
    found: list[str] = []
    for layer in layers:
        for name, mod in layer.named_modules():
            if name and name not in found and _norm_like(mod, stack.hidden_size):
                found.append(name)

    def everywhere(name: str) -> bool:
        mods = [dict(layer.named_modules()).get(name) for layer in layers]
        return all(
            m is not None and (_norm_like(m, stack.hidden_size) or isinstance(m, nn.Identity))
            for m in mods
        )

    return [n for n in found if everywhere(n)]


def probe_norms(
    base: nn.Module,
    stack: AttentionStack,
    inputs: InputEncoder,
    ids: torch.Tensor,
    candidates: set[str] | None,
) -> NormProbe:
    """Run the probe once and capture what `NormProbe.disproves` checks, for the
    `candidates` norms (None: every normalisation module of the layers). `ids` are the
    probe's token ids (image models: a fixed random image of the model's size instead)."""
    names = _norm_names(stack) if candidates is None else sorted(candidates)
    attention = stack.spec.value.rsplit(".", 1)[0] if "." in stack.spec.value else ""
    everywhere = set.intersection(*({n for n, _ in x.named_modules()} for x in stack.layers))
    readers = [
        n
        for n, _ in stack.layers[0].named_modules()
        if n in everywhere
        and n not in names
        and n != attention
        and not n.startswith(f"{attention}.")
    ]
    taps: dict[str, list[torch.Tensor]] = {}

    def keep(key: str, x: Any) -> None:
        x = x[0] if isinstance(x, tuple) and x else x
        if not isinstance(x, torch.Tensor):
            return
        x = stack.spec.axes.first_sequence(x)  # one sequence: element 0
        taps.setdefault(key, []).append(x.detach().double().cpu())

    def sink(tap: Tap, layer: int, x: Captured) -> None:
        assert isinstance(x, torch.Tensor)  # no "maps" tap
        keep(tap, x[0])

    with HookSet() as hooks, torch.no_grad():
        stack.tap(hooks, sink, ("input", "e", "block", "output"))
        for name in names:
            for mod in distinct([layer.get_submodule(name) for layer in stack.layers]):
                hooks.pre(mod, lambda m, a, name=name: keep(f"in:{name}", a))
                hooks.post(mod, lambda m, a, o, name=name: keep(f"out:{name}", first_tensor(o)))
        for name in readers:
            for mod in distinct([layer.get_submodule(name) for layer in stack.layers]):
                hooks.pre(mod, lambda m, a, name=name: keep(f"read:{name}", a))
        base(**inputs.batch([_probe_input(inputs, ids)], base))
    return _assemble_probe(stack, names, readers, taps)


def _probe_input(inputs: InputEncoder, ids: torch.Tensor) -> Any:
    if inputs.spec.modality != "image":
        return inputs.encode_ids(ids)
    config: Any = inputs.config
    size = (int(getattr(config, "num_channels", 3)), *pair(config.image_size))
    return inputs.encode_image(torch.randn(size, generator=torch.Generator().manual_seed(0)))


def _assemble_probe(
    stack: AttentionStack,
    names: list[str],
    readers: list[str],
    taps: dict[str, list[torch.Tensor]],
) -> NormProbe:
    n_layers = stack.n_layers

    def stacked(key: str) -> torch.Tensor | None:
        got = taps.get(key, [])
        if len(got) != n_layers or len({t.shape for t in got}) != 1:
            return None  # not run once per layer (an expert of a mixture, say)
        return torch.stack(got)

    x, a, e, out = (stacked(k) for k in ("input", "block", "e", "output"))
    if x is None or a is None or e is None or out is None:
        raise IdentifiableError("the probe did not run every layer once; no norm layout is proved")
    norms = {}
    for name in names:
        ins, outs = stacked(f"in:{name}"), stacked(f"out:{name}")
        if ins is not None and outs is not None:
            mods = [layer.get_submodule(name) for layer in stack.layers]
            norms[name] = _NormCapture(ins, outs, _offset(mods, ins, outs))
    reads = [r for n in readers if (r := stacked(f"read:{n}")) is not None]
    return NormProbe(x, a, e, out, norms, reads)


def _offset(mods: list[nn.Module], ins: torch.Tensor, outs: torch.Tensor) -> bool | None:
    """False when each module is its weights applied to its input, True when it scales by
    1 + weight (Gemma), None when neither reproduces it (or it is not a norm)."""
    for offset in (False, True):
        try:
            params = [norm_params(m, offset) for m in mods]
        except IdentifiableError:
            return None
        if all(p is None or _rel(p(ins[i]), outs[i]) <= 1e-4 for i, p in enumerate(params)):
            return offset
    return None
