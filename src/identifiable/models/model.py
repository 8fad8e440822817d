"""`Model`: a Hugging Face model plus its spec, able to trace sequences into plain tensors."""

from __future__ import annotations

import contextlib
import inspect
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.compat import (
    VISION_TOWERS,
    adapt_spec,
    ask_for_attention_weights,
    dtype_of,
    window_config,
)
from identifiable.models.fingerprint import model_fingerprint
from identifiable.models.hooks import (
    HookSet,
    first_tensor,
    get_submodule,
    hidden_input,
    replace_hidden_input,
)
from identifiable.models.specs import ArchSpec, find_spec
from identifiable.models.trace import Trace
from identifiable.unicode import check_unicode

TextOrPair = str | tuple[str, str]
ModelInput = Any
"""What `trace` accepts: a text, a pair `(a, b)`, token ids (list[int] or a 1-D
integer tensor), a tokenizer's `BatchEncoding` (or a mapping with "input_ids")
of one sequence, or an `Encoding`."""

_HALF = (torch.float16, torch.bfloat16)


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
    pixel_values: torch.Tensor | None = None  # [C, H, W], image models (input_ids: positions)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.input_ids, self.tokens, self.n_dropped))

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class _HeadWeights:
    """One layer's W_V, b_V, W_O, b_O in the orientation of docs/definitions.md (x @ W)."""

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


def _raw_heads(layer: nn.Module, path: str) -> torch.Tensor:
    """A raw `[d, H, d_v]` projection parameter (`ArchSpec.weight_layout` "heads")."""
    try:
        p = layer.get_parameter(path)
    except AttributeError as exc:
        raise IdentifiableError(
            f"the model has no parameter '{path}' ({exc}); its architecture spec does not match "
            "this model class (see README 'Adding an architecture')."
        ) from None
    if p.dim() != 3:
        raise IdentifiableError(
            f"parameter '{path}' has shape {tuple(p.shape)}, but weight layout 'heads' reads "
            "[d, H, d_v]; the spec does not match this model."
        )
    return p


def _e_module(layer: nn.Module, spec: ArchSpec) -> nn.Module:
    """The module whose first input is E: the value projection, or (raw "heads"
    parameters, which have no module of their own) the attention module holding W_V."""
    if spec.weight_layout == "heads":
        return _attention_module(layer, spec.value)
    return get_submodule(layer, spec.value)


