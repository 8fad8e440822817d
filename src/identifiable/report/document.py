"""Assemble the reproduction folder: tables, figures, summary.json and index.html.

Called with the stage tables (see `report.stages`). Writes every table as CSV and
Parquet, every figure as PNG and SVG, then summary.json, and index.html last, each
atomically, so a folder with an index.html is always a finished report.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from identifiable.report import claims, figures
from identifiable.report.files import write_figure
from identifiable.report.html import Markup, h, page, png_img, table_html
from identifiable.report.paper import PAPER_LABEL
from identifiable.store.files import atomic_write_text, write_table

PACKAGES = (
    "identifiable",
    "torch",
    "transformers",
    "numpy",
    "scipy",
    "pandas",
    "pyarrow",
    "matplotlib",
)

EFFECTIVE_NOTE = (
    "Effective attention is not a probability distribution: it is raw attention with its null-space part "
    "removed, the part that provably cannot change the head's output. Its entries may be negative and its "
    "rows need not sum to 1."
)


@dataclass
class Section:
    key: str
    title: str
    claim: str
    explain: str
    figures: list[tuple[str, bytes]]  # (stem, png)
    verdicts: list[claims.Verdict]
    tables: list[tuple[str, pd.DataFrame]]


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _tables(
    results: dict[str, dict[str, pd.DataFrame]],
) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Final tables (name → DataFrame) and the verdicts that go with them."""
    att, tok, hta = results["attention"], results["tokens"], results["attribution"]
    to_tokens = (
        att["to_tokens"]
        .groupby(["layer", "head", "kind", "target"], as_index=False)["value"]
        .mean()
        if not att["to_tokens"].empty
        else att["to_tokens"].drop(columns="seq")
    )
    groups = claims.neighbour_groups(hta["groups"])
    positions = claims.relative_positions(hta["offsets"])
    share, v3b = claims.not_top_share(hta["own"])
    specials = hta["specials"].groupby("layer", as_index=False)[["share_sum", "queries"]].sum()
    specials["percent_from_special_inputs"] = 100 * specials["share_sum"] / specials["queries"]
    specials = specials[["layer", "percent_from_special_inputs"]]
    tables = {
        "fig1a_pearson_by_length": att["by_length"],
        "fig1a_pearson_by_layer": att["by_layer"],
        "fig1bc_attention_to_tokens": to_tokens,
        "fig2a_identifiability": tok["per_layer"],
        "fig2a_control": tok["control"],
        "fig2b_cross_layer": tok["cross_layer"],
        "fig3a_own_contribution": hta["own"],
        "fig3b_own_not_top": share,
        "fig4a_neighbour_groups": groups,
        "fig4b_relative_position": positions,
        "fig4_special_share": specials,
    }
    return tables, {"fig3b": v3b}


