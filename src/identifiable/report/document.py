"""Assemble the reproduction folder: tables, figures, summary.json and index.html.

Called with the stage tables, read through their contract (`identifiable.report.tables`).
Writes every table as CSV and Parquet, every figure as PNG and SVG, then summary.json,
and index.html last, each atomically, so a folder with an index.html is always a
finished report.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from identifiable.report import (
    certify_section,
    claims,
    decoder_section,
    figures,
    mixing_section,
    posterior_section,
    tokens_section,
)
from identifiable.report.files import write_figure, write_tables
from identifiable.report.html import Markup, h, page, png_img, table_html
from identifiable.report.methods import first_value, methods_section
from identifiable.report.paper import PAPER_LABEL
from identifiable.report.prose import EFFECTIVE_NOTE, PROSE, dequantized, not_analysed
from identifiable.report.section import Section
from identifiable.report.tables import (
    AttentionStageTables,
    AttributionStageTables,
    CertifyStageTables,
    DecoderStageTables,
    MixingStageTables,
    PosteriorStageTables,
    Results,
    TokenStageTables,
)
from identifiable.report.verdicts import (
    NOT_EVIDENCE,
    PIPELINE_CHECK,
    headline,
    pipeline_check,
    tally,
)
from identifiable.store.files import atomic_write_text

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


def _change_note(change: dict[str, Any], d_v: int) -> str:
    """The measured change of the real (biased) head output, for the sentence above."""
    if not change.get("n_heads"):
        return f"No sequence is longer than d_v = {d_v}, so A_eff = A and nothing changes."
    return (
        f"Measured on this run ({change['n_heads']} heads × layers of {change['n_sequences']} sequences longer "
        f"than d_v = {d_v}; table fig1_output_change): replacing A by A_eff changes the bias-free output by at "
        f"most {change['bias_free_max']:.1e} (rounding) but the real, biased head output by a median of "
        f"{change['biased_median']:.1%} and up to {change['biased_max']:.1%} (relative Frobenius norm)."
    )


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _tables(results: Results, causal: bool) -> tuple[dict[str, pd.DataFrame], dict[str, Any]]:
    """Final tables (name → DataFrame) and the verdicts that go with them. Each stage's
    tables are read through its contract (`identifiable.report.tables`): a missing stage
    or table raises, naming both. A decoder's (`causal`) attention stage owes two more."""
    att = AttentionStageTables.of(results)
    tok = TokenStageTables.of(results)
    hta = AttributionStageTables.of(results)
    mixing, certify = MixingStageTables.optional(results), CertifyStageTables.optional(results)
    posterior = PosteriorStageTables.optional(results)
    to_tokens = (
        att.to_tokens.groupby(["layer", "head", "kind", "target"], as_index=False)["value"].mean()
        if not att.to_tokens.empty
        else att.to_tokens.drop(columns="seq")
    )
    groups = claims.neighbour_groups(hta.groups)
    positions = claims.relative_positions(hta.offsets)
    _, v3b = claims.not_top_share(hta.own, hta.trends)
    share = hta.own_summary[["layer", "p_tilde", "p_tilde_lo", "p_tilde_hi"]].rename(
        columns={"p_tilde": "percent", "p_tilde_lo": "percent_lo", "p_tilde_hi": "percent_hi"}
    )
    specials = hta.specials.groupby("layer", as_index=False)[["share_sum", "queries"]].sum()
    specials["percent_from_special_inputs"] = 100 * specials["share_sum"] / specials["queries"]
    specials = specials[["layer", "percent_from_special_inputs"]]
    tables = {
        "fig1a_pearson_by_length": att.by_length,
        "fig1a_pearson_by_layer": att.by_layer,
        "fig1bc_attention_to_tokens": to_tokens,
        "fig1_output_change": att.output_change,
        "fig2a_identifiability": tok.per_layer,
        "fig2a_control": tok.control,
        "fig2a_fits": tok.fits,
        "fig2a_grid": tok.grid,
        "fig2_split": tok.counts,
        "fig2_protocol": tok.protocol,
        "fig2b_cross_layer": tok.cross_layer,
        "fig3a_own_contribution": hta.own,
        "fig3a_own_summary": hta.own_summary,
        "fig3b_own_not_top": share,
        "fig4a_neighbour_groups": groups,
        "fig4a_groups_summary": hta.groups_summary,
        "fig4b_relative_position": positions,
        "fig4b_positions_summary": hta.offsets_summary,
        "fig4_special_share": specials,
        "fig34_estimator": hta.estimator,
        "fig34_trends": hta.trends,
    }
    # beyond the paper (present when the run had these stages)
    if causal:
        decoder = DecoderStageTables.of(results)
        tables["decoder_sinks"], tables["decoder_by_prefix"] = decoder.sinks, decoder.by_prefix
    if mixing is not None:
        tables["mixing_correlations"] = mixing.correlations
        tables["mixing_summary"] = mixing.summary
        if not mixing.unavailable.empty:  # written only when a method was left out
            tables["mixing_unavailable"] = mixing.unavailable
    if certify is not None:
        tables["certify_rows"] = certify.rows
        tables["certify_by_layer"] = certify.by_layer
        tables["certify_by_length"] = certify.by_length
    if posterior is not None:
        tables["posterior_rows"] = posterior.rows
        tables["posterior_by_layer"] = posterior.by_layer
        tables["posterior_by_length"] = posterior.by_length
    return tables, {"fig3b": v3b}


