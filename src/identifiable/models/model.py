"""`Model`: a Hugging Face model plus its spec, able to trace sequences into plain tensors."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.hooks import (
    HookSet,
    first_tensor,
    get_submodule,
    hidden_input,
    replace_hidden_input,
)
from identifiable.models.specs import ArchSpec, spec_for
from identifiable.models.trace import Trace

TextOrPair = str | tuple[str, str]


class TruncationWarning(UserWarning):
    """A text was longer than the model's maximum positions and was cut."""


@dataclass(frozen=True)
class ModelInfo:
    name: str
    architecture: str
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    max_positions: int
    is_causal: bool
    intermediate_size: int = 0  # MLP width, for memory estimates


@dataclass(frozen=True)
class Encoding:
    """A tokenised text. Unpacks as `input_ids, tokens, n_dropped`."""

    input_ids: torch.Tensor  # [n] int64
    tokens: list[str]
    n_dropped: int
    token_type_ids: torch.Tensor | None = None  # [n], for models with segment embeddings

    def __iter__(self) -> Iterator[Any]:
        return iter((self.input_ids, self.tokens, self.n_dropped))

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class _HeadWeights:
    """One layer's W_V, b_V, W_O, b_O in the orientation of SPEC.md (x @ W)."""

    w_v: torch.Tensor  # [d, H_kv·d_v]
    b_v: torch.Tensor  # [H_kv·d_v]
    w_o: torch.Tensor  # [H·d_v, d]
    b_o: torch.Tensor  # [d]


class _StopForward(Exception):
    pass


def _weight_in_out(module: nn.Module, layout: str) -> torch.Tensor:
    w = module.weight
    return w if layout == "conv1d" else w.T


def _bias(module: nn.Module, size: int, like: torch.Tensor) -> torch.Tensor:
    b = getattr(module, "bias", None)
    return b if b is not None else torch.zeros(size, dtype=like.dtype, device=like.device)


