"""`Model` and `Seq2SeqModel`: a Hugging Face model plus its spec, able to trace sequences into
plain tensors.

Both are compositions of the same parts: an `InputEncoder` (models/encoding.py) turns
what users give into `Encoding`s, `AttentionStack`s (models/stack.py) know where each
piece of docs/definitions.md lives and tap a forward pass, and one `TraceBuilder`
(models/capture.py) turns the taps into `Trace`s. An encoder-only or decoder-only model
has one stack; an encoder–decoder model three (its encoder is a plain `Model`, its decoder's
two stacks are built and traced by models/decoder.py). Layer
streaming is models/streaming.py, the functional view for attribution
models/functional.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models import backends, budget, functional
from identifiable.models.arguments import check_hf_model
from identifiable.models.backends import AttentionChoice, check_choice
from identifiable.models.capture import TraceMeta, trace_batch
from identifiable.models.decoder import decoder_ids, decoder_side, seq2seq_spec, trace_pair
from identifiable.models.discover import Discovery, discover_spec, probe_ids
from identifiable.models.encoding import (
    Encoding,
    InputEncoder,
    ModelInput,
    TextOrPair,
    TruncationWarning,
    input_encoder,
    many_items,
    resolve_tokenizer,
    with_progress,
)
from identifiable.models.fingerprint import model_fingerprint
from identifiable.models.hooks import get_submodule
from identifiable.models.protocol import ModelInfo, TracedModel
from identifiable.models.selection import Selection, indices, layer_range
from identifiable.models.specs import (
    ArchSpec,
    Seq2SeqSpec,
    find_spec,
)
from identifiable.models.stack import (
    base_model_of,
    stack_of,
    value_columns,
)
from identifiable.models.streaming import stream_layers
from identifiable.models.trace import Seq2SeqTrace, Trace

__all__ = [
    "Encoding",
    "Model",
    "ModelInfo",
    "ModelInput",
    "Seq2SeqModel",
    "TextOrPair",
    "TracedModel",
    "TruncationWarning",
    "base_model_of",
    "value_columns",
]


class Model:
    """A traced view of a Hugging Face model. Build with `identifiable.load_model` or `Model.from_hf`.

    Task-head models are unwrapped to their base model (`hf_model`; the original
    is `task_model`). Families outside the spec table are discovered by
    introspection and accepted only when `verify()` proves the discovered spec
    on a probe input (`identifiable.models.discover`).

    Attributes:
        stack: the `AttentionStack` that captures every trace.
        inputs: the `InputEncoder` (tokenizer, image processor, batching).
        spec, layers, windows, kv_head_of: the stack's spec (transformers 4.x paths
            applied), layers, per-layer windows and `[H]` key/value head of each head.
        info: sizes (`ModelInfo`).
        discovery: the `Discovery` when the spec was found by introspection, else None.
    """

    def __init__(
        self,
        hf_model: nn.Module,
        tokenizer: Any = None,
        *,
        name: str = "",
        spec: ArchSpec | None = None,
        image_processor: Any = None,
        attention: AttentionChoice = "auto",
    ) -> None:
        attention = check_choice(attention)
        check_hf_model(hf_model, tokenizer)  # one line for None, a Model, TransformerLens
        config: Any = hf_model.config
        name = name or str(getattr(config, "_name_or_path", "") or type(hf_model).__name__)
        self.task_model = hf_model
        loaded = backends.implementation(hf_model)
        base = base_model_of(hf_model)  # left in its mode: each pass runs in eval (backends)
        tokenizer = resolve_tokenizer(hf_model, tokenizer)
        self.discovery: Discovery | None = None
        if spec is None and getattr(config, "is_encoder_decoder", False):
            raise IdentifiableError(
                f"'{config.model_type}' is an encoder–decoder model: build it with "
                "Model.from_hf(model, tokenizer) or load_model(...), which return a Seq2SeqModel"
            )
        spec = spec or find_spec(str(config.model_type))
        if (
            spec is not None
            and spec.tower
            and isinstance(getattr(base, spec.tower, None), nn.Module)
        ):
            base = getattr(base, spec.tower)  # CLIP: the vision tower (images in)
        if spec is None:
            with backends.eager(hf_model):  # discovery's probes read the modules' outputs
                self.discovery = discover_spec(base, tokenizer)
            spec = self.discovery.spec
        self.hf_model = base
        self.stack = stack_of(base, spec)
        self.inputs: InputEncoder = input_encoder(
            base, self.stack.spec, tokenizer, name=name, image_processor=image_processor,
            source=hf_model,
        )  # fmt: skip
        self.attention, self.recompute_error = self._capture_with(attention, loaded)
        self.info = ModelInfo.of_stack(base.config, self.stack, name, self.inputs.max_positions)
        self.special_tokens = (
            {"cls": "[CLS]"}
            if self.modality == "image"
            else {
                role: tok
                for role in ("cls", "sep", "bos", "eos")
                if (tok := getattr(tokenizer, f"{role}_token", None))
            }
        )

    def _capture_with(self, attention: AttentionChoice, loaded: str) -> tuple[str, float | None]:
        """(the implementation traces run under, the probe's |A_recomputed − A_eager|).

        The model keeps its own implementation between calls (backends.running)."""
        impl = "eager" if self.discovery is not None else loaded
        if self.discovery is None:
            with backends.running(self.hf_model, loaded):
                impl = backends.capture_implementation(self.hf_model, self.stack, attention)
        if impl == "eager":
            return "eager", None
        with backends.running(self.hf_model, impl):
            ok, err, why = backends.prove(
                self.hf_model, self.stack, self.inputs, probe_ids(self.hf_model)
            )
        if not ok:
            warnings.warn(f"{why}: the model runs eager attention", UserWarning, stacklevel=4)
            return "eager", err
        return impl, err

    @classmethod
    def from_hf(
        cls,
        hf_model: nn.Module,
        tokenizer: Any = None,
        *,
        name: str = "",
        spec: ArchSpec | None = None,
        image_processor: Any = None,
        attention: AttentionChoice = "auto",
    ) -> Model | Seq2SeqModel:
        """Wrap a model you loaded yourself.

        `attention` (models/backends.py): "auto" traces under the implementation the
        model was loaded with where its maps can be recomputed from Q and K (sdpa, flash;
        proved equal to eager's on a probe), else eager; "sdpa" also switches an eager
        model to sdpa; "eager" always runs eager attention. `Model.attention` says which
        one traces run under; the model keeps its own implementation between calls.

        Task-head models (`AutoModelForMaskedLM`, `…ForSequenceClassification`, …)
        are traced through their base model. Without `tokenizer`, the one saved
        in the model's directory is used when there is one; token-id inputs need none.
        Pass `spec` to trace a family with your own `ArchSpec`. Encoder–decoder
        models (T5, BART, …) give a `Seq2SeqModel`.
        """
        check_hf_model(hf_model, tokenizer)
        if spec is None and getattr(hf_model.config, "is_encoder_decoder", False):
            return Seq2SeqModel(hf_model, tokenizer, name=name)
        return cls(
            hf_model,
            tokenizer,
            name=name,
            spec=spec,
            image_processor=image_processor,
            attention=attention,
        )

    # ---- the parts, by their old names ----------------------------------------------
    @property
    def spec(self) -> ArchSpec:
        return self.stack.spec

    @property
    def layers(self) -> list[nn.Module]:
        return self.stack.layers

    @property
    def windows(self) -> list[int | None]:
        return self.stack.windows

    @property
    def kv_head_of(self) -> torch.Tensor:
        return self.stack.kv_head_of

    @property
    def modality(self) -> str:
        return self.stack.spec.modality

    @property
    def tokenizer(self) -> Any:
        return self.inputs.tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self.inputs.tokenizer = value

    @property
    def image_processor(self) -> Any:
        return self.inputs.image_processor

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def meta(self) -> TraceMeta:
        """What each trace of this model says about it."""
        i = self.info
        return TraceMeta(i.name, self.spec.name, dict(self.special_tokens), i.dequantized_from)

    def __repr__(self) -> str:
        info = self.info
        kv = f" ({info.n_kv_heads} key/value)" if info.n_kv_heads != info.n_heads else ""
        dtype = str(next(self.hf_model.parameters()).dtype).removeprefix("torch.")
        return (
            f"Model({info.name!r}, family={info.architecture!r}, layers={info.n_layers}, "
            f"heads={info.n_heads}{kv}, head_dim={info.head_dim}, dtype={dtype}, "
            f"device={self.device})" + (f"; {info.not_analysed}" if info.not_analysed else "")
        )

    @property
    def fingerprint(self) -> str:
        """Stable id of config + every weight, for keying caches (models/fingerprint.py)."""
        return model_fingerprint(self.hf_model)

    # ---- encoding ------------------------------------------------------------
    def encode(self, text: ModelInput, *, truncate: bool = True) -> Encoding:
        """Tokenise a text or a pair `(a, b)` in the model's own format (an image for
        vision models, see `encode_image`). Token ids and a `BatchEncoding` are accepted
        too, as by `trace`, so every analysis that encodes takes what `trace` takes."""
        return self.inputs.encode(text, truncate=truncate)

    def encode_ids(
        self, input_ids: Any, *, token_type_ids: Any = None, truncate: bool = True
    ) -> Encoding:
        """An `Encoding` of token ids you made yourself (list[int] or a 1-D integer tensor).

        The ids are used as given: no special tokens are added.
        """
        return self.inputs.encode_ids(input_ids, token_type_ids=token_type_ids, truncate=truncate)

    def encode_image(self, image: Any) -> Encoding:
        """An image as the model's tokens (see `InputEncoder.encode_image`)."""
        return self.inputs.encode_image(image)

    def batch_inputs(self, encs: Sequence[Encoding]) -> dict[str, torch.Tensor]:
        """The forward pass's keyword arguments for `encs`, padded, on the model's device."""
        return self.inputs.batch(encs, self.hf_model)

    # ---- tracing -------------------------------------------------------------
    def trace(
        self,
        text: ModelInput,
        *,
        truncate: bool = True,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        memory_budget: int | None = None,
    ) -> Trace:
        """One forward pass of one sequence, captured as a `Trace` (no padding).

        `text` is a text, a pair `(a, b)` (a tuple), token ids (list[int] or a
        1-D integer tensor, used as given) or a tokenizer's `BatchEncoding` of one
        sequence (padding positions dropped). A list of texts is refused: use a
        tuple for a pair and `trace_many` for many texts.

        `layers`: consecutive layers to keep (default all; the pass stops after the
        last); `heads`: query heads to keep (default all). Nothing outside the
        selection is kept, and under recomputed attention (`Model.attention` not
        "eager") no map outside it is ever computed. `trace.layers` / `trace.heads`
        give the model's indices. `memory_budget`: bytes the trace may use (default:
        the memory available now); a trace whose formula (docs/families.md, 'Memory and streaming',
        models/budget.py) exceeds it is refused before the forward pass; on a GPU its
        forward part is checked against the GPU's free memory, and the budget bounds the
        result (host memory)."""
        chosen = layer_range(self.stack.requested(layers), self.stack.n_layers)
        kept = indices(heads, self.stack.n_heads, "heads")
        enc = self.inputs.encode_any(text, truncate)
        self.check_memory(len(enc), len(chosen), kept, memory_budget, "this trace")
        return self._trace_batch([enc], layers=chosen, heads=kept)[0]

    def memory_plan(
        self, n: int, n_layers: int, heads: Sequence[int] | None, *, streaming: bool = False
    ) -> budget.TracePlan:
        """The bytes a trace of n tokens, `n_layers` layers and `heads` (None: all) takes
        (models/budget.py, docs/families.md, 'Memory and streaming')."""
        info = self.info
        shape = budget.Shape(
            info.n_heads, info.n_kv_heads, info.head_dim, info.hidden_size,
            info.intermediate_size or 4 * info.hidden_size,
            next(self.hf_model.parameters()).element_size(),
        )  # fmt: skip
        return budget.plan(
            shape, n, n, layers=n_layers, heads=info.n_heads if heads is None else len(heads),
            eager=self.attention == "eager", streaming=streaming,
            masked=any(w is not None for w in self.windows),
            shared_out_proj=heads is None and self.stack.has_out_proj(),
            gpu=self.device.type == "cuda",
        )  # fmt: skip

    def check_memory(
        self,
        n: int,
        n_layers: int,
        heads: Sequence[int] | None,
        memory_budget: int | None,
        what: str,
        *,
        streaming: bool = False,
        batch: int = 1,
    ) -> None:
        """Refuse in one line a trace over `memory_budget` bytes (None: available memory);
        `batch` sequences padded to n tokens take `batch` times one's bytes (on a GPU: as
        for `trace`)."""
        one = self.memory_plan(n, n_layers, heads, streaming=streaming)
        eager = self.attention == "eager"  # advise sdpa only where maps can be recomputed
        sdpa = eager and backends.why_not_recomputed(self.hf_model, self.stack) is None
        budget.check_trace(one, memory_budget, what, n, batch, self.device, sdpa)

    def trace_many(
        self,
        texts: Iterable[ModelInput] | Any,
        *,
        batch_size: int = 8,
        truncate: bool = True,
        progress: bool | None = None,
        column: str | None = None,
        pair_columns: tuple[str, str] | None = None,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        memory_budget: int | None = None,
    ) -> Iterator[Trace]:
        """Stream Traces in input order, batching with padding internally.

        `texts` is an iterable of anything `trace` accepts, a `BatchEncoding` of
        a batch, or a `datasets.Dataset` with `column=` (one text per row) or
        `pair_columns=(a, b)` (a pair per row); a Dataset with a single text
        column needs neither.

        `progress`: a bar of the texts traced (None: when a person is watching).
        Each result equals `trace(text)` up to float rounding (tested). Within a
        window of a few batches texts are sorted by length, so padding stays small.
        `layers`, `heads` and `memory_budget` as for `trace`; the budget is checked
        before each batch's forward pass, for the batch padded to its longest text.
        """
        if batch_size < 1:
            raise IdentifiableError(f"batch_size must be ≥ 1, got {batch_size}")
        chosen = layer_range(self.stack.requested(layers), self.stack.n_layers)
        kept = indices(heads, self.stack.n_heads, "heads")
        if memory_budget is not None:  # a bad value is refused before any text is read
            self.check_memory(1, len(chosen), kept, memory_budget, "trace_many")
        items = many_items(texts, column, pair_columns)
        window = batch_size * 4
        buf: list[Encoding] = []
        select = Selection(chosen, kept, memory_budget)
        for text in with_progress(items, progress):
            buf.append(self.inputs.encode_any(text, truncate))
            if len(buf) == window:
                yield from self._trace_window(buf, batch_size, select)
                buf = []
        if buf:
            yield from self._trace_window(buf, batch_size, select)

    def _trace_window(
        self, encs: Sequence[Encoding], batch_size: int, select: Selection
    ) -> Iterator[Trace]:
        order = sorted(range(len(encs)), key=lambda i: len(encs[i]))
        out: dict[int, Trace] = {}
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = [encs[i] for i in idx]
            n = max(len(e) for e in batch)
            self.check_memory(
                n, len(select.layers), select.heads, select.memory_budget, "trace_many",
                batch=len(batch),
            )  # fmt: skip
            traces = self._trace_batch(batch, layers=select.layers, heads=select.heads)
            for i, tr in zip(idx, traces, strict=True):
                out[i] = tr
        for i in range(len(encs)):
            yield out.pop(i)

    def _trace_batch(
        self,
        encs: Sequence[Encoding],
        *,
        layers: range | None = None,
        heads: Sequence[int] | None = None,
    ) -> list[Trace]:
        return trace_batch(
            self.hf_model, self.stack, self.inputs, encs, self.meta,
            layers=layers, heads=heads, attention=self.attention,
        )  # fmt: skip

    def key_mask(self, n: int) -> torch.Tensor:
        """`[L, n, n]` bool: which keys each query row of each layer may attend to.

        Derived from the spec and the model's config, not from the attention
        weights: all keys (encoders), keys ≤ i (decoders), narrowed to a window
        on sliding-window/local layers (`windows`: i − j < w for decoders,
        |i − j| ≤ w for encoders, as Hugging Face builds these masks). Each
        trace checks that its attention is exactly 0 outside this mask.
        """
        return self.stack.key_mask(n)

    def iter_layers(
        self,
        text: ModelInput,
        *,
        truncate: bool = True,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        memory_budget: int | None = None,
    ) -> Iterator[tuple[int, Trace]]:
        """Yield `(layer, trace)` one layer at a time, during a single forward pass.

        Each `trace` is a one-layer `Trace` of that layer (attentions `[1, H, n, n]`,
        hidden_states `[2, n, d]`: the layer's input and output) that verifies and
        feeds every analysis on its own. The forward pass runs in a worker thread
        that waits after each layer until the caller asks for the next, so at most
        one layer's n×n maps (two while the next is being built) are alive instead
        of all L: for a 7B model (32 layers of 32 heads) at n = 4096 that is 2.1 GB
        per layer in float32 instead of 69 GB. Stopping early (break) ends the
        forward pass.

        `layers` (any, yielded in the model's order; the pass ends after the last),
        `heads` and `memory_budget` as for `trace` (the budget is checked before the
        pass, from the streaming formula of docs/families.md, 'Memory and streaming').
        """
        chosen = self.stack.requested(layers)
        kept = indices(heads, self.stack.n_heads, "heads")
        enc = self.inputs.encode_any(text, truncate)
        self.check_memory(len(enc), 1, kept, memory_budget, "iter_layers", streaming=True)
        impl = self.attention

        def forward() -> Any:
            with backends.running(self.hf_model, impl):
                return self.hf_model(**self.batch_inputs([enc]))

        return stream_layers(
            self.stack, enc, forward, self.meta, layers=chosen, heads=kept,
            recompute=impl != "eager",
        )  # fmt: skip

    def vocabulary_embeddings(self) -> torch.Tensor:
        """`[V, d_emb]` the word-embedding matrix (no position or segment part), float32 on the CPU."""
        embeddings = self.hf_model.get_input_embeddings()  # type: ignore[operator]
        return embeddings.weight.detach().float().cpu()  # type: ignore[no-any-return]

    # ---- functional view for attribution --------------------------------------
    def embed(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        *,
        pixel_values: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """e^0 `[n, d]`: the embedding layer's output, i.e. the input of layer 1.

        Image models take `pixel_values` `[C, H, W]`; without it, the image of the
        last `encode` whose `input_ids` object this is (Hidden Token Attribution
        encodes, then embeds the same ids).
        """
        return functional.embed(
            self.hf_model, self.stack, self.inputs, input_ids, token_type_ids, pixel_values
        )

    def layer_outputs(self, e0: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states of every layer as a differentiable function of e^0.

        Args:
            e0: `[n, d]` or `[B, n, d]`, fed to layer 1 in place of the embeddings.
            input_ids: `[n]`; only sets the sequence length and positions (RoPE, masks).
        Returns:
            `[L+1, n, d]` (or `[B, L+1, n, d]`); index 0 is e0 itself.
        Works under `torch.func.jvp`/`vmap` and autograd.
        """
        return functional.layer_outputs(self.hf_model, self.stack, self.inputs, e0, input_ids)

    def placeholder_pixels(self, batch: int, dtype: torch.dtype) -> torch.Tensor:
        """`[batch, C, H, W]` zeros of the model's image size, for passes whose layer inputs
        are replaced by hooks (the pixels only have to have the right size)."""
        return self.inputs.placeholder_pixels(batch, dtype, self.device)


class Seq2SeqModel:
    """A traced view of an encoder–decoder model (T5, mT5, BART, mBART, Marian).

    Build with `Model.from_hf(model, tokenizer)` or `identifiable.load_model`, which
    return this class for encoder–decoder models. `trace(source, target)` returns a
    `Seq2SeqTrace`; `encoder` is the encoder stack as a plain `Model` (trace,
    effective attention, Hidden Token Attribution of the source). The decoder's
    self-attention and its cross-attention are two more `AttentionStack`s over the
    decoder's layers (`decoder_stack`, `cross_stack`).
    """

    def __init__(
        self,
        hf_model: nn.Module,
        tokenizer: Any = None,
        *,
        name: str = "",
        spec: Seq2SeqSpec | None = None,
    ) -> None:
        check_hf_model(hf_model, tokenizer)
        config: Any = hf_model.config
        spec = spec or seq2seq_spec(base_model_of(hf_model))
        # keeps its implementation and mode: each pass is eager, then back
        self.task_model = hf_model
        base = base_model_of(hf_model)
        self.hf_model, self.spec = base, spec
        self.tokenizer = resolve_tokenizer(hf_model, tokenizer)
        name = name or str(getattr(config, "_name_or_path", ""))
        # The encoder stack alone is an encoder-only model: trace and HTA reuse `Model`.
        self.encoder = Model(
            get_submodule(base, spec.encoder_stack), self.tokenizer, name=name,
            spec=spec.encoder, attention="eager",
        )  # fmt: skip
        self.encoder.stack.label = "encoder"
        self.info = self.encoder.info
        side = decoder_side(base, spec, self.info, name)
        self.decoder_layers, self.decoder_info = side.layers, side.info
        self.decoder_stack, self.cross_stack = side.self_stack, side.cross_stack
        self.decoder_start_token_id = side.start_token_id

    @classmethod
    def from_hf(cls, hf_model: nn.Module, tokenizer: Any = None, **options: Any) -> Seq2SeqModel:
        """`Seq2SeqModel(hf_model, tokenizer, name=..., spec=...)`, named as `Model.from_hf`."""
        return cls(hf_model, tokenizer, **options)

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    def decoder_inputs(self, target: ModelInput | None, source: Encoding) -> Encoding:
        """The decoder's input: the target's ids shifted right behind the start token.

        This is what the decoder reads in training with `labels=target`. Without a
        target the source ids are used (the decoder reconstructs the source).
        """
        ids = decoder_ids(
            target, source.input_ids, self.decoder_start_token_id, self.encoder.encode
        )
        return Encoding(ids, self.encoder.inputs.token_strings(ids), 0)

    def trace(
        self, source: ModelInput, target: ModelInput | None = None, *, truncate: bool = True
    ) -> Seq2SeqTrace:
        """Encoder, decoder and cross-attention traces of one (source, target) pair.

        `source` is anything `Model.trace` takes (text, token ids, BatchEncoding);
        `target` is a text or token ids, fed to the decoder shifted right (see
        `decoder_inputs`); None feeds the source.
        """
        src = self.encoder.inputs.encode_any(source, truncate)
        dec = self.decoder_inputs(target, src)
        meta = TraceMeta(self.encoder.info.name, self.spec.name, dict(self.encoder.special_tokens))
        stacks = (self.encoder.stack, self.decoder_stack, self.cross_stack)
        return trace_pair(self.hf_model, stacks, src, dec, meta)

    def trace_many(
        self, pairs: Iterable[ModelInput | tuple[ModelInput, ModelInput]]
    ) -> Iterator[Seq2SeqTrace]:
        """`trace` of each item: a source, or `(source, target)` given as a list [s, t]."""
        for item in pairs:
            if isinstance(item, list) and len(item) == 2:
                yield self.trace(item[0], item[1])
            else:
                yield self.trace(item)
