"""docs/families.md carries the generated family table, current with the committed record."""

from __future__ import annotations

from pathlib import Path

from helpers.family_table import BEGIN, load_table, render

PAGE = Path(__file__).resolve().parents[2] / "docs" / "families.md"


def test_the_family_page_is_generated_from_the_committed_table():
    text = PAGE.read_text()
    assert BEGIN in text, "run scripts/family_table.py --docs"
    assert render(load_table()) in text, "stale: run scripts/family_table.py --docs"


def test_a_changed_record_makes_the_page_stale():
    table = load_table()
    row = next(iter(table["families"].values()))
    row["status"] = "verified" if row["status"] != "verified" else "failing"
    assert render(table) not in PAGE.read_text()
