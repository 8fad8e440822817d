"""Inputs: text, pairs, token ids, a tokenizer's BatchEncoding, images and datasets → `Encoding`s,
and a batch of `Encoding`s → the keyword arguments of one forward pass.

Everything a user may hand to `Model.trace`, `trace_many` or an analysis is accepted
here or refused in one line naming what to give instead; nothing here runs the model.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.models.arguments import check_fields
from identifiable.models.compat import dtype_of
from identifiable.models.specs import ArchSpec
from identifiable.utils.checks import whole
from identifiable.utils.progress import track, watching
from identifiable.utils.unicode import check_unicode

TextOrPair = str | tuple[str, str]
ModelInput = Any
"""What `trace` accepts: a text, a pair `(a, b)`, token ids (list[int] or a 1-D
integer tensor), a tokenizer's `BatchEncoding` (or a mapping with "input_ids")
of one sequence, or an `Encoding`."""


class TruncationWarning(UserWarning):
    """A text was longer than the model's maximum positions and was cut."""


@dataclass(frozen=True)
class Encoding:
    """A tokenised text. Unpacks as `input_ids, tokens, n_dropped`."""

    input_ids: torch.Tensor  # [n] int64
    tokens: list[str]
    n_dropped: int
    token_type_ids: torch.Tensor | None = None  # [n], for models with segment embeddings
    pixel_values: torch.Tensor | None = None  # [C, H, W], image models (input_ids: positions)

    def __post_init__(self) -> None:
        check_fields(self, ("input_ids",), ("token_type_ids", "pixel_values"))
        whole(self.n_dropped, "n_dropped")

    def __iter__(self) -> Iterator[Any]:
        return iter((self.input_ids, self.tokens, self.n_dropped))

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