def value_columns(
    spec: ArchSpec, width: int, n_heads: int, head_dim: int
) -> tuple[int, slice | list[int]]:
    """(H_kv, the output columns of the value module that hold W_V, in key/value-head order).

    Args:
        width: output width of the value module (the fused width for fused QKV).
    """
    if spec.fused_qkv is not None:
        chunks, index = spec.fused_qkv
        part = width // chunks
        return part // head_dim, slice(index * part, (index + 1) * part)
    if spec.fused is None:
        return width // head_dim, slice(0, width)
    n_kv = (width // head_dim - n_heads) // 2  # fused width is (H + 2·H_kv)·d_v
    if n_kv < 1 or (n_heads + 2 * n_kv) * head_dim != width or n_heads % n_kv:
        raise IdentifiableError(
            f"the fused QKV projection has width {width}, which is not (H + 2·H_kv)·d_v for "
            f"H = {n_heads}, d_v = {head_dim}; the spec's fused layout does not fit this model."
        )
    if spec.fused == "qkv_blocks":
        start = (n_heads + n_kv) * head_dim
        return n_kv, slice(start, start + n_kv * head_dim)
    group = n_heads // n_kv + 2  # per key/value head: its query heads, its key, its value
    cols = [(g * group + group - 1) * head_dim + c for g in range(n_kv) for c in range(head_dim)]
    return n_kv, cols


def base_model_of(hf_model: nn.Module) -> nn.Module:
    """The body of a task-head model (`*ForMaskedLM`, `*ForCausalLM`, `*ForSequenceClassification`,
    `*ForTokenClassification`, `*ForQuestionAnswering`, …), or the model itself."""
    base = getattr(hf_model, "base_model", None)
    return base if isinstance(base, nn.Module) else hf_model


def _resolve_tokenizer(hf_model: nn.Module, tokenizer: Any) -> Any:
    """The given tokenizer, else the one saved beside the model's weights (or None)."""
    if tokenizer is not None:
        return tokenizer
    from pathlib import Path

    source = str(getattr(hf_model, "name_or_path", "") or "") or str(
        getattr(hf_model.config, "_name_or_path", "") or ""
    )
    if not source or not Path(source).expanduser().is_dir():
        return None
    try:
        from transformers import AutoTokenizer

        found = AutoTokenizer.from_pretrained(str(Path(source).expanduser()), local_files_only=True)
    except Exception:
        return None
    return found if len(found) >= 2 else None  # an empty tokenizer when no files exist


class Model:
    """A traced view of a Hugging Face model. Build with `identifiable.load_model` or `Model.from_hf`.

    Task-head models are unwrapped to their base model (`hf_model`; the original
    is `task_model`). Families outside the spec table are discovered by
    introspection and accepted only when `verify()` proves the discovered spec
    on a probe input (`identifiable.models.discover`).
    """

    def __init__(
        self,
        hf_model: nn.Module,
        tokenizer: Any = None,
        *,
        name: str = "",
        spec: ArchSpec | None = None,
        image_processor: Any = None,
    ) -> None:
        if type(hf_model).__name__ in ("TransformerBridge", "HookedTransformer"):
            raise IdentifiableError(
                "a TransformerLens model is not a Hugging Face model: trace it with "
                "identifiable.models.lens.trace_from_lens(bridge, tokens)"
            )
        config = hf_model.config
        self.task_model = hf_model
        _ensure_eager(hf_model)
        hf_model.eval()
        base = base_model_of(hf_model)
        vision = getattr(base, "vision_model", None)
        if config.model_type in VISION_TOWERS and isinstance(vision, nn.Module):
            base, config = vision, vision.config  # CLIP: the vision tower (images in)
        self.tokenizer = _resolve_tokenizer(hf_model, tokenizer)
        self.discovery = None  # a `Discovery` when the spec was found by introspection
        if spec is None and getattr(config, "is_encoder_decoder", False):
            raise IdentifiableError(
                f"'{config.model_type}' is an encoder–decoder model: build it with "
                "Model.from_hf(model, tokenizer) or load_model(...), which return a Seq2SeqModel"
            )
        if spec is None:
            spec = find_spec(config.model_type)
        if spec is None:
            from identifiable.models.discover import discover_spec

            self.discovery = discover_spec(base, self.tokenizer)
            spec = self.discovery.spec
        self._setup(base, spec, name)
        self.modality = spec.modality
        self.image_processor = None
        self._last_image: tuple[torch.Tensor, torch.Tensor] | None = None
        if spec.modality == "image":
            given = image_processor if image_processor is not None else tokenizer
            self.image_processor = (
                given if _is_image_processor(given) else _resolve_image_processor(hf_model)
            )
            self.tokenizer = None
            self.special_tokens = {"cls": "[CLS]"}

    def _setup(self, base: nn.Module, spec: ArchSpec, name: str) -> None:
        config = base.config
        spec = adapt_spec(base, spec)  # transformers 4.x module paths, where they differ
        self.spec: ArchSpec = spec
        self.hf_model = base.eval()
        self.layers = _logical_layers(base, spec)
        n_heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        head_dim = int(getattr(config, "head_dim", None) or hidden // n_heads)
        # E is the input of `_value_modules`; the block output is the output of
        # `_out_modules`, or (`spec.block_output_at`) their hidden-state-shaped input.
        self._value_modules = [_e_module(layer, spec) for layer in self.layers]
        self._out_modules = [
            get_submodule(layer, spec.block_output_at or spec.out_proj) for layer in self.layers
        ]
        width = self._projections(0)[0].shape[1]
        n_kv, self._v_cols = value_columns(spec, width, n_heads, head_dim)
        if n_kv < 1 or n_heads % n_kv:
            raise IdentifiableError(
                f"the value projection has width {width}, which gives {n_kv} key/value heads of "
                f"width {head_dim} for {n_heads} query heads; the spec does not fit this model."
            )
        self.info = ModelInfo(
            name=name or str(getattr(config, "_name_or_path", "")),
            architecture=spec.name,
            model_type=config.model_type,
            n_layers=len(self.layers),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            hidden_size=hidden,
            max_positions=_max_positions(config, self.tokenizer, spec),
            is_causal=spec.causal,
            intermediate_size=int(
                getattr(config, "intermediate_size", None)
                or getattr(config, "n_inner", None)
                or getattr(config, "ffn_dim", None)  # OPT
                or getattr(config, "hidden_dim", None)  # DistilBERT
                or getattr(config, "d_inner", None)  # XLNet
                or 4 * hidden
            ),
        )
        self.kv_head_of = torch.arange(n_heads) // (n_heads // n_kv)
        self._weights = [self._head_weights(i) for i in range(len(self.layers))]
        # (versions of the W_O parameters, the stacked W_O shared by traces): `_stacked_out_proj`
        self._out_proj_cache: tuple[tuple[int, ...], torch.Tensor] | None = None
        self.windows = _layer_windows(config, spec, len(self.layers))
        # Segment ids only for models with more than one segment embedding (RoBERTa has
        # one), or that compare segments instead of embedding them (XLNet).
        takes_types = "token_type_ids" in inspect.signature(base.forward).parameters
        self._accepts_token_types = takes_types and (
            int(getattr(config, "type_vocab_size", 0) or 0) > 1 or spec.relative_segments
        )
        self.special_tokens = {
            role: tok
            for role in ("cls", "sep", "bos", "eos")
            if (tok := getattr(self.tokenizer, f"{role}_token", None))
        }

    @classmethod
    def from_hf(
        cls,
        hf_model: nn.Module,
        tokenizer: Any = None,
        *,
        name: str = "",
        spec: ArchSpec | None = None,
        image_processor: Any = None,
    ) -> Any:
        """Wrap a model you loaded yourself (switched to eager attention if needed).

        Task-head models (`AutoModelForMaskedLM`, `…ForSequenceClassification`, …)
        are traced through their base model. Without `tokenizer`, the one saved
        in the model's directory is used when there is one; token-id inputs need none.
        Pass `spec` to trace a family with your own `ArchSpec`. Encoder–decoder
        models (T5, BART, …) give a `Seq2SeqModel` (identifiable.models.seq2seq).
        """
        if spec is None and getattr(hf_model.config, "is_encoder_decoder", False):
            from identifiable.models.seq2seq import Seq2SeqModel

            return Seq2SeqModel(hf_model, tokenizer, name=name)
        return cls(hf_model, tokenizer, name=name, spec=spec, image_processor=image_processor)

    # ---- weights -------------------------------------------------------------
    def _projections(self, layer: int) -> tuple[torch.Tensor, ...]:
        """(W_V over every output column of the value module, b_V, W_O, b_O) of a layer,
        in the orientation x @ W; views of the parameters (in-place updates show)."""
        spec, mod = self.spec, self.layers[layer]
        if spec.weight_layout == "heads":
            v, o = _raw_heads(mod, spec.value), _raw_heads(mod, spec.out_proj)
            w_v = v.reshape(v.shape[0], -1)  # column h·d_v + c is v[:, h, c]
            w_o = o.reshape(o.shape[0], -1).T  # row h·d_v + c is o[:, h, c]
            return w_v, torch.zeros_like(w_v[0]), w_o, torch.zeros_like(w_o[0])
        v_mod, o_mod = self._value_modules[layer], get_submodule(mod, spec.out_proj)
        w_v = _weight_in_out(v_mod, spec.weight_layout)
        w_o = _weight_in_out(o_mod, spec.weight_layout)
        return w_v, _bias(v_mod, w_v.shape[1], w_v), w_o, _bias(o_mod, w_o.shape[1], w_o)

    def _batch_first(self, x: torch.Tensor) -> torch.Tensor:
        """A layer-level tensor as [B, n, …]: sequence-first models (XLNet) pass [n, B, …]."""
        return x.transpose(0, 1) if self.spec.sequence_first else x

    def _capture_attention_io(
        self,
        hooks: HookSet,
        on_e: Callable[[torch.Tensor], Any],
        on_block: Callable[[torch.Tensor], Any],
    ) -> None:
        """Hook every run of every layer: E `[B, n, d]` to `on_e`, then the attention block
        output `[B, n, d]` (after W_O and b_O, before dropout and residual) to `on_block`."""

        def block_input(m: nn.Module, a: Any) -> None:
            if a[0].dim() == 3:  # XLNet's dropout also runs on the attention maps (4-D)
                on_block(self._batch_first(a[0]))

        for mod in _distinct(self._value_modules):
            hooks.pre(mod, lambda m, a: on_e(self._batch_first(a[0])))
        for mod in _distinct(self._out_modules):
            if self.spec.block_output_at is None:
                hooks.post(mod, lambda m, a, o: on_block(self._batch_first(first_tensor(o))))
            else:
                hooks.pre(mod, block_input)

    def _head_weights(self, layer: int) -> _HeadWeights:
        info = self.info
        w_v, b_v, w_o, b_o = self._projections(layer)
        w_v, b_v = w_v[:, self._v_cols], b_v[self._v_cols]
        expected_v = (info.hidden_size, info.n_kv_heads * info.head_dim)
        expected_o = (info.n_heads * info.head_dim, info.hidden_size)
        if tuple(w_v.shape) != expected_v or tuple(w_o.shape) != expected_o:
            raise IdentifiableError(
                f"layer {layer}: W_V has shape {tuple(w_v.shape)} (expected {expected_v}) and W_O "
                f"{tuple(w_o.shape)} (expected {expected_o}); the output projection of this model "
                "is not separable per head as the spec assumes."
            )
        return _HeadWeights(*(t.detach() for t in (w_v, b_v, w_o, b_o)))

    def _stacked_out_proj(self) -> torch.Tensor:
        """`[L, H, d_v, d]` float32 CPU W_O, one tensor shared by every trace of this model.

        Sharing saves a copy per trace (2 GB for a 7B model) and lets
        `attention.effective` reuse its factorisation of W_O across traces (it
        caches by tensor identity). The copy is rebuilt whenever a weight was
        changed in place (an optimizer step, `load_state_dict`): the detached
        views in `_weights` share their parameters' version counters.
        """
        versions = tuple(w.w_o._version for w in self._weights)
        if self._out_proj_cache is not None and self._out_proj_cache[0] == versions:
            return self._out_proj_cache[1]
        w_o = torch.stack(
            [w.w_o.reshape(self.info.n_heads, self.info.head_dim, -1) for w in self._weights]
        )
        w_o = w_o.float().cpu()
        self._out_proj_cache = (versions, w_o)
        return w_o

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    def __repr__(self) -> str:
        info = self.info
        kv = f" ({info.n_kv_heads} key/value)" if info.n_kv_heads != info.n_heads else ""
        dtype = str(next(self.hf_model.parameters()).dtype).removeprefix("torch.")
        return (
            f"Model({info.name!r}, family={info.architecture!r}, layers={info.n_layers}, "
            f"heads={info.n_heads}{kv}, head_dim={info.head_dim}, dtype={dtype}, "
            f"device={self.device})"
        )

    @property
    def fingerprint(self) -> str:
        """Stable id of config + every weight, for keying caches (models/fingerprint.py)."""
        return model_fingerprint(self.hf_model)

    # ---- encoding ------------------------------------------------------------
    def encode(self, text: TextOrPair, *, truncate: bool = True) -> Encoding:
        """Tokenise a text or a pair `(a, b)` in the model's own format (an image for
        vision models, see `encode_image`). Token ids and a `BatchEncoding` are accepted
        too, as by `trace`, so every analysis that encodes takes what `trace` takes."""
        if self.modality == "image":
            return self.encode_image(text)
        is_text = isinstance(text, str) or (
            isinstance(text, tuple) and all(isinstance(p, str) for p in text)
        )
        if not is_text:  # ids, tensors, BatchEncoding, Encoding; ambiguous lists are refused there
            return self._encode_any(text, truncate)
        parts = _check_text(text)
        tokenizer = self._need_tokenizer("encode text")
        max_len = self.info.max_positions
        full = tokenizer(*parts, add_special_tokens=True, verbose=False)
        n_full = len(full["input_ids"])
        enc = full
        if n_full > max_len:
            if not truncate:
                raise IdentifiableError(
                    f"text has {n_full} tokens but the model takes at most {max_len}; "
                    "shorten it or allow truncation (drop --no-truncate)."
                )
            enc = tokenizer(*parts, add_special_tokens=True, truncation=True, max_length=max_len)
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
            tokens=self._token_strings(ids),
            n_dropped=n_full - len(ids),
            token_type_ids=torch.tensor(tti, dtype=torch.long) if tti is not None else None,
        )

    def encode_ids(
        self,
        input_ids: Any,
        *,
        token_type_ids: Any = None,
        truncate: bool = True,
    ) -> Encoding:
        """An `Encoding` of token ids you made yourself (list[int] or a 1-D integer tensor).

        The ids are used as given: no special tokens are added.
        """
        ids = _as_id_vector(input_ids, "input_ids")
        vocab = int(getattr(self.hf_model.config, "vocab_size", 0) or 0)
        if ids.numel() == 0:
            raise IdentifiableError("input_ids is empty: give at least one token id")
        if int(ids.min()) < 0 or (vocab and int(ids.max()) >= vocab):
            raise IdentifiableError(
                f"token ids must lie in 0..{vocab - 1} (the model's vocabulary); got "
                f"{int(ids.min())}..{int(ids.max())}"
            )
        tti = None if token_type_ids is None else _as_id_vector(token_type_ids, "token_type_ids")
        if tti is not None and tti.shape != ids.shape:
            raise IdentifiableError(
                f"token_type_ids has {tti.numel()} entries but input_ids has {ids.numel()}"
            )
        n_full, max_len = int(ids.numel()), self.info.max_positions
        if n_full > max_len:
            if not truncate:
                raise IdentifiableError(
                    f"{n_full} token ids but the model takes at most {max_len}; shorten them "
                    "or allow truncation"
                )
            ids = ids[:max_len]
            tti = None if tti is None else tti[:max_len]
            warnings.warn(
                f"{n_full} token ids; dropped the last {n_full - max_len} to fit the model's "
                f"maximum of {max_len}",
                TruncationWarning,
                stacklevel=3,
            )
        return Encoding(ids, self._token_strings(ids), n_full - int(ids.numel()), tti)

    def _encode_any(self, item: ModelInput, truncate: bool) -> Encoding:
        """One sequence from any accepted input kind; ambiguous inputs are refused."""
        if isinstance(item, Encoding):
            return item
        if self.modality == "image":
            return self.encode_image(item)
        if _looks_like_image(item):
            raise IdentifiableError(
                f"'{self.info.name or self.spec.name}' is a text model ({self.spec.name}): give "
                "text or token ids, not an image (pixel values)"
            )
        if isinstance(item, str):
            return self.encode(item, truncate=truncate)
        if isinstance(item, torch.Tensor):
            return self.encode_ids(item, truncate=truncate)
        if isinstance(item, Mapping):
            return self._encode_mapping(item, truncate)
        if isinstance(item, tuple | list):
            if item and all(isinstance(x, str) for x in item):
                if isinstance(item, tuple):
                    return self.encode(item, truncate=truncate)
                raise IdentifiableError(
                    f"a list of {len(item)} texts is ambiguous: pass a pair as a tuple "
                    "(text_a, text_b), or many texts to trace_many([...])"
                )
            if item and all(_is_int(x) for x in item):
                return self.encode_ids(list(item), truncate=truncate)
        raise IdentifiableError(
            f"cannot trace a {type(item).__name__}: give a text, a pair (text_a, text_b), "
            "token ids (list[int] or a 1-D tensor) or a tokenizer's BatchEncoding"
        )

    def encode_image(self, image: Any) -> Encoding:
        """An image as the model's tokens: [CLS] (DeiT: then [DIST]), then the patches
        row by row, named "patch(r,c)" (0-based grid row and column).

        `image` is `pixel_values` (`[C, H, W]` or `[1, C, H, W]` at the model's image
        size), a mapping holding "pixel_values" (an image processor's output), or a
        PIL image (needs the model's image processor). The `input_ids` of the
        result are the token positions 0..n-1 (images have no vocabulary).
        """
        if isinstance(image, Encoding):
            return image
        if isinstance(image, Mapping) and "pixel_values" in image:
            px = image["pixel_values"]
        elif isinstance(image, torch.Tensor) and image.is_floating_point():
            px = image
        elif _is_pil(image):
            if self.image_processor is None:
                raise IdentifiableError(
                    "no image processor for this model: pass one "
                    "(Model.from_hf(model, image_processor=...)) or give pixel_values [C, H, W]"
                )
            px = self.image_processor(images=image.convert("RGB"), return_tensors="pt")
            px = px["pixel_values"]
        elif isinstance(image, str | tuple | list | torch.Tensor):
            raise IdentifiableError(
                f"'{self.info.name or self.spec.name}' is a vision model ({self.spec.name}): give "
                "an image (a PIL image or pixel_values [C, H, W]), not text or token ids"
            )
        else:
            raise IdentifiableError(
                f"cannot trace a {type(image).__name__} with a vision model: give a PIL image "
                "or pixel_values [C, H, W]"
            )
        px = torch.as_tensor(px).detach().cpu().float()
        if px.dim() == 4 and px.shape[0] == 1:
            px = px[0]
        cfg = self.hf_model.config
        size = _pair(getattr(cfg, "image_size", px.shape[-1]))
        patch = _pair(getattr(cfg, "patch_size", 1))
        want = (int(getattr(cfg, "num_channels", 3)), *size)
        if tuple(px.shape) != want:
            raise IdentifiableError(
                f"pixel_values has shape {tuple(px.shape)}, expected {list(want)} (the model's "
                "image size); pass a PIL image with the model's image processor"
            )
        rows, cols = size[0] // patch[0], size[1] // patch[1]
        prefix = ["[CLS]", "[DIST]"] if self.info.model_type == "deit" else ["[CLS]"]
        tokens = prefix + [f"patch({r},{c})" for r in range(rows) for c in range(cols)]
        enc = Encoding(torch.arange(len(tokens)), tokens, 0, None, px)
        self._last_image = (enc.input_ids, px)
        return enc

    def _encode_mapping(self, enc: Mapping, truncate: bool) -> Encoding:
        """A tokenizer's `BatchEncoding` (or dict) of one sequence; padding is removed."""
        rows = _mapping_rows(enc)
        if len(rows) != 1:
            raise IdentifiableError(
                f"this BatchEncoding holds {len(rows)} sequences; trace takes one, "
                "trace_many takes a batch"
            )
        ids, tti = rows[0]
        return self.encode_ids(ids, token_type_ids=tti, truncate=truncate)

    def _token_strings(self, ids: torch.Tensor) -> list[str]:
        if self.tokenizer is None:
            return [f"<{i}>" for i in ids.tolist()]
        return list(self.tokenizer.convert_ids_to_tokens(ids.tolist()))

    def _need_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise IdentifiableError(
                f"cannot {what}: the model has no tokenizer; pass one "
                "(Model.from_hf(model, tokenizer)) or trace token ids instead"
            )
        return self.tokenizer

    # ---- tracing -------------------------------------------------------------
    def trace(self, text: ModelInput, *, truncate: bool = True) -> Trace:
        """One forward pass of one sequence, captured as a `Trace` (no padding).

        `text` is a text, a pair `(a, b)` (a tuple), token ids (list[int] or a
        1-D integer tensor, used as given) or a tokenizer's `BatchEncoding` of one
        sequence (padding positions dropped). A list of texts is refused: use a
        tuple for a pair and `trace_many` for many texts.
        """
        return self._trace_batch([self._encode_any(text, truncate)])[0]

    def trace_many(
        self,
        texts: Iterable[ModelInput] | Any,
        *,
        batch_size: int = 8,
        truncate: bool = True,
        progress: bool = False,
        column: str | None = None,
        pair_columns: tuple[str, str] | None = None,
    ) -> Iterator[Trace]:
        """Stream Traces in input order, batching with padding internally.

        `texts` is an iterable of anything `trace` accepts, a `BatchEncoding` of
        a batch, or a `datasets.Dataset` with `column=` (one text per row) or
        `pair_columns=(a, b)` (a pair per row); a Dataset with a single text
        column needs neither.

        Each result equals `trace(text)` up to float rounding (tested). Within a
        window of a few batches texts are sorted by length, so padding stays small.
        """
        if batch_size < 1:
            raise IdentifiableError(f"batch_size must be ≥ 1, got {batch_size}")
        items = self._many_items(texts, column, pair_columns)
        window = batch_size * 4
        bar = _progress(items, progress)
        buf: list[Encoding] = []
        for text in bar:
            buf.append(self._encode_any(text, truncate))
            if len(buf) == window:
                yield from self._trace_window(buf, batch_size)
                buf = []
        if buf:
            yield from self._trace_window(buf, batch_size)

    def _many_items(
        self, texts: Any, column: str | None, pair_columns: tuple[str, str] | None
    ) -> Iterable[ModelInput]:
        if _is_dataset(texts):
            return _dataset_items(texts, column, pair_columns)
        if column is not None or pair_columns is not None:
            raise IdentifiableError(
                "column= and pair_columns= apply to a datasets.Dataset; for other inputs "
                "pass the texts themselves"
            )
        if isinstance(texts, str | bytes):
            raise IdentifiableError(
                "trace_many takes many texts (a list or other iterable); for one text use trace"
            )
        if isinstance(texts, Mapping):
            if "input_ids" in texts:
                return [{"input_ids": i, "token_type_ids": t} for i, t in _mapping_rows(texts)]
            raise IdentifiableError(
                "trace_many got a mapping, which iterates over its keys: pass a list of texts, "
                "a BatchEncoding, or a datasets.Dataset with column="
            )
        return texts

    def _trace_window(self, encs: Sequence[Encoding], batch_size: int) -> Iterator[Trace]:
        order = sorted(range(len(encs)), key=lambda i: len(encs[i]))
        out: dict[int, Trace] = {}
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            for i, tr in zip(idx, self._trace_batch([encs[i] for i in idx]), strict=True):
                out[i] = tr
        for i in range(len(encs)):
            yield out.pop(i)

    def _pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(self.hf_model.config, "pad_token_id", None)
        return 0 if pad is None else int(pad)

    def _batch_inputs(self, encs: Sequence[Encoding]) -> dict[str, torch.Tensor]:
        if self.modality == "image":
            px = torch.stack([e.pixel_values for e in encs])  # type: ignore[misc]
            return {"pixel_values": px.to(self.device, dtype_of(self.hf_model))}
        n_max = max(len(e) for e in encs)
        ids = torch.full((len(encs), n_max), self._pad_id(), dtype=torch.long)
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

    def key_mask(self, n: int) -> torch.Tensor:
        """`[L, n, n]` bool: which keys each query row of each layer may attend to.

        Derived from the spec and the model's config, not from the attention
        weights: all keys (encoders), keys ≤ i (decoders), narrowed to a window
        on sliding-window/local layers (`windows`: i − j < w for decoders,
        |i − j| ≤ w for encoders, as Hugging Face builds these masks). Each
        trace checks that its attention is exactly 0 outside this mask.
        """
        return _key_masks(n, self.spec.causal, self.windows)

    def _trace_batch(self, encs: Sequence[Encoding]) -> list[Trace]:
        n_layers = self.info.n_layers
        inputs_e: list[torch.Tensor] = []
        attn_out: list[torch.Tensor] = []
        layer_out: list[torch.Tensor] = []
        embedded: list[torch.Tensor] = []

        with HookSet() as hooks, torch.no_grad():
            hooks.pre(
                self.layers[0],
                lambda m, a, k: embedded.append(self._batch_first(hidden_input(a, k))),
                with_kwargs=True,
            )
            # One hook per distinct module, recording calls in order: a layer that
            # runs several times (ALBERT shares its weights) is captured at each run.
            self._capture_attention_io(hooks, inputs_e.append, attn_out.append)
            for mod in _distinct(self.layers):
                hooks.post(
                    mod, lambda m, a, o: layer_out.append(self._batch_first(first_tensor(o)))
                )
            out = self.hf_model(**self._batch_inputs(encs), output_attentions=True)
        attentions = getattr(out, "attentions", None)
        if attentions is None or any(a is None for a in attentions):
            raise IdentifiableError(
                "the model returned no attention probabilities; load it with "
                "attn_implementation='eager' (identifiable.load_model does this for you)."
            )
        counts = {len(inputs_e), len(attn_out), len(layer_out), len(attentions)}
        if counts != {n_layers}:
            raise IdentifiableError(
                f"{n_layers} layers, but the value projection ran {len(inputs_e)} times, the "
                f"output projection {len(attn_out)}, the layers {len(layer_out)} and the model "
                f"returned {len(attentions)} attention maps; the spec '{self.spec.name}' does "
                "not match this model (see README 'Adding an architecture')."
            )
        if self.modality == "image" and attentions[0].shape[-1] != len(encs[0]):
            raise IdentifiableError(
                f"the model made {attentions[0].shape[-1]} tokens of the image but the patch "
                f"grid names {len(encs[0])}; the spec '{self.spec.name}' does not fit this model"
            )
        model_dtype = inputs_e[0].dtype
        values = [self._values(i, inputs_e[i]) for i in range(n_layers)]  # [B, H, N, d_v]
        att = torch.stack(list(attentions), 1)  # [B, L, H, N, N]
        hidden = torch.stack([embedded[0], *layer_out], 1)  # [B, L+1, N, d]
        blocks = torch.stack(attn_out, 1)  # [B, L, N, d]
        vals = torch.stack(values, 1)  # [B, L, H, N, d_v]
        b_v = torch.stack([self._per_query_head(w.b_v) for w in self._weights])  # [L, H, d_v]
        w_o = self._stacked_out_proj()
        b_o = torch.stack([w.b_o for w in self._weights])
        masks = self.key_mask(att.shape[-1]).to(att.device)  # [L, N, N]
        traces = []
        for b, e in enumerate(encs):
            n = len(e)
            a_b = att[b, :, :, :n, :n]
            mask = masks[:, :n, :n]
            _check_key_mask(a_b, mask, self.spec.name)
            traces.append(
                Trace(
                    tokens=list(e.tokens),
                    input_ids=e.input_ids.clone(),
                    attentions=a_b.float().cpu().contiguous(),
                    values=vals[b, :, :, :n].float().cpu().contiguous(),
                    value_bias=b_v.float().cpu(),
                    out_proj=w_o,
                    out_bias=b_o.float().cpu(),
                    hidden_states=hidden[b, :, :n].float().cpu().contiguous(),
                    attn_outputs=blocks[b, :, :n].float().cpu().contiguous(),
                    is_causal=self.spec.causal,
                    kv_head_of=self.kv_head_of.clone(),
                    special_tokens=dict(self.special_tokens),
                    model_name=self.info.name,
                    architecture=self.spec.name,
                    truncated=e.n_dropped,
                    key_mask=mask.cpu().contiguous(),
                    capture_dtype=str(model_dtype).removeprefix("torch."),
                )
            )
        return traces

    def _per_query_head(self, kv_rows: torch.Tensor) -> torch.Tensor:
        """[..., H_kv·d_v] → [..., H, d_v], repeating each key/value head for its query heads."""
        split = kv_rows.reshape(*kv_rows.shape[:-1], self.info.n_kv_heads, self.info.head_dim)
        return split[..., self.kv_head_of.to(split.device), :]

    def _values(self, layer: int, e: torch.Tensor) -> torch.Tensor:
        w_v = self._weights[layer].w_v
        # Half-precision models: E and W_V as the model holds them, multiplied in
        # float32, so T is exact for the captured operands (analyses use float64).
        work = torch.float32 if e.dtype in _HALF else e.dtype
        v = e.to(work) @ w_v.to(work)  # [B, N, H_kv·d_v], bias-free by definition of T
        return self._per_query_head(v).permute(0, 2, 1, 3)  # [B, H, N, d_v]

    # ---- layer streaming -------------------------------------------------------
    def iter_layers(
        self, text: ModelInput, *, truncate: bool = True
    ) -> Iterator[tuple[int, Trace]]:
        """Yield `(layer, trace)` one layer at a time, during a single forward pass.

        Each `trace` is a one-layer `Trace` of that layer (attentions `[1, H, n, n]`,
        hidden_states `[2, n, d]`: the layer's input and output) that verifies and
        feeds every analysis on its own. The forward pass runs in a worker thread
        that waits after each layer until the caller asks for the next, and the
        model is not asked for `output_attentions`, so at most one layer's n×n maps
        (two while the next is being built) are alive instead of all L: for a
        7B model (32 layers of 32 heads) at n = 4096 that is 2.1 GB per layer in
        float32 instead of 69 GB. Stopping early (break) ends the forward pass.
        """
        import queue
        import threading

        enc = self._encode_any(text, truncate)
        box: queue.Queue = queue.Queue(maxsize=1)
        stop = threading.Event()

        def worker() -> None:
            try:
                with torch.no_grad():
                    self._stream_forward(enc, box, stop)
                box.put(("done", None))
            except _StopForward:
                box.put(("done", None))
            except BaseException as exc:  # handed to the caller's thread
                box.put(("error", exc))

        thread = threading.Thread(target=worker, name="identifiable-iter-layers", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = box.get()
                if kind == "done":
                    break
                if kind == "error":
                    raise item
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # unblock a worker waiting to hand over a layer
                with contextlib.suppress(queue.Empty):
                    box.get(timeout=0.05)
            thread.join()

    def _stream_forward(self, enc: Encoding, box: Any, stop: Any) -> None:
        state: dict[str, Any] = {"layer": 0}
        parents = [_attention_module(layer, self.spec.value) for layer in self.layers]
        n = len(enc)
        masks = self.key_mask(n)

        def layer_in(m: nn.Module, a: Any, k: Any) -> None:
            if stop.is_set():
                raise _StopForward
            state["in"] = self._batch_first(hidden_input(a, k))

        def weights(m: nn.Module, a: Any, out: Any) -> None:
            maps = [
                t.permute(2, 3, 0, 1) if self.spec.sequence_first else t  # [n, n, B, H]
                for t in (out if isinstance(out, tuple | list) else (out,))
                if isinstance(t, torch.Tensor) and t.dim() == 4
            ]
            found = [t for t in maps if t.shape[-2:] == (n, n)]
            state["att"] = found[-1] if found else None

        def layer_out(m: nn.Module, a: Any, out: Any) -> None:
            i = state["layer"]
            att = state.pop("att", None)
            if att is None:
                raise IdentifiableError(
                    f"iter_layers: the attention module of the '{self.spec.name}' spec returns "
                    "no attention weights per layer; use trace() for this model"
                )
            a_i = att[0].float().cpu()[None]
            mask = masks[i : i + 1]
            _check_key_mask(a_i, mask, self.spec.name)
            w = self._weights[i]
            tr = Trace(
                tokens=list(enc.tokens),
                input_ids=enc.input_ids.clone(),
                attentions=a_i.contiguous(),
                values=self._values(i, state.pop("e"))[0].float().cpu()[None].contiguous(),
                value_bias=self._per_query_head(w.b_v).float().cpu()[None],
                out_proj=w.w_o.reshape(self.info.n_heads, self.info.head_dim, -1)
                .float()
                .cpu()[None],
                out_bias=w.b_o.float().cpu()[None],
                hidden_states=torch.stack(
                    [state.pop("in")[0], self._batch_first(first_tensor(out))[0]]
                )
                .float()
                .cpu(),
                attn_outputs=state.pop("o")[0].float().cpu()[None],
                is_causal=self.spec.causal,
                kv_head_of=self.kv_head_of.clone(),
                special_tokens=dict(self.special_tokens),
                model_name=self.info.name,
                architecture=self.spec.name,
                truncated=enc.n_dropped,
                key_mask=mask.clone(),
                capture_dtype=str(att.dtype).removeprefix("torch."),
            )
            del att
            box.put(("layer", (i, tr)))
            state["layer"] = i + 1

        with HookSet() as hooks:
            for layer in _distinct(self.layers):
                hooks.pre(layer, layer_in, with_kwargs=True)
                hooks.post(layer, layer_out)
            for mod in _distinct(parents):
                hooks.post(mod, weights)
                if (ask := ask_for_attention_weights(mod)) is not None:  # transformers 4.x
                    hooks.pre(mod, ask, with_kwargs=True)
            self._capture_attention_io(
                hooks, lambda e: state.__setitem__("e", e), lambda o: state.__setitem__("o", o)
            )
            self.hf_model(**self._batch_inputs([enc]))

    def vocabulary_embeddings(self) -> torch.Tensor:
        """`[V, d_emb]` the word-embedding matrix (no position or segment part), float32 on the CPU."""
        return self.hf_model.get_input_embeddings().weight.detach().float().cpu()

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
        captured: list[torch.Tensor] = []
        if self.modality == "image":
            last = self._last_image
            if pixel_values is None and last is not None and last[0] is input_ids:
                pixel_values = last[1]
            if pixel_values is None:
                raise IdentifiableError("embed() of an image model needs pixel_values=")

        def stop(module: nn.Module, args: Any, kwargs: Any) -> None:
            captured.append(self._batch_first(hidden_input(args, kwargs)))
            raise _StopForward

        enc = Encoding(input_ids, [], 0, token_type_ids, pixel_values)
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
        with HookSet() as hooks, self._forward_mode_experts():
            self._forward_ad_substitutes(hooks)
            hooks.pre(
                self.layers[0],
                replace_hidden_input(self._batch_first(x), first_call_only=True),
                with_kwargs=True,
            )
            for layer in _distinct(self.layers):
                hooks.post(layer, lambda m, a, o: outs.append(self._batch_first(first_tensor(o))))
            if self.modality == "image":
                self.hf_model(pixel_values=self.placeholder_pixels(x.shape[0], x.dtype))
            else:
                self.hf_model(input_ids=ids, attention_mask=torch.ones_like(ids))
        result = torch.stack([x, *outs], dim=1)
        return result if batched else result[0]

    def placeholder_pixels(self, batch: int, dtype: torch.dtype) -> torch.Tensor:
        """`[batch, C, H, W]` zeros of the model's image size, for passes whose layer inputs
        are replaced by hooks (the pixels only have to have the right size)."""
        cfg = self.hf_model.config
        shape = (int(getattr(cfg, "num_channels", 3)), *_pair(cfg.image_size))
        return torch.zeros(batch, *shape, device=self.device, dtype=dtype)

    def _forward_ad_substitutes(self, hooks: HookSet) -> None:
        """Swap in the spec's plain-torch equivalents of forward-AD-less modules (`ArchSpec.forward_ad`)."""
        for path, fn_name in self.spec.forward_ad:
            for layer in _distinct(self.layers):
                module = get_submodule(layer, path)
                fn = getattr(sys.modules[type(module).__module__], fn_name, None)
                if fn is None:  # a transformers version without it: the module is left as it is
                    continue
                hooks.replace_forward(module, fn)

    @contextlib.contextmanager
    def _forward_mode_experts(self) -> Iterator[None]:
        """Mixture-of-experts layers on the eager experts loop while `layer_outputs` runs.

        transformers 5.x dispatches experts to `grouped_mm`, which has no forward-mode
        derivative; the eager loop computes the same function. The model's own setting
        is restored afterwards.
        """
        config = self.hf_model.config
        before = getattr(config, "_experts_implementation", None)
        switch = getattr(self.hf_model, "set_experts_implementation", None)
        if before in (None, "eager") or switch is None:
            yield
            return
        switch("eager")
        try:
            yield
        finally:
            switch(before)


def _check_text(text: TextOrPair) -> tuple[str, ...]:
    if isinstance(text, list):
        raise IdentifiableError(
            "a list of texts is ambiguous: pass a pair as a tuple (text_a, text_b), "
            "or many texts to trace_many([...])"
        )
    parts = (text,) if isinstance(text, str) else tuple(text)
    if not parts or len(parts) > 2 or not all(isinstance(p, str) for p in parts):
        raise IdentifiableError("give a text (str) or a text pair (str, str)")
    for p in parts:
        if not p.strip():
            raise IdentifiableError("text is empty: give at least one non-whitespace character")
        check_unicode(p, "text")
    return parts


def _max_positions(config: Any, tokenizer: Any, spec: ArchSpec) -> int:
    positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None
    )
    # XLNet reports -1: relative positions, no limit of its own
    limit = int(positions) - spec.position_offset if positions and positions > 0 else 10**9
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


# ---- layers, windows and key masks -------------------------------------------


def _logical_layers(base: nn.Module, spec: ArchSpec) -> list[nn.Module]:
    """The layers in the order the forward pass runs them (a shared layer appears once per run)."""
    listed = list(get_submodule(base, spec.layers))
    if spec.layer_groups is None:
        return listed
    n_runs = int(base.config.num_hidden_layers)
    groups = [list(get_submodule(g, spec.layer_groups)) for g in listed]
    # ALBERT: run i uses group ⌊i / (L / G)⌋, then every layer inside that group.
    return [layer for i in range(n_runs) for layer in groups[int(i / (n_runs / len(groups)))]]


def _layer_windows(config: Any, spec: ArchSpec, n_layers: int) -> list[int | None]:
    """The attention window of each layer (None: the layer sees every key its row may see)."""
    window, types = window_config(config, spec)
    if not isinstance(window, int) or window <= 0:
        return [None] * n_layers
    if isinstance(types, list | tuple) and len(types) == n_layers:
        local = {"sliding_attention", "local"}
        return [window if t in local else None for t in types]
    return [window] * n_layers  # Mistral, Mixtral: one window for every layer


def _key_masks(n: int, causal: bool, windows: Sequence[int | None]) -> torch.Tensor:
    """`[L, n, n]` bool, see `Model.key_mask`."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    base = j <= i if causal else torch.ones(n, n, dtype=torch.bool)
    masks = []
    for w in windows:
        if w is None:
            masks.append(base)
        elif causal:
            masks.append(base & (i - j < w))
        else:
            masks.append((i - j).abs() <= w)
    return torch.stack(masks) if masks else torch.zeros(0, n, n, dtype=torch.bool)


def _check_key_mask(att: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    """The model's attention must be exactly 0 outside the key mask derived from its config."""
    if bool(mask.all()):
        return  # nothing lies outside (encoders): skip a full pass over L·H·n² weights
    outside = att.masked_fill(mask[:, None], 0)
    if bool(outside.any()):
        layer = int(outside.flatten(1).any(-1).nonzero()[0])
        raise IdentifiableError(
            f"layer {layer} attends to keys outside the mask derived from the config (spec "
            f"'{name}': causal, windows); the spec does not describe this model's masking."
        )


def _attention_module(layer: nn.Module, value_path: str) -> nn.Module:
    """The module around the value projection, whose output carries the attention weights."""
    parent = value_path.rsplit(".", 1)[0] if "." in value_path else ""
    return get_submodule(layer, parent) if parent else layer


def _distinct(modules: Sequence[nn.Module]) -> list[nn.Module]:
    seen: dict[int, nn.Module] = {}
    for m in modules:
        seen.setdefault(id(m), m)
    return list(seen.values())


# ---- inputs --------------------------------------------------------------------


def _pair(x: Any) -> tuple[int, int]:
    return (int(x[0]), int(x[1])) if isinstance(x, list | tuple) else (int(x), int(x))


def _is_pil(x: Any) -> bool:
    return type(x).__module__.startswith("PIL.") and hasattr(x, "convert")


def _looks_like_image(x: Any) -> bool:
    """A PIL image, pixel values (a float tensor of ≥ 3 dims) or an image processor's output."""
    if _is_pil(x):
        return True
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and x.dim() >= 3
    return isinstance(x, Mapping) and "pixel_values" in x


def _is_image_processor(x: Any) -> bool:
    return x is not None and callable(x) and "ImageProcessor" in type(x).__name__


def _resolve_image_processor(hf_model: nn.Module) -> Any:
    """The image processor saved beside the model's weights, or None (offline only)."""
    from pathlib import Path

    source = str(getattr(hf_model.config, "_name_or_path", "") or "")
    if not source or not Path(source).expanduser().is_dir():
        return None
    try:
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(
            str(Path(source).expanduser()), local_files_only=True
        )
    except Exception:
        return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _as_id_vector(x: Any, what: str) -> torch.Tensor:
    """A 1-D int64 tensor from a list of ints or an integer tensor (a batch of one allowed)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
    elif isinstance(x, list | tuple) and all(_is_int(v) for v in x):
        t = torch.tensor(list(x), dtype=torch.long)
    else:
        try:
            t = torch.as_tensor(x)
        except Exception:
            raise IdentifiableError(
                f"{what} must be a list of ints or a 1-D integer tensor, got {type(x).__name__}"
            ) from None
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise IdentifiableError(
            f"{what} must be a list of ints or a 1-D integer tensor, got shape "
            f"{tuple(t.shape)} of {t.dtype}"
        )
    return t.long()


def _mapping_rows(enc: Mapping) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(ids, token types) per sequence of a BatchEncoding-like mapping, padding removed."""
    if "input_ids" not in enc:
        raise IdentifiableError(
            "the mapping has no 'input_ids'; pass a tokenizer's BatchEncoding, token ids or text"
        )

    def rows(key: str) -> list[torch.Tensor] | None:
        value = enc.get(key)
        if value is None:
            return None
        t = value if isinstance(value, torch.Tensor) else None
        if t is None:
            lst = list(value)
            nested = bool(lst) and isinstance(lst[0], list | tuple | torch.Tensor)
            return [_as_id_vector(r, key) for r in lst] if nested else [_as_id_vector(lst, key)]
        t = t.detach().cpu()
        return [_as_id_vector(r, key) for r in t] if t.dim() == 2 else [_as_id_vector(t, key)]

    ids = rows("input_ids") or []
    masks = rows("attention_mask")
    types = rows("token_type_ids")
    out = []
    for b, row in enumerate(ids):
        keep = masks[b].bool() if masks is not None else torch.ones_like(row, dtype=torch.bool)
        if keep.shape != row.shape:
            raise IdentifiableError("attention_mask and input_ids have different shapes")
        out.append((row[keep], None if types is None else types[b][keep]))
    return out


def _is_dataset(obj: Any) -> bool:
    mod = sys.modules.get("datasets")
    if mod is None:
        return False
    return isinstance(obj, mod.Dataset | mod.IterableDataset)


def _dataset_items(
    ds: Any, column: str | None, pair_columns: tuple[str, str] | None
) -> Iterable[ModelInput]:
    """Texts (or pairs) from the named columns of a `datasets.Dataset`."""
    names = list(ds.column_names or [])
    if column is not None and pair_columns is not None:
        raise IdentifiableError("give column= (one text per row) or pair_columns=, not both")
    if column is None and pair_columns is None:
        features = getattr(ds, "features", None) or {}
        texts = [
            c for c in names if getattr(features.get(c), "dtype", "") in ("string", "large_string")
        ]
        if len(texts) != 1:
            raise IdentifiableError(
                f"say which column holds the texts: trace_many(ds, column=NAME) or "
                f"pair_columns=(A, B); the dataset's columns are: {', '.join(names) or 'none'}"
            )
        column = texts[0]
    wanted = [column] if column is not None else list(pair_columns or ())
    if pair_columns is not None and len(wanted) != 2:
        raise IdentifiableError(
            "pair_columns= takes two column names, e.g. ('premise', 'hypothesis')"
        )
    missing = [c for c in wanted if c not in names]
    if missing:
        raise IdentifiableError(
            f"column '{missing[0]}' is not in the dataset; its columns are: {', '.join(names)}"
        )

    def gen() -> Iterator[ModelInput]:
        for row in ds.select_columns(wanted):
            if column is not None:
                yield row[column]
            else:
                yield (row[wanted[0]], row[wanted[1]])

    return _Sized(gen(), len(ds)) if hasattr(ds, "__len__") else gen()


class _Sized:
    """An iterator with a length, so that the progress bar knows the total."""

    def __init__(self, it: Iterator[Any], n: int) -> None:
        self._it, self._n = it, n

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def __len__(self) -> int:
        return self._n
