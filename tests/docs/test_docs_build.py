"""The documentation site builds with `mkdocs build --strict` and covers the public API;
no docstring or doc cites a file outside the repository."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import identifiable

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = ["index", "install", "quickstart", "concepts", "definitions", "viewer", "cli", "changelog"]
API_PAGES = ["index", "models", "attention", "tokens", "attribution", "corpus", "report", "errors"]
DEFINITION_ANCHORS = [
    "notation",
    "null-spaces",
    "rank-tolerance",
    "key-sets",
    "effective-attention",
    "intervals",
    "token-identifiability",
    "hta",
    "self-check",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (
        importlib.util.find_spec("mkdocs") is None
        or importlib.util.find_spec("mkdocstrings") is None
    ):
        pytest.fail(
            "the docs extra is missing: pip install -c constraints.txt -e '.[docs]' "
            "(scripts/setup.sh installs it)",
            pytrace=False,
        )
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        # the checkout's own source (a worktree's PYTHONPATH), not the editable install's
        env={
            "NO_MKDOCS_2_WARNING": "1",
            "PATH": "/usr/bin:/bin",
            "HOME": str(out),
            "PYTHONPATH": str(ROOT / "src"),
        },
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def page(site: Path, name: str) -> str:
    path = site / ("index.html" if name == "index" else f"{name}/index.html")
    assert path.is_file(), f"{path} missing from the built site"
    return path.read_text("utf-8")


def test_key_pages_exist(site: Path) -> None:
    for name in PAGES:
        assert "<article" in page(site, name)
    for name in API_PAGES:
        page(site, f"api/{name}" if name != "index" else "api")
    definitions = page(site, "definitions")
    for anchor in DEFINITION_ANCHORS:
        assert f'id="{anchor}"' in definitions, anchor
    assert "Unreleased" in page(site, "changelog")  # CHANGELOG.md is included, not copied


def test_every_public_name_has_an_api_entry(site: Path) -> None:
    built = "\n".join(p.read_text("utf-8") for p in (site / "api").rglob("index.html"))
    documented = set(re.findall(r'id="identifiable\.[\w.]*?\.(\w+)"', built))
    # every public name (the subpackages of __all__ are modules, documented by their names)
    public = {identifiable._RENAMED.get(n, n) for n in identifiable._EXPORTS}
    assert public - documented == set()
    assert "viewer_iframe" in documented


def test_cli_reference_lists_every_command_with_its_options(site: Path) -> None:
    from identifiable.cli import COMMAND_MODULES

    text = page(site, "cli")
    for name in COMMAND_MODULES:
        if importlib.util.find_spec(f"identifiable.cli.{name}") is not None:
            assert f"identifiable {name}" in text, name
    # generated from the command itself: an option and its default
    assert "--interval-seconds" in text and "attention.html" in text


def test_the_site_fetches_nothing_from_outside(site: Path) -> None:
    for path in site.rglob("*.html"):
        text = path.read_text("utf-8")
        assert not re.search(r'<(script|link|img)[^>]+(src|href)="(https?:)?//', text), path


def test_method_pages_join_the_nav_only_when_present(site: Path) -> None:
    nav = page(site, "index")
    for name in ("mixing", "certified_attention", "token_identifiability"):
        assert (f'href="{name}/"' in nav) == (DOCS / f"{name}.md").is_file(), name


# ---- citations (no build needed) ----------------------------------------------------

OUTSIDE = re.compile(r"\bSPEC\b|SPEC\.md|/work/|\bshared/")
SCANNED = ["src", "tests", "benchmarks", "docs"]


def test_nothing_cites_a_file_outside_the_repository() -> None:
    offenders = []
    for folder in SCANNED:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in {".py", ".md"} or path == Path(__file__):
                continue
            for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
                if OUTSIDE.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_docstring_references_to_docs_resolve() -> None:
    refs = 0
    for path in (ROOT / "src").rglob("*.py"):
        for doc, anchor in re.findall(r"docs/([\w/]+\.md)(?:#([\w-]+))?", path.read_text("utf-8")):
            refs += 1
            target = DOCS / doc
            assert target.is_file(), f"{path}: docs/{doc} does not exist"
            if anchor:
                assert "{#" + anchor + "}" in target.read_text("utf-8"), f"{path}: #{anchor}"
    assert refs >= 10  # the definitions are cited from the modules that implement them