class InputEncoder:
    """Turns what users give into `Encoding`s in one model's own format, and batches them.

    Attributes:
        tokenizer: the model's tokenizer, or None (token ids and images need none).
        image_processor: image models: the processor for PIL images, or None.
        max_positions: the longest sequence the model takes (longer ones are cut or refused).
        limit_source: what sets it, as messages name it (the model's positions or a
            stricter tokenizer).
    """

    def __init__(
        self,
        spec: ArchSpec,
        config: Any,
        *,
        tokenizer: Any,
        name: str,
        max_positions: int,
        accepts_token_types: bool,
        image_processor: Any = None,
        limit_source: str = "",
    ) -> None:
        self.spec, self.config, self.name = spec, config, name
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.max_positions = max_positions
        self.limit_source = limit_source or f"the model's maximum of {max_positions}"
        self.accepts_token_types = accepts_token_types
        # the image of the last `encode_image`, for `embed(input_ids)` of those positions
        self.last_image: tuple[torch.Tensor, torch.Tensor] | None = None

    # ---- one sequence ------------------------------------------------------------
    def encode(self, text: ModelInput, *, truncate: bool = True) -> Encoding:
        """A text or a pair `(a, b)` in the model's own format (images: `encode_image`);
        ids, tensors, BatchEncodings and Encodings as `encode_any` takes them."""
        if self.spec.modality == "image":
            return self.encode_image(text)
        is_text = isinstance(text, str) or (
            isinstance(text, tuple) and all(isinstance(p, str) for p in text)
        )
        if not is_text:  # ids, tensors, BatchEncoding, Encoding; ambiguous lists are refused there
            return self.encode_any(text, truncate)
        parts = check_text(text)
        tokenizer = self.need_tokenizer("encode text")
        max_len = self.max_positions
        full = tokenizer(*parts, add_special_tokens=True, verbose=False)
        n_full = len(full["input_ids"])
        enc = full
        if n_full > max_len:
            if not truncate:
                raise IdentifiableError(
                    f"text has {n_full} tokens but the model takes at most {max_len} "
                    f"({self.limit_source}); shorten it or allow truncation (drop --no-truncate)."
                )
            enc = tokenizer(*parts, add_special_tokens=True, truncation=True, max_length=max_len)
            warnings.warn(
                f"text has {n_full} tokens; dropped {n_full - len(enc['input_ids'])} to fit "
                f"{self.limit_source}",
                TruncationWarning,
                stacklevel=3,
            )
        ids = torch.tensor(enc["input_ids"], dtype=torch.long)
        tti = enc.get("token_type_ids")
        return Encoding(
            input_ids=ids,
            tokens=self.token_strings(ids),
            n_dropped=n_full - len(ids),
            token_type_ids=torch.tensor(tti, dtype=torch.long) if tti is not None else None,
        )

    def encode_ids(
        self, input_ids: Any, *, token_type_ids: Any = None, truncate: bool = True
    ) -> Encoding:
        """Token ids used as given (list[int] or a 1-D integer tensor): no special tokens added."""
        ids = as_id_vector(input_ids, "input_ids")
        vocab = int(getattr(self.config, self.spec.vocab_attr, 0) or 0)
        if ids.numel() == 0:
            raise IdentifiableError("input_ids is empty: give at least one token id")
        if int(ids.min()) < 0 or (vocab and int(ids.max()) >= vocab):
            raise IdentifiableError(
                f"token ids must lie in 0..{vocab - 1} (the model's vocabulary); got "
                f"{int(ids.min())}..{int(ids.max())}"
            )
        tti = None if token_type_ids is None else as_id_vector(token_type_ids, "token_type_ids")
        if tti is not None and tti.shape != ids.shape:
            raise IdentifiableError(
                f"token_type_ids has {tti.numel()} entries but input_ids has {ids.numel()}"
            )
        n_full, max_len = int(ids.numel()), self.max_positions
        if n_full > max_len:
            if not truncate:
                raise IdentifiableError(
                    f"{n_full} token ids but the model takes at most {max_len} "
                    f"({self.limit_source}); shorten them or allow truncation"
                )
            ids = ids[:max_len]
            tti = None if tti is None else tti[:max_len]
            warnings.warn(
                f"{n_full} token ids; dropped the last {n_full - max_len} to fit "
                f"{self.limit_source}",
                TruncationWarning,
                stacklevel=3,
            )
        return Encoding(ids, self.token_strings(ids), n_full - int(ids.numel()), tti)

    def encode_any(self, item: ModelInput, truncate: bool) -> Encoding:
        """One sequence from any accepted input kind; ambiguous inputs are refused."""
        if isinstance(item, Encoding):
            return item
        if self.spec.modality == "image":
            return self.encode_image(item)
        if looks_like_image(item):
            raise IdentifiableError(
                f"'{self.name or self.spec.name}' is a text model ({self.spec.name}): give "
                "text or token ids, not an image (pixel values)"
            )
        if isinstance(item, str):
            return self.encode(item, truncate=truncate)
        if isinstance(item, torch.Tensor):
            return self.encode_ids(item, truncate=truncate)
        if isinstance(item, Mapping):
            rows = mapping_rows(item)
            if len(rows) != 1:
                raise IdentifiableError(
                    f"this BatchEncoding holds {len(rows)} sequences; trace takes one, "
                    "trace_many takes a batch"
                )
            ids, tti = rows[0]
            return self.encode_ids(ids, token_type_ids=tti, truncate=truncate)
        if isinstance(item, tuple | list):
            if item and all(isinstance(x, str) for x in item):
                if isinstance(item, tuple):
                    return self.encode(item, truncate=truncate)
                raise IdentifiableError(
                    f"a list of {len(item)} texts is ambiguous: pass a pair as a tuple "
                    "(text_a, text_b), or many texts to trace_many([...])"
                )
            if item and all(is_int(x) for x in item):
                return self.encode_ids(list(item), truncate=truncate)
        raise IdentifiableError(
            f"cannot trace a {type(item).__name__}: give a text, a pair (text_a, text_b), "
            "token ids (list[int] or a 1-D tensor) or a tokenizer's BatchEncoding"
        )

    def encode_image(self, image: Any) -> Encoding:
        """An image as the model's tokens: `spec.prefix_tokens` ([CLS]; DeiT: then [DIST]),
        then the patches row by row, named "patch(r,c)" (0-based grid row and column).

        `image` is `pixel_values` (`[C, H, W]` or `[1, C, H, W]` at the model's image
        size), a mapping holding "pixel_values" (an image processor's output), or a
        PIL image (needs the model's image processor). The `input_ids` of the
        result are the token positions 0..n-1 (images have no vocabulary).
        """
        if isinstance(image, Encoding):
            return image
        px = torch.as_tensor(self._pixels(image)).detach().cpu().float()
        if px.dim() == 4 and px.shape[0] == 1:
            px = px[0]
        size = pair(getattr(self.config, "image_size", px.shape[-1]))
        patch = pair(getattr(self.config, "patch_size", 1))
        want = (int(getattr(self.config, "num_channels", 3)), *size)
        if tuple(px.shape) != want:
            raise IdentifiableError(
                f"pixel_values has shape {tuple(px.shape)}, expected {list(want)} (the model's "
                "image size); pass a PIL image with the model's image processor"
            )
        rows, cols = size[0] // patch[0], size[1] // patch[1]
        patches = [f"patch({r},{c})" for r in range(rows) for c in range(cols)]
        tokens = [*self.spec.prefix_tokens, *patches]
        enc = Encoding(torch.arange(len(tokens)), tokens, 0, None, px)
        self.last_image = (enc.input_ids, px)
        return enc

    def _pixels(self, image: Any) -> Any:
        if isinstance(image, Mapping) and "pixel_values" in image:
            return image["pixel_values"]
        if isinstance(image, torch.Tensor) and image.is_floating_point():
            return image
        if is_pil(image):
            if self.image_processor is None:
                raise IdentifiableError(
                    "no image processor for this model: pass one "
                    "(Model.from_hf(model, image_processor=...)) or give pixel_values [C, H, W]"
                )
            return self.image_processor(images=image.convert("RGB"), return_tensors="pt")[
                "pixel_values"
            ]
        if isinstance(image, str | tuple | list | torch.Tensor):
            raise IdentifiableError(
                f"'{self.name or self.spec.name}' is a vision model ({self.spec.name}): give "
                "an image (a PIL image or pixel_values [C, H, W]), not text or token ids"
            )
        raise IdentifiableError(
            f"cannot trace a {type(image).__name__} with a vision model: give a PIL image "
            "or pixel_values [C, H, W]"
        )

    def token_strings(self, ids: torch.Tensor) -> list[str]:
        if self.tokenizer is None:
            return [f"<{i}>" for i in ids.tolist()]
        # an id the tokenizer lacks (a model's vocabulary may be larger) gives None there
        found = self.tokenizer.convert_ids_to_tokens(ids.tolist())
        return [
            t if isinstance(t, str) else f"<{i}>" for i, t in zip(ids.tolist(), found, strict=True)
        ]

    def need_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise IdentifiableError(
                f"cannot {what}: the model has no tokenizer; pass one "
                "(Model.from_hf(model, tokenizer)) or trace token ids instead"
            )
        return self.tokenizer

    # ---- batches ---------------------------------------------------------------
    def pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(self.config, "pad_token_id", None)
        return 0 if pad is None else int(pad)

    def batch(self, encs: Sequence[Encoding], hf_model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The forward pass's keyword arguments for `encs`, padded to the longest, on the
        model's device (image models: `pixel_values` in the model's dtype)."""
        device = next(hf_model.parameters()).device
        if self.spec.modality == "image":
            px = torch.stack([e.pixel_values for e in encs])  # type: ignore[misc]
            return {"pixel_values": px.to(device, dtype_of(hf_model))}
        n_max = max(len(e) for e in encs)
        ids = torch.full((len(encs), n_max), self.pad_id(), dtype=torch.long)
        mask = torch.zeros((len(encs), n_max), dtype=torch.long)
        tti = torch.zeros((len(encs), n_max), dtype=torch.long)
        for b, e in enumerate(encs):
            ids[b, : len(e)] = e.input_ids
            mask[b, : len(e)] = 1
            if e.token_type_ids is not None:
                tti[b, : len(e)] = e.token_type_ids
        inputs = {"input_ids": ids, "attention_mask": mask}
        if self.accepts_token_types:
            inputs["token_type_ids"] = tti
        return {k: v.to(device) for k, v in inputs.items()}

    def placeholder_pixels(
        self, batch: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """`[batch, C, H, W]` zeros of the model's image size, for passes whose layer inputs
        are replaced by hooks (the pixels only have to have the right size)."""
        shape = (int(getattr(self.config, "num_channels", 3)), *pair(self.config.image_size))
        return torch.zeros(batch, *shape, device=device, dtype=dtype)


def input_encoder(
    base: torch.nn.Module,
    spec: ArchSpec,
    tokenizer: Any,
    *,
    name: str = "",
    image_processor: Any = None,
    source: torch.nn.Module | None = None,
) -> InputEncoder:
    """The `InputEncoder` of a base model traced with `spec` (`source`: the model as the
    user gave it, beside whose weights an image processor may be saved)."""
    config: Any = base.config
    takes_types = "token_type_ids" in inspect.signature(base.forward).parameters
    accepts = takes_types and spec.segments.passed(config)
    limit, limited_by = position_limit(config, tokenizer, spec)
    if spec.modality == "image":
        given = image_processor if image_processor is not None else tokenizer
        image_processor, tokenizer = resolve_image_processor(source or base, given), None
    else:
        image_processor = None
    return InputEncoder(
        spec,
        config,
        tokenizer=tokenizer,
        name=name,
        max_positions=limit,
        limit_source=limited_by,
        accepts_token_types=accepts,
        image_processor=image_processor,
    )


# ---- many sequences -----------------------------------------------------------


def many_items(
    texts: Any, column: str | None, pair_columns: tuple[str, str] | None
) -> Iterable[ModelInput]:
    """The items of `trace_many`'s input: an iterable, a batched BatchEncoding or a Dataset."""
    if is_dataset(texts):
        return dataset_items(texts, column, pair_columns)
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
            return [{"input_ids": i, "token_type_ids": t} for i, t in mapping_rows(texts)]
        raise IdentifiableError(
            "trace_many got a mapping, which iterates over its keys: pass a list of texts, "
            "a BatchEncoding, or a datasets.Dataset with column="
        )
    return texts  # type: ignore[no-any-return]


