"""One output-folder policy for every command that writes a folder (`reproduce --out`,
`tokens --out`, `tokens --cache-dir`): no `/`, no HOME, no links, no foreign files, no
folder inside a run of ours, and an unwritable place refused, all before any work."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from identifiable.store.outdir import write_manifest


@pytest.fixture
def no_model(monkeypatch):
    """Refusals come before any work: the model must never load."""

    def never(*args, **kwargs):
        raise AssertionError("the model must not load before the folders are checked")

    import identifiable.cli.tokens as tokens_cli
    import identifiable.experiments.pipeline as pipeline

    monkeypatch.setattr(tokens_cli, "load", never)
    monkeypatch.setattr(pipeline, "resolve_model", never)


def _report(root: Path, kind: str = "reproduce") -> Path:
    """A finished run of ours: files, then its manifest."""
    (root / "tables").mkdir(parents=True)
    (root / "tables" / "t.csv").write_text("a\n1\n")
    (root / "index.html").write_text("<html></html>")
    write_manifest(root, kind)
    return root


@pytest.fixture
def places(ws) -> dict[str, str]:
    """The hostile places, made in the workspace; name -> path."""
    root = ws.root
    (root / "a-file").write_text("not a folder")
    (root / "busy").mkdir()
    (root / "busy" / "notes.txt").write_text("the user's")
    (root / "target").mkdir()
    (root / "link-dir").symlink_to(root / "target")
    report = _report(root / "report")
    (root / "link-into-report").symlink_to(report / "tables")
    _report(root / "done", "tokens")
    (root / ".work.identifiable-partial" / ".cache").mkdir(parents=True)
    (root / ".work.identifiable-partial" / ".cache" / "run.json").write_text("{}")
    (root / ".blocked.identifiable-partial").write_text("a file in the way")
    (root / ".mixed.identifiable-partial").mkdir()
    (root / ".mixed.identifiable-partial" / "mine.txt").write_text("the user's")
    (root / "cache-with-folder" / "sub").mkdir(parents=True)
    (root / "cache-ok").mkdir()
    (root / "cache-ok" / ("token-pairs-" + "0" * 16 + ".json")).write_text("{}")
    return {
        "ws": str(root),
        "home": os.environ["HOME"],
        "report": str(report),
    }


TOKENS_OUT = [
    (["--out", "/"], "filesystem root"),
    (["--out", "{home}"], "home directory"),
    (["--out", "{home}", "--force"], "home directory"),
    (["--out", "."], "current directory"),
    (["--out", ".."], "ancestor of the current directory"),
    (["--out", "{ws}/.."], "ancestor of the current directory"),
    (["--out", "{ws}/link-dir"], "symbolic link"),
    (["--out", "{ws}/link-into-report"], "symbolic link"),
    (["--out", "{ws}/link-into-report", "--force"], "symbolic link"),
    (["--out", "{ws}/report/tables"], "a folder identifiable wrote"),
    (["--out", "{ws}/report/new"], "a folder identifiable wrote"),
    (["--out", "{ws}/report/tables/deeper/still"], "a folder identifiable wrote"),
    (["--out", "{ws}/.work.identifiable-partial/x"], "a folder identifiable wrote"),
    (["--out", "{ws}/report", "--force"], "holds an identifiable reproduce run"),
    (["--out", "{ws}/report"], "holds no identifiable tokens run"),
    (["--out", "{ws}/busy"], "holds no identifiable tokens run"),
    (["--out", "{ws}/busy", "--force"], "--force refused"),
    (["--out", "{ws}/done"], "pass --force to replace it"),
    (["--out", "{ws}/a-file"], "is a file"),
    (["--out", "{ws}/a-file/sub"], "is a file, not a folder"),
    (["--out", "/proc/identifiable-out"], "cannot be written"),
    (["--out", "/proc/identifiable/deeper"], "cannot be written"),
    (["--out", "{ws}/blocked"], "is in the way"),
    (["--out", "{ws}/mixed"], "holds files identifiable did not write"),
]

CACHE_DIRS = [
    (["--cache-dir", "/"], "filesystem root"),
    (["--cache-dir", "{home}"], "home directory"),
    (["--cache-dir", "."], "current directory"),
    (["--cache-dir", ""], "current directory"),  # typer reads "" as Path(".")
    (["--cache-dir", "{ws}/link-dir"], "symbolic link"),
    (["--cache-dir", "{ws}/a-file"], "is a file"),
    (["--cache-dir", "{ws}/a-file/sub"], "is a file, not a folder"),
    (["--cache-dir", "/proc/identifiable-cache"], "cannot be written"),
    (["--cache-dir", "{ws}/busy"], "not identifiable cache files"),
    (["--cache-dir", "{ws}/cache-with-folder"], "not identifiable cache files"),
    (["--cache-dir", "{ws}/report"], "a folder identifiable wrote"),
    (["--cache-dir", "{ws}/report/.cache"], "a folder identifiable wrote"),
    (["--cache-dir", "{ws}/out-here/cache"], "inside --out"),
    (["--cache-dir", "{ws}/out-here"], "inside --out"),
]


def _fill(args: list[str], places: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        for key, value in places.items():
            a = a.replace("{" + key + "}", value)
        out.append(a)
    return out


def _ids(cases):
    return [" ".join(a) or "(empty)" for a, _ in cases]


@pytest.mark.parametrize(("args", "expect"), TOKENS_OUT, ids=_ids(TOKENS_OUT))
def test_tokens_out_follows_the_folder_policy(ws, places, no_model, args, expect) -> None:
    outcome = ws.refused(["tokens", "--max-tokens", "64", *_fill(args, places)], expect)
    assert "--resume" not in outcome.err  # tokens has no --resume


@pytest.mark.parametrize(("args", "expect"), CACHE_DIRS, ids=_ids(CACHE_DIRS))
def test_tokens_cache_dir_follows_the_folder_policy(ws, places, no_model, args, expect) -> None:
    out = ["--out", f"{places['ws']}/out-here"]
    ws.refused(["tokens", "--max-tokens", "64", *out, *_fill(args, places)], expect)


def test_a_cache_dir_of_cache_files_only_passes_the_check(ws, places, no_model) -> None:
    args = ["tokens", "--out", "fresh", "--cache-dir", f"{places['ws']}/cache-ok"]
    with pytest.raises(AssertionError, match="must not load"):  # got as far as the model
        ws.main(args)


REPRODUCE_OUT = [
    (["--out", "{ws}/report/sub"], "a folder identifiable wrote"),
    (["--out", "{ws}/report/tables", "--resume"], "a folder identifiable wrote"),
    (["--out", "{ws}/done", "--force"], "holds an identifiable tokens run"),
    (["--out", "/proc/identifiable-report"], "cannot be written"),
    (["--out", "{ws}/a-file/sub"], "is a file, not a folder"),
    (["--out", "{ws}/link-into-report", "--resume"], "symbolic link"),
]


@pytest.mark.parametrize(("args", "expect"), REPRODUCE_OUT, ids=_ids(REPRODUCE_OUT))
def test_reproduce_out_follows_the_same_policy(ws, places, no_model, args, expect) -> None:
    ws.refused(["reproduce", "--budget", "smoke", *_fill(args, places)], expect)


# ---- a run that is live right now ----------------------------------------------------------


def _hold_lock(out: Path) -> int:
    """What a live run holds: the exclusive lock on `.OUT.identifiable.lock`, with its pid."""
    fd = os.open(out.parent / f".{out.name}.identifiable.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"4242\n")
    return fd


@pytest.mark.parametrize("command", ["reproduce", "tokens"])
def test_a_live_run_is_named_live_not_interrupted(ws, no_model, command) -> None:
    out = ws.root / "r"
    (ws.root / ".r.identifiable-partial" / ".cache").mkdir(parents=True)
    (ws.root / ".r.identifiable-partial" / ".cache" / "settings.json").write_text("{}")
    fd = _hold_lock(out)
    try:
        for extra in ([], ["--force"], ["--resume"] if command == "reproduce" else []):
            outcome = ws.refused([command, "--out", str(out), *extra], "process 4242")
            assert "is writing to" in outcome.err and "interrupted" not in outcome.err
    finally:
        os.close(fd)


def test_an_interrupted_run_is_still_named_interrupted(ws, no_model) -> None:
    (ws.root / ".r.identifiable-partial" / ".cache").mkdir(parents=True)
    (ws.root / ".r.identifiable-partial" / ".cache" / "settings.json").write_text("{}")
    (ws.root / ".r.identifiable.lock").write_text("1\n")  # left by a killed run, not held
    ws.refused(["reproduce", "--out", str(ws.root / "r")], "was interrupted")


# ---- a corrupt manifest in a finished run ---------------------------------------------------

DEEP = "[" * 200_000 + "]" * 200_000


DEEP_CASES = [
    (command, extra, expect)
    for command in ("reproduce", "tokens")
    for extra, expect in (
        (["--force"], "--force refused"),
        (["--resume"], "cannot resume"),
        ([], "holds no identifiable"),
    )
    if not (command == "tokens" and extra == ["--resume"])  # tokens has no --resume
]


@pytest.mark.parametrize(("command", "extra", "expect"), DEEP_CASES)
def test_a_200k_deep_manifest_is_one_line(ws, no_model, command, extra, expect) -> None:
    report = _report(ws.root / "r", "reproduce" if command == "reproduce" else "tokens")
    (report / ".cache" / "manifest.json").write_text(DEEP)
    ws.refused([command, "--out", str(report), *extra], expect)


def test_a_manifest_of_the_wrong_shape_vouches_for_nothing(ws, no_model) -> None:
    report = _report(ws.root / "r")
    for text in ("[]", '{"writer": "identifiable", "files": [], "dirs": []}', '"x"', "{"):
        (report / ".cache" / "manifest.json").write_text(text)
        ws.refused(["reproduce", "--out", str(report), "--force"], "--force refused")
    assert (report / "index.html").read_text() == "<html></html>"  # nothing was deleted
