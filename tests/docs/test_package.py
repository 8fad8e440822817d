"""Package-level promises: one version number, one exception type that is also a ValueError."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import identifiable
from identifiable.errors import IdentifiableError

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_single_sourced() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    # The number lives only in identifiable.__version__; pyproject reads it from there.
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "identifiable.__version__"
    assert identifiable.__version__ == importlib.metadata.version("identifiable")


def test_cli_prints_the_same_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "identifiable", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == f"identifiable {identifiable.__version__}"


def test_changelog_has_an_unreleased_section_and_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text("utf-8")
    assert "## [Unreleased]" in text
    assert f"## [{identifiable.__version__}]" in text


def test_identifiable_error_is_a_value_error() -> None:
    assert issubclass(IdentifiableError, ValueError)
    assert identifiable.IdentifiableError is IdentifiableError
    # A bad argument from the library is caught by the conventional `except ValueError`.
    from identifiable.viewer.build import viewer_html_for_trace

    with pytest.raises(ValueError, match="at least 1 MB") as info:
        viewer_html_for_trace(object(), max_bytes=10)  # type: ignore[arg-type]
    assert type(info.value) is IdentifiableError


def test_cli_still_reports_it_on_one_line_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    from identifiable.cli import main

    with pytest.raises(SystemExit) as info:
        main(["view", "   "])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the text is empty") and err.count("\n") == 1
