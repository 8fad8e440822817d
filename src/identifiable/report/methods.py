"""The report's Methods section: splits, probe fitting, sample sizes, estimator, deviations.

Every number comes from the tables of the run (`fig2_split`, `fig2_protocol`,
`fig2a_identifiability`, `fig34_estimator`) and its settings.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from identifiable.report import tokens_section
from identifiable.report.html import Markup, h, table_html

CAUSAL_ROWS = (
    "The model is causal: query row i attends to keys 0..i only, so each row has its own value "
    "matrix, the first i + 1 rows of T = E·W_V·H, and its own null space, of dimension "
    "i + 1 − rank(T≤i) ≥ i + 1 − d_v (d_v = {d_v}). Effective attention projects each row onto "
    "the row space of its own prefix; masked entries are exactly 0 in A and A_eff and are left "
    "out of Fig. 1a's Pearson r, and Fig. 1's null-space dimension is that of the last row (the "
    "whole sequence). Section 9 follows every row: its null-space dimension and its share in "
    "the null space, ‖a − ã‖/‖a‖, against prefix length, and the attention on the first token "
    "averaged over the rows that see it (all rows, unless a sliding window hides it), raw "
    "against effective, per head."
)

POSTERIOR = (
    "Section 8 samples the posterior over the valid attention rows of a row, P_i = {{ã ≥ 0 on "
    "its keys, Σ ã = 1, ã T = a T}}, under a uniform prior (every valid row equally likely): "
    "the first {sequences} pairs of d_v + 2 to d_v + 1 + {null_dim} tokens (dim P_i up to "
    "{null_dim}; else the longest that fit), {rows} query row(s) per layer "
    "drawn under the seed and shared by its heads, 4 chains per row (hit-and-run up to dim "
    "P_i = 16, the billiard walk above; both exact, docs/posterior.md) run until each row "
    "has {samples} effective samples of its worst weight and a split-R̂ ≤ 1.01, or a cap of "
    "25 × {samples} / 4 draws per chain. A row that ends short of either is flagged: shown "
    "in the table and figure and left out of the verdicts, which count it. Certified "
    "intervals, A_eff and the constrained row are those of the same rows."
)


def first_value(df: pd.DataFrame, column: str, default: Any = "?") -> Any:
    return df[column].iloc[0] if column in df and len(df) else default


def methods_section(
    tables: dict[str, pd.DataFrame], settings: dict[str, Any], d_v: int, d: int
) -> Markup:
    """The Methods section: splits, probe fitting, sample sizes, estimator, deviations."""
    split, proto, est = tables["fig2_split"], tables["fig2_protocol"], tables["fig34_estimator"]
    fig2 = tables["fig2a_identifiability"]
    budget = settings.get("budget", {})
    p = {c: first_value(proto, c) for c in proto.columns} if len(proto) else {}
    items = [
        (
            "Data",
            f"Corpus {settings.get('corpus', {}).get('name', '?')}, formatted as [CLS] a [SEP] b [SEP] pairs of "
            f"at most {budget.get('max_tokens', '?')} tokens, shuffled under seed {settings.get('seed', '?')}. "
            f"Fig. 1 uses the first {budget.get('attention_sequences', '?')} pairs.",
        ),
        (
            "Split (Fig. 2)",
            f"{first_value(split, 'n_tokens')} tokens of {first_value(split, 'n_sequences')} sequences (cap "
            f"{first_value(split, 'token_cap')} tokens, raised to what the split needs for the model's width), split "
            f"by sequence, never by token: train {first_value(split, 'train_sequences')} sequences / "
            f"{first_value(split, 'train_tokens')} tokens, validation {first_value(split, 'val_sequences')} / "
            f"{first_value(split, 'val_tokens')}, test {first_value(split, 'test_sequences')} / {first_value(split, 'test_tokens')}. "
            "Every fitting choice uses the validation sequences; rates are measured on the test sequences only.",
        ),
        (
            "Probe fitting (Fig. 2)",
            tokens_section.probe_protocol(p)
            + " "
            + tokens_section.methods_counts(fig2)
            + " Tests check on synthetic data that doubling the steps lowers the validation loss by at "
            "most 1%, that linear-cos leaves its start and matches scipy's optimiser.",
        ),
        (
            "Fig. 2b regimes",
            "Ridge start and identity start: the linear-cos probe of each training layer refined by L-BFGS "
            "from the least-squares fit to unit-normalised targets and from the identity (the naive probe), "
            "each with the same validation early stopping (steps and stop reason in tables/fig2b_cross_layer.csv); "
            "the better-validated of the two is the Fig. 2a probe. Both are shown because the transfer across "
            "layers depends on where the fit starts; the verdict reports each.",
        ),
        (
            "Attribution (Figs. 3-4)",
            f"{first_value(est, 'n_sequences')} pairs of {first_value(est, 'min_length')}–{first_value(est, 'max_length')} tokens "
            f"(the first pairs of the corpus in the range {budget.get('attribution_min_tokens', '?')}–"
            f"{budget.get('attribution_max_tokens', '?')} tokens); "
            + (
                "exact Jacobian norms."
                if int(first_value(est, "probes", -1)) < 0
                else f"unbiased estimator of the squared Frobenius norms with {first_value(est, 'probes')} random "
                f"orthonormal probes per input token, median relative standard error of c_ii "
                f"{first_value(est, 'median_rel_stderr_own', float('nan')):.1%} (delta method). "
            )
            + f"Intervals: {first_value(est, 'bootstrap_resamples')} bootstrap resamples of the sequences (seeded), "
            "percentile 95% intervals.",
        ),
        (
            "Deviations from the paper",
            f"Model: {settings.get('model', '?')} instead of BERT-base (head width d_v = {d_v} instead of 64). "
            "Sample sizes are the budget's (above), smaller than the paper's. The paper states neither the MLP "
            "width nor its training schedule nor the normalisation of Fig. 4a; ours are given here. Fig. 2a's "
            "quick-budget probes choose Adam hyperparameters once, on the deepest layer, to fit the time budget "
            "(the protocol allows a choice per layer). Figs. 3-4 use the estimator where the paper's exact "
            "computation is too slow for the budget." + tokens_section.narrow_mlp(fig2, d),
        ),
    ]
    if "posterior_rows" in tables:
        items.insert(-1, ("Attention posterior", _posterior(budget)))
    if "decoder_by_prefix" in tables:
        items.insert(1, ("Decoders (causal rows)", CAUSAL_ROWS.format(d_v=d_v)))
    return h(
        "section",
        h("h2", "Methods"),
        h("dl", [(h("dt", k), h("dd", v)) for k, v in items]),
        h(
            "details",
            h("summary", "table fig2_protocol (probe settings)"),
            table_html(proto, max_rows=4),
        ),
        id="methods",
    )


def _posterior(budget: dict[str, Any]) -> str:
    """The Methods entry of the posterior section, with the budget's sample sizes."""
    return POSTERIOR.format(
        sequences=budget.get("posterior_sequences", "?"),
        null_dim=budget.get("posterior_null_dim", "?"),
        rows=budget.get("posterior_rows_per_head", "?"),
        samples=budget.get("posterior_samples", "?"),
    )
