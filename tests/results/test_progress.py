"""Progress by default where work takes seconds and a person is watching; silent otherwise."""

from __future__ import annotations

import io
import sys
from contextlib import nullcontext

import pytest

import identifiable.attribution.api as api
from identifiable.corpus import core

TEXT = "the miller sells bread to every traveller"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def shown(monkeypatch) -> list[bool]:
    """Records whether hidden_token_attribution asked for a progress bar."""
    calls: list[bool] = []
    real = api._progress_bar

    def spy(enabled: bool, description: str):
        calls.append(enabled)
        return real(False, description)  # never draw in the test

    monkeypatch.setattr(api, "_progress_bar", spy)
    return calls


@pytest.mark.parametrize(
    ("interactive", "probes", "progress", "expected"),
    [
        (True, None, None, True),  # exact mode, a person watching: on by default
        (False, None, None, False),  # a log file or CI: silent
        (True, 4, None, False),  # the estimator takes well under a second here
        (True, None, False, False),  # asked for silence
        (False, 4, True, True),  # asked for a bar
    ],
)
def test_exact_attribution_shows_progress_by_default_when_watched(
    tiny_model, monkeypatch, shown, interactive, probes, progress, expected
) -> None:
    monkeypatch.setattr(api, "_interactive", lambda: interactive)
    api.hidden_token_attribution(tiny_model("bert"), TEXT, probes=probes, progress=progress)
    assert shown == [expected]


def test_interactive_means_a_terminal_or_jupyter(monkeypatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert api._interactive() is False
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert api._interactive() is True


def test_corpus_tokenising_spinner(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert isinstance(core._tokenizing(None, "wiki"), nullcontext)
    assert not isinstance(core._tokenizing(True, "wiki"), nullcontext)
    monkeypatch.setattr(sys, "stderr", _Tty())
    status = core._tokenizing(None, "wiki")
    assert type(status).__name__ == "Status" and "tokenising corpus 'wiki'" in str(status.status)
    assert isinstance(core._tokenizing(False, "wiki"), nullcontext)


def test_load_corpus_with_a_tokenizer_is_silent_when_asked(bert_tokenizer, capsys) -> None:
    corpus = core.load_corpus(tokenizer=bert_tokenizer, max_tokens=24, limit=5, progress=False)
    assert len(corpus) == 5
    assert capsys.readouterr().err == ""
