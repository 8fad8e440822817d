"""Families refused by name: one line that says why a model cannot be analysed here.

identifiable analyses softmax attention over token ids: A·(E W_V) W_O per head, with A a
softmax over the keys. A family that feeds other inputs (audio samples, spectrogram frames,
pixels, layout boxes beside the tokens) or whose attention is not one softmax map per head
over its keys (chunked sliding-window attention, block-sparse, LSH-sampled, n-gram streams)
is refused before discovery or the encoder–decoder table is consulted, in one line naming
the family and the reason, instead of a failure to find or prove a spec.

`REFUSED` is data, like the spec table: one `Refusal` per kind of attention, naming the
model types (and, where a config switch selects the attention, the value refused). The
input check is generic: a base model whose forward takes no `input_ids` is refused with the
input it takes instead.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from torch import nn

from identifiable.errors import IdentifiableError

_NOT_A_MAP = "not a softmax attention map per head over its keys: not analysed"


@dataclass(frozen=True)
class Refusal:
    """Model types refused by name, and why (the phrase after "'type' ").

    Attributes:
        model_types: `config.model_type` values refused.
        reason: what the family does, ending in what follows for the user.
        attr, value: refused only when `config.<attr> == value` (the attention a config
            switch selects); "" refuses every model of the types.
    """

    model_types: tuple[str, ...]
    reason: str
    attr: str = ""
    value: object = None


REFUSED: tuple[Refusal, ...] = (
    Refusal(
        ("longformer", "led"),
        f"uses sliding-window plus global attention computed in chunks, {_NOT_A_MAP}",
    ),
    Refusal(
        ("big_bird", "bigbird_pegasus"),
        "uses block-sparse attention (window, global and random blocks), "
        f"{_NOT_A_MAP}; load it with attention_type='original_full' for full attention",
        attr="attention_type",
        value="block_sparse",
    ),
    Refusal(
        ("longt5",),
        f"uses local (or transient-global) attention over blocks of the sequence, {_NOT_A_MAP}",
    ),
    Refusal(
        ("pegasus_x",),
        f"uses block-local attention with global tokens in its encoder, {_NOT_A_MAP}",
    ),
    Refusal(
        ("prophetnet", "xlm-prophetnet"),
        "decodes with n-gram self-attention over a main and several predicting streams, "
        "not one softmax attention map per head: not analysed",
    ),
    Refusal(("mra",), f"uses multi-resolution block approximations of attention, {_NOT_A_MAP}"),
    Refusal(("yoso",), f"uses LSH-sampled (Bernoulli) attention, {_NOT_A_MAP}"),
    Refusal(
        ("convbert",),
        "mixes tokens with span-based dynamic convolution heads beside its attention heads, "
        "and its output projection reads both: not analysed",
    ),
    Refusal(
        ("deepseek_v4",),
        "attends to a window of tokens plus keys pooled over blocks of tokens (compressed "
        "keys, some picked by an indexer), so its map's keys are not the tokens; its values "
        "carry RoPE that is undone at each query, so W_O differs per row: not analysed",
    ),
    Refusal(
        ("hy_v4",),
        "gates each head's output after the attention (a sigmoid of the query's hidden "
        "state times A·V, so a head's output is not A·(E W_V)) and carries several residual "
        "streams between layers (hyper-connections): not analysed",
    ),
    Refusal(
        ("mimo_v2_flash",),
        "gives its sliding-window layers twice the key/value heads of its full-attention "
        "layers, and a trace holds one grouping of query heads onto key/value heads for "
        "every layer: not supported",
    ),
    Refusal(
        ("longcat_flash",),
        "runs two attention sublayers in each layer (self_attn.0 and self_attn.1, each with "
        "its own MLP, beside a shortcut mixture of experts), so a layer has two maps per head "
        "and no layer output between them: not supported",
    ),
    Refusal(
        ("zamba2",),
        "runs one shared attention block at several depths, reading the hidden state and the "
        "input embeddings side by side (width 2d) through per-depth adapters: not supported",
    ),
    Refusal(
        ("inkling2_text",),
        "convolves its keys and values over neighbouring tokens and gates each head's output, "
        "so a head's output is not A·(E W_V): not analysed",
    ),
    Refusal(
        ("hrm_text",),
        "runs its two layer stacks recurrently, several cycles per token, so a layer has no "
        "single attention map: not analysed",
    ),
    Refusal(
        ("fastspeech2_conformer",),
        "is a text-to-speech model (conformer blocks, a variance adaptor, spectrogram "
        "output): not supported",
    ),
    Refusal(
        ("seamless_m4t", "seamless_m4t_v2"),
        "is a speech-and-text translation model whose base model holds several towers: "
        "not supported",
    ),
    Refusal(("bros",), "needs layout boxes (bbox) besides token ids: not supported"),
    Refusal(("lxmert",), "needs visual features besides token ids: not supported"),
    Refusal(("vilt",), "needs an image (pixel_values) besides token ids: not supported"),
    Refusal(("udop",), "needs layout boxes and an image besides token ids: not supported"),
    Refusal(
        ("blip_2_qformer",),
        "reads learned query embeddings and image features, not token ids: not supported",
    ),
)

_INPUTS = {
    "input_values": "audio input (input_values)",
    "input_features": "audio features (input_features)",
    "pixel_values": "image input (pixel_values)",
}


def refusal(base: nn.Module) -> str | None:
    """The one line refusing `base` (a Hugging Face base model) by name, or None."""
    config: Any = getattr(base, "config", None)
    model_type = str(getattr(config, "model_type", "") or type(base).__name__)
    for entry in REFUSED:
        if model_type in entry.model_types and (
            not entry.attr or getattr(config, entry.attr, None) == entry.value
        ):
            return f"'{model_type}' {entry.reason}"
    try:
        params = list(inspect.signature(base.forward).parameters)
    except (TypeError, ValueError):
        return None
    if "input_ids" in params:
        return None
    takes = next((what for name, what in _INPUTS.items() if name in params), None)
    if takes is None:
        takes = f"'{params[0]}'" if params else "no inputs"
    if "pixel_values" in params:  # image families need a spec that says where the patches go
        return (
            f"'{model_type}' takes {takes}, not token ids: image models are traced with a spec "
            "(modality='image', as vit, deit and clip in the table), not discovered"
        )
    return f"'{model_type}' takes {takes}, not token ids: not supported"


def refuse(base: nn.Module) -> None:
    """Raise the one line of `refusal` when there is one."""
    line = refusal(base)
    if line is not None:
        raise IdentifiableError(line)
