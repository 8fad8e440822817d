"""Streaming extraction of (e^l_i, e^0_i) for every layer l from a stream of Traces.

Memory is bounded by the token cap: one buffer `[max_tokens, L+1, d]` is allocated
on the first trace and filled in place; traces are dropped as soon as they are
copied. Only whole sequences are kept (the look-up compares a token with the other
tokens of its sequence), so collection stops at the first sequence that no longer
fits. Traces arrive in corpus order and the forward pass has no randomness, so
the result is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from identifiable.errors import IdentifiableError

if TYPE_CHECKING:
    from identifiable.models.trace import Trace

STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class TokenPairs:
    """Hidden states of every layer for a set of tokens.

    Attributes:
        states: `[N, L+1, d]` float32 (or float16): `states[i, l]` is e^l_i, the
            output of layer l for token i; `states[i, 0]` is e^0_i, the input of layer 1.
        seq_ids: `[N]` int64 sequence of each token, 0 … S−1 in corpus order, in
            contiguous runs.
        input_ids: `[N]` int64 vocabulary id of each token.
        positions: `[N]` int64 position of each token in its sequence.
        n_truncated: sequences the model truncated to its maximum length.
    """

    states: torch.Tensor
    seq_ids: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    n_truncated: int = 0

    @property
    def n_tokens(self) -> int:
        return int(self.seq_ids.numel())

    @property
    def n_sequences(self) -> int:
        return int(self.seq_ids[-1]) + 1 if self.n_tokens else 0

    @property
    def n_layers(self) -> int:
        """L: the number of layers (states hold L+1 entries, e^0 included)."""
        return int(self.states.shape[1]) - 1

    @property
    def hidden_size(self) -> int:
        return int(self.states.shape[2])

    def layer(self, layer: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        """e^layer of the given rows (all if None) as float32 `[n_rows, d]`; 0 gives e^0."""
        self.check_layer(layer)
        block = self.states[:, layer] if rows is None else self.states[rows, layer]
        return block.float()

    def check_layer(self, layer: int) -> None:
        if not 0 <= layer <= self.n_layers:
            raise IdentifiableError(
                f"layer {layer} is out of range: valid layers are 0..{self.n_layers} "
                "(0 is the embedding output e^0, l the output of layer l)"
            )


def collect_token_pairs(
    traces: Iterable[Trace],
    *,
    max_tokens: int,
    dtype: torch.dtype = torch.float32,
    on_tokens: Callable[[int], None] | None = None,
) -> TokenPairs:
    """Copy the hidden states of streamed traces into one bounded buffer.

    Args:
        traces: Traces in corpus order (e.g. `model.trace_many(texts)`); each has
            `hidden_states` `[L+1, n, d]`.
        max_tokens: cap on the number of tokens kept (whole sequences only).
        dtype: storage dtype, float32 or float16 (halves memory; probes compute in float32).
        on_tokens: called with the number of tokens added after each sequence (progress).

    Returns:
        `TokenPairs` with N ≤ max_tokens tokens.

    Raises:
        IdentifiableError: bad cap, no traces, or traces of different shapes.
    """
    if max_tokens < 1:
        raise IdentifiableError(f"max_tokens must be a positive number of tokens, got {max_tokens}")
    buf: torch.Tensor | None = None
    seq_ids, input_ids, positions = (_per_token(max_tokens, (), torch.long) for _ in range(3))
    n = n_seq = n_truncated = 0
    for trace in traces:
        hs = trace.hidden_states  # [L+1, n_i, d]
        if buf is None:
            buf = _per_token(max_tokens, (hs.shape[0], hs.shape[2]), dtype)
        elif hs.shape[0] != buf.shape[1] or hs.shape[2] != buf.shape[2]:
            raise IdentifiableError(
                f"traces disagree in shape: {tuple(hs.shape)} after [L+1={buf.shape[1]}, n, "
                f"d={buf.shape[2]}]; all traces must come from one model"
            )
        k = hs.shape[1]
        if n + k > max_tokens:
            break
        buf[n : n + k] = hs.transpose(0, 1)
        seq_ids[n : n + k] = n_seq
        input_ids[n : n + k] = trace.input_ids
        positions[n : n + k] = torch.arange(k)
        n, n_seq = n + k, n_seq + 1
        n_truncated += int(trace.truncated > 0)
        if on_tokens is not None:
            on_tokens(k)
    if buf is None or n == 0:
        raise IdentifiableError(
            "no tokens collected: the corpus is empty or its first sequence is longer than "
            f"max_tokens={max_tokens}; give more text or raise --max-tokens"
        )
    # Shrink to what was filled; the untouched tail of the buffer was never paged in.
    states = buf[:n].clone() if n < max_tokens else buf
    return TokenPairs(
        states, seq_ids[:n].clone(), input_ids[:n].clone(), positions[:n].clone(), n_truncated
    )


def _per_token(max_tokens: int, tail: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """`[max_tokens, *tail]`, allocated once up front (the ids, then the states
    `[max_tokens, L+1, d]`); a cap too large for this machine is one line (torch raises
    RuntimeError, not MemoryError, when malloc refuses)."""
    try:
        return torch.empty((max_tokens, *tail), dtype=dtype)
    except (RuntimeError, MemoryError):
        size = max_tokens * math.prod(tail) * torch.empty((), dtype=dtype).element_size()
        shape = " × ".join(str(s) for s in (max_tokens, *tail))
        raise IdentifiableError(
            f"holding {max_tokens} tokens ([{shape}] {dtype}) needs {size / 2**30:.1f} GiB, "
            "more than this machine can allocate; lower max_tokens (CLI --max-tokens)"
        ) from None
