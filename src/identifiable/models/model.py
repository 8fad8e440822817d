"""`Model` and `Seq2SeqModel`: a Hugging Face model plus its spec, able to trace sequences into
plain tensors.

Both are compositions of the same parts: an `InputEncoder` (models/encoding.py) turns
what users give into `Encoding`s, `AttentionStack`s (models/stack.py) know where each
piece of docs/definitions.md lives and tap a forward pass, and one `TraceBuilder`
(models/capture.py) turns the taps into `Trace`s. An encoder-only or decoder-only model
has one stack; an encoder–decoder model three (its encoder is a plain `Model`, its decoder's
two stacks are built and traced by models/decoder.py).

This module builds them (construction, loading, the attention implementation traces run
under); `Model`'s other concerns live one module each: `model_core` (its parts, metadata,
repr), `model_inputs` (encoding), `model_memory` (memory planning), `model_tracing`
(trace, trace_many, iter_layers, key_mask) and `model_functional` (the functional view for
attribution). Layer streaming is models/streaming.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models import backends
from identifiable.models.arguments import check_hf_model
from identifiable.models.backends import AttentionChoice, check_choice
from identifiable.models.capture import TraceMeta
from identifiable.models.decoder import decoder_ids, decoder_side, seq2seq_spec, trace_pair
from identifiable.models.discover import discover_spec, probe_ids
from identifiable.models.encoding import (
    Encoding,
    ModelInput,
    TextOrPair,
    TruncationWarning,
    input_encoder,
    resolve_tokenizer,
)
from identifiable.models.hooks import get_submodule
from identifiable.models.model_functional import FunctionalView
from identifiable.models.model_tracing import Tracing
from identifiable.models.protocol import ModelInfo, TracedModel
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
from identifiable.models.trace import Seq2SeqTrace

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


class Model(Tracing, FunctionalView):
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
        self.discovery = None
        if spec is None and getattr(config, "is_encoder_decoder", False):
            raise IdentifiableError(
                f"'{config.model_type}' is an encoder–decoder model: build it with "
                "Model.from_hf(model, tokenizer) or load_model(...), which return a Seq2SeqModel"
            )
        base_config: Any = base.config  # a multimodal model's: its language model's
        spec = spec or find_spec(str(base_config.model_type))
        if spec is not None:
            base = spec.tower.of(base)  # CLIP: the vision tower (images in)
        if spec is None:
            with backends.eager(hf_model):  # discovery's probes read the modules' outputs
                self.discovery = discover_spec(base, tokenizer)
            spec = self.discovery.spec
        self.hf_model = base
        self.stack = stack_of(base, spec)
        self.inputs = input_encoder(
            base,
            self.stack.spec,
            tokenizer,
            name=name,
            image_processor=image_processor,
            source=hf_model,
        )
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
        encoder = get_submodule(base, spec.encoder_stack)
        if getattr(encoder, "config", None) is None:  # a plain nn.Module stack (FSMT's)
            encoder.config = base.config  # its model's, the same object, as HF's other stacks
        self.encoder = Model(
            encoder,
            self.tokenizer,
            name=name,
            spec=spec.encoder,
            attention="eager",
        )
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
