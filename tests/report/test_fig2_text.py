"""Fig. 2 captions come from the fit table; a pipeline check shows no findings."""

from __future__ import annotations

import pandas as pd

from identifiable.report import document, tokens_section


def fit_table(mlp_stopped: list[str], converged: list[bool], failure: list[bool]) -> pd.DataFrame:
    rows = []
    for layer in (1, 2):
        rows.append(
            {"layer": layer, "probe": "naive", "objective": "cos", "optimizer": "",
             "mlp_width": None, "stopped": "no fit", "converged": True, "fit_failure": False,
             "late_gain": 0.0}
        )  # fmt: skip
        rows.append(
            {"layer": layer, "probe": "linear", "objective": "cos", "optimizer": "L-BFGS",
             "mlp_width": None, "stopped": "patience", "converged": True, "fit_failure": False,
             "late_gain": 0.001}
        )  # fmt: skip
        rows.append(
            {"layer": layer, "probe": "mlp", "objective": "cos", "optimizer": "Adam",
             "mlp_width": 512, "stopped": mlp_stopped[layer - 1],
             "converged": converged[layer - 1], "fit_failure": failure[layer - 1],
             "late_gain": 0.0 if converged[layer - 1] else 0.2}
        )  # fmt: skip
    return pd.DataFrame(rows)


def test_caption_says_what_stopped_each_fit_and_the_width_used() -> None:
    done = tokens_section.fit_caption(
        fit_table(["patience", "patience"], [True, True], [False, False])
    )
    assert "linear-cos (L-BFGS): stopped by validation early stopping at 2 of 2 layers" in done
    assert "MLP-cos (Adam, 512 hidden units)" in done
    assert "unfinished" not in done and "Crosses" not in done
    capped = tokens_section.fit_caption(
        fit_table(["patience", "max steps"], [True, False], [False, True])
    )
    assert "the step cap at 1" in capped and "unfinished" in capped and "layer(s) 2" in capped
    assert "below the naive probe" in capped and "Crosses mark" in capped
    assert "Open circles" in capped
    # the old caption's blanket sentence is gone
    assert "trained to early stopping" not in capped


def test_methods_count_the_capped_and_failed_fits() -> None:
    text = tokens_section.methods_counts(
        fit_table(["max steps", "max steps"], [True, False], [False, True])
    )
    assert "2 fit(s) reached the step cap, 1 of them still improving" in text
    assert "1 MLP fit(s) scored below the naive probe" in text
    assert tokens_section.narrow_mlp(fit_table(["patience"] * 2, [True] * 2, [False] * 2), 768)
    assert not tokens_section.narrow_mlp(fit_table(["patience"] * 2, [True] * 2, [False] * 2), 384)


def test_a_pipeline_check_shows_no_claim_count_and_no_verdict_badge() -> None:
    found = {"pipeline_check": False, "supported": 3, "claims_tested": 5}
    assert document.headline(found) == "3 of 5 tested claims supported"  # an older summary
    check = {"pipeline_check": True, "supported": None, "claims_tested": None}
    assert "pipeline check, not evidence" in document.headline(check)
    assert "claims supported" not in document.headline(check)
    assert "pipeline check, not evidence" in str(document._badge("supported", check=True))
    assert "supported" not in str(document._badge("supported", check=True))
    assert document.pipeline_check({"budget": {"pipeline_check": True}})
    from identifiable.experiments.stages import BUDGETS

    assert [b.name for b in BUDGETS.values() if b.pipeline_check] == ["smoke"]


def test_protocol_sentence_follows_the_protocol_row() -> None:
    from identifiable.experiments.stages import BUDGETS
    from identifiable.experiments.tokens import probe_config_for

    cfg = probe_config_for(BUDGETS["quick"])
    row = {
        k: (", ".join(map(str, v)) if isinstance(v, tuple) else str(v))
        for k, v in vars(cfg).items()
    }
    text = tokens_section.probe_protocol(row)
    assert "starting at the linear probe of its objective" in text and "max(512, 2d)" in text
    assert "validation identification rate" in text and "at each layer" in text
    assert f"cap {cfg.max_steps} steps" in text
    older = tokens_section.probe_protocol(row | {"mlp_init": "random", "select_per_layer": "False"})
    assert "from a random start" in older and "max(512, d)" in older
    assert "at the deepest layer" in older and "linear probe of its objective" not in older
