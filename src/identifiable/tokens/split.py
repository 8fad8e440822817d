"""Train / validation / test split by sequence, never by token.

Tokens of one sequence share context, so a probe tested on a token whose
neighbours it was trained on would be tested on partly seen data. Every split
here assigns whole sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from identifiable.errors import IdentifiableError

MIN_SEQUENCES = 3  # one each for train, validation and test


def min_tokens_for(hidden_size: int) -> int:
    """Fewest tokens worth splitting: the training part must determine an affine map.

    An affine probe on width d has d + 1 coefficients per output; with the default
    fractions (test 20 %, validation 10 % of the rest) about 72 % of the tokens train
    it, so 2·(d + 1) tokens leave the training part over-determined.
    """
    return 2 * (hidden_size + 1)


@dataclass(frozen=True)
class SequenceSplit:
    """Token indices of each part, `[n_part]` int64, sorted; sequences never straddle parts."""

    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor

    def sequences(self, seq_ids: torch.Tensor) -> tuple[set[int], set[int], set[int]]:
        """The sequence ids of each part (for checks and reports)."""
        return tuple(set(seq_ids[p].tolist()) for p in (self.train, self.val, self.test))  # type: ignore[return-value]


def split_by_sequence(
    seq_ids: torch.Tensor,
    *,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    seed: int = 0,
    min_tokens: int = 0,
) -> SequenceSplit:
    """Assign whole sequences to train, validation and test.

    Args:
        seq_ids: `[N]` int64 sequence id of each token.
        test_fraction: share of sequences held out for testing.
        val_fraction: share of the remaining sequences held out for early stopping.
        seed: seeds the sequence permutation (a private `torch.Generator`).
        min_tokens: raise unless at least this many tokens are given.

    Returns:
        A `SequenceSplit`; each part keeps at least one sequence.

    Raises:
        IdentifiableError: too few tokens or sequences, or fractions outside (0, 1).
    """
    for name, frac in (("test_fraction", test_fraction), ("val_fraction", val_fraction)):
        if not 0.0 < frac < 1.0:
            raise IdentifiableError(f"{name} must lie strictly between 0 and 1, got {frac}")
    n_tokens = int(seq_ids.numel())
    unique = torch.unique(seq_ids)
    n_seq = int(unique.numel())
    if n_tokens < min_tokens or n_seq < MIN_SEQUENCES:
        raise IdentifiableError(
            f"too few tokens to split by sequence: got {n_tokens} tokens in {n_seq} sequences, "
            f"need at least {max(min_tokens, MIN_SEQUENCES)} tokens in at least {MIN_SEQUENCES} "
            "sequences; raise --max-tokens or use a larger corpus"
        )
    gen = torch.Generator().manual_seed(seed)
    order = unique[torch.randperm(n_seq, generator=gen)]
    n_test = min(max(1, round(test_fraction * n_seq)), n_seq - 2)
    n_val = min(max(1, round(val_fraction * (n_seq - n_test))), n_seq - n_test - 1)
    parts = (order[n_test + n_val :], order[n_test : n_test + n_val], order[:n_test])
    train, val, test = (torch.nonzero(torch.isin(seq_ids, p)).flatten() for p in parts)
    return SequenceSplit(train=train, val=val, test=test)