def _sections(
    model: Any, tables: dict[str, pd.DataFrame], extra: dict[str, Any], out: Path
) -> list[Section]:
    info = model.info
    d_v, n_layers, name = info.head_dim, info.n_layers, info.name
    figs: dict[str, bytes] = {}

    def fig(stem: str, f: Any) -> tuple[str, bytes]:
        png, _ = write_figure(f, out / "figures" / stem)
        figures.close(f)
        figs[stem] = png
        return stem, png

    to_tokens = tables["fig1bc_attention_to_tokens"]
    return [
        Section(
            "attention",
            "1. Attention is not identifiable beyond the head width",
            f"Once a sequence has more tokens than the head width (d_v = {d_v} here), many different attention "
            "matrices give exactly the same head output, so raw and effective attention part ways: their Pearson "
            "correlation is exactly 1 up to n = d_v and falls beyond (paper Fig. 1a).",
            "Left: each dot is one sequence; r compares every raw attention weight with its effective counterpart "
            "(all heads and layers pooled). Middle: the measured null-space dimension, with the lower bound n − d_v. "
            "The dotted line marks the head width, where non-identifiability starts.",
            [
                fig(
                    "fig1a_pearson_by_length",
                    figures.fig1a_pearson(tables["fig1a_pearson_by_length"], d_v, name),
                )
            ],
            [claims.pearson_by_length(tables["fig1a_pearson_by_length"], d_v)],
            [("fig1a_pearson_by_length", tables["fig1a_pearson_by_length"].sort_values("length"))],
        ),
        Section(
            "effective",
            "2. Effective attention pays little attention to [CLS], [SEP] and punctuation",
            "Raw attention piles up on [CLS], [SEP] and punctuation in some layers, but much of that weight lies in "
            "the null space: effective attention to these tokens is far smaller (paper Figs. 1b, 1c).",
            "Dots: one head each (average attention its query tokens pay to the token type); lines: the layer mean. "
            + EFFECTIVE_NOTE,
            [
                fig(
                    "fig1b_raw_attention", figures.fig1bc_targets(to_tokens, "raw", n_layers, name)
                ),
                fig(
                    "fig1c_effective_attention",
                    figures.fig1bc_targets(to_tokens, "effective", n_layers, name),
                ),
            ],
            [claims.effective_vs_raw_targets(to_tokens)],
            [("fig1bc_attention_to_tokens (layer means)", claims.layer_means(to_tokens))],
        ),
        Section(
            "tokens",
            "3. Hidden tokens stay largely identifiable",
            "A probe that maps a hidden state back to the input embeddings finds the token's own input as the "
            "nearest candidate for most tokens at every layer; cosine beats L2 (identity lives in the angle) and "
            "the rate falls with depth yet stays high (paper Fig. 2).",
            "Rate: share of test tokens (held-out sequences) whose nearest input embedding, among the sequence's "
            "own, is their own; bands are 95% intervals; the dotted grey line is a probe fitted on shuffled "
            "targets, which should sit at chance. Right figure: a linear cosine probe trained on one layer, "
            "tested on every layer.",
            [
                fig(
                    "fig2a_identifiability",
                    figures.fig2a_identifiability(
                        pd.concat(
                            [
                                tables["fig2a_identifiability"],
                                tables["fig2a_control"].assign(probe="shuffled"),
                            ]
                        ),
                        n_layers,
                        name,
                    ),
                ),
                fig(
                    "fig2b_cross_layer",
                    figures.fig2b_cross_layer(
                        tables["fig2b_cross_layer"].query(
                            "probe == 'linear' and objective == 'cos'"
                        ),
                        n_layers,
                        name,
                    ),
                ),
            ],
            [
                claims.cosine_beats_l2(tables["fig2a_identifiability"]),
                claims.identifiable_at_depth(
                    tables["fig2a_identifiability"], tables["fig2a_control"]
                ),
                claims.cross_layer(tables["fig2b_cross_layer"]),
            ],
            [
                (
                    "fig2a_identifiability",
                    tables["fig2a_identifiability"][
                        ["layer", "probe", "objective", "rate", "ci_low", "ci_high"]
                    ],
                )
            ],
        ),
        Section(
            "attribution",
            "4. Tokens mix: a hidden token owes less and less to its own input",
            "Hidden Token Attribution measures how much each input token contributes to a hidden token (gradient "
            "norms, rows sum to 100%). The share of the token's own input falls with depth, and in deeper layers "
            "a growing share of tokens gets more from another input than from its own (paper Fig. 3).",
            "Left: distribution over tokens of the contribution of the token's own input (boxes: quartiles). "
            "Second figure: percent of tokens whose largest contributor is another input.",
            [
                fig(
                    "fig3a_own_contribution",
                    figures.fig3a_own(tables["fig3a_own_contribution"], n_layers, name),
                ),
                fig("fig3b_own_not_top", figures.fig3b_not_top(tables["fig3b_own_not_top"], name)),
            ],
            [claims.own_contribution_falls(tables["fig3a_own_contribution"]), extra["fig3b"]],
            [
                ("fig3b_own_not_top", tables["fig3b_own_not_top"]),
                ("fig4_special_share", tables["fig4_special_share"]),
            ],
        ),
        Section(
            "neighbours",
            "5. Contributions come from nearby tokens first, then spread",
            "Inputs close to a token contribute most to it in early layers; with depth the contributions spread "
            "to tokens further away (paper Fig. 4).",
            f"Fig. 4a normalisation ({claims.GROUP_NORMALISATION}); the paper does not state its own, so compare "
            "shapes, not levels. Fig. 4b: total contribution of the input at each relative position (the token "
            "itself left out), normalised to a maximum of 1 per layer.",
            [
                fig(
                    "fig4a_neighbour_groups",
                    figures.fig4a_groups(tables["fig4a_neighbour_groups"], n_layers, name),
                ),
                fig(
                    "fig4b_relative_position",
                    figures.fig4b_positions(
                        tables["fig4b_relative_position"],
                        sorted({1, (n_layers + 1) // 2, n_layers}),
                        name,
                    ),
                ),
            ],
            [
                claims.neighbours_spread(tables["fig4a_neighbour_groups"]),
                claims.peak_at_neighbours(tables["fig4b_relative_position"]),
            ],
            [
                (
                    "fig4a_neighbour_groups",
                    tables["fig4a_neighbour_groups"]
                    .pivot(index="layer", columns="group", values="percent")
                    .reset_index(),
                )
            ],
        ),
    ]


def _badge(status: str) -> Markup:
    cls = {"supported": "ok", "not supported": "no"}.get(status, "mixed")
    return h("span", status, class_=f"badge {cls}")


def _render_section(s: Section) -> Markup:
    return h(
        "section",
        h("h2", s.title),
        h("p", h("strong", "Claim. "), s.claim, class_="claim"),
        [
            h("p", _badge(v.status), " ", v.sentence, class_="verdict", data_claim=v.key)
            for v in s.verdicts
        ],
        [
            h(
                "figure",
                png_img(png, f"figure {stem}", data_figure=stem),
                h("figcaption", f"figures/{stem}.png · .svg"),
            )
            for stem, png in s.figures
        ],
        h("p", s.explain, class_="explain"),
        [
            h("details", h("summary", f"table {name}"), table_html(df, max_rows=24))
            for name, df in s.tables
        ],
        id=s.key,
    )


def write_report(
    out: Path, model: Any, results: dict[str, dict[str, pd.DataFrame]], settings: dict[str, Any]
) -> tuple[list[Path], dict[str, Any]]:
    """Write tables, figures, summary.json and (last) index.html into `out`."""
    tables, extra = _tables(results)
    files: list[Path] = []
    for name, df in tables.items():
        files += write_table(df, out / "tables" / name)
    sections = _sections(model, tables, extra, out)
    files += [
        out / "figures" / f"{stem}.{ext}"
        for s in sections
        for stem, _ in s.figures
        for ext in ("png", "svg")
    ]
    info = model.info
    verdicts = [v for s in sections for v in s.verdicts]
    summary = {
        "title": "Reproduction of Brunner et al., On Identifiability in Transformers (ICLR 2020)",
        "model": {
            "name": info.name,
            "architecture": info.architecture,
            "layers": info.n_layers,
            "heads": info.n_heads,
            "head_dim": info.head_dim,
            "hidden_size": info.hidden_size,
            "fingerprint": settings.get("model_fingerprint"),
        },
        "settings": settings,
        "versions": package_versions(),
        "claims": {
            v.key: {"status": v.status, "sentence": v.sentence, **v.numbers} for v in verdicts
        },
        "supported": sum(v.status == "supported" for v in verdicts),
        "claims_tested": sum(v.status != "not tested" for v in verdicts),
        "paper_reference": PAPER_LABEL,
        "tables": sorted(tables),
    }
    files.append(
        atomic_write_text(
            out / "summary.json",
            json.dumps(summary, indent=2, default=_json_default, allow_nan=True),
        )
    )
    files.append(atomic_write_text(out / "index.html", render_index(model, sections, summary)))
    return files, summary


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def render_index(model: Any, sections: list[Section], summary: dict[str, Any]) -> str:
    info = model.info
    settings = summary["settings"]
    budget = settings["budget"]
    overview = h(
        "table",
        h("tr", h("th", "claim"), h("th", "our run")),
        [
            h(
                "tr",
                h("td", h("a", s.title, href=f"#{s.key}")),
                h("td", [_badge(v.status) for v in s.verdicts]),
            )
            for s in sections
        ],
        class_="overview",
    )
    body = [
        h(
            "header",
            h("h1", "On Identifiability in Transformers: reproduction"),
            h(
                "p",
                f"Model {info.name} ({info.architecture}, {info.n_layers} layers × {info.n_heads} heads, "
                f"head width d_v = {info.head_dim}, width d = {info.hidden_size}) · corpus "
                f"{settings['corpus']['name']} ({settings['corpus']['items']} items) · budget {budget['name']} · "
                f"seed {settings['seed']}",
                class_="meta",
            ),
            h(
                "p",
                "Each section states a claim of Brunner et al. (ICLR 2020), shows our figure beside the paper's "
                "BERT-base values (read off its figures, about ±0.02; labelled as such) and says whether our run "
                "supports it. The verdicts are computed from the tables in this folder by the rules in "
                "identifiable.report.claims.",
                class_="note",
            ),
            h("p", EFFECTIVE_NOTE, class_="warning"),
        ),
        h(
            "section",
            h("h2", "Summary"),
            h(
                "p",
                f"{summary['supported']} of {summary['claims_tested']} tested claims supported.",
            ),
            overview,
        ),
        [_render_section(s) for s in sections],
        h(
            "section",
            h("h2", "Files and settings"),
            h(
                "p",
                "Figures: figures/*.png and *.svg. Tables: tables/*.csv and *.parquet. Headline numbers, settings "
                "and package versions: summary.json.",
            ),
            h("pre", json.dumps({"budget": budget, "versions": summary["versions"]}, indent=1)),
        ),
    ]
    return page(
        "Reproduction: On Identifiability in Transformers", body, styles=["base.css", "report.css"]
    )
