"""The `Trace`: plain tensors captured from one forward pass of one sequence.

Everything downstream (attention, tokens, attribution) reads only these tensors,
never the Hugging Face model. Shapes use:
L layers, H query heads, n real tokens (no padding), d model width, d_v head width.

Notation follows docs/definitions.md#notation: for layer l and head h,
    head output = A (E W_V + 1 b_Vᵀ) H,    T = E W_V H  (bias-free),
with `values[l, h]` = E W_V (n×d_v) and `out_proj[l, h]` = H (d_v×d).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.models.arguments import check_fields
from identifiable.results import Result
from identifiable.utils.checks import expect, shown
from identifiable.utils.precision import float32_matmul_precision, float32_matmuls_exact

# the tensor fields every Trace has (key_mask and key_input_ids may be None)
_TENSORS = (
    "input_ids",
    "attentions",
    "values",
    "value_bias",
    "out_proj",
    "out_bias",
    "hidden_states",
    "attn_outputs",
    "kv_head_of",
)


@dataclass
class Trace(
    Result,
    dims={
        "attentions": ("layer", "head", "query", "key"),
        "values": ("layer", "head", "key", "value_dim"),
        "value_bias": ("layer", "head", "value_dim"),
        "out_proj": ("layer", "head", "value_dim", "model_dim"),
        "out_bias": ("layer", "model_dim"),
        "hidden_states": ("state", "token", "model_dim"),
        "attn_outputs": ("layer", "token", "model_dim"),
        "key_mask": ("layer", "query", "key"),
        "input_ids": ("token",),
        "key_input_ids": ("key",),
        "kv_head_of": ("head",),
    },
    plot={"fields": ("attentions",), "layer": 0, "head": 0},
    summary=("architecture",),
):
    """Captured pieces of one sequence.

    Attributes:
        tokens: the n token strings, as the tokenizer spells them.
        input_ids: `[n]` int64.
        attentions: `[L, H, n, n]` attention probabilities A (rows sum to 1;
            masked (causal) entries exactly 0).
        values: `[L, H, n, d_v]` E·W_V per query head, without the value bias.
            Under grouped-query attention heads sharing a key/value head hold
            the same rows (see `kv_head_of`).
        value_bias: `[L, H, d_v]` b_V per query head (zeros if the model has none).
        out_proj: `[L, H, d_v, d]` the head's slice H of W_O (rows h·d_v … (h+1)·d_v).
        out_bias: `[L, d]` b_O (zeros if the model has none).
        hidden_states: `[L+1, n, d]`; index 0 is e^0, the input of layer 1,
            index l the output of layer l.
        attn_outputs: `[L, n, d]` the attention block's own output captured from
            the model (after W_O and b_O, before dropout/residual). Used by `verify`.
        is_causal: decoder-style attention (row i sees keys ≤ i).
        kv_head_of: `[H]` index of the key/value head each query head reads.
        special_tokens: role → token string for this model, e.g.
            {"cls": "[CLS]", "sep": "[SEP]"} or {"bos": "<|endoftext|>"}.
        model_name: where the model came from (hub id, path or "minilm").
        architecture: the spec name used to trace it (e.g. "bert", "gpt2", "llama").
        dequantized_from: "GGUF Q4_1" where the model's weights were dequantized from a
            quantized file (`ModelInfo.dequantized_from`), else "".
        truncated: number of tokens dropped because the text was too long.
        key_mask: `[L, n, n]` bool, the keys each query row of each layer may
            attend to, derived from the spec and the config (all keys, keys ≤ i,
            sliding/local windows); the attention is exactly 0 outside it. None
            (traces built by hand) means all keys, or keys ≤ i when `is_causal`;
            read it through `keys_seen(layer)`.
        capture_dtype: the dtype the model computed in ("float32", "bfloat16",
            …); the tensors above are float32 whatever it is. Sets `tolerance`.
        key_tokens: None for self-attention (the keys are `tokens`). For a
            cross-attention trace of an encoder–decoder model, the n_k encoder
            tokens that the n decoder rows attend to: `attentions` is then
            `[L, H, n, n_k]`, `values` `[L, H, n_k, d_v]` (E_enc·W_V) and
            `key_mask` `[L, n, n_k]` (docs/definitions.md#cross-attention).
        key_input_ids: `[n_k]` int64, the encoder's ids (cross-attention only).
        layers: the model's layer of each trace layer, where the trace holds some of
            them (`Model.trace(layers=...)`, `iter_layers`); None: all, from 0.
        heads: the model's query head of each trace head, where the trace holds some
            of them (`heads=`); None: all. Analyses number heads as the trace does
            (0..len(heads)−1); `attn_outputs` is then those heads' share of the block
            output (see `TraceBuilder`), which `verify()` reproduces.
    """

    tokens: list[str]
    input_ids: torch.Tensor
    attentions: torch.Tensor
    values: torch.Tensor
    value_bias: torch.Tensor
    out_proj: torch.Tensor
    out_bias: torch.Tensor
    hidden_states: torch.Tensor
    attn_outputs: torch.Tensor
    is_causal: bool
    kv_head_of: torch.Tensor
    special_tokens: dict[str, str] = field(default_factory=dict)
    model_name: str = ""
    architecture: str = ""
    truncated: int = 0
    key_mask: torch.Tensor | None = None
    capture_dtype: str = "float32"
    key_tokens: list[str] | None = None
    key_input_ids: torch.Tensor | None = None
    layers: list[int] | None = None
    heads: list[int] | None = None
    dequantized_from: str = ""

    def __post_init__(self) -> None:
        check_fields(self, _TENSORS, ("key_mask", "key_input_ids"))

    @classmethod
    def from_tensors(
        cls,
        attentions: torch.Tensor,
        values: torch.Tensor,
        out_proj: torch.Tensor,
        *,
        causal: bool | None = None,
        key_mask: torch.Tensor | None = None,
        tokens: list[str] | None = None,
    ) -> Trace:
        """A trace of bare tensors from any model, for every trace-level analysis.

        Shapes (the leading L and H may be left out together, or L alone):
            attentions: `[L, H, n, n_k]` attention probabilities A (rows sum to 1);
            values: `[L, H, n_k, d_v]` E·W_V per head (without the value bias);
            out_proj: `[L, H, d_v, d]` each head's rows H of W_O;
            key_mask: `[L, n, n_k]` or `[n, n_k]` bool, the keys each row may see.
        n_k = n is self-attention; n_k ≠ n (or `tokens` of the rows given with
        n_k ≠ n) is a cross-attention trace (rows: queries, keys: the values' rows).
        `causal=None` reads causality off A: a square map whose entries above the
        diagonal are all exactly 0 (what a causal mask leaves) is causal.
        Biases are zero and there is no captured output, so `verify()` does not
        apply: these tensors are taken as they are.
        """

        a = _lead(attentions, 4, "attentions [L, H, n, n_k]")
        v = _lead(values, 4, "values [L, H, n_k, d_v]")
        w = _lead(out_proj, 4, "out_proj [L, H, d_v, d]")
        n_l, n_h, n, n_k = a.shape
        if tuple(v.shape[:3]) != (n_l, n_h, n_k) or tuple(w.shape[:3]) != (n_l, n_h, v.shape[-1]):
            raise IdentifiableError(
                f"shapes do not fit: attentions {tuple(a.shape)} [L, H, n, n_k], values "
                f"{tuple(v.shape)} [L, H, n_k, d_v], out_proj {tuple(w.shape)} [L, H, d_v, d]"
            )
        cross = n != n_k
        if causal is None:
            causal = not cross and n > 1 and not bool(a.triu(1).any())
        if causal and cross:
            raise IdentifiableError("causal=True needs square attention maps (n_k = n)")
        mask = None
        if key_mask is not None:
            mask = torch.as_tensor(key_mask, dtype=torch.bool).cpu()
            mask = mask.expand(n_l, n, n_k) if mask.dim() == 2 else mask
            if tuple(mask.shape) != (n_l, n, n_k):
                raise IdentifiableError(
                    f"key_mask has shape {tuple(mask.shape)}, expected [n, n_k] or [L, n, n_k] "
                    f"= {[n_l, n, n_k]}"
                )
            if bool(a.masked_fill(mask[:, None], 0).any()):
                raise IdentifiableError("attentions put weight on keys outside key_mask")
        d, d_v = int(w.shape[-1]), int(v.shape[-1])
        return cls(
            tokens=list(tokens) if tokens is not None else [f"<{i}>" for i in range(n)],
            input_ids=torch.arange(n),
            attentions=a,
            values=v,
            value_bias=torch.zeros(n_l, n_h, d_v, dtype=v.dtype),
            out_proj=w,
            out_bias=torch.zeros(n_l, d, dtype=w.dtype),
            hidden_states=torch.zeros(n_l + 1, 0, d),  # not captured: only d is known
            attn_outputs=torch.zeros(n_l, 0, d),
            is_causal=bool(causal),
            kv_head_of=torch.arange(n_h),
            architecture="tensors",
            key_mask=mask,
            key_tokens=[f"<{j}>" for j in range(n_k)] if cross else None,
            key_input_ids=torch.arange(n_k) if cross else None,
        )

    # ---- sizes -------------------------------------------------------------
    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_keys(self) -> int:
        """Keys per row: n for self-attention, the encoder length for cross-attention."""
        return int(self.values.shape[-2])

    @property
    def is_cross(self) -> bool:
        """A cross-attention trace (rows are decoder tokens, keys encoder tokens)."""
        return self.key_tokens is not None

    @property
    def n_layers(self) -> int:
        return int(self.attentions.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.attentions.shape[1])

    @property
    def head_dim(self) -> int:
        return int(self.values.shape[-1])

    @property
    def hidden_size(self) -> int:
        return int(self.hidden_states.shape[-1])

    def __len__(self) -> int:
        return self.n_tokens

    @property
    def device(self) -> torch.device:
        """Where the trace's tensors are, and where the analyses of it run."""
        return self.attentions.device

    def to(self, device: torch.device | str) -> Trace:
        """A copy of the trace on `device` ("cuda", "mps", "cpu"); the analyses of a trace
        run on its device (float64 rank decisions of an MPS trace on the CPU)."""
        from dataclasses import fields, replace

        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)

    # ---- derived quantities -----------------------------------------------
    def reconstruct_attention_output(self, layer: int) -> torch.Tensor:
        """Σ_h A_h (E W_V^h + 1 b_V^hᵀ) H_h + b_O for one layer, `[n, d]`, in float64."""
        self.check_layer(layer)
        a = self.attentions[layer].double()
        v = self.values[layer].double() + self.value_bias[layer].double()[:, None, :]
        heads = torch.einsum("hij,hjv,hvd->id", a, v, self.out_proj[layer].double())
        return heads + self.out_bias[layer].double()

    def reconstruction_errors(self) -> torch.Tensor:
        """Relative Frobenius error of the reconstructed attention output per layer, `[L]`."""
        errs = []
        for layer in range(self.n_layers):
            rec = self.reconstruct_attention_output(layer)
            ref = self.attn_outputs[layer].double()
            errs.append(torch.linalg.norm(rec - ref) / torch.linalg.norm(ref).clamp_min(1e-30))
        return torch.stack(errs)

    def keys_seen(self, layer: int) -> torch.Tensor:
        """`[n, n_k]` bool: row i of `layer` may attend to key j (see `key_mask`)."""
        self.check_layer(layer)
        if self.key_mask is not None:
            return self.key_mask[layer]
        full = torch.ones(self.n_tokens, self.n_keys, dtype=torch.bool, device=self.device)
        return full.tril() if self.is_causal and not self.is_cross else full

    def sees_all_keys(self, layer: int) -> bool:
        """Whether every row of `layer` may attend to every key: `keys_seen(layer).all()`,
        without forming the `[n, n_k]` mask when the trace has none."""
        self.check_layer(layer)
        if self.key_mask is not None:
            return bool(self.key_mask[layer].all())
        return not (self.is_causal and not self.is_cross) or self.n_tokens <= 1

    @property
    def tolerance(self) -> float:
        """`verify()`'s default relative tolerance for this trace's capture dtype.

        Rule: max(1e-4, eps · √d / 2), eps the machine epsilon of `capture_dtype`
        and d the model width. A half-precision model rounds V, the head
        outputs and W_O's output to eps/2 each; summing d rounded products lets
        these grow like √d in the worst case the rule allows. float32 keeps the
        fixed 1e-4 (its eps · √d / 2 is below 1e-5 for any d < 10⁴); bfloat16 at
        d = 384 gets 7.7e-2, float16 9.6e-3. A wrong spec gives errors of order 1.
        """
        eps = _eps(self.capture_dtype)
        return max(1e-4, eps * self.hidden_size**0.5 / 2)

    def verify(self, rtol: float | None = None) -> torch.Tensor:
        """Prove the capture reproduces the model: raise if any layer's relative error > rtol.

        `rtol` defaults to `tolerance` (which follows the capture dtype). When a
        half-precision trace fails within 10× its tolerance the error names
        rounding, not the spec, as the likely cause. So does a float32 trace that
        fails by less than 0.1 while float32 matmuls run at reduced precision
        (`precision.float32_matmul_precision()`, read when verify runs): "medium"
        makes a CPU with bfloat16 support multiply in bfloat16, ~3e-3 relative on
        MiniLM, where a wrong spec errs by order 1.
        Returns the per-layer relative errors `[L]`.
        """
        tol = self.tolerance if rtol is None else float(rtol)
        if self.attn_outputs.shape[1] != self.n_tokens:
            raise IdentifiableError(
                "this trace holds no captured attention output (built from tensors), so "
                "verify() has nothing to compare with"
            )
        errs = self.reconstruction_errors()
        bad = [(i, float(e)) for i, e in enumerate(errs) if not (e <= tol)]
        if bad:
            shown = ", ".join(f"layer {i}: {e:.2e}" for i, e in bad)
            worst = max(e for _, e in bad)
            half = self.capture_dtype != "float32" and _eps(self.capture_dtype) > 1e-6
            if half and worst <= 10 * max(tol, self.tolerance):
                raise IdentifiableError(
                    f"trace does not reproduce the model's attention output within {tol:g} "
                    f"({shown}): the model computes in {self.capture_dtype}, whose rounding "
                    f"(eps {_eps(self.capture_dtype):.1e}) is the likely cause, not the spec; "
                    "trace in float32 (dtype=torch.float32) to confirm, or use the dtype's "
                    "default tolerance (verify() without rtol)."
                )
            if not half and not float32_matmuls_exact() and worst <= 0.1:
                # The advice comes first: discovery quotes a failure up to its first ';'.
                raise IdentifiableError(
                    f"float32 matmuls run at reduced precision "
                    f"('{float32_matmul_precision()}'): call "
                    "torch.set_float32_matmul_precision('highest') and trace again; that "
                    f"setting, not the spec, is the likely cause that the trace misses the "
                    f"model's attention output by {worst:.1e} (tolerance {tol:g}; {shown}), "
                    "or pass a larger rtol to verify()."
                )
            raise IdentifiableError(
                f"trace does not reproduce the model's attention output ({shown}; "
                f"tolerance {tol:g}). The architecture spec for '{self.architecture}' "
                "probably reads E or W_V/W_O from the wrong place; see docs/families.md, 'Adding an architecture'."
            )
        return errs

    def check_layer(self, layer: int) -> None:
        _check_integer("layer", layer)
        if not 0 <= layer < self.n_layers:
            raise IdentifiableError(
                f"layer {layer} is out of range: valid layers are 0..{self.n_layers - 1}"
            )

    def check_head(self, head: int) -> None:
        _check_integer("head", head)
        if not 0 <= head < self.n_heads:
            raise IdentifiableError(
                f"head {head} is out of range: valid heads are 0..{self.n_heads - 1}"
            )

    def check_row(self, row: int) -> None:
        _check_integer("row", row)
        if not 0 <= row < self.n_tokens:
            raise IdentifiableError(
                f"row {row} is out of range: valid rows are 0..{self.n_tokens - 1}"
            )


def _check_integer(name: str, value: object) -> None:
    """An index must be an integer (numpy and torch integer scalars too), never a bool or float."""
    try:
        if isinstance(value, bool):
            raise TypeError
        operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise IdentifiableError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None


def _lead(x: Any, rank: int, what: str) -> torch.Tensor:
    """`x` as a CPU tensor of `rank` dimensions (missing leading ones added), or one line."""
    try:
        x = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError):
        raise IdentifiableError(f"{what} takes a tensor, got {shown(x)}") from None
    if not x.is_floating_point():
        raise IdentifiableError(f"{what} takes floating-point numbers, got {x.dtype}")
    while x.dim() < rank:
        x = x.unsqueeze(0)
    if x.dim() != rank:
        raise IdentifiableError(
            f"{what} has {x.dim()} dimensions; expected {rank} (or fewer, without "
            "the leading layer and head dimensions)"
        )
    return x.detach().cpu()


