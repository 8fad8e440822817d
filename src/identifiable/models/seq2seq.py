"""Encoder–decoder models (T5, mT5, BART, mBART, Marian): three traces per sequence pair.

One forward pass of a (source, target) pair gives three kinds of attention, each
captured as its own `Trace` so that every analysis written for encoder-only and
decoder-only models applies unchanged:

- `encoder`: the encoder's self-attention over the n_s source tokens (all keys);
- `decoder`: the decoder's causal self-attention over the n_t decoder tokens;
- `cross`: the decoder's cross-attention. Row i is decoder token i, the keys are
  the encoder's n_s output vectors E_enc, so A is `[n_t, n_s]` and
  T = E_enc·W_V·H is `[n_s, d]`: rank, null space and effective attention live
  over the encoder length (docs/definitions.md#cross-attention).

`verify()` proves each of the three captures. The encoder alone is also a plain
`Model` (`Seq2SeqModel.encoder`), which is where Hidden Token Attribution runs:
a decoder hidden state depends on two input sequences, for which the paper's
attribution (one input sequence) is not defined.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.hooks import HookSet, first_tensor, get_submodule, hidden_input
from identifiable.models.model import (
    _HALF,
    Encoding,
    Model,
    ModelInfo,
    ModelInput,
    _as_id_vector,
    _bias,
    _check_key_mask,
    _ensure_eager,
    _is_int,
    _key_masks,
    _resolve_tokenizer,
    _weight_in_out,
    value_columns,
)
from identifiable.models.specs import ArchSpec
from identifiable.models.trace import Trace


@dataclass(frozen=True)
class Seq2SeqSpec:
    """Where the three attention kinds live in one encoder–decoder family.

    Attributes:
        name: short family name.
        model_types: `config.model_type` values covered.
        encoder: spec of the encoder's self-attention, paths relative to the encoder stack.
        decoder: spec of the decoder's causal self-attention, relative to the decoder stack.
        cross: spec of the decoder's cross-attention (its value projection's input is E_enc).
        encoder_stack, decoder_stack: paths of the two stacks in the base model.
        decoder_heads_attr: config attribute with the decoder's number of heads.
    """

    name: str
    model_types: tuple[str, ...]
    encoder: ArchSpec
    decoder: ArchSpec
    cross: ArchSpec
    encoder_stack: str = "encoder"
    decoder_stack: str = "decoder"
    decoder_heads_attr: str = "num_attention_heads"


def _t5(part: str, value: str, out: str, causal: bool) -> ArchSpec:
    return ArchSpec(
        name=f"t5-{part}",
        model_types=("t5", "mt5"),
        layers="block",
        value=value,
        out_proj=out,
        causal=causal,
        norm="pre",
    )


def _bart(part: str, attn: str, causal: bool) -> ArchSpec:
    return ArchSpec(
        name=f"bart-{part}",
        model_types=("bart", "mbart", "marian"),
        layers="layers",
        value=f"{attn}.v_proj",
        out_proj=f"{attn}.out_proj",
        causal=causal,
    )


SEQ2SEQ_SPECS: tuple[Seq2SeqSpec, ...] = (
    Seq2SeqSpec(
        name="t5",
        model_types=("t5", "mt5"),
        encoder=_t5("encoder", "layer.0.SelfAttention.v", "layer.0.SelfAttention.o", False),
        decoder=_t5("decoder", "layer.0.SelfAttention.v", "layer.0.SelfAttention.o", True),
        cross=_t5("cross", "layer.1.EncDecAttention.v", "layer.1.EncDecAttention.o", False),
    ),
    Seq2SeqSpec(
        name="bart",
        model_types=("bart", "mbart", "marian"),
        encoder=_bart("encoder", "self_attn", False),
        decoder=_bart("decoder", "self_attn", True),
        cross=_bart("cross", "encoder_attn", False),
        decoder_heads_attr="decoder_attention_heads",
    ),
)


def find_seq2seq_spec(model_type: str) -> Seq2SeqSpec | None:
    for spec in SEQ2SEQ_SPECS:
        if model_type in spec.model_types:
            return spec
    return None


@dataclass
class Seq2SeqTrace:
    """The three captures of one (source, target) pair.

    Attributes:
        encoder: self-attention over the n_s source tokens (`[L_enc, H, n_s, n_s]`).
        decoder: causal self-attention over the n_t decoder tokens (`[L_dec, H, n_t, n_t]`).
        cross: cross-attention, `attentions` `[L_dec, H, n_t, n_s]`, `values`
            `[L_dec, H, n_s, d_v]` = E_enc·W_V, `key_tokens` the source tokens.
    """

    encoder: Trace
    decoder: Trace
    cross: Trace

    def verify(self, rtol: float | None = None) -> dict[str, torch.Tensor]:
        """Prove all three captures (see `Trace.verify`); the per-layer errors of each."""
        out = {}
        for part in ("encoder", "decoder", "cross"):
            try:
                out[part] = getattr(self, part).verify(rtol)
            except IdentifiableError as exc:
                raise IdentifiableError(f"{part} attention: {exc}") from None
        return out


class _Attention:
    """One attention kind (e.g. the decoder's cross-attention) across the layers of a stack."""

    def __init__(
        self, layers: list[nn.Module], spec: ArchSpec, n_heads: int, head_dim: int, hidden: int
    ) -> None:
        self.spec = spec
        self.value_modules = [get_submodule(layer, spec.value) for layer in layers]
        self.out_modules = [get_submodule(layer, spec.out_proj) for layer in layers]
        width = _weight_in_out(self.value_modules[0], spec.weight_layout).shape[1]
        n_kv, cols = value_columns(spec, width, n_heads, head_dim)
        if n_kv < 1 or n_heads % n_kv:
            raise IdentifiableError(
                f"{spec.name}: the value projection has width {width}, which does not split "
                f"into heads of width {head_dim} for {n_heads} heads; the spec does not fit."
            )
        self.n_heads, self.n_kv, self.head_dim = n_heads, n_kv, head_dim
        self.kv_head_of = torch.arange(n_heads) // (n_heads // n_kv)
        w_v, b_v, w_o, b_o = [], [], [], []
        for v_mod, o_mod in zip(self.value_modules, self.out_modules, strict=True):
            wv = _weight_in_out(v_mod, spec.weight_layout)
            bv = _bias(v_mod, wv.shape[1], wv)
            wo = _weight_in_out(o_mod, spec.weight_layout)
            if tuple(wv[:, cols].shape) != (hidden, n_kv * head_dim) or tuple(wo.shape) != (
                n_heads * head_dim,
                hidden,
            ):
                raise IdentifiableError(
                    f"{spec.name}: W_V has shape {tuple(wv[:, cols].shape)} and W_O "
                    f"{tuple(wo.shape)}, expected {(hidden, n_kv * head_dim)} and "
                    f"{(n_heads * head_dim, hidden)}; the spec does not fit this model."
                )
            w_v.append(wv[:, cols].detach())
            b_v.append(bv[cols].detach())
            w_o.append(wo.detach())
            b_o.append(_bias(o_mod, wo.shape[1], wo).detach())
        self.w_v = w_v
        self.b_v = torch.stack([self._per_query_head(b) for b in b_v])  # [L, H, d_v]
        self.w_o = torch.stack([w.reshape(n_heads, head_dim, -1) for w in w_o])  # [L, H, d_v, d]
        self.b_o = torch.stack(b_o)  # [L, d]

    def _per_query_head(self, kv_rows: torch.Tensor) -> torch.Tensor:
        split = kv_rows.reshape(*kv_rows.shape[:-1], self.n_kv, self.head_dim)
        return split[..., self.kv_head_of.to(split.device), :]

    def values(self, layer: int, e: torch.Tensor) -> torch.Tensor:
        """`[H, N, d_v]` E·W_V (bias-free) from the value module's input `[1, N, d]`."""
        work = torch.float32 if e.dtype in _HALF else e.dtype
        v = e[0].to(work) @ self.w_v[layer].to(work)
        return self._per_query_head(v).permute(1, 0, 2)

    def hook(self, hooks: HookSet, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        for mod in self.value_modules:
            hooks.pre(mod, lambda m, a: inputs.append(a[0]))
        for mod in self.out_modules:
            hooks.post(mod, lambda m, a, o: outputs.append(first_tensor(o)))


class Seq2SeqModel:
    """A traced view of an encoder–decoder model (T5, mT5, BART, mBART, Marian).

    Build with `Model.from_hf(model, tokenizer)` or `identifiable.load_model`, which
    return this class for encoder–decoder models. `trace(source, target)` returns a
    `Seq2SeqTrace`; `encoder` is the encoder stack as a plain `Model` (trace,
    effective attention, Hidden Token Attribution of the source).
    """

    def __init__(
        self,
        hf_model: nn.Module,
        tokenizer: Any = None,
        *,
        name: str = "",
        spec: Seq2SeqSpec | None = None,
    ) -> None:
        config = hf_model.config
        spec = spec or find_seq2seq_spec(config.model_type)
        if spec is None:
            known = sorted(t for s in SEQ2SEQ_SPECS for t in s.model_types)
            raise IdentifiableError(
                f"encoder–decoder architecture '{config.model_type}' is not supported; "
                f"supported: {', '.join(known)}. Describe it with a Seq2SeqSpec "
                "(identifiable.models.seq2seq) and pass spec=..."
            )
        self.task_model = hf_model
        _ensure_eager(hf_model)
        hf_model.eval()
        base = getattr(hf_model, "base_model", None)
        base = base if isinstance(base, nn.Module) else hf_model
        self.hf_model = base
        self.spec = spec
        self.tokenizer = _resolve_tokenizer(hf_model, tokenizer)
        name = name or str(getattr(config, "_name_or_path", ""))
        enc_stack = get_submodule(base, spec.encoder_stack)
        dec_stack = get_submodule(base, spec.decoder_stack)
        # The encoder stack alone is an encoder-only model: trace and HTA reuse `Model`.
        self.encoder = Model(enc_stack, self.tokenizer, name=name, spec=spec.encoder)
        enc_info = self.encoder.info
        dec_layers = list(get_submodule(dec_stack, spec.decoder.layers))
        dec_heads = int(getattr(config, spec.decoder_heads_attr, None) or enc_info.n_heads)
        head_dim = int(getattr(config, "head_dim", None) or enc_info.hidden_size // dec_heads)
        d = enc_info.hidden_size
        self._enc = _Attention(
            self.encoder.layers, spec.encoder, enc_info.n_heads, enc_info.head_dim, d
        )
        self._dec = _Attention(dec_layers, spec.decoder, dec_heads, head_dim, d)
        self._cross = _Attention(dec_layers, spec.cross, dec_heads, head_dim, d)
        self.decoder_layers = dec_layers
        self.info = enc_info
        self.decoder_info = ModelInfo(
            name=name,
            architecture=spec.name,
            model_type=config.model_type,
            n_layers=len(dec_layers),
            n_heads=dec_heads,
            n_kv_heads=self._dec.n_kv,
            head_dim=head_dim,
            hidden_size=d,
            max_positions=enc_info.max_positions,
            is_causal=True,
        )
        start = getattr(config, "decoder_start_token_id", None)
        if start is None:  # T5 starts decoding from the pad token
            start = getattr(config, "pad_token_id", None)
        self.decoder_start_token_id = int(start or 0)

    @classmethod
    def from_hf(
        cls,
        hf_model: nn.Module,
        tokenizer: Any = None,
        *,
        name: str = "",
        spec: Seq2SeqSpec | None = None,
    ) -> Seq2SeqModel:
        return cls(hf_model, tokenizer, name=name, spec=spec)

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    def decoder_inputs(self, target: ModelInput | None, source: Encoding) -> Encoding:
        """The decoder's input: the target's ids shifted right behind the start token.

        This is what the decoder reads in training with `labels=target`. Without a
        target the source ids are used (the decoder reconstructs the source).
        """
        if target is None:
            labels = source.input_ids
        elif isinstance(target, str | tuple):
            labels = self.encoder.encode(target).input_ids
        elif isinstance(target, torch.Tensor) or (
            isinstance(target, list) and target and all(_is_int(x) for x in target)
        ):
            labels = _as_id_vector(target, "target")
        else:
            raise IdentifiableError(
                f"target must be a text or token ids (list[int] or a 1-D tensor), got "
                f"{type(target).__name__}"
            )
        if labels.numel() == 0:
            raise IdentifiableError("the target is empty: give at least one token")
        ids = torch.cat([torch.tensor([self.decoder_start_token_id]), labels[:-1]])
        return Encoding(ids, self.encoder._token_strings(ids), 0)

    def trace(
        self, source: ModelInput, target: ModelInput | None = None, *, truncate: bool = True
    ) -> Seq2SeqTrace:
        """Encoder, decoder and cross-attention traces of one (source, target) pair.

        `source` is anything `Model.trace` takes (text, token ids, BatchEncoding);
        `target` is a text or token ids, fed to the decoder shifted right (see
        `decoder_inputs`); None feeds the source.
        """
        src = self.encoder._encode_any(source, truncate)
        dec = self.decoder_inputs(target, src)
        return self._capture(src, dec)

    def trace_many(
        self, pairs: Iterable[ModelInput | tuple[ModelInput, ModelInput]]
    ) -> Iterator[Seq2SeqTrace]:
        """`trace` of each item: a source, or `(source, target)` given as a list [s, t]."""
        for item in pairs:
            if isinstance(item, list) and len(item) == 2:
                yield self.trace(item[0], item[1])
            else:
                yield self.trace(item)

    def _capture(self, src: Encoding, dec: Encoding) -> Seq2SeqTrace:
        enc_in: list[torch.Tensor] = []
        enc_out: list[torch.Tensor] = []
        dec_in: list[torch.Tensor] = []
        dec_out: list[torch.Tensor] = []
        cross_in: list[torch.Tensor] = []
        cross_out: list[torch.Tensor] = []
        enc_layers: list[torch.Tensor] = []
        dec_layers: list[torch.Tensor] = []
        embedded: dict[str, torch.Tensor] = {}
        dev = self.device
        with HookSet() as hooks, torch.no_grad():
            for key, first in (("enc", self.encoder.layers[0]), ("dec", self.decoder_layers[0])):

                def keep(m: nn.Module, a: Any, k: Any, key: str = key) -> None:
                    embedded.setdefault(key, hidden_input(a, k))

                hooks.pre(first, keep, with_kwargs=True)
            self._enc.hook(hooks, enc_in, enc_out)
            self._dec.hook(hooks, dec_in, dec_out)
            self._cross.hook(hooks, cross_in, cross_out)
            for layer in self.encoder.layers:
                hooks.post(layer, lambda m, a, o: enc_layers.append(first_tensor(o)))
            for layer in self.decoder_layers:
                hooks.post(layer, lambda m, a, o: dec_layers.append(first_tensor(o)))
            ids = src.input_ids[None].to(dev)
            dids = dec.input_ids[None].to(dev)
            out = self.hf_model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                decoder_input_ids=dids,
                decoder_attention_mask=torch.ones_like(dids),
                output_attentions=True,
                use_cache=False,
            )
        maps = {
            "encoder": out.encoder_attentions,
            "decoder": out.decoder_attentions,
            "cross": out.cross_attentions,
        }
        if any(v is None or any(a is None for a in v) for v in maps.values()):
            raise IdentifiableError(
                "the model returned no attention probabilities; load it with "
                "attn_implementation='eager' (identifiable.load_model does this for you)."
            )
        n_enc, n_dec = len(self.encoder.layers), len(self.decoder_layers)
        counts = {
            "encoder": (n_enc, len(enc_in), len(enc_out), len(enc_layers), len(maps["encoder"])),
            "decoder": (n_dec, len(dec_in), len(dec_out), len(dec_layers), len(maps["decoder"])),
            "cross": (n_dec, len(cross_in), len(cross_out), n_dec, len(maps["cross"])),
        }
        for part, c in counts.items():
            if len(set(c)) != 1:
                raise IdentifiableError(
                    f"{part} attention: {c[0]} layers, but the value projection ran {c[1]} "
                    f"times, the output projection {c[2]}, and the model returned {c[4]} "
                    f"maps; the spec '{self.spec.name}' does not match this model."
                )
        dtype = str(enc_in[0].dtype).removeprefix("torch.")
        enc_hidden = torch.stack([embedded["enc"][0], *(h[0] for h in enc_layers)])
        dec_hidden = torch.stack([embedded["dec"][0], *(h[0] for h in dec_layers)])
        common = {
            "special_tokens": dict(self.encoder.special_tokens),
            "model_name": self.encoder.info.name,
            "architecture": self.spec.name,
            "capture_dtype": dtype,
        }

        def build(part, att, inputs, outputs, hidden, rows, keys) -> Trace:
            a = torch.stack([m[0] for m in maps[part]])  # [L, H, n_rows, n_keys]
            causal = part == "decoder"
            n_r, n_k = len(rows), len(keys)
            mask = _key_masks(n_r, causal, [None] * a.shape[0]) if part != "cross" else None
            if mask is None:
                mask = torch.ones(a.shape[0], n_r, n_k, dtype=torch.bool)
            _check_key_mask(a.cpu(), mask, self.spec.name)
            cross = part == "cross"
            values = torch.stack([att.values(i, e) for i, e in enumerate(inputs)])
            if values.shape[-2] != n_k:
                raise IdentifiableError(
                    f"{part} attention: the value projection read {values.shape[-2]} vectors "
                    f"but the attention has {n_k} keys; the spec '{self.spec.name}' reads E "
                    "from the wrong module."
                )
            return Trace(
                tokens=list(rows.tokens),
                input_ids=rows.input_ids.clone(),
                attentions=a.float().cpu().contiguous(),
                values=values.float().cpu(),
                value_bias=att.b_v.float().cpu(),
                out_proj=att.w_o.float().cpu(),
                out_bias=att.b_o.float().cpu(),
                hidden_states=hidden.float().cpu().contiguous(),
                attn_outputs=torch.stack([o[0] for o in outputs]).float().cpu(),
                is_causal=causal,
                kv_head_of=att.kv_head_of.clone(),
                truncated=src.n_dropped if part == "encoder" else 0,
                key_mask=mask,
                key_tokens=list(keys.tokens) if cross else None,
                key_input_ids=keys.input_ids.clone() if cross else None,
                **common,
            )

        return Seq2SeqTrace(
            encoder=build("encoder", self._enc, enc_in, enc_out, enc_hidden, src, src),
            decoder=build("decoder", self._dec, dec_in, dec_out, dec_hidden, dec, dec),
            cross=build("cross", self._cross, cross_in, cross_out, dec_hidden, dec, src),
        )