class Model:
    """A traced view of a Hugging Face model. Build with `identifiable.load_model` or `Model.from_hf`."""

    def __init__(self, hf_model: nn.Module, tokenizer: Any, *, name: str = "") -> None:
        config = hf_model.config
        self.spec: ArchSpec = spec_for(config.model_type)
        _ensure_eager(hf_model)
        self.hf_model = hf_model.eval()
        self.tokenizer = tokenizer
        self.layers = list(get_submodule(hf_model, self.spec.layers))
        n_heads = int(config.num_attention_heads)
        n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
        hidden = int(config.hidden_size)
        head_dim = int(getattr(config, "head_dim", None) or hidden // n_heads)
        self.info = ModelInfo(
            name=name or str(getattr(config, "_name_or_path", "")),
            architecture=self.spec.name,
            model_type=config.model_type,
            n_layers=len(self.layers),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            hidden_size=hidden,
            max_positions=_max_positions(config, tokenizer, self.spec),
            is_causal=self.spec.causal,
            intermediate_size=int(
                getattr(config, "intermediate_size", None)
                or getattr(config, "n_inner", None)
                or getattr(config, "hidden_dim", None)  # DistilBERT
                or 4 * hidden
            ),
        )
        self.kv_head_of = torch.arange(n_heads) // (n_heads // n_kv)
        self._value_modules = [get_submodule(layer, self.spec.value) for layer in self.layers]
        self._out_modules = [get_submodule(layer, self.spec.out_proj) for layer in self.layers]
        self._weights = [self._head_weights(i) for i in range(len(self.layers))]
        # Segment ids only for models with more than one segment embedding (RoBERTa has one).
        self._accepts_token_types = (
            "token_type_ids" in inspect.signature(hf_model.forward).parameters
            and int(getattr(config, "type_vocab_size", 0) or 0) > 1
        )
        self.special_tokens = {
            role: tok
            for role in ("cls", "sep", "bos", "eos")
            if (tok := getattr(tokenizer, f"{role}_token", None))
        }

    @classmethod
    def from_hf(cls, hf_model: nn.Module, tokenizer: Any, *, name: str = "") -> Model:
        """Wrap a model you loaded yourself (switched to eager attention if needed)."""
        return cls(hf_model, tokenizer, name=name)

    # ---- weights -------------------------------------------------------------
    def _head_weights(self, layer: int) -> _HeadWeights:
        info, spec = self.info, self.spec
        v_mod, o_mod = self._value_modules[layer], self._out_modules[layer]
        w_v = _weight_in_out(v_mod, spec.weight_layout)
        b_v = _bias(v_mod, w_v.shape[1], w_v)
        if spec.fused_qkv is not None:
            chunks, index = spec.fused_qkv
            width = w_v.shape[1] // chunks
            w_v = w_v[:, index * width : (index + 1) * width]
            b_v = b_v[index * width : (index + 1) * width]
        w_o = _weight_in_out(o_mod, spec.weight_layout)
        b_o = _bias(o_mod, w_o.shape[1], w_o)
        expected_v = (info.hidden_size, info.n_kv_heads * info.head_dim)
        expected_o = (info.n_heads * info.head_dim, info.hidden_size)
        if tuple(w_v.shape) != expected_v or tuple(w_o.shape) != expected_o:
            raise IdentifiableError(
                f"layer {layer}: W_V has shape {tuple(w_v.shape)} (expected {expected_v}) and W_O "
                f"{tuple(w_o.shape)} (expected {expected_o}); the output projection of this model "
                "is not separable per head as the spec assumes."
            )
        return _HeadWeights(*(t.detach() for t in (w_v, b_v, w_o, b_o)))

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def fingerprint(self) -> str:
        """Stable id of config + weights, for keying caches."""
        h = hashlib.sha256(self.hf_model.config.to_json_string().encode())
        params = list(self.hf_model.parameters())
        with torch.no_grad():
            for p in params[:: max(1, len(params) // 16)]:  # ~16 tensors sampled
                h.update(p.detach().float().cpu().flatten()[:4096].numpy().tobytes())
        return h.hexdigest()[:16]

    # ---- encoding ------------------------------------------------------------
    def encode(self, text: TextOrPair, *, truncate: bool = True) -> Encoding:
        """Tokenise a text or a pair `(a, b)` in the model's own format."""
        parts = _check_text(text)
        max_len = self.info.max_positions
        full = self.tokenizer(*parts, add_special_tokens=True, verbose=False)
        n_full = len(full["input_ids"])
        enc = full
        if n_full > max_len:
            if not truncate:
                raise IdentifiableError(
                    f"text has {n_full} tokens but the model takes at most {max_len}; "
                    "shorten it or allow truncation (drop --no-truncate)."
                )
            enc = self.tokenizer(
                *parts, add_special_tokens=True, truncation=True, max_length=max_len
            )
            warnings.warn(
                f"text has {n_full} tokens; dropped {n_full - len(enc['input_ids'])} to fit the "
                f"model's maximum of {max_len}",
                TruncationWarning,
                stacklevel=2,
            )
        ids = torch.tensor(enc["input_ids"], dtype=torch.long)
        tti = enc.get("token_type_ids")
        return Encoding(
            input_ids=ids,
            tokens=self.tokenizer.convert_ids_to_tokens(enc["input_ids"]),
            n_dropped=n_full - len(ids),
            token_type_ids=torch.tensor(tti, dtype=torch.long) if tti is not None else None,
        )

    # ---- tracing -------------------------------------------------------------
    def trace(self, text: TextOrPair, *, truncate: bool = True) -> Trace:
        """One forward pass of one sequence, captured as a `Trace` (no padding)."""
        return self._trace_batch([self.encode(text, truncate=truncate)])[0]

    def trace_many(
        self,
        texts: Iterable[TextOrPair],
        *,
        batch_size: int = 8,
        truncate: bool = True,
        progress: bool = False,
    ) -> Iterator[Trace]:
        """Stream Traces in input order, batching with padding internally.

        Each result equals `trace(text)` up to float rounding (tested). Within a
        window of a few batches texts are sorted by length, so padding stays small.
        """
        if batch_size < 1:
            raise IdentifiableError(f"batch_size must be ≥ 1, got {batch_size}")
        window = batch_size * 4
        bar = _progress(texts, progress)
        buf: list[Encoding] = []
        for text in bar:
            buf.append(self.encode(text, truncate=truncate))
            if len(buf) == window:
                yield from self._trace_window(buf, batch_size)
                buf = []
        if buf:
            yield from self._trace_window(buf, batch_size)

    def _trace_window(self, encs: Sequence[Encoding], batch_size: int) -> Iterator[Trace]:
        order = sorted(range(len(encs)), key=lambda i: len(encs[i]))
        out: dict[int, Trace] = {}
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            for i, tr in zip(idx, self._trace_batch([encs[i] for i in idx]), strict=True):
                out[i] = tr
        for i in range(len(encs)):
            yield out.pop(i)

    def _batch_inputs(self, encs: Sequence[Encoding]) -> dict[str, torch.Tensor]:
        n_max = max(len(e) for e in encs)
        pad = self.tokenizer.pad_token_id
        pad = 0 if pad is None else int(pad)
        ids = torch.full((len(encs), n_max), pad, dtype=torch.long)
        mask = torch.zeros((len(encs), n_max), dtype=torch.long)
        tti = torch.zeros((len(encs), n_max), dtype=torch.long)
        for b, e in enumerate(encs):
            ids[b, : len(e)] = e.input_ids
            mask[b, : len(e)] = 1
            if e.token_type_ids is not None:
                tti[b, : len(e)] = e.token_type_ids
        inputs = {"input_ids": ids, "attention_mask": mask}
        if self._accepts_token_types:
            inputs["token_type_ids"] = tti
        return {k: v.to(self.device) for k, v in inputs.items()}

    def _trace_batch(self, encs: Sequence[Encoding]) -> list[Trace]:
        n_layers = self.info.n_layers
        inputs_e: list[torch.Tensor | None] = [None] * n_layers
        attn_out: list[torch.Tensor | None] = [None] * n_layers
        layer_out: list[torch.Tensor | None] = [None] * n_layers
        embedded: list[torch.Tensor] = []

        def keep(store: list[Any], i: int, what: str) -> Any:
            def hook(module: nn.Module, args: Any, output: Any = None) -> None:
                store[i] = args[0] if what == "input" else first_tensor(output)

            return hook

        with HookSet() as hooks, torch.no_grad():
            hooks.pre(
                self.layers[0],
                lambda m, a, k: embedded.append(hidden_input(a, k)),
                with_kwargs=True,
            )
            for i in range(n_layers):
                hooks.pre(self._value_modules[i], keep(inputs_e, i, "input"))
                hooks.post(self._out_modules[i], keep(attn_out, i, "output"))
                hooks.post(self.layers[i], keep(layer_out, i, "output"))
            out = self.hf_model(**self._batch_inputs(encs), output_attentions=True)
        attentions = getattr(out, "attentions", None)
        if attentions is None or any(a is None for a in attentions):
            raise IdentifiableError(
                "the model returned no attention probabilities; load it with "
                "attn_implementation='eager' (identifiable.load_model does this for you)."
            )
        values = [self._values(i, inputs_e[i]) for i in range(n_layers)]  # [B, H, N, d_v]
        att = torch.stack(list(attentions), 1)  # [B, L, H, N, N]
        hidden = torch.stack([embedded[0], *layer_out], 1)  # [B, L+1, N, d]
        blocks = torch.stack(attn_out, 1)  # [B, L, N, d]
        vals = torch.stack(values, 1)  # [B, L, H, N, d_v]
        b_v = torch.stack([self._per_query_head(w.b_v) for w in self._weights])  # [L, H, d_v]
        w_o = torch.stack(
            [w.w_o.reshape(self.info.n_heads, self.info.head_dim, -1) for w in self._weights]
        )
        b_o = torch.stack([w.b_o for w in self._weights])
        traces = []
        for b, e in enumerate(encs):
            n = len(e)
            traces.append(
                Trace(
                    tokens=list(e.tokens),
                    input_ids=e.input_ids.clone(),
                    attentions=att[b, :, :, :n, :n].float().cpu().contiguous(),
                    values=vals[b, :, :, :n].float().cpu().contiguous(),
                    value_bias=b_v.float().cpu(),
                    out_proj=w_o.float().cpu(),
                    out_bias=b_o.float().cpu(),
                    hidden_states=hidden[b, :, :n].float().cpu().contiguous(),
                    attn_outputs=blocks[b, :, :n].float().cpu().contiguous(),
                    is_causal=self.spec.causal,
                    kv_head_of=self.kv_head_of.clone(),
                    special_tokens=dict(self.special_tokens),
                    model_name=self.info.name,
                    architecture=self.spec.name,
                    truncated=e.n_dropped,
                )
            )
        return traces

    def _per_query_head(self, kv_rows: torch.Tensor) -> torch.Tensor:
        """[..., H_kv·d_v] → [..., H, d_v], repeating each key/value head for its query heads."""
        split = kv_rows.reshape(*kv_rows.shape[:-1], self.info.n_kv_heads, self.info.head_dim)
        return split[..., self.kv_head_of.to(split.device), :]

    def _values(self, layer: int, e: torch.Tensor | None) -> torch.Tensor:
        if e is None:
            raise IdentifiableError(f"layer {layer}: the value projection never ran; spec mismatch")
        v = e @ self._weights[layer].w_v  # [B, N, H_kv·d_v], bias-free by definition of T
        return self._per_query_head(v).permute(0, 2, 1, 3)  # [B, H, N, d_v]

    def vocabulary_embeddings(self) -> torch.Tensor:
        """`[V, d_emb]` the word-embedding matrix (no position or segment part), float32 on the CPU."""
        return self.hf_model.get_input_embeddings().weight.detach().float().cpu()

    # ---- functional view for attribution --------------------------------------
    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """e^0 `[n, d]`: the embedding layer's output, i.e. the input of layer 1."""
        captured: list[torch.Tensor] = []

        def stop(module: nn.Module, args: Any, kwargs: Any) -> None:
            captured.append(hidden_input(args, kwargs))
            raise _StopForward

        enc = Encoding(input_ids, [], 0, token_type_ids)
        with HookSet() as hooks, torch.no_grad():
            hooks.pre(self.layers[0], stop, with_kwargs=True)
            with contextlib.suppress(_StopForward):
                self.hf_model(**self._batch_inputs([enc]))
        return captured[0][0].detach()

    def layer_outputs(self, e0: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states of every layer as a differentiable function of e^0.

        Args:
            e0: `[n, d]` or `[B, n, d]`, fed to layer 1 in place of the embeddings.
            input_ids: `[n]`; only sets the sequence length and positions (RoPE, masks).
        Returns:
            `[L+1, n, d]` (or `[B, L+1, n, d]`); index 0 is e0 itself.
        Works under `torch.func.jvp`/`vmap` and autograd.
        """
        batched = e0.dim() == 3
        x = e0 if batched else e0.unsqueeze(0)
        ids = input_ids.to(self.device).reshape(1, -1).expand(x.shape[0], -1)
        outs: list[torch.Tensor] = []
        with HookSet() as hooks:
            hooks.pre(self.layers[0], replace_hidden_input(x), with_kwargs=True)
            for layer in self.layers:
                hooks.post(layer, lambda m, a, o: outs.append(first_tensor(o)))
            self.hf_model(input_ids=ids, attention_mask=torch.ones_like(ids))
        result = torch.stack([x, *outs], dim=1)
        return result if batched else result[0]


def _check_text(text: TextOrPair) -> tuple[str, ...]:
    parts = (text,) if isinstance(text, str) else tuple(text)
    if not parts or len(parts) > 2 or not all(isinstance(p, str) for p in parts):
        raise IdentifiableError("give a text (str) or a text pair (str, str)")
    for p in parts:
        if not p.strip():
            raise IdentifiableError("text is empty: give at least one non-whitespace character")
    return parts


def _max_positions(config: Any, tokenizer: Any, spec: ArchSpec) -> int:
    positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None
    )
    limit = int(positions) - spec.position_offset if positions else 10**9
    tok_max = getattr(tokenizer, "model_max_length", None)
    if tok_max and tok_max < 10**6:
        limit = min(limit, int(tok_max))
    return limit


def _ensure_eager(hf_model: nn.Module) -> None:
    impl = getattr(hf_model.config, "_attn_implementation", "eager")
    if impl == "eager":
        return
    try:
        hf_model.set_attn_implementation("eager")
    except Exception as exc:
        raise IdentifiableError(
            f"the model uses '{impl}' attention, which returns no attention probabilities, and "
            f"could not be switched to eager ({exc}); load it with attn_implementation='eager'."
        ) from None
    warnings.warn(f"switched the model from '{impl}' to eager attention", UserWarning, stacklevel=3)


def _progress(texts: Iterable[TextOrPair], enabled: bool) -> Iterable[TextOrPair]:
    if not enabled:
        return texts
    from rich.progress import track

    total = len(texts) if hasattr(texts, "__len__") else None  # type: ignore[arg-type]
    return track(texts, description="tracing", total=total, transient=True)