def _eps(dtype_name: str) -> float:
    """Machine epsilon of a dtype named like "bfloat16" (float32's for unknown names)."""
    dtype = getattr(torch, dtype_name, None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return float(torch.finfo(dtype).eps)
    return float(torch.finfo(torch.float32).eps)


@dataclass
class Seq2SeqTrace:
    """The three captures of one (source, target) pair of an encoder–decoder model.

    Attributes:
        encoder: self-attention over the n_s source tokens (`[L_enc, H, n_s, n_s]`).
        decoder: causal self-attention over the n_t decoder tokens (`[L_dec, H, n_t, n_t]`).
        cross: cross-attention, `attentions` `[L_dec, H, n_t, n_s]`, `values`
            `[L_dec, H, n_s, d_v]` = E_enc·W_V, `key_tokens` the source tokens.
    """

    encoder: Trace
    decoder: Trace
    cross: Trace

    def __post_init__(self) -> None:
        for part in ("encoder", "decoder", "cross"):
            expect(getattr(self, part), Trace, part, "a Trace")

    def verify(self, rtol: float | None = None) -> dict[str, torch.Tensor]:
        """Prove all three captures (see `Trace.verify`); the per-layer errors of each."""
        out = {}
        for part in ("encoder", "decoder", "cross"):
            try:
                out[part] = getattr(self, part).verify(rtol)
            except IdentifiableError as exc:
                raise IdentifiableError(f"{part} attention: {exc}") from None
        return out
