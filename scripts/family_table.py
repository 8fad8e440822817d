"""Regenerate the family table: classify every model type the installed transformers
registers (tests/helpers/family_table.py), write tests/models/family_table.json and the
generated section of docs/families.md.

    PYTHONPATH=src .venv/bin/python scripts/family_table.py          # everything (~15 min)
    PYTHONPATH=src .venv/bin/python scripts/family_table.py --only jamba qwen3_next
    PYTHONPATH=src .venv/bin/python scripts/family_table.py --docs   # the page from the json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.family_table import BEGIN, END, TABLE, classify, load_table, render  # noqa: E402

PAGE = ROOT / "docs" / "families.md"


def sweep(only: list[str]) -> dict:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    rows = load_table()["families"] if only else {}
    for t in only or sorted(CONFIG_MAPPING_NAMES):
        s = classify(t)
        rows[t] = {"status": s.status, "reason": s.reason[:300], "family": s.family}
        print(f"{t}: {s.status} {s.reason[:100]}", flush=True)
    return {"transformers": transformers.__version__, "families": rows}


def write_page(table: dict) -> None:
    text = PAGE.read_text()
    section = render(table)
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Every registered model type\n\n" + section + "\n"
    PAGE.write_text(text)


if __name__ == "__main__":
    if "--docs" not in sys.argv:  # --only TYPE ...: re-classify those model types only
        only = sys.argv[sys.argv.index("--only") + 1 :] if "--only" in sys.argv else []
        TABLE.write_text(
            json.dumps(sweep(only), indent=1, ensure_ascii=False, sort_keys=True) + "\n"
        )
    write_page(load_table())
