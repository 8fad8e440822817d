"""The report's prose: title, claim and explanation of each paper section, as data.

`report/document.py` fills the `{placeholders}` (`str.format`) with values measured on
the run: `d_v` (the head width), `effective_note` and `change_note` (section 2) and
`group_normalisation` (section 5). The text is the reader's contract with the verdicts
below it, so it lives in one place, apart from the code that lays the page out.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Prose(NamedTuple):
    """One section's words: its heading, the paper's claim, and how to read the figures."""

    title: str
    claim: str
    explain: str


EFFECTIVE_NOTE = (
    "Effective attention is not a probability distribution: it is raw attention with its null-space part "
    "removed. That part cannot change the head's output as the paper writes it, A·E·W_V·H, without the value "
    "bias (A_eff T = A T for T = E W_V H); the model's heads also add the value bias b_V, and since the rows "
    "of A_eff need not sum to 1, replacing A by A_eff does change the real head output (measured below). "
    "Its entries may be negative and its rows need not sum to 1."
)

PROSE: dict[str, Prose] = {
    "attention": Prose(
        "1. Attention is not identifiable beyond the head width",
        "Once a sequence has more tokens than the head width (d_v = {d_v} here), many different attention "
        "matrices give exactly the same head output, so raw and effective attention part ways: their Pearson "
        "correlation is exactly 1 up to n = d_v and falls beyond (paper Fig. 1a).",
        "Left: each dot is one sequence; r compares every raw attention weight with its effective counterpart "
        "(all heads and layers pooled). Middle: the measured null-space dimension, with the lower bound n − d_v. "
        "The dotted line marks the head width, where non-identifiability starts. r = 1 below d_v holds by "
        "construction (there A_eff = A); the verdict tests the fall beyond it.",
    ),
    "effective": Prose(
        "2. Effective attention pays little attention to [CLS], [SEP] and punctuation",
        "Raw attention piles up on [CLS], [SEP] and punctuation in some layers, but much of that weight lies in "
        "the null space: effective attention to these tokens is far smaller (paper Figs. 1b, 1c).",
        "Dots: one head each (average attention its query tokens pay to the token type); lines: the layer mean. "
        "{effective_note} {change_note}",
    ),
    "tokens": Prose(
        "3. Hidden tokens stay largely identifiable",
        "A probe that maps a hidden state back to the input embeddings finds the token's own input as the "
        "nearest candidate for most tokens at every layer; cosine beats L2 (identity lives in the angle) and "
        "the rate falls with depth yet stays high (paper Fig. 2).",
        "Rate: share of test tokens (held-out sequences) whose nearest input embedding, among the sequence's "
        "own, is their own; bands are 95% intervals; the dotted grey line is a probe fitted on shuffled "
        "targets, which should sit at chance. How each probe was fitted and what stopped it is in the "
        "caption (computed from the table below, which gives every fit's optimiser, steps, stop reason, "
        "final training and validation loss and whether it finished) and in Methods; every loss curve is "
        "in tables/fig2a_fits.csv. Fig. 2b: a linear cosine probe "
        "trained on one layer, tested on every layer, fitted from two starts (the least-squares fit and the "
        "identity), each refined to validation early stopping, because the transfer depends on where the "
        "fit starts.",
    ),
    "attribution": Prose(
        "4. Tokens mix: a hidden token owes less and less to its own input",
        "Hidden Token Attribution measures how much each input token contributes to a hidden token (gradient "
        "norms, rows sum to 100%). The share of the token's own input falls with depth, and in deeper layers "
        "a growing share of tokens gets more from another input than from its own (paper Fig. 3).",
        "Left: the median over tokens of the contribution of the token's own input, with its quartiles "
        "(band), each with a 95% bootstrap interval over sequences. Second figure: percent of tokens whose "
        "largest contributor is another input. Both depend on sequence length, so the pairs are drawn from "
        "the paper's length range.",
    ),
    "neighbours": Prose(
        "5. Contributions come from nearby tokens first, then spread",
        "Inputs close to a token contribute most to it in early layers; with depth the contributions spread "
        "to tokens further away (paper Fig. 4).",
        "Fig. 4a normalisation ({group_normalisation}); the paper does not state its own, so compare "
        "shapes, not levels. Fig. 4b: total contribution of the input at each relative position (the token "
        "itself left out), normalised to a maximum of 1 per layer. Bands: 95% bootstrap intervals over "
        "sequences.",
    ),
}
"""Section key → its prose, in report order."""


def not_analysed(info: Any) -> str:
    """ "; layers 0, 2 are mamba (…): not softmax attention, not analysed" for a hybrid
    stack (only its softmax-attention layers are traced), else ""."""
    line = getattr(info, "not_analysed", "")
    return f"; {line}" if line else ""


def dequantized(info: Any) -> str:
    """ ", weights dequantized from GGUF Q4_1" for a model loaded from a GGUF file, else ""."""
    q = getattr(info, "dequantized_from", "")
    return f", weights dequantized from {q}" if q else ""
