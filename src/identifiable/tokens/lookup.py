"""Nearest-neighbour look-up of probe outputs among candidate e^0 vectors.

Token i is identified when the candidate nearest to ĝ(e^l_i), under the distance
that matches the probe's objective (Euclidean for L2, 1 − cos for cosine), is its
own e^0_i. Look-ups are matrix products over chunks, never Python loops over tokens.

Ties: a model without absolute positions gives a repeated token the same e^0
(bit for bit), so the look-up cannot tell the two apart. Candidates are grouped
into classes of identical vectors; `success` counts the nearest candidate being in
the own class (a tie counts as success), `strict` additionally requires the own
vector to be unique among the candidates, and `tied` marks tokens whose own
vector is not unique.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Metric = Literal["l2", "cos"]
_CHUNK_ELEMENTS = 1 << 24  # bound on the scores held at once (64 MiB in float32)
_GROUP = 8  # sequences per batched look-up


def _scores(pred: torch.Tensor, cand: torch.Tensor, metric: Metric) -> torch.Tensor:
    """Scores whose argmin is the nearest candidate, `[..., n_pred, n_cand]`.

    Terms constant over candidates (‖p‖², ‖p‖) are dropped: they do not move the argmin.
    """
    dots = pred @ cand.transpose(-1, -2)
    if metric == "l2":
        return (cand * cand).sum(-1).unsqueeze(-2) - 2.0 * dots
    norms = torch.linalg.vector_norm(cand, dim=-1).clamp_min(1e-12)
    return -dots / norms.unsqueeze(-2)


def nearest_in_set(pred: torch.Tensor, cand: torch.Tensor, metric: Metric) -> torch.Tensor:
    """Index of the nearest candidate for every prediction.

    Args:
        pred: `[N, d]` probe outputs.
        cand: `[M, d]` candidates.
    Returns:
        `[N]` int64 indices into `cand`.
    """
    step = max(1, _CHUNK_ELEMENTS // max(1, cand.shape[0]))
    out = [
        _scores(pred[s : s + step], cand, metric).argmin(-1) for s in range(0, pred.shape[0], step)
    ]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long)


@dataclass(frozen=True)
class SequenceLayout:
    """Tokens of an evaluation set grouped by sequence, padded into a rectangle.

    `index[s, k]` is the row (in the evaluation set) of the k-th token of sequence s,
    or -1 past its end. Built once per evaluation set and reused for every probe.
    """

    index: torch.Tensor  # [S, n_max] int64
    lengths: torch.Tensor  # [S] int64

    @classmethod
    def from_seq_ids(cls, seq_ids: torch.Tensor) -> SequenceLayout:
        """`seq_ids`: `[N]` sequence id of each evaluation row (any order)."""
        order = torch.argsort(seq_ids, stable=True)
        _, lengths = torch.unique_consecutive(seq_ids[order], return_counts=True)
        n_max = int(lengths.max()) if lengths.numel() else 0
        index = torch.full((lengths.numel(), n_max), -1, dtype=torch.long)
        starts = torch.cumsum(lengths, 0) - lengths
        col = torch.arange(order.numel()) - torch.repeat_interleave(starts, lengths)
        row = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
        index[row, col] = order
        return cls(index=index, lengths=lengths)


def nearest_in_sequence(
    pred: torch.Tensor, cand: torch.Tensor, layout: SequenceLayout, metric: Metric
) -> torch.Tensor:
    """Nearest candidate among the tokens of the prediction's own sequence.

    Args:
        pred: `[N, d]` probe outputs, row r for evaluation token r.
        cand: `[N, d]` candidate e^0, row r for evaluation token r.
        layout: the grouping of the N rows by sequence.
    Returns:
        `[N]` int64 row (into `cand`) of the nearest same-sequence candidate.
    """
    s_total, n_max = layout.index.shape
    out = torch.empty(pred.shape[0], dtype=torch.long)
    # Sequences in order of length, a few at a time, each group padded only to its own
    # longest: lengths vary (12 … 128 tokens), and padding to the overall longest
    # would about double the work.
    by_length = torch.argsort(layout.lengths)
    step = max(1, min(_GROUP, _CHUNK_ELEMENTS // max(1, n_max * n_max)))
    for s in range(0, s_total, step):
        rows = by_length[s : s + step]
        idx = layout.index[rows, : int(layout.lengths[rows].max())]  # [S', n']
        valid = idx >= 0
        safe = idx.clamp_min(0)
        scores = _scores(pred[safe], cand[safe], metric)  # [S', n_max, n_max]
        scores.masked_fill_(~valid.unsqueeze(1), math.inf)
        best = scores.argmin(-1)  # [S', n_max] column of the nearest candidate
        out[idx[valid]] = torch.gather(idx, 1, best)[valid]
    return out


def identical_classes(vectors: torch.Tensor) -> torch.Tensor:
    """Class id of every row, equal exactly when two rows are bit-for-bit identical. `[M]` int64."""
    return torch.unique(vectors, dim=0, return_inverse=True)[1]


@dataclass(frozen=True)
class LookupOutcome:
    """Per-token outcome of one look-up. All `[N]`."""

    success: torch.Tensor  # bool: nearest candidate is (identical to) the own e^0
    strict: torch.Tensor  # bool: success and the own e^0 is unique among the candidates
    tied: torch.Tensor  # bool: the own e^0 has an identical twin among the candidates
    chance: torch.Tensor  # float64: success probability of a uniformly random guess


def score_lookup(
    nearest: torch.Tensor,
    own: torch.Tensor,
    classes: torch.Tensor,
    n_candidates: torch.Tensor,
    own_class_size: torch.Tensor,
) -> LookupOutcome:
    """Turn nearest-candidate indices into outcomes.

    Args:
        nearest: `[N]` index of the nearest candidate.
        own: `[N]` index of the token's own candidate.
        classes: `[M]` identical-vector class of each candidate.
        n_candidates: `[N]` number of candidates each token chose among.
        own_class_size: `[N]` candidates (own included) identical to the own one.
    """
    success = classes[nearest] == classes[own]
    tied = own_class_size > 1
    return LookupOutcome(
        success=success,
        strict=success & ~tied,
        tied=tied,
        chance=own_class_size.double() / n_candidates.double(),
    )


def sequence_class_sizes(classes: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
    """For every evaluation row, how many rows of its sequence share its class (itself included). `[N]`."""
    n = classes.numel()
    seq_of = torch.empty(n, dtype=torch.long)
    rows = torch.repeat_interleave(torch.arange(layout.lengths.numel()), layout.lengths)
    seq_of[layout.index[layout.index >= 0]] = rows
    key = seq_of * (int(classes.max()) + 1 if n else 1) + classes
    _, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
    return counts[inverse]


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95 % Wilson score interval for a binomial rate (sensible at rates near 0 or 1)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At p = 0 or 1 one bound is exactly 0 or 1; say so instead of 1 − 1e-16.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


@dataclass(frozen=True)
class CandidateLookup:
    """The candidate set of one evaluation, built once and reused for every probe and layer."""

    cand: torch.Tensor  # [M, d']
    own: torch.Tensor  # [N] own candidate of each test token
    classes: torch.Tensor  # [M]
    n_candidates: torch.Tensor  # [N]
    own_class_size: torch.Tensor  # [N]
    layout: SequenceLayout | None

    def run(self, pred: torch.Tensor, metric: Metric) -> LookupOutcome:
        pred = pred.to(self.cand.device)  # candidates stay on the CPU, probes may not
        if self.layout is not None:
            nearest = nearest_in_sequence(pred, self.cand, self.layout, metric)
        else:
            nearest = nearest_in_set(pred, self.cand, metric)
        return score_lookup(nearest, self.own, self.classes, self.n_candidates, self.own_class_size)


def build_lookup(
    candidates: str,
    y_test: torch.Tensor,
    seq_test: torch.Tensor,
    ids_test: torch.Tensor,
    vocab: torch.Tensor | None,
) -> CandidateLookup:
    """The lookup of `candidates` ("sequence", "corpus" or "vocabulary") for the test tokens."""
    n = y_test.shape[0]
    if candidates == "vocabulary":
        assert vocab is not None
        classes = identical_classes(vocab)
        sizes = torch.bincount(classes)[classes[ids_test]]
        return CandidateLookup(
            vocab, ids_test, classes, torch.full((n,), vocab.shape[0]), sizes, None
        )
    classes = identical_classes(y_test)
    own = torch.arange(n)
    if candidates == "corpus":
        sizes = torch.bincount(classes)[classes]
        return CandidateLookup(y_test, own, classes, torch.full((n,), n), sizes, None)
    layout = SequenceLayout.from_seq_ids(seq_test)
    valid = layout.index >= 0
    n_cand = torch.empty(n, dtype=torch.long)
    n_cand[layout.index[valid]] = layout.lengths[:, None].expand_as(layout.index)[valid]
    return CandidateLookup(
        y_test, own, classes, n_cand, sequence_class_sizes(classes, layout), layout
    )


def lookup_summary(outcome: LookupOutcome) -> dict[str, float | int]:
    """rate with its Wilson interval, strict rate, tokens, ties and chance of one lookup."""
    n = int(outcome.success.numel())
    k = int(outcome.success.sum())
    low, high = wilson_interval(k, n)
    return {
        "rate": k / n if n else float("nan"),
        "ci_low": low,
        "ci_high": high,
        "rate_strict": float(outcome.strict.double().mean()) if n else float("nan"),
        "n_tokens": n,
        "n_tied": int(outcome.tied.sum()),
        "chance": float(outcome.chance.mean()) if n else float("nan"),
    }
