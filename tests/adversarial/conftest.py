"""The adversarial harness: run the real CLI entry point on hostile input and hold it to the
contract every refusal must meet.

A refusal exits with status 2, prints no traceback and at most three lines on stderr, and
changes nothing on disk: the test's whole workspace (where the output would go, its parent,
the inputs) is snapshot before and after and must be identical. Whatever a case runs, when it
ends no command of it has printed a traceback and no weight file in its workspace holds NaN
or inf (the suite's count: 0 tracebacks, 0 non-finite files).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import SCRIPT, Outcome, assert_refused, snapshot
from helpers.training import nonfinite_files
from identifiable.cli import main


@pytest.fixture(scope="session")
def model_dir(tiny_model: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT saved like a user's model folder (config, safetensors, tokenizer)."""
    root = tmp_path_factory.mktemp("models")
    model = tiny_model("bert")
    model.hf_model.save_pretrained(root / "tiny-bert")
    model.tokenizer.save_pretrained(root / "tiny-bert")
    return root / "tiny-bert"


@pytest.fixture(scope="session")
def no_tokenizer_dir(
    tiny_model: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The same model without tokenizer files (config and weights only)."""
    root = tmp_path_factory.mktemp("models")
    tiny_model("bert").hf_model.save_pretrained(root / "no-tokenizer")
    return root / "no-tokenizer"


class Workspace:
    """A scratch folder (the current directory during a case) and the CLI runners."""

    def __init__(self, root: Path, capsys: pytest.CaptureFixture[str], inputs: list[Path]) -> None:
        self.root, self.capsys, self.inputs = root, capsys, inputs
        self.outcomes: list[Outcome] = []

    def _state(self) -> dict[str, Any]:
        return {"workspace": snapshot(self.root), **{str(p): snapshot(p) for p in self.inputs}}

    def main(self, args: list[str]) -> Outcome:
        """In process, through `identifiable.cli.main` (what the script calls)."""
        self.capsys.readouterr()
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = self.capsys.readouterr()
        self.outcomes.append(Outcome(code, captured.out, captured.err))
        return self.outcomes[-1]

    def script(self, args: list[str], **kwargs: Any) -> Outcome:
        """As a user runs it: the installed `identifiable` script in a subprocess."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
        proc = subprocess.run(
            [str(SCRIPT), *args], capture_output=True, cwd=self.root, env=env, timeout=300, **kwargs
        )
        self.outcomes.append(
            Outcome(
                proc.returncode,
                proc.stdout.decode("utf-8", "replace"),
                proc.stderr.decode("utf-8", "replace"),
            )
        )
        return self.outcomes[-1]

    def refused(
        self, args: list[str], expect: str | None = None, *, script: bool = False
    ) -> Outcome:
        before = self._state()
        outcome = self.script(args) if script else self.main(args)
        assert_refused(outcome, expect)
        assert self._state() == before, "a refused command changed files on disk"
        return outcome


@pytest.fixture
def ws(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    model_dir: Path,
    no_tokenizer_dir: Path,
) -> Iterator[Workspace]:
    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    space = Workspace(root, capsys, [model_dir, no_tokenizer_dir])
    yield space
    printed = [o.err + o.out for o in space.outcomes]
    assert not [text for text in printed if "Traceback" in text], "a command printed a traceback"
    assert nonfinite_files(root) == [], "a weight file holds NaN or inf"
