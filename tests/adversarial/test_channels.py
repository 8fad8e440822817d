"""Output channels, as a user's shell sets them up: a full stdout (`> /dev/full`), a reader
that went away (`| head`), and consoles that are not UTF-8. The installed script runs in a
subprocess each time; none may end in a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers.cli import SCRIPT


def _run(args: list[str], cwd: Path, stdout, env: dict[str, str] | None = None):
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100", **(env or {})}
    return subprocess.run(
        [str(SCRIPT), *args], stdout=stdout, stderr=subprocess.PIPE, cwd=cwd,
        env=environment, timeout=300,
    )  # fmt: skip


def _commands(model: Path) -> dict[str, list[str]]:
    return {
        "trace": ["trace", "The cat sat.", "--model", str(model)],
        "attention": [
            "attention",
            "The cat",
            "--model",
            str(model),
            "--layer",
            "1",
            "--head",
            "0",
            "--row",
            "1",
        ],
        "models": ["models"],
        "version": ["--version"],
        "help": ["reproduce", "--help"],
    }


def _full_device() -> bool:
    import stat

    try:
        return stat.S_ISCHR(os.stat("/dev/full").st_mode)
    except OSError:
        return False


@pytest.mark.skipif(
    not _full_device(),
    reason="/dev/full is not the full device on this machine (opening it for writing would "
    "create a plain file that takes every byte, so no write could fail)",
)
@pytest.mark.parametrize("name", ["trace", "attention", "models", "version", "help"])
def test_a_full_stdout_is_one_line(ws, model_dir, name) -> None:
    with open("/dev/full", "r+b", buffering=0) as full:  # r+: never creates the file
        proc = _run(_commands(model_dir)[name], ws.root, full)
    err = proc.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(lines) == 1 and "cannot write to standard output (No space left" in lines[0]


@pytest.mark.parametrize("name", ["trace", "models", "version"])
def test_a_reader_that_went_away_ends_quietly(ws, model_dir, name) -> None:
    read, write = os.pipe()
    os.close(read)  # `| head` that has already exited
    try:
        proc = _run(_commands(model_dir)[name], ws.root, write)
    finally:
        os.close(write)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, err
    assert err.strip() == ""  # no traceback, no "Exception ignored"


@pytest.mark.parametrize("encoding", ["ascii", "latin-1", "cp1252"])
def test_a_console_without_utf8_gets_ascii_spellings(ws, model_dir, encoding) -> None:
    """The issue's case: `PYTHONIOENCODING=ascii identifiable attention … --row 1` raised
    UnicodeEncodeError on "≤"."""
    proc = _run(
        _commands(model_dir)["attention"], ws.root, subprocess.PIPE, {"PYTHONIOENCODING": encoding}
    )
    out, err = proc.stdout.decode(encoding), proc.stderr.decode(encoding, "replace")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "UnicodeEncodeError" not in err
    assert "<= head width" in out and "≤" not in out
    out.encode(encoding)  # everything printed is in the console's encoding


def test_help_on_an_ascii_console(ws, model_dir) -> None:
    """finetune's help says 'w ≥ 0': an ASCII console reads 'w >= 0', and nothing fails."""
    proc = _run(["finetune", "--help"], ws.root, subprocess.PIPE, {"PYTHONIOENCODING": "ascii"})
    out = proc.stdout.decode("ascii")
    assert proc.returncode == 0 and "w >= 0" in out


def test_an_error_on_an_ascii_console_is_one_line(ws, model_dir) -> None:
    proc = _run(
        ["view", "café ≤ naïve", "--model", str(model_dir), "--max-mb", "0"],
        ws.root,
        subprocess.PIPE,
        {"PYTHONIOENCODING": "ascii"},
    )
    err = proc.stderr.decode("ascii")
    assert proc.returncode == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "--max-mb must be" in err


def test_a_token_in_another_script_is_escaped_not_fatal(ws, model_dir) -> None:
    proc = _run(
        ["trace", "naïve ≤ 東京", "--model", str(model_dir)],
        ws.root,
        subprocess.PIPE,
        {"PYTHONIOENCODING": "ascii"},
    )
    err = proc.stderr.decode("ascii", "replace")
    assert proc.returncode == 0, err
    proc.stdout.decode("ascii")