def _sample_captions(tables: dict[str, pd.DataFrame], d_v: int) -> dict[str, str]:
    """Sample sizes and estimator for each figure's caption (read from the tables)."""
    by_length = tables["fig1a_pearson_by_length"]
    split = tables["fig2_split"]
    est = tables["fig34_estimator"]
    att = (
        f"{len(by_length)} sequences of {int(by_length['length'].min())}–{int(by_length['length'].max())} "
        f"tokens ({int((by_length['length'] > d_v).sum())} longer than d_v = {d_v}); effective attention: "
        "paper variant (bias-free T), float64."
        if len(by_length)
        else "no sequences."
    )
    tok = (
        f"{first_value(split, 'n_tokens')} tokens of {first_value(split, 'n_sequences')} sequences, split by sequence into "
        f"train {first_value(split, 'train_sequences')} / validation {first_value(split, 'val_sequences')} / test "
        f"{first_value(split, 'test_sequences')} sequences ({first_value(split, 'test_tokens')} test tokens); rates on test "
        "tokens only, candidates: the e^0 of the token's own sequence; bands: 95% Wilson intervals. "
        + tokens_section.fit_caption(tables["fig2a_identifiability"])
    )
    probes = int(first_value(est, "probes", -1))
    err = first_value(est, "median_rel_stderr_own", float("nan"))
    estimator = (
        "exact Jacobian norms"
        if probes < 0
        else f"estimator with {probes} random orthonormal probes per input token (median relative standard "
        f"error of c_ii {err:.1%})"
    )
    hta = (
        f"{first_value(est, 'n_sequences')} sequences of {first_value(est, 'min_length')}–{first_value(est, 'max_length')} tokens "
        f"({first_value(est, 'n_tokens')} tokens per layer); {estimator}; error bars and bands: 95% bootstrap "
        f"intervals over sequences ({first_value(est, 'bootstrap_resamples')} resamples, seeded)."
    )
    return {"attention": att, "tokens": tok, "attribution": hta}


FigureWriter = Callable[[str, Any, str], tuple[str, bytes, str]]
"""`fig(stem, figure, caption)`: writes the figure (PNG and SVG) and closes it."""


