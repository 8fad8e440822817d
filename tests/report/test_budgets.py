"""Budgets: every stage has work under each, `full` names the paper budget, unknown names fail."""

from __future__ import annotations

import pytest

from identifiable.errors import IdentifiableError
from identifiable.experiments.stages import BUDGETS, resolve_budget


def test_full_is_the_older_name_of_the_paper_budget() -> None:
    assert resolve_budget("full") is resolve_budget("paper") is BUDGETS["paper"]
    paper = BUDGETS["paper"]
    assert paper.max_tokens == 128 and paper.attribution_min_tokens == 100
    # the paper's lengths; HTA by the 4-probe estimator (exact is ~42 min per pair on one
    # CPU core), whose standard error the report states
    assert paper.attribution_probes == 4 and paper.mixing_probes == 4


def test_every_budget_gives_every_stage_work() -> None:
    for b in BUDGETS.values():
        assert b.attention_sequences > 0 and b.token_max_tokens > 0
        assert b.attribution_sequences > 0 and b.mixing_sequences > 0
        assert b.certify_sequences > 0 and b.certify_rows_per_head > 0
        assert b.posterior_sequences > 0 and b.posterior_rows_per_head > 0
        assert b.posterior_samples > 0 and b.posterior_null_dim > 0


def test_an_unknown_budget_names_the_known_ones() -> None:
    with pytest.raises(IdentifiableError, match="choose one of quick, paper, smoke"):
        resolve_budget("huge")