def with_progress(items: Iterable[Any], enabled: bool | None) -> Iterable[Any]:
    """`items` with a bar of the texts traced (None: only when a person is watching)."""
    return track(items, "tracing", enabled=watching() if enabled is None else enabled)


def is_dataset(obj: Any) -> bool:
    mod = sys.modules.get("datasets")
    if mod is None:
        return False
    return isinstance(obj, mod.Dataset | mod.IterableDataset)


def dataset_items(
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


# ---- checks ------------------------------------------------------------------


def check_text(text: TextOrPair) -> tuple[str, ...]:
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


# Where families keep their context length: BERT, Llama, …; GPT-2, GPT-J; GPT-2's older
# name; MPT; ChatGLM and Qwen-1.
_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")


def position_limit(config: Any, tokenizer: Any, spec: ArchSpec) -> tuple[int, str]:
    """(the longest sequence the model takes, what sets it, for messages).

    The model's own context length (its position table less the spec's offset, from the
    family's config field), unless the tokenizer's `model_max_length` is stricter; a
    model without one (relative positions: XLNet's −1, ALiBi) takes what its tokenizer
    allows."""
    field = next((f for f in _POSITION_FIELDS if _positive(getattr(config, f, None))), None)
    model = int(getattr(config, field)) - spec.position_offset if field else None
    field = _field_name(config, field) if field else None
    tok_max: Any = getattr(tokenizer, "model_max_length", None)
    tok = int(tok_max) if _positive(tok_max) and tok_max < 10**6 else None
    if tok is not None and (model is None or tok < model):
        besides = f", stricter than the model's {model} ({field})" if model else ""
        return tok, f"the tokenizer's model_max_length of {tok}{besides}"
    if model is None:
        return 10**9, "no limit of the model's own"
    return model, f"the model's maximum of {model} positions ({field})"


def _field_name(config: Any, field: str) -> str:
    """The config's own name of `field` (GPT-2 spells max_position_embeddings n_positions)."""
    aliases = getattr(config, "attribute_map", None)
    return str(aliases.get(field, field)) if isinstance(aliases, dict) else field


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def resolve_tokenizer(hf_model: torch.nn.Module, tokenizer: Any) -> Any:
    """The given tokenizer, else the one saved beside the model's weights (or None)."""
    if tokenizer is not None:
        return tokenizer
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


def resolve_image_processor(hf_model: torch.nn.Module, given: Any) -> Any:
    """`given` if it is an image processor, else the one saved beside the weights, or None."""
    if given is not None and callable(given) and "ImageProcessor" in type(given).__name__:
        return given
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


def pair(x: Any) -> tuple[int, int]:
    return (int(x[0]), int(x[1])) if isinstance(x, list | tuple) else (int(x), int(x))


def is_pil(x: Any) -> bool:
    return type(x).__module__.startswith("PIL.") and hasattr(x, "convert")


def looks_like_image(x: Any) -> bool:
    """A PIL image, pixel values (a float tensor of ≥ 3 dims) or an image processor's output."""
    if is_pil(x):
        return True
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and x.dim() >= 3
    return isinstance(x, Mapping) and "pixel_values" in x


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def as_id_vector(x: Any, what: str) -> torch.Tensor:
    """A 1-D int64 tensor from a list of ints or an integer tensor (a batch of one allowed)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
    elif isinstance(x, list | tuple) and all(is_int(v) for v in x):
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


def mapping_rows(enc: Mapping[str, Any]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(ids, token types) per sequence of a BatchEncoding-like mapping, padding removed."""
    if "input_ids" not in enc:
        raise IdentifiableError(
            "the mapping has no 'input_ids'; pass a tokenizer's BatchEncoding, token ids or text"
        )

    def rows(key: str) -> list[torch.Tensor] | None:
        value = enc.get(key)
        if value is None:
            return None
        if not isinstance(value, torch.Tensor):
            lst = list(value)
            nested = bool(lst) and isinstance(lst[0], list | tuple | torch.Tensor)
            return [as_id_vector(r, key) for r in lst] if nested else [as_id_vector(lst, key)]
        t = value.detach().cpu()
        return [as_id_vector(r, key) for r in t] if t.dim() == 2 else [as_id_vector(t, key)]

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
