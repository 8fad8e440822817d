"""Output files and hostile numbers, through the real entry point (identifiable.cli.main).

An existing file is never replaced unless --force says so: the commands refuse it in one
line, exit 2, before loading a model, and leave its bytes as they were.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import identifiable.cli.common as cli_common
from helpers.cli import run_main
from identifiable.errors import IdentifiableError

TEXT = "The cat sat on the mat."


@pytest.fixture
def no_model(monkeypatch):
    """Every command loads through `cli.common.load` or its import of it: refuse both."""

    def never(*args, **kwargs):
        raise AssertionError("the model must not load")

    import identifiable.cli.attention as attention
    import identifiable.cli.attribution as attribution
    import identifiable.cli.certify as certify
    import identifiable.cli.mixing as mixing
    import identifiable.cli.tokens as tokens
    import identifiable.cli.trace as trace
    import identifiable.cli.view as view

    for module in (cli_common, attention, attribution, certify, mixing, tokens, trace, view):
        if hasattr(module, "load"):
            monkeypatch.setattr(module, "load", never)


@pytest.mark.parametrize(
    ("command", "option", "suffix"),
    [
        (["trace", TEXT], "--json", ".json"),
        (["attention", TEXT], "--json", ".txt"),
        (["mixing", TEXT], "--json", ".json"),
        (["attribution", TEXT], "--json", ".json"),
        (["certify", TEXT], "--out", ".parquet"),
        (["view", TEXT], "--out", ".html"),
    ],
)
def test_an_existing_file_is_refused_and_kept(capsys, no_model, tmp_path, command, option, suffix):
    mine = tmp_path / f"mine{suffix}"
    mine.write_bytes(b"KEEP")
    code, _, err = run_main([*command, option, str(mine)], capsys)
    assert code == 2 and "\n" not in err.strip() and "Traceback" not in err
    assert f"{option} {mine} already exists" in err and "--force" in err
    assert mine.read_bytes() == b"KEEP"
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name]  # no probe left behind


@pytest.mark.integration
def test_force_replaces_the_file(capsys, tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_bytes(b"KEEP")
    code, _, err = run_main(["trace", TEXT, "--json", str(mine), "--force"], capsys)
    assert code == 0, err
    assert mine.read_bytes().startswith(b"{") and not list(tmp_path.glob(".*"))


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_tokens_refuses_a_folder_holding_files_it_did_not_write(capsys, no_model, tmp_path, force):
    """Files named like its tables but written by someone else (no manifest of ours) are
    foreign: refused with and without --force, as reproduce --out does."""
    (tmp_path / "tokens_control.csv").write_bytes(b"KEEP")
    (tmp_path / "tokens_settings.json").write_bytes(b"KEEP")
    code, _, err = run_main(
        ["tokens", "--out", str(tmp_path), "--max-tokens", "64", *force], capsys
    )
    assert code == 2 and "\n" not in err.strip()
    assert "holds no identifiable" in err and "--resume" not in err
    assert (tmp_path / "tokens_control.csv").read_bytes() == b"KEEP"


def test_an_unwritable_folder_is_refused_before_any_output(capsys, no_model, tmp_path):
    # os.access says yes for root on /proc; the probe file does not.
    code, out, err = run_main(["certify", TEXT, "--out", "/proc/x.parquet"], capsys)
    assert code == 2 and out == "" and "\n" not in err.strip()
    assert "cannot write '/proc/x.parquet'" in err and "--out" in err and "--json" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tokens", "--batch-size", "99999999999"], "--batch-size must be between 1 and 1024"),
        (["tokens", "--seed", "-1"], r"--seed must be between 0 and 2\*\*63-1"),
        (["tokens", "--seed", str(2**63)], r"--seed must be between 0 and 2\*\*63-1"),
        (["tokens", "--cache-dir", "{file}"], "is a file; give a folder"),
        (["tokens", "--cache-dir", "{file}/sub"], "is a file, not a folder"),
        (["reproduce", "--seed", "-1", "--budget", "smoke"], r"--seed must be between"),
    ],
)
def test_bad_numbers_and_paths_are_one_line(capsys, no_model, tmp_path, monkeypatch, args, message):
    import re

    monkeypatch.chdir(tmp_path)
    Path("file").write_bytes(b"KEEP")
    args = [a.replace("{file}", "file") for a in args]
    code, _, err = run_main([*args, *(["--out", "o"] if "--out" not in args else [])], capsys)
    assert code == 2 and "\n" not in err.strip() and "Traceback" not in err
    assert re.search(message, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


def test_a_token_cap_too_large_to_hold_is_one_line():
    import torch

    from identifiable.tokens.extract import _per_token, collect_token_pairs

    with pytest.raises(IdentifiableError, match=r"needs [\d.]+ GiB.*--max-tokens"):
        _per_token(10**12, (7, 384), torch.float32)
    assert _per_token(4, (7, 384), torch.float32).shape == (4, 7, 384)
    # The ids are allocated before the states: a cap too large for them is one line too.
    with pytest.raises(IdentifiableError, match=r"needs [\d.]+ GiB.*--max-tokens"):
        collect_token_pairs(iter([]), max_tokens=10**14)