def _section(
    key: str,
    figs: list[tuple[str, bytes, str]],
    verdicts: list[claims.Verdict],
    shown: list[tuple[str, pd.DataFrame]],
    **values: Any,
) -> Section:
    """Section `key` with its prose (report/prose.py) filled in with `values`."""
    title, claim, explain = (text.format(**values) for text in PROSE[key])
    return Section(key, title, claim, explain, figs, verdicts, shown)


def _attention_sections(
    tables: dict[str, pd.DataFrame], info: Any, caption: str, fig: FigureWriter
) -> list[Section]:
    """Sections 1 and 2: raw against effective attention (paper Fig. 1)."""
    d_v, n_layers, name = info.head_dim, info.n_layers, info.name
    by_length, to_tokens = tables["fig1a_pearson_by_length"], tables["fig1bc_attention_to_tokens"]
    change = claims.output_change(tables["fig1_output_change"], d_v)
    pearson = fig(
        "fig1a_pearson_by_length",
        figures.fig1a_pearson(by_length, d_v, name),
        "Fig. 1a. " + caption,
    )
    raw, effective = (
        fig(
            f"fig1{letter}_{kind}_attention",
            figures.fig1bc_targets(to_tokens, kind, n_layers, name),
            f"Fig. 1{letter}. " + caption,
        )
        for letter, kind in (("b", "raw"), ("c", "effective"))
    )
    return [
        _section(
            "attention",
            [pearson],
            [claims.pearson_by_length(by_length, d_v)],
            [("fig1a_pearson_by_length", by_length.sort_values("length"))],
            d_v=d_v,
        ),
        _section(
            "effective",
            [raw, effective],
            [
                claims.effective_vs_raw_targets(
                    to_tokens, int(by_length["length"].max()) if len(by_length) else 0, d_v
                )
            ],
            [
                ("fig1bc_attention_to_tokens (layer means)", claims.layer_means(to_tokens)),
                (
                    "fig1_output_change (relative change of each head's output, A → A_eff)",
                    tables["fig1_output_change"],
                ),
            ],
            effective_note=EFFECTIVE_NOTE,
            change_note=_change_note(change, d_v),
        ),
    ]


def _tokens_section(
    tables: dict[str, pd.DataFrame], info: Any, caption: str, fig: FigureWriter
) -> Section:
    """Section 3: token identifiability (paper Fig. 2)."""
    n_layers, name = info.n_layers, info.name
    fig2, control, cross = (
        tables[k] for k in ("fig2a_identifiability", "fig2a_control", "fig2b_cross_layer")
    )
    rates = pd.concat([fig2, control.assign(probe="shuffled")])
    linear_cos = cross.query("probe == 'linear' and objective == 'cos'")
    return _section(
        "tokens",
        [
            fig(
                "fig2a_identifiability",
                figures.fig2a_identifiability(rates, n_layers, name),
                "Fig. 2a. " + caption,
            ),
            fig(
                "fig2b_cross_layer",
                figures.fig2b_cross_layer(linear_cos, n_layers, name),
                "Fig. 2b. " + caption,
            ),
        ],
        [
            claims.cosine_beats_l2(fig2),
            claims.identifiable_at_depth(fig2, control),
            claims.cross_layer(cross, fig2),
        ],
        tokens_section.tables(fig2, tables["fig2a_grid"], cross),
    )


