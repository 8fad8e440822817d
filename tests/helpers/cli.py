"""Running the CLI as a user does: the real entry point in-process or the installed script,
and the contract every refusal meets (exit status 2, no traceback, at most three lines)."""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "identifiable"
"""The installed `identifiable` script of this environment."""


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The real CLI entry point in-process: (exit status, stdout, stderr)."""
    from identifiable.cli import main

    try:
        main(args)
        rc = 0
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under `root`: files by content hash, links by target, folders by name."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def assert_refused(outcome: Outcome, expect: str | None = None) -> None:
    """The contract of every refusal (the snapshot part is checked by the caller)."""
    assert outcome.code == 2, f"exit {outcome.code}, stderr:\n{outcome.err}"
    assert "Traceback" not in outcome.err and "Traceback" not in outcome.out, outcome.err
    assert 1 <= len(outcome.err_lines) <= 3, f"{len(outcome.err_lines)} lines:\n{outcome.err}"
    if expect is not None:
        assert expect in outcome.err, f"{expect!r} not in:\n{outcome.err}"
