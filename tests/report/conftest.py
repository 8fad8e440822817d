"""Fixtures of the report tests: one smoke-budget reproduction on the tiny BERT. The browser
harness (`browser`, `open_page`) is tests/helpers/browser.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers.corpora import small_corpus


@pytest.fixture(scope="session")
def corpus() -> list[tuple[str, str]]:
    return small_corpus()


@pytest.fixture(scope="session")
def tiny_bert(tiny_model: Callable[[str], Any]) -> Any:
    return tiny_model("bert")


@pytest.fixture(scope="session")
def finished_run(
    tiny_bert: Any, corpus: list[Any], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """One complete smoke-budget reproduction on the tiny BERT, shared by the report tests."""
    from identifiable.runs.reproduce import reproduce

    out = tmp_path_factory.mktemp("run") / "report"
    reproduce(tiny_bert, corpus, out, budget="smoke", progress=False)
    return out