def _attribution_sections(
    tables: dict[str, pd.DataFrame],
    extra: dict[str, Any],
    info: Any,
    caption: str,
    fig: FigureWriter,
) -> list[Section]:
    """Sections 4 and 5: Hidden Token Attribution (paper Figs. 3 and 4)."""
    n_layers, name = info.n_layers, info.name
    own, groups = tables["fig3a_own_summary"], tables["fig4a_neighbour_groups"]
    depths = sorted({0, (n_layers + 1) // 2 - 1, n_layers - 1})
    return [
        _section(
            "attribution",
            [
                fig(
                    "fig3a_own_contribution",
                    figures.fig3a_own(own, n_layers, name),
                    "Fig. 3a. " + caption,
                ),
                fig("fig3b_own_not_top", figures.fig3b_not_top(own, name), "Fig. 3b. " + caption),
            ],
            [
                claims.own_contribution_falls(tables["fig3a_own_contribution"], own),
                extra["fig3b"],
            ],
            [
                ("fig3a_own_summary", own),
                ("fig4_special_share", tables["fig4_special_share"]),
            ],
        ),
        _section(
            "neighbours",
            [
                fig(
                    "fig4a_neighbour_groups",
                    figures.fig4a_groups(tables["fig4a_groups_summary"], n_layers, name),
                    "Fig. 4a. " + caption,
                ),
                fig(
                    "fig4b_relative_position",
                    figures.fig4b_positions(tables["fig4b_positions_summary"], depths, name),
                    "Fig. 4b. " + caption,
                ),
            ],
            [
                claims.neighbours_spread(tables["fig4a_groups_summary"], tables["fig34_trends"]),
                claims.peak_at_neighbours(
                    tables["fig4b_relative_position"],
                    tables["fig34_trends"],
                    tables["fig4b_positions_summary"],
                ),
            ],
            [
                (
                    "fig4a_neighbour_groups",
                    groups.pivot(index="layer", columns="group", values="percent").reset_index(),
                )
            ],
            group_normalisation=claims.GROUP_NORMALISATION,
        ),
    ]


def _sections(
    model: Any, tables: dict[str, pd.DataFrame], extra: dict[str, Any], out: Path
) -> list[Section]:
    """The five paper sections in paper order, then those beyond the paper."""
    info = model.info
    caption = _sample_captions(tables, info.head_dim)

    def fig(stem: str, f: Any, text: str) -> tuple[str, bytes, str]:
        png, _ = write_figure(f, out / "figures" / stem)
        figures.close(f)
        return stem, png, text

    return [
        *_attention_sections(tables, info, caption["attention"], fig),
        _tokens_section(tables, info, caption["tokens"], fig),
        *_attribution_sections(tables, extra, info, caption["attribution"], fig),
        *_beyond(tables, info.name, fig),
        *([posterior_section.section(tables, info, fig)] if "posterior_rows" in tables else []),
        *([decoder_section.section(tables, info, fig)] if "decoder_sinks" in tables else []),
    ]


def _beyond(tables: dict[str, pd.DataFrame], name: str, fig: Any) -> list[Section]:
    """The two sections beyond the paper, when the run computed them."""
    out = []
    if "mixing_summary" in tables:
        out.append(mixing_section.section(tables, fig))
    if "certify_rows" in tables:
        rows = tables["certify_rows"]
        n_seq = rows["seq"].nunique() if len(rows) else 0
        out.append(
            Section(
                "certify",
                "7. " + certify_section.TITLE,
                "The null space says how many directions an attention row could move in; with the "
                "constraints every attention row obeys (weights ≥ 0, summing to 1) most of that "
                "freedom disappears. Intervals give, for each weight, the least and greatest value "
                "any valid row with the same head output can give it.",
                "Left: widest interval and movable mass of each sampled row against sequence length; "
                "right: by layer, beside the L1 distance that the paper's effective attention and the "
                "constrained effective attention (the valid row closest to uniform) move from raw "
                "attention. Every bound is an LP solved to a certificate. Definitions: "
                "docs/certified_attention.md.",
                [
                    fig(
                        "certify_movement",
                        certify_section.movement_figure(rows, name),
                        f"Certified attention. {len(rows)} sampled rows of {n_seq} sequences "
                        "(every head of every layer); exact LP bounds.",
                    )
                ],
                certify_section.verdicts(rows),
                [("certify_main", certify_section.main_table(rows))],
            )
        )
    return out


def _badge(status: str, check: bool = False) -> Markup:
    if check:
        return h("span", NOT_EVIDENCE, class_="badge mixed")
    cls = {"supported": "ok", "not supported": "no"}.get(status, "mixed")
    return h("span", status, class_=f"badge {cls}")


def _render_section(s: Section, check: bool = False) -> Markup:
    return h(
        "section",
        h("h2", s.title),
        h("p", h("strong", "Claim. "), s.claim, class_="claim"),
        [
            h("p", _badge(v.status, check), " ", v.sentence, class_="verdict", data_claim=v.key)
            for v in s.verdicts
        ],
        [
            h(
                "figure",
                png_img(png, f"figure {stem}", data_figure=stem),
                h("figcaption", text, " ", h("span", f"figures/{stem}.png · .svg", class_="files")),
            )
            for stem, png, text in s.figures
        ],
        h("p", s.explain, class_="explain"),
        [
            h("details", h("summary", f"table {name}"), table_html(df, max_rows=24))
            for name, df in s.tables
        ],
        id=s.key,
    )


def write_report(
    out: Path, model: Any, results: Results, settings: dict[str, Any]
) -> tuple[list[Path], dict[str, Any]]:
    """Write tables, figures, summary.json and (last) index.html into `out`."""
    tables, extra = _tables(results, bool(model.info.is_causal))
    files = write_tables(tables, out / "tables")
    sections = _sections(model, tables, extra, out)
    files += [
        out / "figures" / f"{stem}.{ext}"
        for s in sections
        for stem, _, _ in s.figures
        for ext in ("png", "svg")
    ]
    info = model.info
    verdicts = [v for s in sections for v in s.verdicts]
    check = pipeline_check(settings)
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
            **({"dequantized_from": q} if (q := getattr(info, "dequantized_from", "")) else {}),
            **({"not_analysed": o} if (o := getattr(info, "not_analysed", "")) else {}),
        },
        "settings": settings,
        "versions": package_versions(),
        "claims": {
            v.key: {"status": NOT_EVIDENCE if check else v.status, "sentence": v.sentence}
            | ({"rule_status": v.status} if check else {})
            | v.numbers
            for v in verdicts
        },
        "pipeline_check": check,
        "supported": None if check else sum(v.status == "supported" for v in verdicts),
        "claims_tested": None if check else sum(v.status != "not tested" for v in verdicts),
        "counts": None if check else tally(verdicts),
        "paper_reference": PAPER_LABEL,
        "output_change": claims.output_change(tables["fig1_output_change"], info.head_dim)
        if not tables["fig1_output_change"].empty
        else {},
        "tables": sorted(tables),
    }
    summary["headline"] = headline(summary)
    files.append(
        atomic_write_text(
            out / "summary.json",
            json.dumps(summary, indent=2, default=_json_default, allow_nan=True),
        )
    )
    methods = methods_section(tables, settings, info.head_dim, info.hidden_size)
    files.append(
        atomic_write_text(out / "index.html", render_index(model, sections, summary, methods))
    )
    return files, summary


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def render_index(
    model: Any, sections: list[Section], summary: dict[str, Any], methods: Markup | None = None
) -> str:
    info = model.info
    settings = summary["settings"]
    budget = settings["budget"]
    check = bool(summary.get("pipeline_check"))
    overview = h(
        "table",
        h("tr", h("th", "claim"), h("th", "pipeline check" if check else "our run")),
        [
            h(
                "tr",
                h("td", h("a", s.title, href=f"#{s.key}")),
                h("td", [_badge(v.status, check) for v in s.verdicts]),
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
                f"head width d_v = {info.head_dim}, width d = {info.hidden_size}"
                f"{dequantized(info)}{not_analysed(info)}) · corpus "
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
            h("p", PIPELINE_CHECK, class_="warning") if check else [],
        ),
        h(
            "section",
            h("h2", "Summary"),
            h("p", headline(summary).capitalize() + "."),
            overview,
        ),
        [_render_section(s, check) for s in sections],
        methods if methods is not None else [],
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
