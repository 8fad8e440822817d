"""The decoder side of an encoder–decoder model, for `Seq2SeqModel` (models/model.py).

An encoder–decoder model's encoder is a plain `Model`; its decoder adds two
`AttentionStack`s over the decoder's layers, the causal self-attention and the
cross-attention whose keys are the encoder's outputs. This module builds them
(`decoder_side`), forms the decoder's input (`decoder_ids`: the target shifted right
behind the start token) and traces one (source, target) pass into the three `Trace`s of
a `Seq2SeqTrace` (`trace_pair`). It knows nothing of `Model`, so models/model.py imports
it and not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models import backends
from identifiable.models.capture import TraceBuilder, TraceMeta
from identifiable.models.compat import seq2seq_forward_options
from identifiable.models.encoding import Encoding, ModelInput, as_id_vector, is_int
from identifiable.models.hooks import HookSet, get_submodule
from identifiable.models.protocol import ModelInfo
from identifiable.models.specs import Seq2SeqSpec, all_seq2seq_specs, find_seq2seq_spec
from identifiable.models.stack import AttentionStack, logical_layers
from identifiable.models.trace import Seq2SeqTrace
from identifiable.models.unsupported import refuse


def seq2seq_spec(base: nn.Module) -> Seq2SeqSpec:
    """The spec of an encoder–decoder base model; one line refusing its family by name
    (models/unsupported.py) or listing the known ones if none."""
    refuse(base)
    model_type = str(getattr(base.config, "model_type", ""))
    spec = find_seq2seq_spec(model_type)
    if spec is None:
        known = sorted(t for s in all_seq2seq_specs() for t in s.model_types)
        raise IdentifiableError(
            f"encoder–decoder architecture '{model_type}' is not supported; "
            f"supported: {', '.join(known)}. Describe it with a Seq2SeqSpec "
            "(identifiable.models.specs) and pass spec=... or register_spec(spec)"
        )
    return spec


@dataclass(frozen=True)
class DecoderSide:
    """The decoder's layers, its two stacks (self-attention, cross-attention), its
    `ModelInfo` (causal) and the token id decoding starts from."""

    layers: list[nn.Module]
    self_stack: AttentionStack
    cross_stack: AttentionStack
    info: ModelInfo
    start_token_id: int


def decoder_side(base: nn.Module, spec: Seq2SeqSpec, enc_info: ModelInfo, name: str) -> DecoderSide:
    """The decoder of `base` (the base model) as two stacks, sized from its config (the
    head count falls back to the encoder's, the head width to hidden size / heads)."""
    config: Any = base.config
    layers = logical_layers(get_submodule(base, spec.decoder_stack), spec.decoder)
    heads = int(getattr(config, spec.decoder_heads_attr, None) or enc_info.n_heads)
    head_dim = int(getattr(config, "head_dim", None) or enc_info.hidden_size // heads)
    self_stack, cross_stack = (
        AttentionStack(
            layers,
            part,
            n_heads=heads,
            head_dim=head_dim,
            hidden_size=enc_info.hidden_size,
            label=label,
        )
        for part, label in ((spec.decoder, "decoder"), (spec.cross, "cross"))
    )
    info = ModelInfo(
        name=name,
        architecture=spec.name,
        model_type=str(config.model_type),
        n_layers=len(layers),
        n_heads=heads,
        n_kv_heads=self_stack.n_kv_heads,
        head_dim=head_dim,
        hidden_size=enc_info.hidden_size,
        max_positions=enc_info.max_positions,
        is_causal=True,
    )
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:  # T5 starts decoding from the pad token
        start = getattr(config, "pad_token_id", None)
    return DecoderSide(layers, self_stack, cross_stack, info, int(start or 0))


def decoder_ids(
    target: ModelInput | None,
    source_ids: torch.Tensor,
    start_token_id: int,
    encode: Callable[[Any], Encoding],
) -> torch.Tensor:
    """The decoder's input ids: the target's ids shifted right behind the start token
    (what the decoder reads in training with `labels=target`). A text target is encoded
    with `encode`; without a target the source ids are used."""
    if target is None:
        labels = source_ids
    elif isinstance(target, str | tuple):
        labels = encode(target).input_ids
    elif isinstance(target, torch.Tensor) or (
        isinstance(target, list) and target and all(is_int(x) for x in target)
    ):
        labels = as_id_vector(target, "target")
    else:
        raise IdentifiableError(
            f"target must be a text or token ids (list[int] or a 1-D tensor), got "
            f"{type(target).__name__}"
        )
    if labels.numel() == 0:
        raise IdentifiableError("the target is empty: give at least one token")
    return torch.cat([torch.tensor([start_token_id]), labels[:-1]])


def trace_pair(
    hf_model: nn.Module,
    stacks: tuple[AttentionStack, AttentionStack, AttentionStack],
    src: Encoding,
    dec: Encoding,
    meta: TraceMeta,
) -> Seq2SeqTrace:
    """One forward pass of (`src`, `dec`) through `hf_model` (the base model), tapped by
    the (encoder, decoder, cross) `stacks` into a `Seq2SeqTrace`."""
    encoder = TraceBuilder(stacks[0], [src])
    decoder = TraceBuilder(stacks[1], [dec])
    cross = TraceBuilder(stacks[2], [dec], [src], hidden=False)
    device = next(hf_model.parameters()).device
    # eager for the pass only: the cross- and decoder maps come from eager's probabilities
    with HookSet() as hooks, torch.no_grad(), backends.eager(hf_model):
        for builder in (encoder, decoder, cross):
            builder.stack.tap(hooks, builder, builder.taps, map_shape=builder.map_shape)
        ids, dids = src.input_ids[None].to(device), dec.input_ids[None].to(device)
        hf_model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            decoder_input_ids=dids,
            decoder_attention_mask=torch.ones_like(dids),
            use_cache=False,
            **seq2seq_forward_options(),
        )
    dec_trace = decoder.traces(meta)[0]
    return Seq2SeqTrace(
        encoder=encoder.traces(meta)[0],
        decoder=dec_trace,
        cross=cross.traces(meta, hidden_states=[dec_trace.hidden_states])[0],
    )
