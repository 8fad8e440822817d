"""The house's documents stay an entry and a reference, not a diary: README is at most 200
lines, no source file or doc page carries a "stop N" measurement diary, and the package's
top level holds at most five modules besides `__init__`/`__main__`."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "identifiable"
DIARY = re.compile(r"\bstop \d+\b", re.IGNORECASE)


def diary_lines(paths: list[Path]) -> list[str]:
    """`path:line: text` for every line that dates a measurement by a work stop."""
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if DIARY.search(line):
                found.append(f"{path}:{number}: {line.strip()}")
    return found


def test_readme_is_an_entry_of_at_most_200_lines() -> None:
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move reference text to docs/"
    assert lines[0] == "# identifiable" and "make run" in "\n".join(lines[:20])


def test_no_measurement_diary_in_source_or_docs() -> None:
    paths = [*PACKAGE.rglob("*.py"), *(ROOT / "docs").rglob("*.md")]
    assert diary_lines(paths) == []


def test_the_diary_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("A bound.\nMeasured at stop 43: 1.2 s.\nStop the run.\n", "utf-8")
    assert diary_lines([page]) == [f"{page}:2: Measured at stop 43: 1.2 s."]


def test_at_most_five_top_level_modules() -> None:
    loose = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}
    )
    assert len(loose) <= 5, loose
