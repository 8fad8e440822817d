"""The smoke budget on the embedded model: sized from the model's width, and retryable."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from identifiable.experiments import stages
from identifiable.experiments.tokens import smoke_safe_tokens
from identifiable.runs.reproduce import reproduce
from identifiable.tokens.split import min_tokens_for


def test_smoke_token_cap_follows_the_models_width() -> None:
    budget = stages.resolve_budget("smoke")
    assert smoke_safe_tokens(budget.token_max_tokens, 64, budget.max_tokens) == 400
    cap = smoke_safe_tokens(budget.token_max_tokens, 384, budget.max_tokens)
    assert cap >= min_tokens_for(384) + budget.max_tokens  # MiniLM: one sequence of slack
    assert smoke_safe_tokens(8192, 384) == 8192  # budgets that already suffice are kept


@pytest.mark.integration
def test_smoke_runs_on_minilm_and_a_failed_run_does_not_block_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "report"
    real = stages.attribution_shard_tables

    def broken(*args, **kwargs):
        raise RuntimeError("simulated crash in the last stage")

    monkeypatch.setattr(stages, "attribution_shard_tables", broken)
    with pytest.raises(RuntimeError, match="simulated crash"):
        reproduce("minilm", "wikipedia-sample", out, budget="smoke", progress=False)
    monkeypatch.setattr(stages, "attribution_shard_tables", real)
    # the retry (with --resume, as the one-line error of a plain retry says; never --force)
    # runs to the end: the failed run left nothing in its way
    run = reproduce("minilm", "wikipedia-sample", out, budget="smoke", resume=True, progress=False)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["hidden_size"] == 384
    split = pd.read_csv(out / "tables" / "fig2_split.csv").iloc[0]
    assert split["n_tokens"] >= min_tokens_for(384)  # smoke's 400 tokens were raised
    fits = pd.read_csv(out / "tables" / "fig2a_fits.csv")
    assert {"linear", "mlp"} <= set(fits["probe"])
    # smoke is a pipeline check: no claim count, no verdict badge presented as a finding
    assert summary["pipeline_check"] and summary["claims_tested"] is None
    page = (out / "index.html").read_text()
    assert "Pipeline check" in page and "tested claims supported" not in page
    assert 'class="badge ok"' not in page and 'class="badge no"' not in page
    # each claim says so, and keeps what its rule computed beside it
    claim = run.summary["claims"]["fig2a_cos"]
    assert claim["status"] == "pipeline check, not evidence"
    assert claim["rule_status"] in {
        "supported",
        "partly supported",
        "not supported",
        "not settled",
        "not tested",
    }
