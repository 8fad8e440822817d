"""The report folder's life cycle: validate first, delete only what we wrote, never follow links,
swap in atomically, one run at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from identifiable.cli import main
from identifiable.errors import IdentifiableError
from identifiable.store import outdir_checks
from identifiable.store.outdir import OutputFolder


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under `root` (links as their target text, never followed)."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = p.read_bytes()
            else:
                out[rel] = "dir"
    return out


def fake_run(
    out: Path, *, resume: bool = False, force: bool = False, content: str = "v1", fail: bool = False
) -> None:
    """What `reproduce` does with the folder, without a model: check, run, write, swap."""
    folder = OutputFolder(out, resume=resume, force=force)
    folder.check()
    with folder.run() as work:
        (work / ".cache").mkdir(exist_ok=True)
        (work / ".cache" / "settings.json").write_text(json.dumps({"key": "k", "settings": {}}))
        (work / "figures").mkdir(exist_ok=True)
        (work / "figures" / "fig.png").write_text(content)
        if fail:
            raise RuntimeError("the run failed half way")
        (work / "index.html").write_text(content)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0), capsys.readouterr().err


# ---- the reproduction: --force with a bad model -------------------------------


@pytest.mark.parametrize(
    "extra",
    [["--model", "/nonexistent"], ["--device", "junk"], ["--device", "cuda:7"], ["--model", ""]],
)
def test_force_with_invalid_arguments_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    h = tmp_path / "h"
    (h / ".cache" / "hf").mkdir(parents=True)
    (h / "figures").mkdir()
    (h / ".cache" / "hf" / "token").write_text("k")
    (h / "figures" / "plot.png").write_text("p")
    before = snapshot(tmp_path)
    rc, err = run_cli(["reproduce", "--out", str(h), "--force", *extra], capsys)
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert snapshot(tmp_path) == before


def test_force_refuses_a_folder_that_holds_no_run_of_ours(tmp_path: Path) -> None:
    h = tmp_path / "h"
    (h / ".cache" / "hf").mkdir(parents=True)
    (h / ".cache" / "hf" / "token").write_text("k")
    before = snapshot(tmp_path)
    with pytest.raises(IdentifiableError, match=r"holds no identifiable run.*nothing was deleted"):
        fake_run(h, force=True)
    assert snapshot(tmp_path) == before


# ---- folders never to write into -------------------------------------------------------


def test_refuses_root_home_cwd_and_its_ancestors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    work = home / "projects" / "here"
    work.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    for out, why in [
        ("/", "filesystem root"),
        (str(home), "home directory"),
        ("~", "home directory"),
        (".", "current directory"),
        (str(work), "current directory"),
        ("..", "ancestor"),
        (str(home / "projects"), "ancestor"),
    ]:
        for flags in ({}, {"force": True}, {"resume": True}):
            with pytest.raises(IdentifiableError, match=why):
                OutputFolder(Path(out).expanduser(), **flags).check()


def test_home_is_refused_by_the_cli_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text("secret")
    monkeypatch.setenv("HOME", str(home))
    before = snapshot(tmp_path)
    rc, err = run_cli(["reproduce", "--out", str(home), "--force", "--model", "/x"], capsys)
    assert rc == 2 and "home directory" in err
    assert snapshot(tmp_path) == before


# ---- symbolic links ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["figures", ".cache", "tables"])
def test_force_never_deletes_through_a_link(tmp_path: Path, name: str) -> None:
    out, elsewhere = tmp_path / "report", tmp_path / "elsewhere"
    fake_run(out)
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep me")
    if (out / name).exists():
        os.rename(out / name, tmp_path / f"moved-{name}")
    (out / name).symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(tmp_path)
    with pytest.raises(IdentifiableError, match="refused"):
        fake_run(out, force=True, content="v2")
    assert snapshot(tmp_path) == before


def test_out_itself_a_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    fake_run(real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    before = snapshot(tmp_path)
    for flags in ({}, {"force": True}, {"resume": True}):
        with pytest.raises(IdentifiableError, match="symbolic link"):
            fake_run(link, **flags)
    assert snapshot(tmp_path) == before


def test_resume_never_writes_through_a_linked_figures_folder(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "report", tmp_path / "elsewhere"
    with pytest.raises(RuntimeError):
        fake_run(out, fail=True)  # an interrupted run: its work folder stays for --resume
    partial = tmp_path / ".report.identifiable-partial"
    assert (partial / ".cache" / "settings.json").is_file() and not out.exists()
    elsewhere.mkdir()
    os.rename(partial / "figures", tmp_path / "old-figures")
    (partial / "figures").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(IdentifiableError, match="symbolic link"):
        fake_run(out, resume=True)
    assert list(elsewhere.iterdir()) == []


# ---- atomic replacement --------------------------------------------------------------


def test_a_failed_forced_run_leaves_the_previous_report_intact(tmp_path: Path) -> None:
    out = tmp_path / "report"
    fake_run(out, content="v1")
    before = snapshot(out)
    with pytest.raises(RuntimeError):
        fake_run(out, force=True, content="v2", fail=True)
    assert snapshot(out) == before
    fake_run(out, force=True, content="v3")
    assert (out / "index.html").read_text() == "v3"
    assert (out / "figures" / "fig.png").read_text() == "v3"
    # the old run and the work folder are gone; nothing else was left beside the report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_a_plain_rerun_after_an_interruption_asks_for_resume(tmp_path: Path) -> None:
    out = tmp_path / "report"
    with pytest.raises(RuntimeError):
        fake_run(out, fail=True)
    with pytest.raises(IdentifiableError, match=r"interrupted.*--resume.*--force"):
        fake_run(out)
    fake_run(out, resume=True, content="done")
    assert (out / "index.html").read_text() == "done"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_force_deletes_only_what_the_manifest_lists(tmp_path: Path) -> None:
    out = tmp_path / "report"
    fake_run(out)
    manifest = json.loads((out / ".cache" / "manifest.json").read_text())
    assert set(manifest["files"]) == {
        ".cache/run.json",
        ".cache/settings.json",
        "figures/fig.png",
        "index.html",
    }
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(IdentifiableError, match=r"did not write \(e\.g\. notes\.txt\)"):
        fake_run(out, force=True)
    (out / "notes.txt").unlink()
    (out / "index.html").write_text("v1 edited by hand")  # no longer what we wrote
    with pytest.raises(IdentifiableError, match=r"index\.html"):
        fake_run(out, force=True)
    assert (out / "index.html").read_text() == "v1 edited by hand"


def test_a_malformed_manifest_proves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report"
    fake_run(out)
    for text in ("[]", '{"writer": "identifiable", "files": [], "dirs": []}', "{", '"x"'):
        (out / ".cache" / "manifest.json").write_text(text)
        with pytest.raises(IdentifiableError, match="holds no identifiable run"):
            fake_run(out, force=True)
    assert (out / "index.html").read_text() == "v1"


# ---- one run at a time ------------------------------------------------------------------


def test_a_second_run_into_the_same_folder_refuses(tmp_path: Path) -> None:
    out = tmp_path / "report"
    first = OutputFolder(out)
    first.check()
    with first.run() as work:
        (work / "index.html").write_text("first")
        with (
            pytest.raises(IdentifiableError, match="another identifiable run is writing"),
            OutputFolder(out).run(),
        ):
            pass
    assert (out / "index.html").read_text() == "first"
    assert not outdir_checks._lockfile(out).exists()  # released and removed
